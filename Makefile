# Set-up and the two things everyone runs. `make run ARGS="deployment.decode.gpus=16"` passes
# Hydra overrides; `make test PYTEST_ARGS="-m 'not slow'"` narrows the suite.
PY ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,sweep,aic]'
	touch $(STAMP)

.PHONY: venv run test bench lint
venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/racksim $(ARGS)

test: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/bench_reference.py

lint: $(STAMP)
	$(VENV)/bin/ruff check rackSim tests benchmarks

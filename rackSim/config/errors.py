"""Bad input, by class: every command ends on one plain message and the class's exit code.

The message names the file (and line) or the field, and the fix. The codes are the same for
every command (README, "Exit codes"):

| code | input class |
| --- | --- |
| 2 | scenario keys and values, command-line flags |
| 3 | calibration profile (`perf.profile`, a measured profile) |
| 4 | workload YAML (a WorkloadSpec file) |
| 5 | session-graph pool (JSONL) |
| 6 | trace file (Mooncake JSONL, Azure CSV) |
| 7 | agent session logs |
| 8 | endpoint (unreachable, or not a vLLM server) |

This module imports nothing of the project, so every package can raise these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class InputError(ValueError):
    """Bad input of one class (subclasses set `exit_code`)."""

    exit_code = 2


class ScenarioError(InputError):
    exit_code = 2


class ProfileInputError(InputError):
    exit_code = 3


class WorkloadFileError(InputError):
    exit_code = 4


class PoolInputError(InputError):
    exit_code = 5


class TraceInputError(InputError):
    exit_code = 6


class AgentLogInputError(InputError):
    exit_code = 7


class EndpointInputError(InputError):
    exit_code = 8


def read_yaml_mapping(path: str | Path, label: str, error: type[InputError],
                      what: str) -> dict[str, Any]:
    """The mapping in a YAML file, or `error` naming `label` and the file (and the line of a
    syntax error) with the fix. `what` says what the mapping should hold."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as err:
        raise error(f"{label} {path}: cannot read it ({err.strerror}); fix the path") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise error(f"{label} {path}{where}: not valid YAML "
                    f"({getattr(err, 'problem', None) or err}); fix the file") from None
    if not isinstance(data, dict):
        raise error(f"{label} {path}: expected a mapping of {what}, got "
                    f"{type(data).__name__}; fix the file")
    return data

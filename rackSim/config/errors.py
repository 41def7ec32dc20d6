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

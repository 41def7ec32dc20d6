"""Error policy of the driver: how failures are classified, and when a run stops.

Every failed request is recorded against that request (its RequestRecord's `error` starts with
one of the kinds below, followed by detail; tokens received before the failure are kept). A
failed request is not retried within the run: the lane carries on as if it had completed (the
next prompt's token ids do not depend on what the server generated), so the replay keeps its
shape. The run stops early - gracefully: no new sends, requests in flight finish or time out,
everything is written - once more than `max_errors` requests have failed. A stopped or
interrupted run can be resumed (`racksim-validate run --resume`), which re-sends exactly the
requests without a successful record.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class ErrorPolicy:
    """max_errors: failed requests tolerated before the run stops (0 = stop at the first).
    connect_timeout_s: TCP connect limit. read_timeout_s: longest silence between two streamed
    chunks. request_timeout_s: whole-request limit (send to last token)."""

    max_errors: int = 10
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    request_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_errors < 0:
            raise ValueError(f"--max-errors must be >= 0, got {self.max_errors}")
        for name in ("connect_timeout_s", "read_timeout_s", "request_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def should_stop(self, failed: int) -> bool:
        return failed > self.max_errors


def classify(err: BaseException) -> str:
    """`kind: detail` for an exception raised while sending or streaming a request."""
    detail = f"{type(err).__name__}: {err}"[:300]
    if isinstance(err, httpx.ConnectError | httpx.ConnectTimeout):
        kind = "connect"
    elif isinstance(err, httpx.TimeoutException | TimeoutError):
        kind = "timeout"
    elif isinstance(err, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError
                    | ConnectionError):
        kind = "reset"
    else:
        kind = "protocol"
    return f"{kind}: {detail}"


def error_kind(error: str | None) -> str | None:
    """The kind prefix of a recorded error string (None for success)."""
    if error is None:
        return None
    return error.split(":", 1)[0]

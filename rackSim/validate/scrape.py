"""Prometheus `/metrics` scrapes of a vLLM server, and the is-this-vLLM check.

Scrapes are parsed with prometheus-client's text parser
(`prometheus_client.parser.text_string_to_metric_families`) and stored, one JSON line per
scrape: `{"t_s", "endpoint", "label", "samples": [[name, {labels}, value], ...]}`.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from rackSim.config.errors import EndpointInputError


class EndpointError(EndpointInputError):
    """An endpoint is unreachable or not a vLLM server (the message says which and why)."""


@dataclass(frozen=True)
class ServerInfo:
    """What the preflight learnt: served model id, its max_model_len (tokens) and the server's
    cache shape (`cache_shape`; empty when /metrics has no cache config series)."""

    url: str
    model: str
    max_model_len: int | None
    shape: dict = field(default_factory=dict)


CACHE_CONFIG = "vllm:cache_config_info"


def cache_shape(samples: list[tuple[str, dict[str, str], float]]) -> dict:
    """The KV cache shape a vLLM server exposes in `vllm:cache_config_info`: block_tokens,
    kv_capacity_tokens (num_gpu_blocks x block_size), prefix_caching; plus the server
    process's start time (s since the epoch), which changes when the server restarts."""
    out: dict = {}
    for name, labels, value in samples:
        if name == CACHE_CONFIG:
            block = int(labels.get("block_size", 0) or 0)
            blocks = labels.get("num_gpu_blocks", "None")
            if block and blocks not in ("None", ""):
                out.update(block_tokens=block, kv_capacity_tokens=block * int(blocks))
            out["prefix_caching"] = labels.get("enable_prefix_caching") == "True"
        elif name == "process_start_time_seconds":
            out["process_start_s"] = value
    return out


def shape_change(before: dict, after: dict) -> str | None:
    """What differs between two `cache_shape`s (None when nothing does)."""
    diff = [f"{k}: {before.get(k)} -> {after.get(k)}" for k in sorted(before.keys() | after.keys())
            if before.get(k) != after.get(k)]
    return "; ".join(diff) or None


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample in a Prometheus text exposition."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.append((s.name, dict(s.labels), float(s.value)))
    return out


def metric_total(samples: list[tuple[str, dict[str, str], float]], name: str) -> float:
    """Sum of a sample name's values over all label sets (0 when absent)."""
    return float(sum(v for n, _, v in samples if n == name))


async def scrape(client: httpx.AsyncClient, url: str, timeout_s: float = 5.0
                 ) -> list[tuple[str, dict[str, str], float]]:
    """One /metrics scrape, parsed off the event loop (a vLLM exposition is ~50 KB, ~10 ms)."""
    r = await client.get(url.rstrip("/") + "/metrics", timeout=timeout_s)
    r.raise_for_status()
    return await asyncio.to_thread(parse_metrics, r.text)


async def preflight(client: httpx.AsyncClient, url: str, model: str | None = None,
                    timeout_s: float = 5.0) -> ServerInfo:
    """Check that `url` is a reachable vLLM server: /v1/models lists a model and /metrics has
    `vllm:` series. Raises EndpointError with the reason and the fix."""
    base = url.rstrip("/")
    try:
        r = await client.get(base + "/v1/models", timeout=timeout_s)
    except httpx.HTTPError as err:
        raise EndpointError(
            f"endpoint {url}: unreachable ({type(err).__name__}: {err}); start the server "
            "(e.g. `racksim-validate serve`) or fix --endpoint") from err
    data = None
    if r.status_code == 200:
        try:
            data = r.json()
        except ValueError:
            data = None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list) or not data["data"]:
        raise EndpointError(
            f"endpoint {url}: not a vLLM/OpenAI server (GET /v1/models answered "
            f"{r.status_code} without a model list); point --endpoint at a vLLM server")
    cards = data["data"]
    ids = [c.get("id") for c in cards]
    if model is not None and model not in ids:
        raise EndpointError(f"endpoint {url}: serves {ids}, not --model {model!r}")
    card = cards[ids.index(model)] if model is not None else cards[0]
    try:
        m = await client.get(base + "/metrics", timeout=timeout_s)
        samples = parse_metrics(m.text) if m.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        samples = []
    if not any(n.startswith("vllm:") for n, _, _ in samples):
        raise EndpointError(
            f"endpoint {url}: /metrics has no vllm: series, so this is not a vLLM server "
            "(the driver records vLLM's own metrics); point --endpoint at a vLLM server")
    mml = card.get("max_model_len")
    return ServerInfo(url=base, model=str(card["id"]),
                      max_model_len=int(mml) if isinstance(mml, int) else None,
                      shape=cache_shape(samples))


class ScrapeLog:
    """Appends scrapes to a JSONL file (flushed per scrape)."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("a", encoding="utf-8")
        self.count = 0

    def write(self, t_s: float, endpoint: str, label: str,
              samples: list[tuple[str, dict[str, str], float]] | None, error: str | None = None
              ) -> None:
        row = {"t_s": t_s, "endpoint": endpoint, "label": label,
               "samples": [[n, lab, v] for n, lab, v in samples or []], "error": error}
        self._f.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._f.flush()
        self.count += 1

    def close(self) -> None:
        self._f.close()


def read_scrapes(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _change(a: dict, b: dict, name: str) -> float:
    """Change of a counter (summed over label sets) from scrape `a` to scrape `b`."""
    return (metric_total([tuple(v) for v in b["samples"]], name)
            - metric_total([tuple(v) for v in a["samples"]], name))


def _run_ends(scrapes: list[dict]) -> tuple[dict, dict] | None:
    """A run's first 'before' scrape and last 'after' scrape (None when either is missing)."""
    before = [x for x in scrapes if x["label"] == "before" and x.get("samples")]
    after = [x for x in scrapes if x["label"] == "after" and x.get("samples")]
    return (before[0], after[-1]) if before and after else None


def run_delta(scrapes: list[dict], name: str) -> float:
    """Change of a counter (summed over label sets) from a run's first 'before' scrape to its
    last 'after' scrape (NaN when either is missing)."""
    ends = _run_ends(scrapes)
    return math.nan if ends is None else _change(*ends, name)


#: the server's own means (ms) over a run, from its histograms: TTFT from the API server's
#: arrival stamp to the first token's output processing; queue from the engine core taking the
#: request in (between two steps) to the step that schedules it; prefill from that step to
#: the engine core's first token
SERVER_MEANS = {"server_ttft_mean_ms": "vllm:time_to_first_token_seconds",
                "server_queue_mean_ms": "vllm:request_queue_time_seconds",
                "server_prefill_mean_ms": "vllm:request_prefill_time_seconds"}


def _histogram_mean_ms(a: dict, b: dict, name: str) -> float:
    """Mean (ms) of what a seconds histogram observed between scrapes `a` and `b` (NaN
    without observations)."""
    n = _change(a, b, name + "_count")
    return _change(a, b, name + "_sum") / n * 1e3 if n > 0 else math.nan


def histogram_mean_ms(scrapes: list[dict], name: str) -> float:
    """Mean (ms) of a seconds histogram over a run (NaN without observations or scrapes)."""
    ends = _run_ends(scrapes)
    return math.nan if ends is None else _histogram_mean_ms(*ends, name)


def window_histogram_mean_ms(scrapes: list[dict], name: str, t0: float, t1: float
                             ) -> tuple[float, float, float]:
    """Mean (ms) of a seconds histogram between the first and the last scrape taken during
    the run inside [t0, t1] (driver clock, s), and those two scrapes' times: the requests
    whose observation (for TTFT, the first token) fell between them, the primers at the run's
    start left out. NaN mean without two such scrapes or observations between them."""
    inside = [x for x in scrapes if x["label"] == "during" and x.get("samples")
              and t0 <= x["t_s"] <= t1]
    if len(inside) < 2:
        return math.nan, math.nan, math.nan
    a, b = inside[0], inside[-1]
    return _histogram_mean_ms(a, b, name), a["t_s"], b["t_s"]


def server_means_ms(scrapes: list[dict]) -> dict[str, float]:
    """The server's own TTFT, queue and prefill means (ms) over a run (`SERVER_MEANS`): the
    server's TTFT leaves out the time before it stamps a request and after it emits a token."""
    return {key: histogram_mean_ms(scrapes, name) for key, name in SERVER_MEANS.items()}


def server_ttft_mean_ms(scrapes: list[dict]) -> float:
    """Mean TTFT (ms) the server itself measured over a run (see `SERVER_MEANS`)."""
    return histogram_mean_ms(scrapes, SERVER_MEANS["server_ttft_mean_ms"])

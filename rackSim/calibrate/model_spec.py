"""`racksim-calibrate model CONFIG`: a model spec (scenarios/model/<name>.yaml) from a Hugging
Face `config.json` or the name of a config aiconfigurator-core ships.

Families (by `architectures[0]`):

* GQA dense - Llama, Qwen2/3, Mistral: every layer attention + a dense SwiGLU FFN;
* GQA MoE - Qwen3-MoE: routed experts on the sparse layers (`decoder_sparse_step`,
  `mlp_only_layers`), no shared expert;
* MLA MoE - DeepSeek-V3 (and models built on it, e.g. Kimi-K2): latent attention, a dense FFN
  on the first `first_k_dense_replace` layers, shared + routed experts, MTP draft layers;
* DeepSeek-V4 - compressed attention (CSA / HCA / window layers from `compress_ratios`), whose
  attention shapes the calibration profile carries.

Per token, at the served precision (`--precision`: weights and KV cache in FP8 or BF16)::

    GQA KV bytes = 2 (K, V) x layers x kv_heads x head_dim x kv_bytes
    MLA KV bytes = layers x (kv_lora_rank + qk_rope_head_dim) x kv_bytes

Parameters are the sum of the GEMM shapes `rackSim.perf.dense` prices (`model_gemms`) plus the
embedding table (not counted twice when tied); norms are left out (< 0.01 %). Every value
records the config field it came from in `provenance`; values no field gives are marked
`ASSUMED:` with the reason. A config that lacks a field its family needs is refused naming it.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rackSim.calibrate import aic
from rackSim.calibrate.scenario import SCENARIOS
from rackSim.config.flags import output_dir
from rackSim.config.specs import AttentionShape, ModelSpec
from rackSim.perf.dense import FP8_BLOCK_WEIGHT_BYTES, DenseGeometry, dense_params, model_gemms

GQA_DENSE = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")
GQA_MOE = ("Qwen3MoeForCausalLM",)
MLA_MOE = ("DeepseekV3ForCausalLM",)
COMPRESSED = ("DeepseekV4ForCausalLM",)
SUPPORTED = GQA_DENSE + GQA_MOE + MLA_MOE + COMPRESSED
#: served precision -> (bytes per weight incl. block scales, bytes per KV element)
PRECISIONS = {"fp8": (FP8_BLOCK_WEIGHT_BYTES, 1.0), "bf16": (2.0, 2.0)}
#: MXFP4 expert weights: 4 bits + one 8-bit scale per 32 weights
MXFP4_BYTES = 0.5 + 1.0 / 32


class ModelConfigError(ValueError):
    """A config this command cannot turn into a model spec; the message names the field."""


class Config:
    """A config.json whose reads are recorded: `provenance[spec_field] = config field`."""

    def __init__(self, data: dict[str, Any], source: str):
        self.data, self.source = data, source
        self.provenance: dict[str, str] = {}

    def get(self, field: str, why: str, default: Any = None, required: bool = True) -> Any:
        value = self.data.get(field, default)
        if value is None and required:
            raise ModelConfigError(f"{self.source}: config field '{field}' is missing ({why}); "
                                   "add it to the config")
        return value

    def take(self, spec_field: str, field: str, why: str) -> Any:
        """A required config value, recorded as the source of `spec_field`."""
        value = self.get(field, why)
        self.provenance[spec_field] = field
        return value

    def note(self, spec_field: str, how: str) -> None:
        self.provenance[spec_field] = how


def find_config(source: str) -> tuple[dict[str, Any], str]:
    """(config dict, source label) of a config.json path, a model directory holding one (a
    Hugging Face checkout) or an aiconfigurator-core config name (`Qwen/Qwen3-235B-A22B`,
    `Qwen--Qwen3-235B-A22B`)."""
    path = Path(source)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelConfigError(f"{source}: a directory without a config.json; give the "
                                   "model's config.json or its directory")
        path = path / "config.json"
    if path.suffix == ".json":
        if not path.is_file():
            raise ModelConfigError(f"{source}: no such file")
        try:
            return json.loads(path.read_text()), str(path)
        except json.JSONDecodeError as err:
            raise ModelConfigError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    root = aic.aic_root()
    if root is None:
        raise ModelConfigError(f"'{source}' is not a .json file and aiconfigurator-core (the "
                               "optional extra 'aic') is not installed to look the name up")
    configs = root / "model_configs"
    stem = source.replace("/", "--")
    found = configs / f"{stem}_config.json"
    if not found.is_file():
        names = sorted(p.name.removesuffix("_config.json").replace("--", "/")
                       for p in configs.glob("*_config.json"))
        close = difflib.get_close_matches(source, names, n=5, cutoff=0.3)
        raise ModelConfigError(f"'{source}': aiconfigurator-core ships no such config; "
                               f"closest: {close or names[:5]}")
    return json.loads(found.read_text()), f"aiconfigurator-core model_configs/{found.name}"


def slug(source: str) -> str:
    """File name stem of a model spec: the config's model name in snake case (a file named
    config.json is named after its directory, as in a Hugging Face snapshot)."""
    path = Path(source)
    stem = path.name.removesuffix(".json").removesuffix("_config")
    if stem == "config" and path.parent.name:
        stem = path.parent.name
    return re.sub(r"[^a-z0-9]+", "_", stem.split("--")[-1].lower()).strip("_")


def _attention(c: Config, family: str) -> dict[str, Any]:
    heads = c.take("attention.heads", "num_attention_heads", "attention heads")
    if family == "mla":
        nope = c.get("qk_nope_head_dim", "MLA query/key width")
        rope = c.take("attention.rope_head_dim", "qk_rope_head_dim", "MLA rope width")
        c.note("attention.head_dim", "qk_nope_head_dim + qk_rope_head_dim")
        c.note("attention.kv_heads", "ASSUMED: MLA caches one latent shared by all heads")
        return {"kind": "mla", "heads": heads, "kv_heads": 1, "head_dim": nope + rope,
                "v_head_dim": c.take("attention.v_head_dim", "v_head_dim", "MLA value width"),
                "q_lora_rank": int(c.get("q_lora_rank", "MLA q LoRA", 0, required=False) or 0),
                "kv_lora_rank": c.take("attention.kv_lora_rank", "kv_lora_rank",
                                       "the MLA latent KV cache"),
                "rope_head_dim": rope}
    kv = c.take("attention.kv_heads", "num_key_value_heads", "the GQA KV cache")
    head_dim = c.get("head_dim", "", required=False)
    if head_dim:
        c.note("attention.head_dim", "head_dim")
    else:
        head_dim = c.get("hidden_size", "head width") // heads
        c.note("attention.head_dim", "hidden_size / num_attention_heads (no head_dim field)")
    c.note("attention.v_head_dim", "= head_dim (GQA)")
    return {"kind": "gqa", "heads": heads, "kv_heads": kv, "head_dim": head_dim,
            "v_head_dim": head_dim}


def _window(c: Config, context: int) -> int:
    """Attention window: the whole context unless every layer uses one sliding window."""
    window = c.get("sliding_window", "", required=False)
    if not window or c.get("use_sliding_window", "", True, required=False) is False:
        c.note("sliding_window", "no sliding window in the config: full attention "
               "(window = context window)")
        return context
    if c.get("max_window_layers", "", None, required=False) not in (None,
                                                                   c.data["num_hidden_layers"]):
        raise ModelConfigError(f"{c.source}: config field 'max_window_layers' mixes sliding-"
                               "window and full-attention layers, which is not supported")
    c.note("sliding_window", "sliding_window (every layer)")
    return int(window)


def _moe_layers(c: Config, layers: int) -> tuple[int, int]:
    """(layers with routed experts, dense FFN layers) of a Qwen3-MoE or DeepSeek config."""
    if "first_k_dense_replace" in c.data:
        dense = int(c.take("dense_ffn_layers", "first_k_dense_replace", "dense FFN layers"))
        freq = int(c.get("moe_layer_freq", "", 1, required=False))
        moe = sum(1 for i in range(dense, layers) if i % freq == 0)
        c.note("num_moe_layers", "layers from first_k_dense_replace on, every moe_layer_freq")
        return moe, layers - moe
    step = int(c.get("decoder_sparse_step", "", 1, required=False))
    only = set(c.get("mlp_only_layers", "", [], required=False) or [])
    moe = sum(1 for i in range(layers) if i not in only and (i + 1) % step == 0)
    c.note("num_moe_layers", "layers not in mlp_only_layers, every decoder_sparse_step")
    c.note("dense_ffn_layers", "the other layers (intermediate_size FFN)")
    return moe, layers - moe


def _v4(c: Config, spec: dict[str, Any], weight_bytes: float, kv_bytes: float) -> None:
    """DeepSeek-V4 compressed attention: dense parameters from its layer shapes, KV and index
    bytes per token over the compressed entries one token creates."""
    ratios = c.take("compress_ratios", "compress_ratios", "CSA / HCA / window layers")
    small = min(r for r in ratios if r)
    csa = sum(1 for r in ratios if r == small)
    hca = sum(1 for r in ratios if r and r != small)
    head_dim = c.get("head_dim", "compressed KV entry width")
    g = DenseGeometry(
        hidden=spec["hidden_size"], layers=spec["num_layers"], csa_layers=csa, hca_layers=hca,
        heads=c.get("num_attention_heads", "attention heads"), head_dim=head_dim,
        q_lora_rank=c.get("q_lora_rank", "q LoRA"), o_lora_rank=c.get("o_lora_rank", "o LoRA"),
        o_groups=c.get("o_groups", "output groups"),
        indexer_heads=c.get("index_n_heads", "indexer"),
        indexer_head_dim=c.get("index_head_dim", "indexer"),
        shared_intermediate=spec["moe_intermediate_size"] * spec["num_shared_experts"],
        routed_experts=spec["num_routed_experts"], vocab=c.get("vocab_size", "LM head"),
        hc_mult=c.get("hc_mult", "hyper-connections"))
    spec["dense_params"] = dense_params(g)
    c.note("dense_params", "rackSim.perf.dense.dense_params over the V4 layer shapes")
    big = max(ratios)
    spec["kv_bytes_per_token"] = (csa / small + hca / big) * head_dim * kv_bytes
    c.note("kv_bytes_per_token", "ASSUMED: one head_dim entry per compress ratio tokens on "
           "CSA and HCA layers at the KV precision (window KV is bounded, not per token)")
    spec["indexer_bytes_per_token"] = csa / small * g.indexer_head_dim * (1 + 4 / 128)
    c.note("indexer_bytes_per_token", "ASSUMED: FP8 index keys (index_head_dim + a 4-byte "
           "scale per 128) per compressed CSA entry")
    spec["attention_topk_tokens"] = c.take("attention_topk_tokens", "index_topk",
                                           "sparse selection") * small
    c.note("attention_topk_tokens", "index_topk x the CSA compress ratio")
    if c.get("expert_dtype", "", None, required=False) == "fp4":
        spec["weight_bytes_per_param"] = MXFP4_BYTES
        c.note("weight_bytes_per_param", "expert_dtype fp4: ASSUMED MXFP4 (8-bit scale per 32)"
               " for every weight")
    else:
        spec["weight_bytes_per_param"] = weight_bytes


def spec_from_config(data: dict[str, Any], source: str, name: str, precision: str = "fp8"
                     ) -> dict[str, Any]:
    """The ModelSpec fields (and `provenance`) of a config dict; raises ModelConfigError."""
    if precision not in PRECISIONS:
        raise ModelConfigError(f"precision '{precision}': use one of {sorted(PRECISIONS)}")
    c = Config(data, source)
    arch = c.get("architectures", "the model family")
    arch = arch[0] if isinstance(arch, list) and arch else arch
    if arch not in SUPPORTED:
        raise ModelConfigError(f"{source}: architectures={data.get('architectures')} is not a "
                               f"supported family; supported: {list(SUPPORTED)}")
    c.note("family", f"architectures[0] = {arch}")
    weight_bytes, kv_bytes = PRECISIONS[precision]
    layers = c.take("num_layers", "num_hidden_layers", "layers")
    hidden = c.take("hidden_size", "hidden_size", "hidden width")
    context = c.take("context_window", "max_position_embeddings", "the context window")
    spec: dict[str, Any] = {
        "name": data.get("_name_or_path") or name, "num_layers": layers, "hidden_size": hidden,
        "context_window": context, "weight_bytes_per_param": weight_bytes,
        "vocab_size": c.take("vocab_size", "vocab_size", "the LM head"),
        "gemm_dtype": precision, "num_routed_experts": 0, "experts_per_token": 0,
        "num_moe_layers": 0, "moe_intermediate_size": 0, "num_shared_experts": 0}
    c.note("name", "the config's name")
    c.note("weight_bytes_per_param", f"ASSUMED: served in {precision} (--precision)")
    c.note("gemm_dtype", f"ASSUMED: served in {precision} (--precision)")
    if arch in GQA_MOE + MLA_MOE + COMPRESSED:
        experts_field = "num_experts" if arch in GQA_MOE else "n_routed_experts"
        spec["num_routed_experts"] = c.take("num_routed_experts", experts_field, "routed experts")
        spec["experts_per_token"] = c.take("experts_per_token", "num_experts_per_tok", "top-k")
        spec["moe_intermediate_size"] = c.take("moe_intermediate_size", "moe_intermediate_size",
                                               "expert width")
        shared = c.get("n_shared_experts", "", 0, required=False) or 0
        spec["num_shared_experts"] = int(shared)
        c.note("num_shared_experts", "n_shared_experts" if shared else "no shared expert field")
        if arch in COMPRESSED:
            spec["num_moe_layers"] = layers
            c.note("num_moe_layers", "every V4 layer routes (hash layers by token id)")
        else:
            spec["num_moe_layers"], spec["dense_ffn_layers"] = _moe_layers(c, layers)
    else:
        spec["dense_ffn_layers"] = layers
        c.note("dense_ffn_layers", "every layer (dense model)")
    if spec.get("dense_ffn_layers"):
        spec["dense_intermediate_size"] = c.take("dense_intermediate_size", "intermediate_size",
                                                 "the dense FFN width")
    if arch in COMPRESSED:
        spec["sliding_window"] = c.take("sliding_window", "sliding_window", "the window")
        _v4(c, spec, weight_bytes, kv_bytes)
    else:
        family = "mla" if arch in MLA_MOE else "gqa"
        spec["attention"] = att = _attention(c, family)
        spec["sliding_window"] = _window(c, context)
        if family == "mla":
            spec["kv_bytes_per_token"] = layers * (att["kv_lora_rank"] + att["rope_head_dim"]) \
                * kv_bytes
            c.note("kv_bytes_per_token", f"num_hidden_layers x (kv_lora_rank + qk_rope_head_dim)"
                   f" x {kv_bytes:g} B ({precision} KV cache, ASSUMED)")
        else:
            spec["kv_bytes_per_token"] = 2 * layers * att["kv_heads"] * att["head_dim"] * kv_bytes
            c.note("kv_bytes_per_token", f"2 x num_hidden_layers x num_key_value_heads x "
                   f"head_dim x {kv_bytes:g} B ({precision} KV cache, ASSUMED)")
        probe = ModelSpec.model_construct(**{**spec, "attention": AttentionShape(**att)},
                                          dense_params=1.0, total_params=1.0)
        tied = bool(c.get("tie_word_embeddings", "", False, required=False))
        spec["dense_params"] = (sum(g.params for g in model_gemms(probe))
                                + (0 if tied else spec["vocab_size"] * hidden))
        c.note("dense_params", "sum of rackSim.perf.dense.model_gemms shapes + the embedding "
               "table" + (" (tied to the LM head)" if tied else ""))
    mtp = int(c.get("num_nextn_predict_layers", "", 0, required=False) or 0)
    if mtp and spec["num_routed_experts"]:
        spec["draft"] = _draft(spec, mtp, hidden)
        c.note("draft", "num_nextn_predict_layers MTP layers, each one decoder layer with the "
               "target's routed experts plus the 2 x hidden -> hidden eh_proj")
    spec["total_params"] = spec["dense_params"] + (
        3.0 * hidden * spec["moe_intermediate_size"] * spec["num_routed_experts"]
        * spec["num_moe_layers"])
    c.note("total_params", "dense_params + routed experts (3 x hidden x moe_intermediate_size "
           "per expert and layer)")
    spec["provenance"] = dict(sorted(c.provenance.items()))
    return spec


def _draft(spec: dict[str, Any], layers: int, hidden: int) -> dict[str, Any]:
    """MTP draft layers: per layer, the target's per-layer non-routed share, its routed experts
    and the eh_proj that mixes the embedding with the hidden state."""
    expert = 3.0 * hidden * spec["moe_intermediate_size"]
    per_layer_dense = (spec["dense_params"] - 2 * spec["vocab_size"] * hidden) / spec["num_layers"]
    params = layers * (per_layer_dense + expert * spec["num_routed_experts"] + 2 * hidden * hidden)
    return {"num_layers": layers, "num_routed_experts": spec["num_routed_experts"],
            "experts_per_token": spec["experts_per_token"],
            "moe_intermediate_size": spec["moe_intermediate_size"], "params": params}


def write_spec(spec: dict[str, Any], source: str, precision: str, out: Path) -> ModelSpec:
    """Validate `spec` and write it as YAML with a header naming its source."""
    model = ModelSpec(**spec)
    header = (f"# {model.name}: generated by `racksim-calibrate model` from {source}\n"
              f"# served precision {precision}. `provenance` names the config field behind each"
              " value; values\n# no field gives are marked ASSUMED with the reason.\n")
    body = yaml.safe_dump(json.loads(model.model_dump_json(exclude_defaults=True)),
                          sort_keys=False, width=100)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + body)
    return model


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="racksim-calibrate model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="a config.json, or the name of an aiconfigurator-core config "
                    "(e.g. Qwen/Qwen3-235B-A22B)")
    ap.add_argument("--precision", choices=sorted(PRECISIONS), default="fp8",
                    help="served precision of weights and KV cache (default: %(default)s)")
    ap.add_argument("--name", help="spec name (default: the config's model name, snake case)")
    ap.add_argument("--out-dir", type=output_dir, default=SCENARIOS / "model")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        data, source = find_config(args.config)
        name = args.name or slug(data.get("_name_or_path") or args.config)
        spec = spec_from_config(data, source, name, args.precision)
        out = args.out_dir / f"{name}.yaml"
        model = write_spec(spec, source, args.precision, out)
    except (ModelConfigError, ValueError) as e:
        print(f"racksim-calibrate model: {e}", file=sys.stderr)
        return 2
    print(f"{model.name}: {model.total_params / 1e9:.2f}B params ({model.active_params / 1e9:.2f}B"
          f" active), {model.kv_bytes_per_token:,.0f} KV bytes/token -> {out}")
    return 0

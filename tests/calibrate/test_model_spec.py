"""Config -> model spec for each supported family, against hand-derived parameters and KV bytes,
and every way a config can be refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rackSim.calibrate.command import main as calibrate_main
from rackSim.calibrate.model_spec import ModelConfigError, find_config, slug, spec_from_config
from rackSim.config.specs import ModelSpec

pytest.importorskip("aiconfigurator_core")

LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 80, "hidden_size": 8192,
         "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672,
         "vocab_size": 128256, "max_position_embeddings": 131072,
         "tie_word_embeddings": False}


def _spec(source: str, precision: str = "fp8") -> ModelSpec:
    data, label = find_config(source)
    return ModelSpec(**spec_from_config(data, label, slug(source), precision))


def test_llama_3_1_70b_dense_gqa() -> None:
    m = _spec("meta-llama/Meta-Llama-3.1-70B")
    # per layer: q 8192^2 + k, v 8192 x 1024 + o 8192^2 + FFN 3 x 8192 x 28672; 80 layers;
    # embedding + LM head 2 x 128256 x 8192 (untied)
    per_layer = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    assert m.total_params == pytest.approx(80 * per_layer + 2 * 128256 * 8192, rel=1e-12)
    assert m.total_params == pytest.approx(70.55e9, rel=1e-3)
    assert m.num_routed_experts == m.num_moe_layers == 0
    assert m.active_params == m.total_params
    # 2 x 80 layers x 8 KV heads x 128 x 1 B (FP8)
    assert m.kv_bytes_per_token == 2 * 80 * 8 * 128
    assert _spec("meta-llama/Meta-Llama-3.1-70B", "bf16").kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert m.attention.kind == "gqa" and m.sliding_window == m.context_window == 131072
    assert m.provenance["attention.kv_heads"] == "num_key_value_heads"


def test_qwen3_235b_gqa_moe() -> None:
    m = _spec("Qwen/Qwen3-235B-A22B")
    experts = 94 * 128 * 3 * 4096 * 1536
    attention = 94 * (4096 * (64 + 2 * 4) * 128 + 64 * 128 * 4096)
    router = 94 * 4096 * 128
    assert m.routed_params == experts
    assert m.dense_params == attention + router + 2 * 151936 * 4096
    assert m.total_params == pytest.approx(235.1e9, rel=2e-3)   # "235B"
    assert m.active_params == pytest.approx(22.2e9, rel=1e-2)   # "A22B"
    assert m.kv_bytes_per_token == 2 * 94 * 4 * 128
    assert m.num_shared_experts == 0 and m.draft is None and m.experts_per_token == 8


def test_deepseek_v3_mla_moe_with_mtp() -> None:
    m = _spec("deepseek-ai/DeepSeek-V3")
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    dense = (61 * mla + 3 * 3 * 7168 * 18432 + 58 * 3 * 7168 * 2048 + 58 * 7168 * 256
             + 2 * 129280 * 7168)
    assert m.dense_params == dense
    assert m.routed_params == 58 * 256 * 3 * 7168 * 2048
    assert m.total_params == pytest.approx(671e9, rel=1e-3)    # DeepSeek-V3: 671B, 37B active
    assert m.active_params == pytest.approx(37.5e9, rel=1e-2)
    assert m.kv_bytes_per_token == 61 * (512 + 64)             # latent + rope, FP8
    assert m.attention.kind == "mla" and m.attention.kv_heads == 1
    assert m.dense_ffn_layers == 3 and m.num_moe_layers == 58
    assert m.draft is not None and m.draft.num_routed_experts == 256
    assert m.provenance["attention.kv_heads"].startswith("ASSUMED")


def test_deepseek_v4_flash_compressed() -> None:
    m = _spec("deepseek-ai/DeepSeek-V4-Flash")
    assert m.attention is None                  # shapes live in the calibration profile
    assert m.total_params == pytest.approx(284.3e9, rel=1e-3)  # the reference YAML's sum
    assert m.sliding_window == 128 and m.attention_topk_tokens == 512 * 4
    # 21 CSA layers / 4 + 20 HCA layers / 128, one 512-wide FP8 entry each
    assert m.kv_bytes_per_token == pytest.approx((21 / 4 + 20 / 128) * 512)


def test_command_writes_a_spec_the_scenarios_load(tmp_path: Path) -> None:
    assert calibrate_main(["model", "Qwen/Qwen3-235B-A22B", "--out-dir", str(tmp_path)]) == 0
    data = yaml.safe_load((tmp_path / "qwen3_235b_a22b.yaml").read_text())
    assert ModelSpec(**data).num_routed_experts == 128
    assert data["provenance"]["num_routed_experts"] == "num_experts"


@pytest.mark.parametrize("change, expect", [
    ({"architectures": ["MambaForCausalLM"]}, ["MambaForCausalLM", "not a supported family"]),
    ({"num_key_value_heads": None}, ["num_key_value_heads", "missing"]),
    ({"vocab_size": None}, ["vocab_size", "missing"]),
    ({"sliding_window": 4096, "max_window_layers": 28}, ["max_window_layers"]),
    ({"num_key_value_heads": 7}, ["kv_heads=7"]),
])
def test_bad_configs_are_refused_naming_the_field(tmp_path: Path, change: dict,
                                                  expect: list[str], capsys) -> None:
    cfg = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert calibrate_main(["model", str(path), "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    for word in expect:
        assert word in err
    assert not list(tmp_path.glob("*.yaml"))   # nothing written


def test_unknown_config_name_lists_the_closest(capsys) -> None:
    assert calibrate_main(["model", "Qwen/Qwen3-235B-A23B", "--out-dir", "/nonexistent"]) == 2
    assert "Qwen/Qwen3-235B-A22B" in capsys.readouterr().err


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(1, 128), kv=st.sampled_from([1, 2, 4, 8]),
       group=st.sampled_from([1, 2, 8]), head_dim=st.sampled_from([64, 128, 256]))
def test_gqa_kv_bytes_and_params_scale_with_the_shapes(layers: int, kv: int, group: int,
                                                        head_dim: int) -> None:
    heads = kv * group
    cfg = {**LLAMA, "num_hidden_layers": layers, "num_key_value_heads": kv,
           "num_attention_heads": heads, "head_dim": head_dim}
    m = ModelSpec(**spec_from_config(cfg, "test", "x", "bf16"))
    assert m.kv_bytes_per_token == 2 * layers * kv * head_dim * 2
    attn = 8192 * (heads + 2 * kv) * head_dim + heads * head_dim * 8192
    assert m.dense_params == layers * (attn + 3 * 8192 * 28672) + 2 * 128256 * 8192


def test_a_config_json_is_named_after_its_directory(tmp_path: Path) -> None:
    folder = tmp_path / "Llama-3.1-70B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    assert calibrate_main(["model", str(folder / "config.json"), "--out-dir", str(tmp_path)]) == 0
    assert ModelSpec(**yaml.safe_load((tmp_path / "llama_3_1_70b.yaml").read_text()))


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="precision 'fp6'.*bf16.*fp8"):
        spec_from_config(LLAMA, "test", "x", "fp6")


def test_a_model_directory_is_read_through_its_config_json(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "Llama-3.1-70B"
    folder.mkdir()
    assert calibrate_main(["model", str(folder), "--out-dir", str(tmp_path)]) == 2
    assert f"{folder}: a directory without a config.json" in capsys.readouterr().err
    (folder / "config.json").write_text(json.dumps(LLAMA))
    assert calibrate_main(["model", str(folder), "--out-dir", str(tmp_path)]) == 0
    assert ModelSpec(**yaml.safe_load((tmp_path / "llama_3_1_70b.yaml").read_text()))


def test_a_config_that_is_not_json_names_its_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"architectures": ["LlamaForCausalLM"],\n "hidden_size": }\n')
    assert calibrate_main(["model", str(bad), "--out-dir", str(tmp_path)]) == 2
    assert f"{bad}:2: not valid JSON (Expecting value)" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.yaml"))

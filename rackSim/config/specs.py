"""Validated configuration: what is served, on what, how it is laid out, and what it is asked.

Every model is strict (unknown keys are errors) and every cross-field rule lives in
`RunConfig`'s validators, so a bad scenario fails before anything is simulated, with a message
that names the field.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from rackSim.workload.agentx import AgentXSpec
from rackSim.workload.open_loop import OpenLoopSpec

GB = 1e9
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def resolve_path(path: Path) -> Path | None:
    """An existing file: `path` as given, else relative to the project root; None if neither."""
    for p in (Path(path), PROJECT_ROOT / path):
        if p.is_file():
            return p.resolve()
    return None


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DraftModelSpec(StrictModel):
    """The speculative-decoding draft model (an MTP-style module with its own MoE)."""

    num_layers: PositiveInt = 1
    num_routed_experts: PositiveInt
    experts_per_token: PositiveInt
    moe_intermediate_size: PositiveInt
    params: PositiveFloat = Field(description="total draft parameters (params)")


class AttentionShape(StrictModel):
    """Attention layer shapes of a model generated from its config (`racksim-calibrate model`;
    config.json field names in the descriptions).

    gqa: grouped-query attention, `kv_heads` K and V heads of `head_dim` cached per layer.
    mla: multi-head latent attention (DeepSeek-V3), one `kv_lora_rank + rope_head_dim` latent
    cached per layer; queries of `heads` heads of `head_dim` (= qk_nope + qk_rope) and values of
    `v_head_dim`. Models without this section (DeepSeek-V4-style compressed attention) take
    their attention shapes from the calibration profile.
    """

    kind: Literal["gqa", "mla"]
    heads: PositiveInt = Field(description="num_attention_heads")
    kv_heads: PositiveInt = Field(description="num_key_value_heads (mla: 1 shared latent)")
    head_dim: PositiveInt = Field(description="query/key width per head (mla: nope + rope)")
    v_head_dim: PositiveInt = Field(description="value width per head")
    q_lora_rank: int = Field(default=0, ge=0, description="mla: q_lora_rank (0: no q LoRA)")
    kv_lora_rank: int = Field(default=0, ge=0, description="mla: kv_lora_rank")
    rope_head_dim: int = Field(default=0, ge=0, description="mla: qk_rope_head_dim")

    @model_validator(mode="after")
    def _check(self) -> AttentionShape:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.kind == "mla" and (self.kv_lora_rank <= 0 or self.rope_head_dim <= 0):
            raise ValueError("kind 'mla' needs kv_lora_rank and rope_head_dim")
        return self


class ModelSpec(StrictModel):
    """A transformer model, as data (one YAML file per model under scenarios/model/).

    `dense_params` is stated, not derived: the sum over the model's non-routed layer shapes
    (scenarios/model/*.yaml shows the sum). Routed experts plus dense parameters must come to
    `total_params` within `PARAMS_TOLERANCE`. A dense model has no routed experts
    (`num_routed_experts` = `experts_per_token` = `num_moe_layers` = 0).
    """

    #: largest relative gap allowed between routed + dense parameters and total_params
    PARAMS_TOLERANCE: ClassVar[float] = 0.01

    name: str
    total_params: PositiveFloat = Field(description="all parameters (params)")
    dense_params: PositiveFloat = Field(description=(
        "non-routed parameters (params): attention projections, compressors, indexer, shared "
        "experts, router, hyper-connections, embedding and LM head"))
    num_layers: PositiveInt
    num_moe_layers: int = Field(ge=0, description="layers with routed experts")
    hidden_size: PositiveInt
    num_routed_experts: int = Field(ge=0)
    experts_per_token: int = Field(ge=0)
    num_shared_experts: int = Field(ge=0)
    moe_intermediate_size: int = Field(ge=0)
    weight_bytes_per_param: PositiveFloat = Field(
        description="bytes per weight incl. block scales (FP4 with FP8 scales: 0.5625)")
    kv_bytes_per_token: PositiveFloat = Field(description="global KV cache bytes per token")
    context_window: PositiveInt = Field(description="max tokens per request")
    sliding_window: PositiveInt = Field(description=(
        "tokens attended densely (sliding window; full attention: the context window)"))
    attention_topk_tokens: int = Field(default=0, ge=0, description=(
        "tokens a sparse-attention query selects beyond the window (0: no sparse selection)"))
    indexer_bytes_per_token: float = Field(default=0.0, ge=0,
                                           description="indexer key bytes per token")
    draft: DraftModelSpec | None = None
    attention: AttentionShape | None = Field(default=None, description=(
        "attention shapes of a generated model (None: compressed attention, profile shapes)"))
    dense_ffn_layers: int = Field(default=0, ge=0, description=(
        "layers with a dense FFN instead of routed experts (first_k_dense_replace; all layers "
        "of a dense model)"))
    dense_intermediate_size: int = Field(default=0, ge=0,
                                         description="intermediate_size of the dense FFN")
    vocab_size: int = Field(default=0, ge=0, description="vocab_size (LM head rows)")
    gemm_dtype: Literal["fp8", "bf16"] = Field(
        default="fp8", description="dtype of the dense linear layers of a generated model")
    provenance: dict[str, str] = Field(default_factory=dict, description=(
        "where each value came from: the config field, or 'ASSUMED: <reason>'"))

    @property
    def expert_params(self) -> float:
        """Parameters of one routed expert in one layer (gate, up, down)."""
        return 3.0 * self.hidden_size * self.moe_intermediate_size

    @property
    def routed_params(self) -> float:
        return self.expert_params * self.num_routed_experts * self.num_moe_layers

    @property
    def active_params(self) -> float:
        return self.dense_params + self.expert_params * self.experts_per_token * self.num_moe_layers

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        routed = (self.num_routed_experts, self.experts_per_token, self.num_moe_layers,
                  self.moe_intermediate_size)
        if any(routed) and not all(routed):
            raise ValueError(
                "num_routed_experts, experts_per_token, num_moe_layers and "
                "moe_intermediate_size must all be > 0 (a MoE model) or the first three 0 "
                f"(a dense model); got {routed}")
        if self.experts_per_token > self.num_routed_experts:
            raise ValueError("experts_per_token exceeds num_routed_experts")
        if self.num_moe_layers > self.num_layers:
            raise ValueError("num_moe_layers exceeds num_layers")
        if self.num_moe_layers + self.dense_ffn_layers > self.num_layers:
            raise ValueError(
                f"num_moe_layers={self.num_moe_layers} + dense_ffn_layers="
                f"{self.dense_ffn_layers} exceed num_layers={self.num_layers}")
        if self.dense_ffn_layers and not self.dense_intermediate_size:
            raise ValueError("dense_ffn_layers > 0 needs dense_intermediate_size")
        if self.attention is not None and not self.vocab_size:
            raise ValueError("a model with an 'attention' section needs vocab_size")
        gap = (self.routed_params + self.dense_params) / self.total_params - 1.0
        if abs(gap) > self.PARAMS_TOLERANCE:
            raise ValueError(
                f"routed experts ({self.routed_params:.4g} params) + dense_params="
                f"{self.dense_params:.4g} differ from total_params={self.total_params:.4g} by "
                f"{gap:+.1%} (allowed {self.PARAMS_TOLERANCE:.0%}): check dense_params, "
                "num_moe_layers, hidden_size / moe_intermediate_size")
        return self


class HardwareSpec(StrictModel):
    """One GPU system, as data (one YAML file per system under scenarios/hardware/)."""

    name: str
    gpus_per_rack: PositiveInt
    hbm_bytes: PositiveFloat = Field(description="usable HBM per GPU (bytes)")
    hbm_bw_bytes_s: PositiveFloat = Field(description="peak HBM bandwidth per GPU (bytes/s)")
    flops: dict[str, PositiveFloat] = Field(description="dense peak FLOP/s per GPU by dtype")
    nvlink_bw_bytes_s: PositiveFloat = Field(description="NVLink bandwidth per GPU, one direction")
    host_mem_bytes_per_gpu: float = Field(ge=0, description="CPU memory per GPU for KV offload")
    host_link_bw_bytes_s: PositiveFloat = Field(description="CPU<->GPU bandwidth per GPU")
    cpu_cores_per_gpu: PositiveInt
    power_w: PositiveFloat
    nic_bw_bytes_s: PositiveFloat | None = Field(default=None, description=(
        "scale-out NIC bandwidth per GPU, one direction (bytes/s): traffic between NVLink "
        "domains"))
    nic_latency_us: float | None = Field(default=None, ge=0, description=(
        "one message across the scale-out network, NIC to NIC through the switch tiers (us)"))
    nvlink_domain_gpus: PositiveInt | None = Field(default=None, description=(
        "GPUs per NVLink domain (72 in an NVL72 rack, 8 in an HGX node; None: the whole "
        "rack); an instance never spans domains"))
    sms: PositiveInt | None = Field(default=None, description=(
        "streaming multiprocessors per GPU; dual-batch overlap on DeepEP's normal kernels "
        "takes `dbo.comm_sms` of them from the compute"))
    kernel_tables: str | None = Field(default=None, description=(
        "aiconfigurator-core system whose measured vLLM kernel tables describe this GPU "
        "(systems/data/<name>); racksim-calibrate profile fits to them"))

    #: dtypes the step models price (`perf.weight_dtype`, GEMM and attention dtypes)
    DTYPES: ClassVar[tuple[str, ...]] = ("fp4", "fp8", "bf16")

    @model_validator(mode="after")
    def _check(self) -> HardwareSpec:
        unknown = sorted(set(self.flops) - set(self.DTYPES))
        if unknown:
            raise ValueError(f"flops: unknown dtype(s) {unknown}; use {list(self.DTYPES)}")
        if "bf16" not in self.flops:
            raise ValueError("flops: needs 'bf16' (attention and BF16 GEMMs run in it)")
        if self.gpus_per_rack % self.domain_gpus:
            raise ValueError(
                f"nvlink_domain_gpus={self.nvlink_domain_gpus} does not divide gpus_per_rack="
                f"{self.gpus_per_rack}; a rack holds whole NVLink domains")
        return self

    @property
    def domain_gpus(self) -> int:
        """GPUs one NVLink domain connects (an instance's widest possible width)."""
        return self.nvlink_domain_gpus or self.gpus_per_rack


class SpeculativeSpec(StrictModel):
    num_draft_tokens: int = Field(ge=0)
    accepted_tokens_per_step: PositiveFloat = Field(
        description="tokens emitted per decode step per request (1 + accepted drafts)")

    @model_validator(mode="after")
    def _check(self) -> SpeculativeSpec:
        if self.accepted_tokens_per_step > 1 + self.num_draft_tokens:
            raise ValueError(
                f"accepted_tokens_per_step={self.accepted_tokens_per_step} exceeds "
                f"1 + num_draft_tokens={1 + self.num_draft_tokens}")
        return self


#: The expert-parallel all-to-all kernels of an instance (vLLM's `--all2all-backend`):
#: DeepEP's normal kernels send a token once to each rank that hosts any of its experts,
#: its low-latency kernels one copy per selected expert (docs/perf.md, all-to-all).
All2allBackend = Literal["deepep_high_throughput", "deepep_low_latency"]


#: after an instance kind in a layout label (`P4xDEP8(dbo)+DEP32`): it runs with dual-batch
#: overlap
DBO_MARK = "(dbo)"


class DboSpec(StrictModel):
    """Dual-batch overlap of a DEP instance (vLLM `--enable-dbo`, docs/perf.md): a step whose
    every DP rank has at least the threshold's tokens runs as two microbatches, the MoE
    all-to-all of one hidden behind the other's compute."""

    enabled: bool = Field(default=False, description="split eligible steps in two microbatches")
    decode_token_threshold: NonNegativeInt = Field(default=32, description=(
        "tokens every rank needs in a decode-only step (vLLM --dbo-decode-token-threshold)"))
    prefill_token_threshold: NonNegativeInt = Field(default=512, description=(
        "tokens every rank needs in a step with prefill in it (vLLM "
        "--dbo-prefill-token-threshold)"))
    comm_sms: NonNegativeInt = Field(default=20, description=(
        "SMs DeepEP's normal (high-throughput) kernels hold while they overlap, taken from "
        "the compute (vLLM VLLM_DBO_COMM_SMS); the low-latency kernels hold none"))


class PrefillSpec(StrictModel):
    instances: int = Field(ge=0, description=(
        "prefill instances per rack (0: this rack group only decodes)"))
    gpus_per_instance: PositiveInt
    parallelism: Literal["DEP", "TP"] = "DEP"
    all2all_backend: All2allBackend = Field(default="deepep_high_throughput", description=(
        "DEP all-to-all kernels; vLLM's guide pairs prefill with DeepEP's normal "
        "(high-throughput) kernels"))
    dbo: DboSpec = DboSpec()
    max_num_batched_tokens: PositiveInt = Field(description="token budget per step per rank")
    max_num_seqs: PositiveInt = 64


class DecodeSpec(StrictModel):
    instances: int = Field(default=1, ge=0, description=(
        "decode instances per rack, each `gpus` wide (0: this rack group only prefills)"))
    gpus: PositiveInt = Field(description="DEP width: data-parallel attention ranks = EP ranks")
    parallelism: Literal["DEP", "TP"] = "DEP"
    all2all_backend: All2allBackend = Field(default="deepep_low_latency", description=(
        "DEP all-to-all kernels; vLLM's guide pairs decode with DeepEP's low-latency kernels "
        "(CUDA graphs)"))
    dbo: DboSpec = DboSpec()
    max_num_seqs_per_rank: PositiveInt
    kv_load_cap_per_step: PositiveInt | None = Field(
        default=None, description=(
            "max new KV loads each DP rank's scheduler admits per step (None = no cap)"))
    admission_us_per_request: float = Field(ge=0, description=(
        "scheduler CPU per admitted request on its DP rank (us): request bookkeeping, the "
        "connector's completion notice, the new batch row"))
    admission_us_per_block: float = Field(ge=0, description=(
        "scheduler CPU per received KV block on its DP rank (us): block allocation, "
        "block-table row, caching the block once its KV has arrived"))
    speculative: SpeculativeSpec


class ColocatedSpec(StrictModel):
    """Instances that prefill and decode alike (no P/D disaggregation), as vLLM serves by
    default: every step of a DP rank's scheduler carries its running requests' decode tokens
    first, then prefill chunks up to the token budget."""

    instances: int = Field(default=0, ge=0, description=(
        "colocated instances per rack, each `gpus` wide (0: none)"))
    gpus: PositiveInt = Field(description="DEP width (data-parallel attention ranks = EP ranks) "
                              "or TP size")
    parallelism: Literal["DEP", "TP"] = "DEP"
    all2all_backend: All2allBackend = Field(default="deepep_low_latency", description=(
        "DEP all-to-all kernels, one for all the instance's steps (vLLM picks one backend per "
        "instance)"))
    dbo: DboSpec = DboSpec()
    max_num_batched_tokens: PositiveInt = Field(description=(
        "token budget per step per rank: decode tokens (1 + drafts per request) first, then "
        "prefill chunks"))
    max_num_seqs_per_rank: PositiveInt = Field(description=(
        "running requests per rank, prefilling and decoding"))
    speculative: SpeculativeSpec

    @model_validator(mode="after")
    def _check(self) -> ColocatedSpec:
        decode_tokens = self.max_num_seqs_per_rank * (1 + self.speculative.num_draft_tokens)
        if self.max_num_batched_tokens <= decode_tokens:
            raise ValueError(
                f"colocated.max_num_batched_tokens={self.max_num_batched_tokens}: a full batch "
                f"of {self.max_num_seqs_per_rank} decoding requests takes {decode_tokens} tokens "
                "of it (1 + num_draft_tokens each) and would leave no room for prefill; raise "
                "it or lower max_num_seqs_per_rank")
        return self


class KvTransferSpec(StrictModel):
    mode: Literal["push", "pull"] = "push"
    latency_ms: float = Field(ge=0, description="push: setup latency of one packed-region "
                              "transfer (ms)")
    efficiency: float = Field(gt=0, le=1, description="achieved share of NVLink bandwidth")
    descriptor_latency_us: float = Field(ge=0, description=(
        "pull: completion latency of one (block, layer) read descriptor (us)"))
    descriptor_post_us: float = Field(gt=0, description=(
        "pull: CPU time to post one read descriptor on one posting thread (us)"))
    post_threads: PositiveInt = Field(description=(
        "pull: threads of a decode rank posting descriptors in parallel"))
    descriptors_in_flight: PositiveInt = Field(description=(
        "pull: read descriptors outstanding at once per decode rank"))


class EplbSpec(StrictModel):
    enabled: bool = True
    redundant_experts: int = Field(default=0, ge=0)
    interval_steps: PositiveInt = 3000
    window_steps: PositiveInt = 1000


class CacheSpec(StrictModel):
    block_tokens: Literal[64] = 64
    gpu_memory_utilization: float = Field(gt=0, le=1)
    activation_reserve_bytes: float = Field(ge=0, description="per GPU, kept for activations")
    host_offload: bool = True


class RackGroupSpec(StrictModel):
    """`racks` racks that carry the same layout; a layout left out is the deployment's."""

    name: str
    racks: PositiveInt
    prefill: PrefillSpec | None = None
    decode: DecodeSpec | None = None
    colocated: ColocatedSpec | None = None

    @property
    def gpus_per_rack(self) -> int:
        """GPUs one rack of this group uses (only meaningful once the layout is filled in)."""
        p, d, c = self.prefill, self.decode, self.colocated
        return (p.instances * p.gpus_per_instance + d.instances * d.gpus
                + (c.instances * c.gpus if c is not None else 0))

    @property
    def colocated_instances(self) -> int:
        return self.colocated.instances if self.colocated is not None else 0


class FleetRouterSpec(StrictModel):
    """The global router: which rack prefills a request, and where its decode runs.

    Policies: round_robin; least_work (least outstanding prefill work per prefill GPU);
    session_affinity (a session stays in its rack, first rack by least work); prefix_affinity
    (the rack holding the session's prefix unless another rack's work plus the prompt is
    smaller than the home rack's work plus the uncached part there). Docs: docs/fleets.md.
    """

    policy: Literal["round_robin", "least_work", "session_affinity", "prefix_affinity"] = \
        "session_affinity"
    spill_tokens_per_gpu: PositiveFloat | None = Field(default=None, description=(
        "a rack whose outstanding prefill tokens per prefill GPU exceed this is saturated: "
        "its sessions move to the least-loaded rack (None: never spill)"))
    entry_groups: list[str] | None = Field(default=None, description=(
        "rack groups new sessions start in (None: all); the others take spill-over only"))
    decode_spill: bool = Field(default=True, description=(
        "when every decode instance of the prefill's rack is full, decode in another rack "
        "(KV over the scale-out network)"))


def _merged(base: dict, over: dict) -> dict:
    """`over` on top of `base`, nested dicts merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class DeploymentSpec(StrictModel):
    """A fleet: `racks` racks of the `prefill` + `decode` layout, or rack `groups` with their
    own layouts (a group that leaves its layout out carries the deployment's). A colocated
    fleet sets `colocated.instances` and no prefill or decode instances: a fleet either
    disaggregates or not."""

    name: str
    racks: PositiveInt | None = Field(default=None, description=(
        "racks carrying the layout (None: 1, or the sum over `groups`)"))
    prefill: PrefillSpec
    decode: DecodeSpec
    colocated: ColocatedSpec | None = None
    groups: list[RackGroupSpec] | None = None
    kv_transfer: KvTransferSpec
    router: Literal["round_robin", "least_loaded", "session_affinity", "prefix_affinity"]
    fleet_router: FleetRouterSpec = FleetRouterSpec()
    eplb: EplbSpec
    allreduce: Literal["ring", "recursive_doubling"] = "recursive_doubling"
    cache: CacheSpec

    @model_validator(mode="before")
    @classmethod
    def _inherit_layout(cls, data: object) -> object:
        """A rack group's partial `prefill` / `decode` overrides the deployment's, key by key
        (`decode: {instances: 2, gpus: 16}` keeps the rest of the deployment's decode)."""
        if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
            return data
        groups = []
        for g in data["groups"]:
            if isinstance(g, dict):
                g = dict(g)
                for role in ("prefill", "decode", "colocated"):
                    if isinstance(g.get(role), dict) and isinstance(data.get(role), dict):
                        g[role] = _merged(data[role], g[role])
            groups.append(g)
        return {**data, "groups": groups}

    @property
    def rack_groups(self) -> list[RackGroupSpec]:
        """Every rack group with its layout filled in; without `groups`, one group named after
        the deployment carrying `racks` racks of the top-level layout."""
        if not self.groups:
            return [RackGroupSpec(name=self.name, racks=self.racks or 1, prefill=self.prefill,
                                  decode=self.decode, colocated=self.colocated)]
        return [g.model_copy(update={"prefill": g.prefill or self.prefill,
                                     "decode": g.decode or self.decode,
                                     "colocated": g.colocated or self.colocated})
                for g in self.groups]

    @property
    def is_colocated(self) -> bool:
        """Whether the fleet serves with colocated instances (no P/D disaggregation)."""
        return any(g.colocated_instances for g in self.rack_groups)

    @property
    def num_racks(self) -> int:
        return sum(g.racks for g in self.rack_groups)

    @property
    def num_gpus(self) -> int:
        """GPUs the whole fleet uses."""
        return sum(g.racks * g.gpus_per_rack for g in self.rack_groups)

    @model_validator(mode="after")
    def _check(self) -> DeploymentSpec:
        groups = self.rack_groups
        if self.groups:
            names = [g.name for g in groups]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"groups: names {dup} repeat; give each rack group its own name")
            if self.racks is not None and self.racks != self.num_racks:
                raise ValueError(
                    f"racks={self.racks} but groups carry {self.num_racks} racks; set racks to "
                    f"{self.num_racks} or leave it out")
            unknown = sorted(set(self.fleet_router.entry_groups or ()) - set(names))
            if unknown:
                raise ValueError(
                    f"fleet_router.entry_groups: unknown rack group(s) {unknown}; the groups "
                    f"are {names}")
        elif self.fleet_router.entry_groups is not None and \
                set(self.fleet_router.entry_groups) - {self.name}:
            raise ValueError(
                f"fleet_router.entry_groups: {self.fleet_router.entry_groups} name rack groups "
                f"but this deployment has none besides '{self.name}'; add `groups` or drop it")
        if self.is_colocated:
            mixed = [g.name for g in groups if g.prefill.instances or g.decode.instances]
            if mixed and not self.groups:  # one layout: name the overrides that mend it
                raise ValueError(
                    f"colocated.instances={self.colocated.instances} but the deployment also "
                    f"has {self.prefill.instances} prefill and {self.decode.instances} decode "
                    "instances (an experiment such as smoke sets a disaggregated slice); it either "
                    "disaggregates or colocates: add deployment.prefill.instances=0 "
                    "deployment.decode.instances=0, or set deployment.colocated.instances=0")
            if mixed:
                raise ValueError(
                    f"colocated.instances: rack group(s) {mixed} also have prefill or decode "
                    "instances; a fleet either disaggregates or colocates: set "
                    "prefill.instances=0 and decode.instances=0 there, or colocated.instances=0")
        else:
            for role in ("prefill", "decode"):
                if not sum(g.racks * getattr(g, role).instances for g in groups):
                    raise ValueError(
                        f"{role}.instances: the fleet has no {role} instance; give at least one "
                        f"rack group {role} instances (or serve colocated: colocated.instances)")
        entry = [g for g in groups if self.fleet_router.entry_groups is None
                 or g.name in self.fleet_router.entry_groups]
        if not any(g.prefill.instances or g.colocated_instances for g in entry):
            raise ValueError("fleet_router.entry_groups: none of these groups has prefill or "
                             "colocated instances, so no session could start; name one that "
                             "does")
        return self


class SyntheticSessionsSpec(StrictModel):
    """Parameters of the built-in session-graph generator (see rackSim.workload.synthetic)."""

    turns_mean: PositiveFloat
    first_prompt_tokens_mean: PositiveFloat
    new_tokens_per_turn_mean: PositiveFloat
    output_tokens_mean: PositiveFloat
    tool_delay_s_mean: float = Field(ge=0)
    subagent_prob: float = Field(ge=0, le=1)
    subagent_fanout_max: PositiveInt
    subagent_turns_mean: PositiveFloat
    max_context_tokens: PositiveInt


class ReplaySpec(StrictModel):
    """Closed loop (session pools): lanes, primer, warm-up requests, then the window.
    Open loop (timestamped traces): the first `warmup_s` simulated seconds warm up, then the
    window; `concurrency`, `primer` and `warmup_requests_per_lane` do not apply."""

    concurrency: PositiveInt = Field(description="live agent clients (closed loop)")
    start: Literal["steady", "fresh"] = Field(default="steady", description=(
        "steady: each lane starts where a long-running lane would be at a random instant "
        "(rackSim.workload.replay); fresh: every lane starts a session at its first turn at "
        "t = 0, a batch of agents launched together"))
    primer: bool = True
    warmup_requests_per_lane: int = Field(default=10, ge=0)
    window_s: PositiveFloat = Field(description="measurement window (simulated seconds)")
    warmup_s: float = Field(default=0.0, ge=0, description="open loop: warm-up before the window")
    drain_s: float = Field(
        default=0.0, ge=0,
        description="after the window nothing new is sent; in-flight requests may finish (s)")


class WorkloadSpec(StrictModel):
    """Where the session graphs come from and how they are replayed.

    agentx: the AgentX-style generator (`agentx` section; defaults documented in
    rackSim.workload.agentx). synthetic: the minimal built-in generator. jsonl: recorded session
    graphs (docs/workload_format.md). mooncake / azure: public timestamped traces, replayed
    open loop (`open_loop`: speed-up, offset, jitter).
    """

    name: str
    source: Literal["agentx", "synthetic", "jsonl", "mooncake", "azure"] = "agentx"
    path: Path | None = None
    num_sessions: PositiveInt | None = Field(
        default=None, description="sessions in the pool (None: the generator's default)")
    agentx: AgentXSpec | None = None
    synthetic: SyntheticSessionsSpec | None = None
    open_loop: OpenLoopSpec = OpenLoopSpec()
    replay: ReplaySpec

    @property
    def timestamped(self) -> bool:
        return self.source in ("mooncake", "azure")

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        if self.source == "synthetic" and self.synthetic is None:
            raise ValueError("source 'synthetic' needs a 'synthetic' section")
        if self.source not in ("synthetic", "agentx"):
            if self.path is None:
                what = {"jsonl": "a session-graph pool (JSONL; `racksim-workload import` "
                                 "makes one from agent logs)",
                        "mooncake": "a Mooncake trace (JSONL)",
                        "azure": "an Azure trace (CSV)"}[self.source]
                raise ValueError(f"path: source '{self.source}' reads {what}; give it with "
                                 "workload.path=FILE")
            found = resolve_path(self.path)
            if found is None:
                raise ValueError(f"path: no such file '{self.path}' (relative paths are read "
                                 f"from the working directory, then from {PROJECT_ROOT})")
            object.__setattr__(self, "path", found)
        return self


class PricingSpec(StrictModel):
    name: str
    cached_input_usd_per_mtok: float = Field(ge=0)
    uncached_input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    gpu_hour_usd: float = Field(ge=0, description="cost of one GPU-hour")


class PerfSpec(StrictModel):
    """Which step-time model prices the steps, and its profile.

    roofline: bytes and FLOPs with the efficiencies below. calibrated: the mechanistic model
    with a profile fitted by racksim-calibrate. measured: a profile fitted from a real server's
    steps or records by racksim-validate fit."""

    model: Literal["roofline", "calibrated", "measured"] = "roofline"
    profile: Path | None = None
    hbm_efficiency: float = Field(default=0.8, gt=0, le=1)
    flops_efficiency: float = Field(default=0.6, gt=0, le=1)
    weight_dtype: str = "fp4"
    lagged_ranks: int = Field(default=0, ge=0, description=(
        "ranks per instance whose CPU lags by the profile's straggler_lag_us per sync point"))
    bounded_replay: bool | None = Field(default=None, description=(
        "prefill: replay at most 128 cached tokens through the first 20 layers "
        "(None = the profile's setting)"))
    large_pages: bool | None = Field(default=None, description=(
        "prefill: 2 MB GPU pages for shared host tables (None = the profile's setting)"))
    deepselect: bool | None = Field(default=None, description=(
        "prefill: DeepSelect top-k in the indexer (None = the profile's setting)"))

    @model_validator(mode="after")
    def _check(self) -> PerfSpec:
        if self.model != "roofline":
            if self.profile is None:
                raise ValueError(f"model '{self.model}' needs 'profile'")
            found = resolve_path(self.profile)
            if found is None:
                raise ValueError(f"profile: no such file '{self.profile}'")
            object.__setattr__(self, "profile", found)
        return self


class RunConfig(StrictModel):
    model: ModelSpec
    hardware: HardwareSpec
    deployment: DeploymentSpec
    workload: WorkloadSpec
    pricing: PricingSpec
    perf: PerfSpec = PerfSpec()
    seed: int = Field(default=0, ge=0, description="the run's random seed")
    trace_tokens: bool = Field(
        default=False, description="record every emission time per request (small runs only)")
    progress: bool = True
    plots: bool = Field(
        default=True, description="draw the run's figures (throughput, latency, decode "
        "breakdown PNGs); false skips them and matplotlib")

    @model_validator(mode="after")
    def _cross_field(self) -> RunConfig:
        m, hw, d = self.model, self.hardware, self.deployment
        if self.perf.weight_dtype not in hw.flops:
            raise ValueError(
                f"perf.weight_dtype '{self.perf.weight_dtype}' not in hardware.flops "
                f"{sorted(hw.flops)} ({hw.name} has no {self.perf.weight_dtype} tensor "
                f"cores); set perf.weight_dtype to one of them, or pick other hardware")
        ax = self.workload.agentx
        if ax is not None and ax.context_window > m.context_window:
            raise ValueError(
                f"workload.agentx.context_window={ax.context_window} exceeds the model's "
                f"context_window={m.context_window}; lower it")
        for i, g in enumerate(d.rack_groups):
            self._check_layout(g, f"groups[{i}]." if d.groups else "")
        if d.num_racks > 1 and (hw.nic_bw_bytes_s is None or hw.nic_latency_us is None):
            raise ValueError(
                f"hardware.nic_bw_bytes_s / hardware.nic_latency_us: a fleet of {d.num_racks} "
                f"racks moves KV between racks over the scale-out network; give {hw.name} both")
        return self

    def _check_dbo(self, spec: PrefillSpec | DecodeSpec | ColocatedSpec, at: str) -> None:
        """Dual-batch overlap needs an all-to-all to hide (experts, a DEP instance of 2+ GPUs)
        and, on DeepEP's normal kernels, the GPU's SM count to take `comm_sms` from."""
        hw = self.hardware
        width = spec.gpus_per_instance if isinstance(spec, PrefillSpec) else spec.gpus
        if not self.model.num_routed_experts:
            raise ValueError(
                f"{at}.dbo.enabled: dual-batch overlap hides the expert all-to-all and model "
                f"{self.model.name} has no routed experts; set it false")
        if spec.parallelism != "DEP" or width < 2:
            raise ValueError(
                f"{at}.dbo.enabled: dual-batch overlap hides a DEP instance's expert all-to-all "
                f"and a {spec.parallelism}{width} instance has none (vLLM needs "
                "--data-parallel-size > 1 with --enable-expert-parallel); set it false")
        if spec.all2all_backend != "deepep_high_throughput":
            return
        if hw.sms is None:
            raise ValueError(
                f"hardware.sms: {hw.name} gives no SM count, which {at}.dbo needs (DeepEP's "
                "normal kernels take dbo.comm_sms of them from the compute); add it to the "
                "hardware file")
        if spec.dbo.comm_sms >= hw.sms:
            raise ValueError(
                f"{at}.dbo.comm_sms={spec.dbo.comm_sms}: {hw.name} has {hw.sms} SMs and the "
                "compute needs some; lower it")

    def _check_layout(self, g: RackGroupSpec, where: str) -> None:
        """One rack group's layout: fits its rack and NVLink domains, spreads the experts,
        leaves KV room. `where` prefixes field names (`groups[1].` for a rack group)."""
        m, hw, d = self.model, self.hardware, self.deployment
        p, dec, col = g.prefill, g.decode, g.colocated
        parts = (f"{p.instances} prefill x {p.gpus_per_instance} + {dec.instances} decode x "
                 f"{dec.gpus}" + (f" + {col.instances} colocated x {col.gpus}"
                                  if g.colocated_instances else ""))
        if g.gpus_per_rack > hw.gpus_per_rack:
            raise ValueError(
                f"deployment.{where}prefill/decode: one rack's layout needs {g.gpus_per_rack} GPUs "
                f"({parts}) but hardware.gpus_per_rack={hw.gpus_per_rack}, and each of its "
                f"racks={g.racks} racks holds the whole layout; shrink the layout or split it "
                "over rack groups")
        widths = [(f"{where}prefill.gpus_per_instance", p.gpus_per_instance, p.instances),
                  (f"{where}decode.gpus", dec.gpus, dec.instances)]
        if col is not None:
            widths.append((f"{where}colocated.gpus", col.gpus, col.instances))
        for field, width, n in widths:
            if n and width > hw.domain_gpus:
                raise ValueError(
                    f"deployment.{field}={width}: an instance never spans NVLink domains and "
                    f"{hw.name} has {hw.domain_gpus} GPUs per domain; narrow it")
        if not fits_domains([w for _, w, n in widths for _ in range(n)], hw.domain_gpus,
                            hw.gpus_per_rack // hw.domain_gpus):
            raise ValueError(
                f"deployment.{where}prefill/decode: {parts}-GPU instances cannot be packed "
                f"into {hw.gpus_per_rack // hw.domain_gpus} NVLink domains of {hw.domain_gpus} "
                "GPUs without splitting one; change the widths or counts")
        for role, spec, n in (("prefill", p, p.instances), ("decode", dec, dec.instances),
                              ("colocated", col, g.colocated_instances)):
            if n and spec.dbo.enabled:
                self._check_dbo(spec, f"deployment.{where}{role}")
        experts = m.num_routed_experts + d.eplb.redundant_experts
        for field, ep, n in widths:
            if n and experts % ep:
                raise ValueError(
                    f"deployment.{field}={ep}: {m.num_routed_experts} routed + "
                    f"{d.eplb.redundant_experts} redundant experts cannot be spread evenly over "
                    f"{ep} EP ranks; pick a width that divides {experts}")
        if dec.instances and m.draft is not None and m.draft.num_routed_experts % dec.gpus \
                and dec.gpus <= m.draft.num_routed_experts:
            raise ValueError(
                f"deployment.{where}decode.gpus={dec.gpus}: draft model's "
                f"{m.draft.num_routed_experts} experts cannot be spread over it; "
                f"{_widths_for(experts, m.draft.num_routed_experts)}")
        if g.colocated_instances and m.draft is not None and \
                m.draft.num_routed_experts % col.gpus and col.gpus <= m.draft.num_routed_experts:
            raise ValueError(
                f"deployment.{where}colocated.gpus={col.gpus}: draft model's "
                f"{m.draft.num_routed_experts} experts cannot be spread over it; "
                f"{_widths_for(experts, m.draft.num_routed_experts)}")
        for role, n, spec in (("decode", dec.instances, dec.speculative),
                              ("colocated", g.colocated_instances,
                               col.speculative if col is not None else None)):
            if n and m.draft is None and spec.num_draft_tokens > 0:
                raise ValueError(
                    f"deployment.{where}{role}.speculative.num_draft_tokens="
                    f"{spec.num_draft_tokens}: model {m.name} has no draft (MTP) layers, so its "
                    f"drafts would cost nothing; set deployment.{role}.speculative."
                    "num_draft_tokens=0 and accepted_tokens_per_step=1, or use a model spec "
                    "with a draft")
        if m.attention is not None:
            for field, width, n in widths:
                par = (p.parallelism if "prefill" in field else dec.parallelism
                       if "decode" in field else col.parallelism)
                if n and par == "TP" and m.attention.heads % width:
                    raise ValueError(
                        f"deployment.{field}={width}: tensor parallelism splits the model's "
                        f"{m.attention.heads} attention heads; pick a width that divides "
                        f"{m.attention.heads}")
        for role, gpus, n in (("prefill", p.gpus_per_instance, p.instances),
                              ("decode", dec.gpus, dec.instances),
                              ("colocated", col.gpus if col else 1, g.colocated_instances)):
            kv = kv_bytes_per_gpu(self, gpus)
            need = m.context_window * m.kv_bytes_per_token
            if n and kv < need:
                raise ValueError(
                    f"deployment.{where}{role}: weights "
                    f"{weights_bytes_per_gpu(m, d, gpus) / GB:.1f} GB + activations leave "
                    f"{max(kv, 0) / GB:.2f} GB of KV per GPU, less than one full-context request "
                    f"({need / GB:.2f} GB); widen the instance or lower "
                    "cache.activation_reserve_bytes")

    def for_group(self, group: RackGroupSpec) -> RunConfig:
        """This run with one rack group's layout as the deployment's (what the step models of
        that group's instances read); not re-validated, the fleet was."""
        dep = self.deployment.model_copy(update={
            "prefill": group.prefill, "decode": group.decode, "colocated": group.colocated,
            "groups": None, "racks": 1})
        return self.model_copy(update={"deployment": dep})


def _widths_for(experts: int, draft_experts: int) -> str:
    """The fix for a width that spreads the target's experts but not the draft's."""
    both = math.gcd(experts, draft_experts)
    widths = ", ".join(str(w) for w in range(2, both + 1) if both % w == 0)
    return f"pick a width that divides both {experts} and {draft_experts} ({widths})"


def fits_domains(widths: list[int], domain_gpus: int, domains: int) -> bool:
    """Whether instances of these widths pack into `domains` NVLink domains of `domain_gpus`
    GPUs each without one spanning two (first fit, widest first: exact for the power-of-two
    widths EP layouts use)."""
    free = [domain_gpus] * domains
    for w in sorted(widths, reverse=True):
        slot = next((i for i, f in enumerate(free) if f >= w), None)
        if slot is None:
            return False
        free[slot] -= w
    return True


def weights_bytes_per_gpu(m: ModelSpec, d: DeploymentSpec, gpus: int) -> float:
    """Weight bytes resident on each GPU of an instance `gpus` wide.

    Routed experts (plus redundant copies) are spread over the EP ranks; everything else
    (attention, shared experts, embeddings, draft model) is replicated on every rank.
    """
    experts_per_rank = (m.num_routed_experts + d.eplb.redundant_experts) / gpus
    routed = m.expert_params * m.num_moe_layers * experts_per_rank
    draft = m.draft.params if m.draft else 0.0
    return (routed + m.dense_params + draft) * m.weight_bytes_per_param


def kv_bytes_per_gpu(cfg: RunConfig, gpus: int) -> float:
    """HBM left for KV cache on each GPU of an instance `gpus` wide (bytes)."""
    hw, d = cfg.hardware, cfg.deployment
    usable = hw.hbm_bytes * d.cache.gpu_memory_utilization
    return usable - weights_bytes_per_gpu(cfg.model, d, gpus) - d.cache.activation_reserve_bytes

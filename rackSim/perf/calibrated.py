"""The calibrated step model: mechanistic parts (bytes, FLOPs, ranks, queues) whose speeds come
from a calibration profile (`calibration/<hardware>__<model>.yaml`).

Decode step of a DEPn instance (ms); a TPn instance (one DP rank, heads and experts sharded n
ways, two all-reduces per layer instead of the all-to-all) is priced by `_decode_tp`::

    max over ranks r of [attention_r + indexer_r + dense_r]      (per-rank requests and KV)
  + moe + comm + draft                                            (hottest EP rank, 1/balancedness)
  + cpu (scheduling + admission) + sync (DP all-reduce) + straggler (slowest rank's CPU)

and the breakdown fields sum to the step time. See docs/perf.md for each equation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import compress
from pathlib import Path

from rackSim.config.errors import ScenarioError
from rackSim.config.specs import RunConfig
from rackSim.perf.attention import attention_cost
from rackSim.perf.comm import allreduce_ms, alltoall_layer_ms
from rackSim.perf.cpu import StragglerModel, admission_ms, exposed_cpu_ms, exposed_lag_ms
from rackSim.perf.dense import (
    ACTIVATION_BYTES,
    WEIGHT_BYTES,
    DenseCost,
    DenseGeometry,
    GemmKernel,
    dense_gemms,
    mhc_bytes_per_token,
    model_gemms,
)
from rackSim.perf.eplb import EplbConfig, EplbState
from rackSim.perf.moe import (
    MoeKernel,
    MoeShape,
    dispatched_tokens,
    experts_hit_random,
    moe_rank_ms,
)
from rackSim.perf.overlap import (
    dual_batch_ms,
    least_rank_tokens,
    microbatched,
    prefill_microbatch,
    split_alltoall_ms,
)
from rackSim.perf.prefill_opts import (
    PrefillOptimisations,
    gather_factor,
    replayed_tokens,
    topk_select_ms,
)
from rackSim.perf.profile import Profile
from rackSim.perf.step import DecodeBatch, PrefillBatch, StepBreakdown

MS = 1e3


_PROFILES: dict[tuple[str, int, int], Profile] = {}


def load_profile(cfg: RunConfig) -> Profile:
    """The scenario's profile, read once per file version: a fleet has one step model per
    instance (210 in 14 full racks), and parsing the YAML for each took 9-14 s. Step models
    only read their profile."""
    if cfg.perf.profile is None:
        raise ValueError("perf.profile: the calibrated model needs a profile")
    path = Path(cfg.perf.profile)
    try:
        st = path.stat()
    except OSError:
        return Profile.load(path)  # names the file and the fix
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _PROFILES:
        _PROFILES.clear()  # one scenario's profiles at a time; an edited file is read again
        _PROFILES[key] = Profile.load(path)
    return _PROFILES[key]


def dense_geometry(cfg: RunConfig, p: Profile) -> DenseGeometry:
    """Non-routed layer shapes: the model spec's sizes, the profile's attention constants."""
    m = cfg.model

    def c(name: str) -> int:
        return int(p.value(name))

    return DenseGeometry(
        hidden=m.hidden_size, layers=m.num_layers, csa_layers=c("csa_layers"),
        hca_layers=c("hca_layers"), heads=c("attention_heads"), head_dim=c("attention_head_dim"),
        q_lora_rank=c("q_lora_rank"), o_lora_rank=c("o_lora_rank"), o_groups=c("o_groups"),
        indexer_heads=c("indexer_heads"), indexer_head_dim=c("indexer_head_dim"),
        shared_intermediate=m.moe_intermediate_size * m.num_shared_experts,
        routed_experts=m.num_routed_experts, vocab=c("vocab_size"), hc_mult=c("hc_mult"))


def gemm_kernel(p: Profile, dtype: str, hbm_bytes_s: float, flops_s: float) -> GemmKernel:
    """The fitted GEMM speeds of `dtype` ('fp8' or 'bf16') on hardware of these peaks."""
    quant = p.value("gemm_fp8_quant_bytes") if dtype == "fp8" else 0.0
    return GemmKernel(kernel_ms=p.value(f"gemm_{dtype}_kernel_us") / MS,
                      hbm_bytes_ms=hbm_bytes_s / MS * p.value(f"gemm_{dtype}_hbm_efficiency"),
                      flops_ms=flops_s / MS * p.value(f"gemm_{dtype}_flops_efficiency"),
                      quant_bytes=quant, weight_bytes=WEIGHT_BYTES[dtype],
                      activation_bytes=ACTIVATION_BYTES[dtype])


def dense_cost(cfg: RunConfig, p: Profile) -> DenseCost:
    """Dense GEMMs and mHC priced with the profile's speeds (a generated model: its
    `model_gemms`, no mHC)."""
    hw, m = cfg.hardware, cfg.model
    kernels = {d: gemm_kernel(p, d, hw.hbm_bw_bytes_s, hw.flops[d]) for d in ("fp8", "bf16")}
    if m.attention is not None:  # standard attention: its GEMMs, no hyper-connections
        return DenseCost(gemms=model_gemms(m), kernels=kernels, layers=m.num_layers,
                         mhc_kernel_ms=0.0, mhc_bytes_per_token=0.0, mhc_bytes_ms=1.0)
    g = dense_geometry(cfg, p)
    hbm_ms = hw.hbm_bw_bytes_s / MS
    return DenseCost(
        gemms=dense_gemms(g), kernels=kernels, layers=g.layers,
        mhc_kernel_ms=p.value("mhc_kernel_us") / MS,
        mhc_bytes_per_token=mhc_bytes_per_token(g),
        mhc_bytes_ms=hbm_ms * p.value("mhc_hbm_efficiency"))


class CalibratedStepModel:
    """Prices the steps of one instance (`role` 'prefill' or 'decode').

    Optional overrides (None = take the scenario / profile value) exist so experiments can
    compare variants of one scenario: `eplb_enabled`, `allreduce`, `lagged_ranks`,
    `prefill_opts`, `low_latency_decode` (the specialised small-batch decode kernels of a TP
    instance instead of the standard path; profile setting `low_latency_decode`), and
    `balancedness` (a fixed value instead of the EPLB state, used when fitting).
    """

    def __init__(self, cfg: RunConfig, role: str = "decode", seed: int = 0,
                 profile: Profile | None = None, *, eplb_enabled: bool | None = None,
                 allreduce: str | None = None, lagged_ranks: int | None = None,
                 prefill_opts: PrefillOptimisations | None = None,
                 balancedness: tuple[float, float] | None = None,
                 low_latency_decode: bool | None = None):
        if role not in ("prefill", "decode", "colocated"):
            raise ValueError(f"role must be 'prefill', 'decode' or 'colocated', not '{role}'")
        self.cfg, self.role, self.seed = cfg, role, seed
        p = profile if profile is not None else load_profile(cfg)
        self.profile = p
        m, hw, d = cfg.model, cfg.hardware, cfg.deployment
        p.require_model(m.name)
        if role == "colocated" and d.colocated is None:
            raise ValueError("deployment.colocated: a colocated step model needs the "
                             "colocated layout")
        spec = {"decode": d.decode, "prefill": d.prefill, "colocated": d.colocated}[role]
        self.ranks = spec.gpus_per_instance if role == "prefill" else spec.gpus
        #: tensor-parallel width (1 for DEP: experts spread, attention data-parallel)
        self.tp = self.ranks if spec.parallelism == "TP" else 1
        #: the all-to-all kernels (`dispatched_tokens`)
        self._all2all = spec.all2all_backend
        att = m.attention
        #: TP ranks the KV cache is split over (GQA: KV heads; MLA / V4: one shared latent)
        self._kv_shards = min(self.tp, att.kv_heads) if att and att.kind == "gqa" else 1
        hbm_ms = hw.hbm_bw_bytes_s / MS
        # weight streaming (draft dense weights, EPLB copies): the MoE kernel's HBM speed, or
        # a dense model's GEMMs'
        stream = "moe" if m.num_routed_experts else f"gemm_{m.gemm_dtype}"
        self._hbm_ms = hbm_ms * p.value(f"{stream}_hbm_efficiency")
        # The MoE kernel: 'vllm' speeds are fitted to the vLLM kernel tables, 'megamoe' (the
        # fused dispatch-GEMM-combine kernel of the published deployment) to D3/D4; none for
        # a dense model.
        self.moe_kernel_name = str(p.setting("moe_kernel", "vllm"))
        speeds = "megamoe" if self.moe_kernel_name == "megamoe" else "moe"
        self.kernel = MoeKernel(
            kernel_ms=p.value(f"{speeds}_kernel_us") / MS,
            hbm_bytes_ms=hbm_ms * p.value(f"{speeds}_hbm_efficiency"),
            flops_ms=hw.flops[cfg.perf.weight_dtype] / MS * p.value("moe_flops_efficiency"),
            token_bytes=p.value("moe_token_bytes")) if m.num_routed_experts else None
        wb = m.weight_bytes_per_param
        self.target = MoeShape(m.num_routed_experts, m.experts_per_token, m.expert_params,
                               m.expert_params * wb, m.hidden_size, m.num_moe_layers)
        self.draft_shape: MoeShape | None = None
        self._draft_dense_bytes = 0.0
        if m.draft is not None:
            dp = 3.0 * m.hidden_size * m.draft.moe_intermediate_size
            self.draft_shape = MoeShape(m.draft.num_routed_experts, m.draft.experts_per_token,
                                        dp, dp * wb, m.hidden_size, m.draft.num_layers)
            routed = dp * m.draft.num_routed_experts * m.draft.num_layers
            self._draft_dense_bytes = max(m.draft.params - routed, 0.0) * wb
        self.attn = attention_cost(m, hw, p, cfg.perf.weight_dtype)
        self.dense = dense_cost(cfg, p)
        self._dense_kernel_ms = p.value("dense_kernel_us") / MS
        self._dense_fixed_ms = m.num_layers * self._dense_kernel_ms  # other per-layer kernels
        self._dense_by_tokens: dict[tuple[float, float, int, bool], float] = {}
        self._nvlink_ms = hw.nvlink_bw_bytes_s / MS * p.value("a2a_nvlink_efficiency")
        # DeepEP's normal kernels have their own speeds where the profile measured them
        # (kernel-table profiles: `a2a_ht_*`), else the all-to-all's
        a2a = ("a2a_ht" if self._all2all == "deepep_high_throughput"
               and "a2a_ht_op_us" in p.params else "a2a")
        self._a2a_op_ms = p.value(f"{a2a}_op_us") / MS
        self._a2a_nvlink_ms = hw.nvlink_bw_bytes_s / MS * p.value(f"{a2a}_nvlink_efficiency")
        #: dual-batch overlap (`overlap.py`): the spec's settings, None when off
        self._dbo = spec.dbo if spec.dbo.enabled else None
        #: DeepGEMM's slowdown on the SMs DeepEP's normal kernels leave it (`_overlapped`)
        self._dbo_compute = 1.0
        if self._dbo is not None:
            if self.moe_kernel_name == "megamoe":
                raise ScenarioError(
                    f"deployment.{role}.dbo.enabled: profile '{p.name}' prices the MoE as the "
                    "fused MegaMoE kernel, whose dispatch and combine run inside it, so there "
                    "is no separate all-to-all for dual-batch overlap to hide; set it false, "
                    "or use a profile of DeepEP all-to-all kernels (a generated profile)")
            if self._all2all == "deepep_high_throughput":
                self._dbo_compute = hw.sms / (hw.sms - self._dbo.comm_sms)
        # TP all-reduce: its own fitted speeds when the profile has them (kernel-table
        # profiles), else the all-to-all's
        ar = "tp_allreduce" if "tp_allreduce_op_us" in p.params else "a2a"
        self._ar_op_ms = p.value(f"{ar}_op_us") / MS
        self._ar_bytes_ms = hw.nvlink_bw_bytes_s / MS * p.value(f"{ar}_nvlink_efficiency")
        self._cpu_step_ms = p.value("cpu_step_ms")
        #: TP decode: the specialised low-latency kernels (True) or the standard path (False)
        self.low_latency_decode = bool(p.setting("low_latency_decode", True)
                                       if low_latency_decode is None else low_latency_decode)
        self._tp_layer_latency_ms = p.value(
            "tp_layer_latency_us_low_latency" if self.low_latency_decode
            else "tp_layer_latency_us_standard") / MS
        optimised = bool(p.setting("admission_optimised", True))
        self._admit_ns = p.value("admission_ns_per_token" if optimised
                                 else "admission_ns_per_token_baseline")
        self._admit_us_request = d.decode.admission_us_per_request
        self._admit_us_block = d.decode.admission_us_per_block
        self.allreduce = allreduce or d.allreduce
        dp_ranks = self.ranks // self.tp
        self._sync_ms = allreduce_ms(self.allreduce, dp_ranks, p.value("allreduce_call_ms"),
                                     p.value("allreduce_hop_ms"))
        self._dispatch = str(p.setting("moe_dispatch", "alltoall"))
        self.prefill_opts = prefill_opts or self._scenario_prefill_opts(cfg, p)
        self._replay_baseline = p.value("replay_tokens_baseline")
        #: share of the layers a replayed cached token passes through
        self._replay_share = (min(self.prefill_opts.replay_layers, m.num_layers)
                              / m.num_layers)
        self._host_link_ms = hw.host_link_bw_bytes_s / MS  # host -> GPU KV loads (bytes/ms)
        self._tlb = p.value("tlb_overhead")
        self._topk_ns = p.value("topk_ns_per_candidate")
        lag = cfg.perf.lagged_ranks if lagged_ranks is None else lagged_ranks
        # a step with prefill in it runs eagerly, layer by layer; a decode step as CUDA graphs
        sync_points = m.num_layers if role != "decode" else int(
            p.setting("decode_sync_points", 1))
        self._absorb = p.value("straggler_absorb")
        self._sync_points = sync_points
        #: expected straggler delay of the last priced step (ms), for reports and fits
        self.last_straggler_expected_ms = 0.0
        #: target-model EPLB balancedness of the last priced decode or mixed step (NaN before
        #: one, and for TP and prefill steps: not modelled there); step rows record it
        self.last_balancedness = math.nan
        self.straggler = StragglerModel(
            ranks=self.ranks, jitter_ms=p.value("straggler_jitter_us") / MS,
            sync_points=sync_points, lag_ms=p.value("straggler_lag_us") / MS,
            lagged=min(lag, self.ranks), seed=seed * 7919 + 17)
        self.redundant = d.eplb.redundant_experts
        self.eplb_enabled = d.eplb.enabled if eplb_enabled is None else eplb_enabled
        self._fixed_b = balancedness
        self.eplb_target: EplbState | None = None
        self.eplb_draft: EplbState | None = None
        if balancedness is None and self.target.experts:
            self.eplb_target = self._eplb_state(self.target, "target", seed * 2 + 1)
            if self.draft_shape is not None and role != "prefill":
                self.eplb_draft = self._eplb_state(self.draft_shape, "draft", seed * 2 + 2)
        self._eplb_busy = (0, 0)
        self._eplb_extra_ms = 0.0
        #: step length used to spread rearrangement copies over steps (ms); a modelling
        #: choice of the order of a decode step, not a fitted value.
        self._nominal_step_ms = 15.0
        self._last_rearrangements = 0
        self._b, self._b_until = (1.0, 1.0), -1  # balancedness, valid below step _b_until
        self._prefill_steps = 0
        self._linear_context = max(self.attn.window,
                                   self.attn.csa_compress * self.attn.topk_entries)
        self._rank_terms_by_q: dict[int, tuple[float, ...]] = {}
        self._cache: dict[tuple[float, ...], tuple[float, float, float]] = {}
        #: (MoE, all-to-all, draft) of the last DEP decode step with requests (ms), for
        #: `decode_repeat`
        self._shape: tuple[float, float, float] | None = None

    @staticmethod
    def _scenario_prefill_opts(cfg: RunConfig, p: Profile) -> PrefillOptimisations:
        """Profile `prefill_optimisations`, overridden by PerfSpec fields `bounded_replay`,
        `large_pages`, `deepselect` when the scenario sets them."""
        opts = dict(p.setting("prefill_optimisations") or {})
        for name in ("bounded_replay", "large_pages", "deepselect"):
            value = getattr(cfg.perf, name)
            if value is not None:
                opts[name] = bool(value)
        return PrefillOptimisations(**opts)

    # -- EPLB -------------------------------------------------------------------------------
    def _eplb_state(self, shape: MoeShape, which: str, seed: int) -> EplbState:
        p, e = self.profile, self.cfg.deployment.eplb
        slots = shape.experts + (self.redundant if which == "target" else 0)
        if slots % self.ranks:
            slots = shape.experts
        cfg = EplbConfig(
            layers=shape.layers, experts=shape.experts, ranks=self.ranks,
            sigma=p.value(f"eplb_sigma_{which}"),
            sigma_group=p.value(f"eplb_sigma_group_{which}"),
            groups=int(p.value("eplb_groups")), drift_steps=p.value("eplb_drift_steps"),
            enabled=self.eplb_enabled, redundant=slots - shape.experts,
            interval_steps=e.interval_steps, window_steps=e.window_steps,
            epoch_steps=int(p.value("eplb_epoch_steps")), expert_bytes=shape.expert_bytes)
        return EplbState(cfg, seed=seed)

    def balancedness(self, step_index: int) -> tuple[float, float]:
        """(target, draft) balancedness at `step_index`; advances the EPLB states."""
        if self._fixed_b is not None:
            return self._fixed_b
        if step_index < self._b_until:  # no EPLB epoch starts before `_b_until`
            return self._b
        t = self.eplb_target.advance(step_index) if self.eplb_target else 1.0
        dr = self.eplb_draft.advance(step_index) if self.eplb_draft else 1.0
        if self.eplb_target and self.eplb_target.rearrangements != self._last_rearrangements:
            self._last_rearrangements = self.eplb_target.rearrangements
            st = self.eplb_target
            duration = st.rebalance_ms(self._nvlink_ms)
            # The copies overlap the steps that follow (about one per `nominal_step_ms`); their
            # HBM traffic (read + write) competes with the MoE kernels of those steps.
            steps = max(1, int(duration // self._nominal_step_ms) + 1)
            self._eplb_busy = (st.last_rearrangement_step, st.last_rearrangement_step + steps)
            self._eplb_extra_ms = 2.0 * st.last_moved_bytes / self._hbm_ms / steps
        if (t, dr) != self._b:  # the decode shapes priced at the old balancedness are dead
            self._cache.clear()
        self._b = (t, dr)
        self._b_until = min((s.next_epoch_step for s in (self.eplb_target, self.eplb_draft)
                             if s is not None), default=math.inf)
        return t, dr

    def _eplb_overhead_ms(self, step_index: int) -> float:
        start, end = self._eplb_busy
        return self._eplb_extra_ms if start <= step_index < end else 0.0

    # -- shared pieces -------------------------------------------------------------------------
    def _moe_comm(self, shape: MoeShape, tokens_total: float, ranks: int, b: float
                  ) -> tuple[float, float]:
        if self.kernel is None:  # no routed experts
            return 0.0, 0.0
        redundant = self.redundant if shape is self.target else 0
        if (shape.experts + redundant) % ranks:
            redundant = 0
        copies = dispatched_tokens(tokens_total, ranks, shape.top_k, b, self._all2all)
        moe = moe_rank_ms(self.kernel, shape, tokens_total, ranks, b,
                          copies if self._dispatch == "alltoall" else tokens_total, redundant)
        # MegaMoE fuses the target model's dispatch and combine into its one kernel: their
        # launches are in megamoe_kernel_us, only the bytes remain here.
        fused = shape is self.target and self.moe_kernel_name == "megamoe"
        comm = shape.layers * alltoall_layer_ms(copies, shape.hidden, ranks,
                                                0.0 if fused else self._a2a_op_ms,
                                                self._a2a_nvlink_ms)
        return moe, comm

    def _draft_ms(self, requests_total: float, ranks: int, b: float, draft_tokens: int) -> float:
        """Draft model: one forward per draft token over one token per request (ms)."""
        if self.draft_shape is None or draft_tokens <= 0 or requests_total <= 0:
            return 0.0
        moe, comm = self._moe_comm(self.draft_shape, requests_total, ranks, b)
        dense = (self.draft_shape.layers * self._dense_kernel_ms
                 + self._draft_dense_bytes / self._hbm_ms)
        return draft_tokens * (moe + comm + dense)

    def _straggler(self, gpu_ms: float) -> float:
        """Straggler delay of a step whose GPU work takes `gpu_ms` (ms); sets
        `last_straggler_expected_ms`."""
        st = self.straggler
        lag = exposed_lag_ms(st.lag_ms, self._absorb, gpu_ms / self._sync_points) \
            if st.lagged else 0.0
        self.last_straggler_expected_ms, sample = st.draw(lag)
        return sample

    def _dense_ms(self, tokens: float, requests: float, shards: int, decode: bool) -> float:
        """Dense GEMMs and mHC time of one GPU (ms), cached by its arguments."""
        key = (tokens, requests, shards, decode)
        got = self._dense_by_tokens.get(key)
        if got is None:
            if len(self._dense_by_tokens) > 4096:
                self._dense_by_tokens.clear()
            got = self._dense_by_tokens[key] = self.dense.ms(tokens, requests, shards, decode)
        return got

    # -- tensor parallel -------------------------------------------------------------------------
    def _tp_allreduce_ms(self, tokens: float, layers: int) -> float:
        """Two ring all-reduces (after attention and after the FFN/MoE) of BF16 activations per
        layer over the TP group (ms)."""
        t = self.tp
        nbytes = tokens * self.cfg.model.hidden_size * 2.0
        return layers * 2.0 * (self._ar_op_ms + 2.0 * (t - 1) / t * nbytes / self._ar_bytes_ms)

    def _moe_tp_ms(self, shape: MoeShape, tokens: float) -> float:
        """MoE with every expert sharded over the TP group: each GPU reads 1/tp of every hit
        expert and does 1/tp of the FLOPs; no imbalance, no all-to-all (ms)."""
        t = self.tp
        if self.kernel is None:  # no routed experts
            return 0.0
        assignments = tokens * shape.top_k
        hit = experts_hit_random(shape.experts, shape.experts, assignments)
        return shape.layers * self.kernel.layer_ms(tokens, assignments / t, hit / t,
                                                   shape.expert_bytes, shape.expert_params,
                                                   shape.hidden)

    def _decode_tp(self, batch: DecodeBatch, cpu: float) -> StepBreakdown:
        """Decode step of a TPn instance: one DP rank, heads and experts sharded n ways."""
        t, m, a = self.tp, self.cfg.model, self.attn
        reqs, ctx = sum(batch.requests_per_rank), sum(batch.context_tokens_per_rank)
        q = 1 + batch.draft_tokens
        tokens = reqs * q
        moe = self._moe_tp_ms(self.target, tokens)
        attention = self._tp_decode_attention_ms(reqs, ctx, q)
        indexer = a.decode_indexer_ms(reqs, ctx)
        dense = self._dense_fixed_ms + self._dense_ms(tokens, reqs, t, True)
        comm = self._tp_allreduce_ms(tokens, m.num_layers)
        # Exposed per-layer latency of the small-batch decode path (launch gaps, latency-bound
        # GEMVs and elementwise kernels, the all-reduce handshakes) beyond bytes / FLOPs: the
        # standard path's or the specialised (fused, low-latency) kernels'. Charged per layer
        # executed: target layers to `dense`, draft layers to `draft`.
        dense += m.num_layers * self._tp_layer_latency_ms
        draft = self._tp_draft_ms(reqs, batch.draft_tokens)
        gpu = moe + attention + indexer + dense + comm + draft
        return StepBreakdown(moe=moe, attention=attention, indexer=indexer, dense=dense,
                             comm=comm, draft=draft, cpu=cpu, sync=self._sync_ms,
                             straggler=self._straggler(gpu))

    def _tp_decode_attention_ms(self, reqs: float, ctx: float, q: int) -> float:
        """Decode attention of a TPn instance over `reqs` requests holding `ctx` context
        tokens, `q` query tokens each (ms). Heads are split; a single shared KV head or latent
        (and the index keys) is read by all, GQA KV heads are split with the query heads."""
        a, t = self.attn, self.tp
        e = a.entries(ctx / reqs)
        return (a.layers * a.kernel_ms
                + reqs * (e * (q * a.entry_flops / a.flops_ms / t
                               + a.entry_bytes / a.bytes_ms / self._kv_shards)
                          + a.layers * a.request_ms))

    def _tp_draft_ms(self, reqs: float, draft_tokens: int) -> float:
        """Draft model of a TPn instance: one forward per draft token over `reqs` (ms)."""
        if self.draft_shape is None or draft_tokens <= 0:
            return 0.0
        t = self.tp
        per = (self._moe_tp_ms(self.draft_shape, reqs)
               + self.draft_shape.layers * (self._dense_kernel_ms + self._tp_layer_latency_ms)
               + self._draft_dense_bytes / t / self._hbm_ms
               + self._tp_allreduce_ms(reqs, self.draft_shape.layers))
        return draft_tokens * per

    # -- decode -----------------------------------------------------------------------------------
    def decode_step(self, batch: DecodeBatch) -> StepBreakdown:
        """Price one decode step (see the module docstring); fields sum to the step time."""
        reqs = batch.requests_per_rank
        n = len(reqs)
        q = 1 + batch.draft_tokens
        total = sum(reqs)
        self._shape = None
        if total <= 0:
            return StepBreakdown(cpu=self._decode_cpu_ms(batch, 0.0), sync=self._sync_ms)
        if self.tp > 1:
            cost = self._decode_tp(batch, 0.0)
            gpu = cost.total_ms - cost.sync - cost.straggler
            return replace(cost, cpu=self._decode_cpu_ms(batch, gpu))
        step = batch.step_index
        # no EPLB epoch starts before `_b_until`: most steps need not ask `balancedness`
        b_t, b_d = self._b if step < self._b_until else self.balancedness(step)
        self.last_balancedness = b_t
        if self._dbo is not None and microbatched(
                [r * q for r in reqs], self._dbo.decode_token_threshold):
            return self._decode_dbo(batch, q, b_t, b_d)
        key = (total, q, b_t, b_d, n)
        shape = self._cache.get(key)
        if shape is None:
            moe, comm = self._moe_comm(self.target, total * q, n, b_t)
            shape = (moe, comm, self._draft_ms(total, n, b_d, batch.draft_tokens))
            if len(self._cache) > 4096:  # a fixed balancedness never clears it
                self._cache.clear()
            self._cache[key] = shape
        self._shape = shape
        return self._decode_dep(batch, shape, q)

    def decode_repeat(self, batch: DecodeBatch) -> StepBreakdown:
        """`decode_step(batch)` for a batch that admits nothing and has the same requests on
        every rank as the last batch priced (only the contexts and the step index moved): the
        terms of the request counts (MoE, all-to-all, draft) are the last step's until an
        EPLB epoch may change the balancedness."""
        shape = self._shape
        if shape is None or batch.step_index >= self._b_until:
            return self.decode_step(batch)
        return self._decode_dep(batch, shape, 1 + batch.draft_tokens)

    def _decode_dep(self, batch: DecodeBatch, shape: tuple[float, float, float], q: int
                    ) -> StepBreakdown:
        """A DEP decode step whose (MoE, all-to-all, draft) are `shape` (ms): the busiest
        rank's attention, indexer and dense work, CPU and straggler on top."""
        moe, comm, draft = shape
        moe += self._eplb_overhead_ms(batch.step_index)
        wr, wc = self._busiest_rank(batch.requests_per_rank, batch.context_tokens_per_rank, q)
        a = self.attn
        attention = a.decode_attention_ms(wr, wc, q)
        indexer = a.decode_indexer_ms(wr, wc)
        dense = self._dense_fixed_ms + self._dense_ms(wr * q, wr, 1, True)
        gpu = moe + attention + indexer + dense + comm + draft
        cpu = self._decode_cpu_ms(batch, gpu)
        # positional (the field order): one per simulated step, kwargs cost a third more
        return StepBreakdown(moe, attention, indexer, dense, comm, draft, cpu, self._sync_ms,
                             self._straggler(gpu))

    def _decode_dbo(self, batch: DecodeBatch, q: int, b_t: float, b_d: float
                    ) -> StepBreakdown:
        """A DEP decode step as two microbatches of half of every rank's requests
        (`_overlapped`); the draft model runs once over the whole batch."""
        reqs, n = batch.requests_per_rank, len(batch.requests_per_rank)
        total = sum(reqs)
        moe, comm = self._moe_comm(self.target, total * q / 2.0, n, b_t)
        half = self._decode_share([r / 2.0 for r in reqs],
                                  [c / 2.0 for c in batch.context_tokens_per_rank], q)
        moe, attention, indexer, dense, comm = self._overlapped(
            moe, half.attention, half.indexer,
            self._dense_fixed_ms + self._dense_ms(half.rank_tokens, half.rank_requests, 1, True),
            comm)
        moe += self._eplb_overhead_ms(batch.step_index)
        draft = self._draft_ms(total, n, b_d, batch.draft_tokens)
        gpu = moe + attention + indexer + dense + comm + draft
        return StepBreakdown(moe, attention, indexer, dense, comm, draft,
                             self._decode_cpu_ms(batch, gpu), self._sync_ms,
                             self._straggler(gpu))

    def _overlapped(self, moe: float, attention: float, indexer: float, dense: float,
                    comm: float) -> tuple[float, float, float, float, float]:
        """The GPU parts of a step run as two microbatches, from one microbatch's parts (ms):
        the compute parts twice, and as `comm` the all-to-all the overlap leaves exposed
        (`overlap.dual_batch_ms`). On DeepEP's normal kernels vLLM gives DeepGEMM, the MoE's
        and the dense FP8 GEMMs' kernel, the SMs the communication leaves; attention and the
        indexer keep theirs (ASSUMED: their kernels are not restricted)."""
        s = self._dbo_compute
        moe, dense = moe * s, dense * s
        layers = self.target.layers
        dispatch, combine = split_alltoall_ms(comm, layers, self._a2a_op_ms)
        step = dual_batch_ms(attention + indexer + dense, moe, dispatch, combine,
                             self.cfg.model.num_layers, layers)
        compute = 2.0 * (moe + attention + indexer + dense)
        return (2.0 * moe, 2.0 * attention, 2.0 * indexer, 2.0 * dense,
                max(step - compute, 0.0))

    def _decode_cpu_ms(self, batch: DecodeBatch, gpu_ms: float) -> float:
        """Exposed CPU of a decode step (`cpu.exposed_cpu_ms`): the fitted per-step residual
        plus each DP rank's admission work beyond `gpu_ms`, behind which async scheduling hides
        it. The work prepared during a step belongs to the next one; consecutive decode steps'
        GPU times differ by a few percent, so the step's own GPU time stands in for its
        predecessor's."""
        adm = batch.rank_admissions
        if not adm and (batch.new_loads or batch.admitted_prompt_tokens):
            adm = ((batch.new_loads, batch.admitted_prompt_tokens, 0),)
        return exposed_cpu_ms(self._cpu_step_ms, adm, gpu_ms, self._admit_ns,
                              self._admit_us_request, self._admit_us_block)

    def _rank_terms(self, q: int) -> tuple[float, ...]:
        """Per-rank work terms at `q` query tokens per request, cached per q:
        (per attended entry, per index key, per request dense, linear alpha, linear beta)."""
        terms = self._rank_terms_by_q.get(q)
        if terms is None:
            a = self.attn
            per_entry = q * a.entry_flops / a.flops_ms + a.entry_bytes / a.bytes_ms
            ki = a.indexer_bytes_per_token / a.indexer_bytes_ms
            # dense work per request: q tokens' share of the GEMMs and mHC plus its LM-head
            # row (dense is affine in tokens and requests)
            one = self.dense.ms(1, 1, decode=True)
            kd = (q * (self.dense.ms(2, 1, decode=True) - one)
                  + self.dense.ms(1, 2, decode=True) - one) + a.layers * a.request_ms
            alpha = per_entry * (a.layers * a.window + a.csa_layers * a.topk_entries) + kd
            beta = ki + per_entry * a.hca_layers / a.hca_compress
            terms = self._rank_terms_by_q[q] = (per_entry, ki, kd, alpha, beta)
        return terms

    def _busiest_rank(self, reqs: Sequence[int], ctxs: Sequence[float], q: int
                      ) -> tuple[int, float]:
        """(requests, context tokens) of the rank with the most per-rank GPU work.

        A rank whose mean context is past the window and the top-k reach (the usual decode
        case) has work linear in (requests, context): alpha r + beta c. Other ranks are
        priced term by term; empty ranks have none.
        """
        per_entry, ki, kd, alpha, beta = self._rank_terms(q)
        a = self.attn
        linear = self._linear_context
        worst, wr, wc = -1.0, 0, 0.0
        for r, c in compress(zip(reqs, ctxs, strict=True), reqs):  # ranks with requests
            if c >= linear * r:
                v = alpha * r + beta * c
            else:
                avg = c / r
                sel = avg / a.csa_compress
                e = (a.layers * (avg if avg < a.window else a.window)
                     + a.csa_layers * (sel if sel < a.topk_entries else a.topk_entries)
                     + a.hca_layers * avg / a.hca_compress)
                v = r * e * per_entry + c * ki + r * kd
            if v > worst:
                worst, wr, wc = v, r, c
        return wr, wc

    # -- prefill ---------------------------------------------------------------------------------
    def _prefill_gpu(self, tokens_total: float, requests: int, mean_context: float, n: int,
                     b: float, busiest: float = 0.0, dec: _DecodeShare | None = None
                     ) -> tuple[float, float, float, float, float]:
        """GPU parts of a prefill step computing `tokens_total` tokens on `n` ranks (the
        busiest rank `busiest` of them, if more than an even share), with a colocated step's
        decode share `dec` in the same forward: (moe, attention, indexer, dense, comm) in ms."""
        g = gather_factor(self.prefill_opts, self._tlb)
        a = self.attn
        dec = dec or NO_DECODE
        if self.tp > 1:
            # TP: every GPU sees all tokens with 1/tp of the heads and of each expert.
            t = self.tp
            tokens = tokens_total + dec.tokens
            moe = self._moe_tp_ms(self.target, tokens)
            comm = self._tp_allreduce_ms(tokens, self.cfg.model.num_layers)
            dense = self._dense_fixed_ms + self._dense_ms(tokens, requests + dec.requests, t,
                                                          False)
            attention = a.prefill_attention_ms(tokens_total / t, mean_context, requests) * g
            score = a.prefill_indexer_score_ms(tokens_total / t, mean_context) * g
            pairs = a.prefill_indexer_pairs(tokens_total / t, mean_context)
            select = topk_select_ms(self.prefill_opts, pairs, self._topk_ns, self._hbm_ms)
            return (moe, attention + dec.attention, score + select + dec.indexer, dense, comm)
        per_rank = max(tokens_total / n, busiest)
        moe, comm = self._moe_comm(self.target, tokens_total + dec.tokens, n, b)
        dense = self._dense_fixed_ms + self._dense_ms(per_rank + dec.rank_tokens,
                                                      requests / n + dec.rank_requests, 1, False)
        attention = a.prefill_attention_ms(per_rank, mean_context, requests / n) * g
        score = a.prefill_indexer_score_ms(per_rank, mean_context) * g
        pairs = a.prefill_indexer_pairs(per_rank, mean_context)
        select = topk_select_ms(self.prefill_opts, pairs, self._topk_ns, self._hbm_ms)
        return (moe, attention + dec.attention, score + select + dec.indexer, dense, comm)

    def _prefill_parts(self, batch: PrefillBatch, b: float, dec: _DecodeShare | None = None
                       ) -> tuple[tuple[float, ...], float]:
        """GPU parts of `batch` (`_prefill_gpu`, with the bounded replay of cached tokens) and
        its CPU: step, admission of the prompts, KV promoted from the host tier (ms)."""
        n = batch.ranks
        reqs = max(batch.num_requests, 1)
        cached = max(batch.attended_tokens - batch.new_tokens, 0) / reqs
        mean_ctx = cached + batch.new_tokens / reqs / 2.0
        busiest = batch.busiest_rank_tokens
        parts = self._prefill_gpu(batch.new_tokens, reqs, mean_ctx, n, b, busiest, dec)
        replay = replayed_tokens(self.prefill_opts, cached, self._replay_baseline) * reqs
        if replay > 0:
            more = self._prefill_gpu(batch.new_tokens + replay, reqs, mean_ctx, n, b,
                                     busiest * (1.0 + replay / batch.new_tokens), dec)
            share = self._replay_share
            parts = tuple([v + (w - v) * share for v, w in zip(parts, more, strict=True)])
        host = batch.host_loaded_bytes / n / self._host_link_ms
        cpu = self._cpu_step_ms + admission_ms(batch.admitted_prompt_tokens, self._admit_ns) + host
        return parts, cpu

    def prefill_step(self, batch: PrefillBatch) -> StepBreakdown:
        n = batch.ranks
        self._prefill_steps += 1
        b = self.balancedness(self._prefill_steps)[0] if self.ranks == n else 1.0
        if self._dbo is not None and microbatched([least_rank_tokens(batch)],
                                                  self._dbo.prefill_token_threshold):
            # the microbatch keeps the step's admissions and host loads: its CPU is the step's
            half, cpu = self._prefill_parts(prefill_microbatch(batch), b)
            moe, attention, indexer, dense, comm = self._overlapped(*half)
        else:
            (moe, attention, indexer, dense, comm), cpu = self._prefill_parts(batch, b)
        sync = self._sync_ms if n == self.ranks else allreduce_ms(
            self.allreduce, n // self.tp, self.profile.value("allreduce_call_ms"),
            self.profile.value("allreduce_hop_ms"))
        gpu = moe + comm + dense + attention + indexer
        return StepBreakdown(moe, attention, indexer, dense, comm, cpu=cpu, sync=sync,
                             straggler=self._straggler(gpu))

    # -- colocated -------------------------------------------------------------------------------
    def mixed_step(self, prefill: PrefillBatch, decode: DecodeBatch) -> StepBreakdown:
        """One step of a colocated instance: prefill chunks and decode tokens in one forward.

        Without prefill it is a decode step (CUDA graphs, `decode_step`). Otherwise the
        experts, the all-to-all (TP: all-reduce) and the dense GEMMs see both token sets at
        once (weights read once, per-call costs paid once: a batch with prefill in it runs
        eagerly); attention and the indexer add the busiest rank's decode to the prefill
        chunks'; the draft model runs over the decoding requests; CPU is the step's plus the
        admitted prompts'. The busiest rank's prefill tokens and its decode requests set the
        per-rank parts together (an upper bound when they sit on different ranks)."""
        reqs, ctxs = decode.requests_per_rank, decode.context_tokens_per_rank
        if prefill.new_tokens <= 0:
            return self.decode_step(decode)
        q = 1 + decode.draft_tokens
        total = sum(reqs)
        self._shape = None  # the EPLB states may move here: no repeat of a decode step
        b_t, b_d = self.balancedness(decode.step_index)
        self.last_balancedness = b_t
        if total <= 0:
            dec, draft = NO_DECODE, 0.0
        elif self.tp > 1:
            ctx = sum(ctxs)
            dec = _DecodeShare(total * q, total * q, total, total,
                               self._tp_decode_attention_ms(total, ctx, q),
                               self.attn.decode_indexer_ms(total, ctx))
            draft = self._tp_draft_ms(total, decode.draft_tokens)
        else:
            draft = self._draft_ms(total, len(reqs), b_d, decode.draft_tokens)
            if self._dbo is not None and microbatched(
                    [min(reqs) * q + least_rank_tokens(prefill)],
                    self._dbo.prefill_token_threshold):
                # two microbatches, each half the prefill chunks and half of every rank's
                # decoding requests; the step's CPU (`prefill_microbatch`)
                half, cpu = self._prefill_parts(
                    prefill_microbatch(prefill), b_t,
                    self._decode_share([r / 2.0 for r in reqs], [c / 2.0 for c in ctxs], q))
                moe, attention, indexer, dense, comm = self._overlapped(*half)
                return self._mixed(moe, attention, indexer, dense, comm, draft, cpu,
                                   decode.step_index)
            dec = self._decode_share(reqs, ctxs, q)
        (moe, attention, indexer, dense, comm), cpu = self._prefill_parts(prefill, b_t, dec)
        return self._mixed(moe, attention, indexer, dense, comm, draft, cpu, decode.step_index)

    def _decode_share(self, reqs: Sequence[float], ctxs: Sequence[float], q: int
                      ) -> _DecodeShare:
        """The decode part of a DEP step over `reqs` / `ctxs` per rank (a colocated step's, or
        a decode microbatch's): its busiest rank's attention and indexer."""
        wr, wc = self._busiest_rank(reqs, ctxs, q)
        total = sum(reqs)
        return _DecodeShare(total * q, wr * q, total, wr, self.attn.decode_attention_ms(wr, wc, q),
                            self.attn.decode_indexer_ms(wr, wc))

    def _mixed(self, moe: float, attention: float, indexer: float, dense: float, comm: float,
               draft: float, cpu: float, step_index: int) -> StepBreakdown:
        """A colocated step's breakdown from its parts (ms): EPLB copies, straggler."""
        moe += self._eplb_overhead_ms(step_index)
        gpu = moe + attention + indexer + dense + comm + draft
        return StepBreakdown(moe=moe, attention=attention, indexer=indexer, dense=dense,
                             comm=comm, draft=draft, cpu=cpu, sync=self._sync_ms,
                             straggler=self._straggler(gpu))


@dataclass(frozen=True, slots=True)
class _DecodeShare:
    """The decode part of a colocated step, as the prefill pricing adds it: tokens of all
    ranks and of the busiest rank, requests of all ranks and of the busiest rank, and the
    busiest rank's decode attention and indexer (ms)."""

    tokens: float
    rank_tokens: float
    requests: float
    rank_requests: float
    attention: float
    indexer: float


NO_DECODE = _DecodeShare(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

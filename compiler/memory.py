"""The memory budget of one GPU of an engine shape (GiB): the single rule precheck, the solver,
the memory map, the perf model and the targets share.

vLLM 0.33 sizes its KV cache inside `--gpu-memory-utilization x HBM`, a budget that must fit in
the memory free when the worker takes its snapshot (after CUDA and NCCL are up), and NIXL
registers after the profile run; so those stay outside (`reserved_gib`). Inside: weights, the
Engram shard when in HBM, the workspace (activations, DeepEP buffers, vLLM's 150 MiB margin),
then KV. Weights an instance offloads to host memory (compiler.offload: its role's or pinned
entry's `weight_offload`) leave the budget: they are pinned in the tray's DRAM
(compiler.host_memory); the prefetch backend's GPU buffers, allocated with the weights, stay
in it. Expert weights and the
LM head are split die-local by output columns, so on a GPU with several memory domains each
domain holds an equal share (SYSTEM.md, memory placement).

Pipeline stages (shape.pp > 1) hold only their layers (vLLM's split, compiler.shapes
stage_layers): their attention, dense FFN and MoE weights and their layers' KV; the embedding
lives on the first stage, the LM head (tied or not) and the built-in draft on the last (vLLM
builds the drafter on the last pipeline rank only: v1/worker/gpu_model_runner.py). Sliding-window
layers are taken as spread evenly over the stages. vLLM sizes every worker's KV cache to the
fewest blocks any worker holds (v1/core/kv_cache_planning.py get_kv_cache_configs), so an
instance's KV capacity is that of the stage with the fewest KV tokens; the other stages leave the
rest of their KV budget unused.
"""

import math
from dataclasses import dataclass

from compiler import arch, engine_policy, offload
from compiler.shapes import Shape, stage_layer_mix
from schemas.model import ModelSpec

GIB = arch.GIB
ACTIVATION_TOKENS = 8192  # tokens per forward pass the workspace is sized for (assumed)
ACTIVATION_COPIES = 12  # live hidden-sized buffers per token in a layer (assumed)
MAX_REQUESTS = 1 << 20  # what `requests_at` answers for a model that keeps no KV


def utilization(capacity_gib: float, reserved_gib: float) -> float:
    """`--gpu-memory-utilization`: what is not reserved, rounded down to 2 decimals (rounding
    up would ask vLLM for memory the reserve holds, and its start-up check refuses that)."""
    return math.floor(100 * (capacity_gib - reserved_gib) / capacity_gib + 1e-9) / 100


@dataclass(frozen=True)
class GpuBudget:
    capacity_gib: float
    reserved_gib: float  # outside the engine's budget
    weights_gib: float  # in HBM
    engram_gib: float
    workspace_gib: float
    kv_min_gib: float  # one maximum-length request
    pool_in_hbm: bool  # the spare HBM is lent to the KV pool instead of the KV cache
    offload_gib: float = 0.0  # weights in pinned host memory (compiler.offload)
    kv_token_bytes: float = 0.0  # KV per token of context on this GPU (its stage's layers)
    kv_window_bytes: float = 0.0  # KV per request of its sliding-window layers (whole window)
    state_bytes: float = 0.0  # per request: its linear-attention layers' state, any length

    @property
    def utilization(self) -> float:
        return utilization(self.capacity_gib, self.reserved_gib)

    @property
    def budget_gib(self) -> float:
        return self.utilization * self.capacity_gib

    @property
    def fixed_gib(self) -> float:
        """What the budget holds whatever the load: weights, Engram, workspace."""
        return self.weights_gib + self.engram_gib + self.workspace_gib

    @property
    def spare_gib(self) -> float:
        """Budget left beyond the fixed parts and one maximum-length request."""
        return self.budget_gib - self.fixed_gib - self.kv_min_gib

    @property
    def fits(self) -> bool:
        return self.spare_gib >= 0

    @property
    def pool_gib(self) -> float:
        return max(0.0, self.spare_gib) if self.pool_in_hbm else 0.0

    @property
    def kv_gib(self) -> float:
        """The KV cache: everything left in the budget (less what the HBM pool takes)."""
        return self.budget_gib - self.fixed_gib - self.pool_gib

    @property
    def total_gib(self) -> float:
        """What the GPU must hold at least: the reserve, the budget's fixed parts, one request."""
        return self.reserved_gib + self.fixed_gib + self.kv_min_gib

    def request_kv_gib(self, context_tokens: int) -> float:
        """One request's KV on this GPU at `context_tokens` of context (its window layers
        counted whole, as for the maximum-length request, and its linear-attention state)."""
        return (self.kv_token_bytes * context_tokens + self.kv_window_bytes
                + self.state_bytes) / GIB

    def requests_at(self, context_tokens: int) -> int:
        """Requests of `context_tokens` each whose KV the KV cache holds at once."""
        per = self.request_kv_gib(context_tokens)
        return max(0, int(self.kv_gib / per)) if per > 0 else MAX_REQUESTS


def weight_parts_gib(model: ModelSpec, shape: Shape, with_draft: bool = False,
                     vision: bool = False) -> tuple[float, float]:
    """(routed experts, the rest) per GPU of the heaviest pipeline stage. Routed experts split
    over the stage's GPUs; everything else replicated per DP rank, split by TP."""
    return max(stage_weight_parts_gib(model, shape, with_draft, vision), key=sum)


def stage_weight_parts_gib(model: ModelSpec, shape: Shape, with_draft: bool = False,
                           vision: bool = False) -> list[tuple[float, float]]:
    """(routed experts, the rest) per GPU of each pipeline stage; the draft (its experts split
    like the target's) and the vision tower (split by TP) on the last and first stage. A
    latent MoE's projections are whole on every rank (kimi_k3/nvidia/model.py l.477-505:
    ReplicatedLinear)."""
    p = arch.params(model)
    eb = arch.dtype_bytes(model, "experts")
    wb = arch.dtype_bytes(model, "weights")
    hb = arch.dtype_bytes(model, "embedding")
    # EPLB replicas live on expert-parallel ranks only
    replicas = model.moe.slots / model.moe.experts if model.moe and shape.ep > 1 else 1.0
    draft_experts, draft_rest = arch.draft_bytes(model) if with_draft and model.draft \
        else (0.0, 0.0)
    draft = draft_experts / shape.stage_gpus + draft_rest / shape.tp
    tower = p.vision * arch.WEIGHT_BYTES["bf16"] / shape.tp if vision else 0.0
    head = p.embedding + p.lm_head
    if shape.pp == 1:
        experts = p.routed_experts * replicas * eb / shape.gpus
        rest = ((p.non_expert - head - p.latent_proj) * wb + head * hb) / shape.tp \
            + p.latent_proj * wb
        return [(experts / GIB, (rest + draft + tower) / GIB)]
    out = []
    n_moe = arch.moe_layers(model)
    for s, (n, dense, _) in enumerate(stage_layer_mix(model, shape.pp)):
        moe = n - dense if model.moe else 0
        moe_share = moe / n_moe if n_moe else 0.0
        rest = (p.attention * n / model.layers + p.dense_ffn * dense / max(1, model.dense_layers)
                + (p.shared_experts + p.router) * moe_share)
        heads = 0
        if s == 0:
            heads += p.embedding
        if s == shape.pp - 1:  # the LM head, its own copy when tied to the embedding
            heads += p.lm_head or p.embedding
        experts = p.routed_experts * moe_share * replicas * eb / shape.stage_gpus
        out.append((experts / GIB,
                    ((rest * wb + heads * hb) / shape.tp + p.latent_proj * moe_share * wb
                     + (draft if s == shape.pp - 1 else 0.0) + (tower if s == 0 else 0.0))
                    / GIB))
    return out


def kv_bytes_per_token_per_gpu(model: ModelSpec, shape: Shape, kv_dtype: str) -> float:
    """A request's KV lives on its DP rank; under TP, GQA heads split (replicated past kv_heads)
    while an MLA latent is replicated on every rank (REFERENCE-DATA.md B2)."""
    per_token = arch.kv_bytes_per_token(model, kv_dtype)
    a = model.attention
    if shape.tp > 1 and a.kind != "mla":
        index = arch.index_key_bytes_per_token(model)  # one replicated head: whole per rank
        return (per_token - index) * max(1, a.kv_heads // shape.tp) / a.kv_heads + index
    return per_token


def state_bytes_per_gpu(model: ModelSpec, shape: Shape, draft_tokens: int) -> float:
    """A request's linear-attention state on one GPU of its DP rank: heads split over TP
    (kimi_k3/nvidia/model.py get_mamba_state_shape_from_config l.1506-1523, divided by the TP
    size in mamba_utils.py kda_state_shape)."""
    return arch.state_bytes_per_request(model, draft_tokens) / shape.tp


def activations_gib(model: ModelSpec) -> float:
    activations = ACTIVATION_TOKENS * model.hidden_size * 2 * ACTIVATION_COPIES
    if model.mhc_routes:
        activations *= model.mhc_routes
    return activations / GIB


def gpu_budget(inputs, role: str, shape: Shape, engram_gpus: int) -> GpuBudget:
    """One GPU of `shape` in `role` (with pipeline stages: of the stage whose KV cache holds
    the fewest tokens, which bounds the instance's); the Engram tables (when this role keeps
    them in HBM) are spread over `engram_gpus` GPUs."""
    return min(stage_budgets(inputs, role, shape, engram_gpus),
               key=lambda b: b.kv_gib / b.kv_token_bytes if b.kv_token_bytes else math.inf)


def requests_that_fit(inputs, role: str, shape: Shape, engram_gpus: int,
                      context_tokens: int) -> tuple[int, GpuBudget]:
    """Requests of `context_tokens` each that one DP rank of `shape` holds in its KV cache at
    once (with pipeline stages: the fewest any stage holds, since vLLM sizes every worker's
    cache to the smallest), and the budget of the GPU that bounds it."""
    return min(((b.requests_at(context_tokens), b)
                for b in stage_budgets(inputs, role, shape, engram_gpus)),
               key=lambda nb: nb[0])


def stage_budgets(inputs, role: str, shape: Shape, engram_gpus: int) -> list[GpuBudget]:
    """One GPU of each pipeline stage of `shape` (one entry without PP)."""
    r, model = inputs.resolved, inputs.model.spec
    dtype = r.kv_cache_dtype.value
    per_token = kv_bytes_per_token_per_gpu(model, shape, dtype)
    window = arch.kv_window_bytes_per_request(model, dtype)
    state = state_bytes_per_gpu(model, shape, r.speculative.draft_tokens if r.speculative else 0)
    engram = arch.engram_bytes(model) / max(1, engram_gpus) if r.engram_in_hbm(role) else 0.0
    buffers = engine_policy.of(inputs, role, shape).buffers_gib
    workspace = activations_gib(model) + buffers + r.engines.vllm.memory.redundancy_gib.value
    off = offload.of(inputs, role, shape)
    held = off.stages if off else [offload.StageOffload(0, 0.0)] * shape.pp
    full, sliding = model.layers - model.attention.sliding_layers, model.attention.sliding_layers
    out = []
    for (n, _, w), parts, away in zip(stage_layer_mix(model, shape.pp),
                                      stage_weight_parts_gib(model, shape, r.uses_draft,
                                                             r.loads_vision), held, strict=True):
        share = (n - w) / full if shape.pp > 1 and full else 1.0  # of the full layers' KV
        window_share = w / sliding if shape.pp > 1 and sliding else 1.0
        state_share = n / model.layers if shape.pp > 1 else 1.0  # linear layers: spread evenly
        kv = (per_token * share * r.max_model_len.value + window * window_share
              + state * state_share)
        out.append(GpuBudget(
            capacity_gib=inputs.system.gpu.hbm_gib.value, reserved_gib=r.gpu_reserve_gib.value,
            weights_gib=sum(parts) - min(away.host_gib, sum(parts)) + away.buffer_gib,
            engram_gib=engram / GIB, workspace_gib=workspace, kv_min_gib=kv / GIB,
            pool_in_hbm=role == "prefill" and r.kv_pool_hbm.value, offload_gib=away.host_gib,
            kv_token_bytes=per_token * share, kv_window_bytes=window * window_share,
            state_bytes=state * state_share))
    return out

"""The memory budget of one GPU of an engine shape (GiB): the single rule precheck, the solver,
the memory map, the perf model and the targets share.

vLLM 0.33 sizes its KV cache inside `--gpu-memory-utilization x HBM`, a budget that must fit in
the memory free when the worker takes its snapshot (after CUDA and NCCL are up), and NIXL
registers after the profile run; so those stay outside (`reserved_gib`). Inside: weights, the
Engram shard when in HBM, the workspace (activations, DeepEP buffers, vLLM's 150 MiB margin),
then KV. Weights offloaded to host memory (`serving.weight_offload`, vLLM's UVA offload) leave
the budget: they are pinned in the tray's DRAM (compiler.host_memory). Expert weights and the
LM head are split die-local by output columns, so on a GPU with several memory domains each
domain holds an equal share (SYSTEM.md, memory placement).
"""

import math
from dataclasses import dataclass

from compiler import arch
from compiler.resolve import is_multi_node_nvlink, nodes_of
from compiler.shapes import Shape
from schemas.model import ModelSpec

GIB = arch.GIB
ACTIVATION_TOKENS = 8192  # tokens per forward pass the workspace is sized for (assumed)
ACTIVATION_COPIES = 12  # live hidden-sized buffers per token in a layer (assumed)


@dataclass(frozen=True)
class GpuBudget:
    capacity_gib: float
    reserved_gib: float  # outside the engine's budget
    weights_gib: float  # in HBM
    engram_gib: float
    workspace_gib: float
    kv_min_gib: float  # one maximum-length request
    pool_in_hbm: bool  # the spare HBM is lent to the KV pool instead of the KV cache
    offload_gib: float = 0.0  # weights in pinned host memory, read over the GPU-CPU link

    @property
    def utilization(self) -> float:
        """`--gpu-memory-utilization`: what is not reserved, rounded down to 2 decimals."""
        return math.floor(100 * (self.capacity_gib - self.reserved_gib) / self.capacity_gib
                          + 1e-9) / 100

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


def weight_parts_gib(model: ModelSpec, shape: Shape, with_draft: bool = False
                     ) -> tuple[float, float]:
    """(routed experts, the rest) per GPU. Routed experts split over all n GPUs; everything
    else replicated per DP rank, split by TP."""
    p = arch.params(model)
    eb = arch.WEIGHT_BYTES[model.dtypes.experts]
    wb = arch.WEIGHT_BYTES[model.dtypes.weights]
    # EPLB replicas live on expert-parallel ranks only
    replicas = model.moe.slots / model.moe.experts if model.moe and shape.ep > 1 else 1.0
    experts = p.routed_experts * replicas * eb / shape.gpus
    rest = p.non_expert * wb / shape.tp
    draft = 0.0
    if with_draft and model.draft:
        draft = p.draft * wb / shape.tp
    return experts / GIB, (rest + draft) / GIB


def offload_gib(inputs, shape: Shape) -> float:
    """Weights per GPU that `serving.weight_offload` keeps in host memory: what it asks for, at
    most the offloadable weights (routed experts only, or all). vLLM offloads whole parameters in
    load order until `--cpu-offload-gb` is reached (vllm/model_executor/offloader/uva.py), so
    the last one may take up to one layer's tensor more from HBM to host than this."""
    asked = inputs.deployment.spec.serving.weight_offload
    if asked is None:
        return 0.0
    experts, rest = weight_parts_gib(inputs.model.spec, shape, inputs.resolved.uses_draft)
    return round(min(asked.gib_per_gpu, experts if asked.experts_only else experts + rest), 3)


def kv_bytes_per_token_per_gpu(model: ModelSpec, shape: Shape, kv_dtype: str) -> float:
    """A request's KV lives on its DP rank; under TP, GQA heads split (replicated past kv_heads)
    while an MLA latent is replicated on every rank (REFERENCE-DATA.md B2)."""
    per_token = arch.kv_bytes_per_token(model, kv_dtype)
    a = model.attention
    if shape.tp > 1 and a.kind != "mla":
        return per_token * max(1, a.kv_heads // shape.tp) / a.kv_heads
    return per_token


def activations_gib(model: ModelSpec) -> float:
    activations = ACTIVATION_TOKENS * model.hidden_size * 2 * ACTIVATION_COPIES
    if model.mhc_routes:
        activations *= model.mhc_routes
    return activations / GIB


def all2all_of(inputs, role: str, shape: Shape) -> str | None:
    """The dispatch backend of a DP+EP instance (None: no all-to-all)."""
    if shape.dp <= 1 or shape.ep <= 1:
        return None
    nodes = nodes_of(shape, inputs.system)
    return inputs.resolved.all2all(role, nodes, is_multi_node_nvlink(inputs.system, nodes)).value


def gpu_budget(inputs, role: str, shape: Shape, engram_gpus: int) -> GpuBudget:
    """One GPU of `shape` in `role`; the Engram tables (when this role keeps them in HBM) are
    spread over `engram_gpus` GPUs."""
    r, model = inputs.resolved, inputs.model.spec
    kv = kv_bytes_per_token_per_gpu(model, shape, r.kv_cache_dtype.value) * r.max_model_len.value
    kv += arch.kv_window_bytes_per_request(model, r.kv_cache_dtype.value)
    engram = arch.engram_bytes(model) / max(1, engram_gpus) if r.engram_in_hbm(role) else 0.0
    buffers = r.engine_buffers_gib(all2all_of(inputs, role, shape), nodes_of(shape, inputs.system))
    workspace = activations_gib(model) + buffers + r.engines.vllm.memory.redundancy_gib.value
    offload = offload_gib(inputs, shape)
    return GpuBudget(
        capacity_gib=inputs.system.gpu.hbm_gib.value, reserved_gib=r.gpu_reserve_gib.value,
        weights_gib=sum(weight_parts_gib(model, shape, r.uses_draft)) - offload,
        engram_gib=engram / GIB, workspace_gib=workspace, kv_min_gib=kv / GIB,
        pool_in_hbm=role == "prefill" and r.kv_pool_hbm.value, offload_gib=offload)

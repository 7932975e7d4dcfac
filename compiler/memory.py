"""What one GPU of an engine shape must hold: weights, KV, Engram share, workspace (GiB).

Expert weights and the LM head are split die-local by output columns, so on a GPU with several
memory domains each domain holds an equal share (SYSTEM.md, memory placement).
"""

from dataclasses import dataclass

from compiler import arch
from compiler.catalog.system import System
from compiler.shapes import Shape
from schemas.model import ModelSpec

GIB = arch.GIB
ACTIVATION_TOKENS = 8192  # tokens per forward pass the workspace is sized for (assumed)
ACTIVATION_COPIES = 12  # live hidden-sized buffers per token in a layer (assumed)
HEADROOM_GIB = 1.0  # assumed: left unallocated per GPU for fragmentation and CUDA context


@dataclass(frozen=True)
class GpuMemory:
    weights_gib: float
    kv_min_gib: float
    engram_gib: float
    workspace_gib: float

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_min_gib + self.engram_gib + self.workspace_gib

    def spare_gib(self, capacity_gib: float) -> float:
        """What is left of `capacity_gib` beyond this and the headroom: a prefill rank's HBM
        pool segment, or (plus kv_min_gib) a decode rank's KV cache."""
        return capacity_gib - self.total_gib - HEADROOM_GIB


def weights_gib_per_gpu(model: ModelSpec, shape: Shape, with_draft: bool = False) -> float:
    """Routed experts split over all n GPUs; everything else replicated per DP rank, split by TP."""
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
    return (experts + rest + draft) / GIB


def kv_bytes_per_token_per_gpu(model: ModelSpec, shape: Shape, kv_dtype: str) -> float:
    """A request's KV lives on its DP rank; under TP, GQA heads split (replicated past kv_heads)
    while an MLA latent is replicated on every rank (REFERENCE-DATA.md B2)."""
    per_token = arch.kv_bytes_per_token(model, kv_dtype)
    a = model.attention
    if shape.tp > 1 and a.kind != "mla":
        return per_token * max(1, a.kv_heads // shape.tp) / a.kv_heads
    return per_token


def workspace_gib(model: ModelSpec, system: System) -> float:
    activations = ACTIVATION_TOKENS * model.hidden_size * 2 * ACTIVATION_COPIES
    if model.mhc_routes:
        activations *= model.mhc_routes
    return system.reserve.runtime_gib.value + system.reserve.nccl_gib.value + activations / GIB


def gpu_memory(model: ModelSpec, shape: Shape, system: System, kv_dtype: str,
               max_model_len: int, engram_share_gpus: int, engram_in_hbm: bool,
               with_draft: bool) -> GpuMemory:
    kv = kv_bytes_per_token_per_gpu(model, shape, kv_dtype) * max_model_len
    kv += arch.kv_window_bytes_per_request(model, kv_dtype)
    engram = arch.engram_bytes(model) / engram_share_gpus if engram_in_hbm else 0.0
    return GpuMemory(weights_gib_per_gpu(model, shape, with_draft), kv / GIB, engram / GIB,
                     workspace_gib(model, system))

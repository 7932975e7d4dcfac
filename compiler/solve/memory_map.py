"""What each memory domain of an instance's GPUs holds, in GiB.

Weights are split die-local by output columns, so every domain of a GPU holds an equal share
of everything; a prefill rank with the HBM pool keeps one maximum-length request's KV and
lends the rest to Mooncake; a decode rank gives all that is left to its KV cache.
"""

from compiler import arch
from compiler.memory import kv_bytes_per_token_per_gpu, weights_gib_per_gpu, workspace_gib
from compiler.plan import DomainMemory
from compiler.precheck import kv_dtype, max_model_len, uses_draft
from compiler.shapes import Shape
from compiler.solve.problem import Problem

HEADROOM_GIB = 1.0  # assumed: left unallocated per GPU for fragmentation and CUDA context


def domain_memory(p: Problem, role: str, shape: Shape, prefill_gpus: int) -> DomainMemory:
    inputs = p.inputs
    model, system = inputs.model.spec, inputs.system
    weights = weights_gib_per_gpu(model, shape, uses_draft(inputs))
    share = prefill_gpus if role == "prefill" else shape.gpus
    engram = p.engram_gib / max(1, share)
    workspace = workspace_gib(model, system)
    free = p.hbm_gib - weights - engram - workspace - HEADROOM_GIB
    pool_cfg = inputs.deployment.spec.serving.kv_pool
    kv, pool = free, 0.0
    if role == "prefill" and pool_cfg and pool_cfg.hbm:
        one_request = kv_bytes_per_token_per_gpu(model, shape, kv_dtype(inputs)) \
            * max_model_len(inputs) + arch.kv_window_bytes_per_request(model, kv_dtype(inputs))
        kv = min(free, one_request / arch.GIB)
        pool = free - kv
    d = system.domains_per_gpu
    return DomainMemory(weights_gib=round(weights / d, 3), kv_gib=round(kv / d, 3),
                        engram_gib=round(engram / d, 3), pool_gib=round(pool / d, 3),
                        workspace_gib=round(workspace / d, 3),
                        capacity_gib=round(p.hbm_gib / d, 3))


def total_gib(m: DomainMemory) -> float:
    return m.weights_gib + m.kv_gib + m.engram_gib + m.pool_gib + m.workspace_gib

"""What each memory domain of an instance's GPUs holds, in GiB.

Weights are split die-local by output columns, so every domain of a GPU holds an equal share
of everything; a prefill rank with the HBM pool keeps one maximum-length request's KV and
lends the rest to Mooncake; a decode rank gives all that is left to its KV cache.
"""

from compiler.memory import gpu_memory
from compiler.plan import DomainMemory
from compiler.precheck import kv_dtype, max_model_len, uses_draft
from compiler.shapes import Shape
from compiler.solve.problem import Problem


def domain_memory(p: Problem, role: str, shape: Shape, prefill_gpus: int) -> DomainMemory:
    inputs = p.inputs
    mem = gpu_memory(inputs.model.spec, shape, inputs.system, kv_dtype(inputs),
                     max_model_len(inputs), prefill_gpus if role == "prefill" else shape.gpus,
                     inputs.deployment.spec.serving.engram_placement == "hbm", uses_draft(inputs))
    spare = mem.spare_gib(p.hbm_gib)
    pool_cfg = inputs.deployment.spec.serving.kv_pool
    kv, pool = spare + mem.kv_min_gib, 0.0
    if role == "prefill" and pool_cfg and pool_cfg.hbm:
        kv = min(kv, mem.kv_min_gib)
        pool = max(0.0, spare)
    d = inputs.system.domains_per_gpu
    return DomainMemory(weights_gib=round(mem.weights_gib / d, 3), kv_gib=round(kv / d, 3),
                        engram_gib=round(mem.engram_gib / d, 3), pool_gib=round(pool / d, 3),
                        workspace_gib=round(mem.workspace_gib / d, 3),
                        capacity_gib=round(p.hbm_gib / d, 3))


def total_gib(m: DomainMemory) -> float:
    return m.weights_gib + m.kv_gib + m.engram_gib + m.pool_gib + m.workspace_gib

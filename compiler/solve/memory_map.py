"""What each memory domain of an instance's GPUs holds, in GiB (compiler.memory.gpu_budget,
split evenly over the GPU's domains: weights are split die-local by output columns). The GPUs
of pipeline stages hold different layers: `stage_domain_memory` gives each stage's."""

from compiler.memory import GpuBudget, gpu_budget, stage_budgets
from compiler.plan import DomainMemory
from compiler.shapes import Shape
from compiler.solve.problem import Problem


def domain_memory(p: Problem, role: str, shape: Shape, prefill_gpus: int) -> DomainMemory:
    mem = gpu_budget(p.inputs, role, shape, prefill_gpus if role == "prefill" else shape.gpus)
    return split(mem, p.inputs.system.domains_per_gpu)


def stage_domain_memory(p: Problem, role: str, shape: Shape, prefill_gpus: int
                        ) -> tuple[DomainMemory, ...]:
    """Per pipeline stage (rank r of the instance is on stage r // shape.stage_gpus)."""
    budgets = stage_budgets(p.inputs, role, shape,
                            prefill_gpus if role == "prefill" else shape.gpus)
    return tuple(split(b, p.inputs.system.domains_per_gpu) for b in budgets)


def split(mem: GpuBudget, domains: int) -> DomainMemory:
    """Per domain, rounded to MiB-ish; the reserve takes the rounding so the parts sum to the
    capacity (the budget's KV is what is left, so unrounded they do exactly)."""
    d = domains
    parts = {"weights_gib": round(mem.weights_gib / d, 3), "kv_gib": round(mem.kv_gib / d, 3),
             "engram_gib": round(mem.engram_gib / d, 3), "pool_gib": round(mem.pool_gib / d, 3),
             "workspace_gib": round(mem.workspace_gib / d, 3)}
    capacity = round(mem.capacity_gib / d, 3)
    return DomainMemory(**parts, reserved_gib=round(capacity - sum(parts.values()), 3),
                        capacity_gib=capacity)


def total_gib(m: DomainMemory) -> float:
    return m.weights_gib + m.kv_gib + m.engram_gib + m.pool_gib + m.workspace_gib \
        + m.reserved_gib

"""vLLM's memory budget (`--gpu-memory-utilization`) from the plan's memory map.

vLLM allocates the weights (Engram tables in HBM are weights to it), its KV cache and its
workspace from one budget: a fraction of each GPU's memory. vLLM 0.33's Mooncake store registers
host DRAM only and cannot take an HBM segment, so the HBM the plan lends to the pool is given to
the engine's own KV cache (a prefill rank's local prefix cache, which the KV router sees) and is
inside the budget too; only what the map leaves free (headroom) stays outside. The fraction is
the tightest GPU's, rounded down to 2 decimals so that vLLM never exceeds the map.
"""

import math

from compiler.plan import DomainMemory, Instance, Plan
from targets._errors import TargetError


def gpu_domains(plan: Plan, gpu: str) -> tuple[DomainMemory, ...]:
    ids = [f"{gpu}-d{d}" for d in range(plan.hardware.domains_per_gpu)]
    missing = [i for i in ids if i not in plan.memory]
    if missing:
        raise TargetError(f"memory: no entry for memory domains {missing}")
    return tuple(plan.memory[i] for i in ids)


def engine_fraction(domains: tuple[DomainMemory, ...]) -> float:
    engine = sum(d.weights_gib + d.kv_gib + d.engram_gib + d.pool_gib + d.workspace_gib
                 for d in domains)
    return engine / sum(d.capacity_gib for d in domains)


def gpu_memory_utilization(plan: Plan, instance: Instance) -> float:
    fraction = min(engine_fraction(gpu_domains(plan, g)) for g in instance.gpus)
    return math.floor(fraction * 100) / 100

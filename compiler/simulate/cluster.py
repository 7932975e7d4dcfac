"""What the simulator knows of a compiled plan: each instance's DP ranks and their GPUs, trays
and NVLink domains, batch limits, KV capacity, step times; the pool's segments; the links.

The perf contexts come from compiler.perf.predict.context, the KV budget from
compiler.memory.gpu_budget: the same numbers `rackc predict` uses for the plan's layout.
"""

from dataclasses import dataclass

from compiler import arch
from compiler.load import Inputs
from compiler.memory import gpu_budget
from compiler.perf import comm
from compiler.perf.predict import groups as perf_groups
from compiler.perf.serving import Workload
from compiler.plan import Plan
from compiler.shapes import parse_shape
from compiler.simulate.steps import StepTimes

# A Mooncake master lookup (the client's Get of an object's replica list) before a load:
# assumed, one RPC round trip inside the cluster; no public figure for the master's latency.
POOL_LOOKUP_US = 100.0


@dataclass(frozen=True)
class RankInfo:
    gpus: tuple[str, ...]
    trays: tuple[str, ...]
    domain: str  # NVLink domain of its first GPU


@dataclass(frozen=True)
class InstanceInfo:
    id: str
    role: str  # prefill | decode | aggregated
    ranks: tuple[RankInfo, ...]
    max_seqs: int  # per DP rank (--max-num-seqs)
    max_tokens: int  # per DP rank per step (--max-num-batched-tokens)
    kv_tokens: int  # KV cache of one DP rank, in tokens
    steps: StepTimes
    draft_tokens: int
    acceptance: float
    kv_token_bytes: float  # per GPU of a rank, per token of context
    gpus: frozenset[str]
    stores_to_pool: bool  # its KV connectors include the Mooncake store


@dataclass(frozen=True)
class Segment:
    location: str  # tray id (dram) or memory domain id (hbm)
    tray: str
    tokens: int


@dataclass(frozen=True)
class Cluster:
    instances: tuple[InstanceInfo, ...]
    segments: tuple[Segment, ...]  # the Mooncake pool (empty: none)
    block_size: int
    policy: str  # the plan's routing policy
    overlap_credit: float
    kv_bytes_per_token: float  # whole model, one token
    nic_gbps: float
    system_name: str
    rdma_devices_per_tray: int
    inputs: Inputs

    def transfer_us(self, nbytes: float, kind: str) -> float:
        return comm.transfer_us(self.inputs.system, nbytes, kind, self.nic_gbps)


def build_cluster(inputs: Inputs, plan: Plan, w: Workload) -> Cluster:
    """The plan's instances with the perf model's contexts for their groups."""
    from compiler.api import layouts

    perf = {(g.role, g.shape.name): g for g in perf_groups(inputs, layouts(plan.instances), w)}
    instances = []
    steps: dict[tuple[str, str], StepTimes] = {}  # instances of one group share a memo
    for inst in plan.instances:
        shape = parse_shape(inst.shape)
        g = perf[(inst.role, shape.name)]
        per_rank = len(inst.gpus) // max(1, inst.dp)
        ranks = []
        for d in range(inst.dp):
            gpus = tuple(inst.gpus[d * per_rank:(d + 1) * per_rank])
            trays = tuple(dict.fromkeys(plan.tray_of_gpu(x).id for x in gpus))
            ranks.append(RankInfo(gpus, trays, plan.tray_of_gpu(gpus[0]).nvlink_domain))
        mem = gpu_budget(inputs, inst.role, shape, g.ctx.engram_gpus)
        kv_tokens = int(mem.kv_gib * arch.GIB / mem.kv_token_bytes) if mem.kv_token_bytes \
            else 1 << 40
        instances.append(InstanceInfo(
            inst.id, inst.role, tuple(ranks), inst.max_batch, inst.max_batched_tokens,
            kv_tokens, steps.setdefault((inst.role, shape.name), StepTimes(g.ctx, shape)),
            g.ctx.draft_tokens, g.ctx.acceptance,
            mem.kv_token_bytes, frozenset(inst.gpus),
            any("Mooncake" in k for k in inst.kv_connectors)))
    r = inputs.resolved
    per_token = arch.kv_bytes_per_token(inputs.model.spec, r.kv_cache_dtype.value)
    segments = ()
    if plan.kv_pool.enabled:
        segments = tuple(Segment(s.location, s.location.rsplit("-g", 1)[0]
                                 if s.kind == "hbm" else s.location,
                                 int(s.gib * arch.GIB / per_token))
                         for s in plan.kv_pool.segments)
    hw = plan.fleet[0]
    return Cluster(tuple(instances), segments, plan.routing.block_size, plan.routing.policy,
                   plan.routing.overlap_score_credit, per_token, r.nic_gbps_per_gpu.value,
                   inputs.system.name,
                   hw.rdma_devices_per_tray, inputs)


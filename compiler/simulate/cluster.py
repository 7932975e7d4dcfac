"""What the simulator knows of a compiled plan: each instance's DP ranks and their GPUs, trays
and NVLink domains, batch limits, KV capacity, step times; the pool's segments; the links.

The perf contexts come from compiler.perf.predict.context, the KV budget from
compiler.memory.gpu_budget: the same numbers `rackc predict` uses for the plan's layout.
"""

from dataclasses import dataclass, field

from compiler import arch
from compiler.ids import gpu_of_domain, tray_of_gpu
from compiler.load import Inputs
from compiler.memory import gpu_budget
from compiler.perf import comm
from compiler.perf.predict import groups as perf_groups
from compiler.perf.predict import instance_layouts
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
    system: str = ""  # its system's name (a mixed fleet's instances differ)


@dataclass(frozen=True)
class Segment:
    location: str  # tray id (dram) or memory domain id (hbm)
    tray: str
    tokens: int
    system: str = ""  # its tray's system


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
    # a mixed fleet's systems by name: (inputs, NIC Gb/s per GPU, RDMA devices per tray);
    # empty: one system, the fields above
    systems: dict[str, tuple[Inputs, float, int]] = field(default_factory=dict)

    def transfer_us(self, nbytes: float, kind: str, system: str = "") -> float:
        """KV moved over `kind` from (or into) a GPU of `system`, at its links' rates."""
        inputs, nic = self.systems[system][:2] if system in self.systems \
            else (self.inputs, self.nic_gbps)
        return comm.transfer_us(inputs.system, nbytes, kind, nic)

    def rdma_devices(self, system: str = "") -> int:
        return self.systems[system][2] if system in self.systems \
            else self.rdma_devices_per_tray


def build_cluster(inputs: Inputs, plan: Plan, w: Workload,
                  fleet: tuple[Inputs, ...] = ()) -> Cluster:
    """The plan's instances with the perf model's contexts for their groups. A mixed fleet's
    plan takes `fleet`, each group's inputs: an instance is matched to the inputs of its
    system (the system of its first GPU's tray), and its group's perf contexts and KV budget
    are that system's."""
    by_name = {i.system.name: i for i in fleet} or {inputs.system.name: inputs}
    system_of = {inst.id: plan.hardware_of(plan.tray_of_gpu(inst.gpus[0]).id).system
                 for inst in plan.instances} if fleet else {}
    perf = {}
    for name, group in by_name.items():
        mine = [i for i in plan.instances if system_of.get(i.id, name) == name]
        for g in perf_groups(group, instance_layouts(mine), w):
            perf[(name, g.role, g.shape.name)] = g
    instances = []
    steps: dict[tuple[str, str, str], StepTimes] = {}  # instances of one group share a memo
    for inst in plan.instances:
        shape = parse_shape(inst.shape)
        name = system_of.get(inst.id, inputs.system.name)
        group = by_name[name]
        g = perf[(name, inst.role, shape.name)]
        per_rank = len(inst.gpus) // max(1, inst.dp)
        ranks = []
        for d in range(inst.dp):
            gpus = tuple(inst.gpus[d * per_rank:(d + 1) * per_rank])
            trays = tuple(dict.fromkeys(plan.tray_of_gpu(x).id for x in gpus))
            ranks.append(RankInfo(gpus, trays, plan.tray_of_gpu(gpus[0]).nvlink_domain))
        mem = gpu_budget(group, inst.role, shape, g.ctx.engram_gpus)
        kv_tokens = int(mem.kv_gib * arch.GIB / mem.kv_token_bytes) if mem.kv_token_bytes \
            else 1 << 40
        instances.append(InstanceInfo(
            inst.id, inst.role, tuple(ranks), inst.max_batch, inst.max_batched_tokens,
            kv_tokens, steps.setdefault((name, inst.role, shape.name), StepTimes(g.ctx, shape)),
            g.ctx.draft_tokens, g.ctx.acceptance,
            mem.kv_token_bytes, frozenset(inst.gpus),
            any("Mooncake" in k for k in inst.kv_connectors), name if fleet else ""))
    r = inputs.resolved
    per_token = arch.kv_bytes_per_token(inputs.model.spec, r.kv_cache_dtype.value)
    segments = ()
    if plan.kv_pool.enabled:
        segments = tuple(_segment(plan, s, per_token, bool(fleet))
                         for s in plan.kv_pool.segments)
    hw = plan.fleet[0]
    systems = {name: (group, _nic_gbps(group),
                      next(h.rdma_devices_per_tray for h in plan.fleet if h.system == name))
               for name, group in by_name.items()} if fleet else {}
    return Cluster(tuple(instances), segments, plan.routing.block_size, plan.routing.policy,
                   plan.routing.overlap_score_credit, per_token, _nic_gbps(inputs),
                   inputs.system.name, hw.rdma_devices_per_tray, inputs, systems)


def _nic_gbps(inputs: Inputs) -> float:
    return inputs.resolved.nic_gbps_per_gpu.value


def _segment(plan: Plan, s, per_token: float, fleet: bool) -> Segment:
    tray = tray_of_gpu(gpu_of_domain(s.location)) if s.kind == "hbm" else s.location
    return Segment(s.location, tray, int(s.gib * arch.GIB / per_token),
                   plan.hardware_of(tray).system if fleet else "")


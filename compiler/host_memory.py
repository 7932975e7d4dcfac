"""The host memory budget of a tray: what its engines pin in DRAM must fit in what the node
allocates to pods.

Per tray: the Mooncake DRAM segment (the store registers it with the NIC: pinned), the Engram
tables of instances that read them from host memory (one copy per instance and node when its
DP ranks share them, `dp_shared_memory`; a TP instance's ranks hold their TP shards), the
weights each rank offloads (Instance.weight_offload: pinned, for UVA reads or prefetch
copies), each engine rank's process and the store client's transfer buffer, the node's reserve
(capacity less allocatable: the kubelet's reserves and the GPU nodes' DaemonSets), and up to a
GiB per pod, since a pod requests whole GiB (compiler.site). The pool segment takes what is
left, at most the deployment's `dram_fraction`.
"""

from dataclasses import dataclass

from compiler import arch
from compiler.load import Inputs
from compiler.plan import Decision, HostMemory, Instance

ROUNDING_GIB = 1.0  # the most a pod's memory request rounds up (to whole GiB)


@dataclass(frozen=True)
class TrayLoad:
    ranks: int  # engine ranks (GPUs) on the tray
    engram_gib: float  # Engram tables pinned on the tray
    weights_gib: float  # weights offloaded by the tray's ranks
    pods: int  # engine pods on the tray: one per instance
    kinds: tuple[str, ...] = ()  # the (role/shape) of the instances running there


def ranks_on(inst: Instance, tray: str) -> int:
    return sum(1 for g in inst.gpus if g.startswith(tray + "-"))


def engram_share_gib(tables_gib: float, inst: Instance, on_tray: int) -> float:
    """The host Engram one instance pins on a tray where `on_tray` of its ranks run."""
    if inst.engram != "host":
        return 0.0
    return tables_gib if inst.dp > 1 else tables_gib * on_tray / inst.tp


def tray_loads(inputs: Inputs, instances: list[Instance]) -> dict[str, TrayLoad]:
    tables = arch.engram_bytes(inputs.model.spec) / arch.GIB
    ranks: dict[str, int] = {}
    engram: dict[str, float] = {}
    weights: dict[str, float] = {}
    pods: dict[str, int] = {}
    kinds: dict[str, set[str]] = {}
    for inst in instances:
        for tray in inst.trays:
            on_tray = ranks_on(inst, tray)
            ranks[tray] = ranks.get(tray, 0) + on_tray
            engram[tray] = engram.get(tray, 0.0) + engram_share_gib(tables, inst, on_tray)
            weights[tray] = weights.get(tray, 0.0) + on_tray * inst.offload_gib
            pods[tray] = pods.get(tray, 0) + 1
            kinds.setdefault(tray, set()).add(f"{inst.role}/{inst.shape}")
    return {t: TrayLoad(n, engram.get(t, 0.0), weights[t], pods[t], tuple(sorted(kinds[t])))
            for t, n in ranks.items()}


def host_memory(inputs: Inputs, instances: list[Instance]
                ) -> tuple[dict[str, HostMemory], list[Decision]]:
    """Per tray running engines, and a decision for each pool segment the budget trims."""
    r = inputs.resolved
    dram = r.dram_gib_per_tray.value
    per_rank = r.host.process_gib_per_rank + (r.host.mooncake_buffer_gib_per_rank
                                              if r.kv_pool_dram.value else 0.0)
    out, decisions = {}, []
    loads = tray_loads(inputs, instances)
    for tray, load in sorted(loads.items()):
        process = load.ranks * per_rank
        left = dram - r.host.reserved_gib - process - load.engram_gib - load.weights_gib \
            - load.pods * ROUNDING_GIB
        wanted = dram * r.dram_fraction.value if r.kv_pool_dram.value else 0.0
        pool = round(max(0.0, min(wanted, left)), 3)
        if pool < wanted:
            offloaded = f", {load.weights_gib:.1f} GiB of offloaded weights" \
                if load.weights_gib else ""
            decisions.append(Decision(
                path=f"kv_pool.segments.{tray}", value=f"{pool:g} GiB", source="rule:host-memory",
                why=f"{r.dram_fraction.value:g} of {dram:g} GiB asked for, but the tray pins "
                    f"{load.engram_gib:.1f} GiB of Engram tables{offloaded} and "
                    f"{process:.1f} GiB for {load.ranks} engine ranks beside a node reserve of "
                    f"{r.host.reserved_gib:.1f} GiB (and {load.pods} GiB for {load.pods} pods' "
                    "whole-GiB requests)"))
        out[tray] = HostMemory(pool_gib=pool, engram_gib=round(load.engram_gib, 3),
                               process_gib=round(process, 3),
                               reserved_gib=round(r.host.reserved_gib, 3), capacity_gib=dram,
                               weights_gib=round(load.weights_gib, 3))
    decisions += _uniform_per_rank(out, loads)
    return out, decisions


def _uniform_per_rank(out: dict[str, HostMemory], loads: dict[str, TrayLoad]) -> list[Decision]:
    """One pod template serves every instance of a role and shape, and any of its pods may land
    on any of its trays: trays running the same kinds of instance get the same pool segment per
    rank (the smallest), so every pod's memory request fits every tray it may land on. A
    fresh layout fills such trays alike; after a fault (`--from`) a tray may run fewer."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for tray, load in loads.items():
        groups.setdefault(load.kinds, []).append(tray)
    decisions = []
    for trays in groups.values():
        per_rank = min(out[t].pool_gib / loads[t].ranks for t in trays)
        for t in sorted(trays):
            pool = round(per_rank * loads[t].ranks, 3)
            if pool < out[t].pool_gib - 1e-6:
                out[t] = out[t].model_copy(update={"pool_gib": pool})
                decisions.append(Decision(
                    path=f"kv_pool.segments.{t}", value=f"{pool:g} GiB", source="rule:host-memory",
                    why=f"{per_rank:g} GiB per rank, as on the other trays running "
                        f"{', '.join(loads[t].kinds)}: one pod template serves them all"))
    return decisions

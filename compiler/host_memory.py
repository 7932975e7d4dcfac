"""The host memory budget of a tray: what its engines pin in DRAM must fit in what the node
allocates to pods.

Per tray: the Mooncake DRAM segment (the store registers it with the NIC: pinned), the Engram
tables of instances that read them from host memory (one copy per instance and node when its
DP ranks share them, `dp_shared_memory`; a TP instance's ranks hold their TP shards), the
weights each rank offloads (`--cpu-offload-gb`, pinned for UVA reads), each engine rank's
process and the store client's transfer buffer, the node's reserve (capacity less allocatable:
the kubelet's reserves and the GPU nodes' DaemonSets), and up to a GiB per pod, since a pod
requests whole GiB (compiler.site). The pool segment takes what is left, at most the
deployment's `dram_fraction`.
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
    for inst in instances:
        for tray in inst.trays:
            on_tray = ranks_on(inst, tray)
            ranks[tray] = ranks.get(tray, 0) + on_tray
            engram[tray] = engram.get(tray, 0.0) + engram_share_gib(tables, inst, on_tray)
            weights[tray] = weights.get(tray, 0.0) + on_tray * inst.cpu_offload_gib
            pods[tray] = pods.get(tray, 0) + 1
    return {t: TrayLoad(n, engram.get(t, 0.0), weights[t], pods[t]) for t, n in ranks.items()}


def host_memory(inputs: Inputs, instances: list[Instance]
                ) -> tuple[dict[str, HostMemory], list[Decision]]:
    """Per tray running engines, and a decision for each pool segment the budget trims."""
    r = inputs.resolved
    dram = r.dram_gib_per_tray.value
    per_rank = r.host.process_gib_per_rank + (r.host.mooncake_buffer_gib_per_rank
                                              if r.kv_pool_dram.value else 0.0)
    out, decisions = {}, []
    for tray, load in sorted(tray_loads(inputs, instances).items()):
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
    return out, decisions

"""Where an instance's ranks run: one rank group per tray (a Kubernetes node).

A vLLM process per node serves the ranks on that node's GPUs, so an instance of n GPUs on k trays
is k rank groups. Ranks are `instance.gpus` in order; each tray must hold a contiguous run of
them and every tray of a multi-tray instance the same number (vLLM's `--data-parallel-size-local`
and the DGD's GPUs per pod are one value per instance).
"""

from dataclasses import dataclass
from itertools import groupby

from compiler.plan import Instance, Plan
from targets._errors import TargetError


@dataclass(frozen=True)
class RankGroup:
    index: int  # node rank inside the instance; 0 is the leader
    tray: str
    node_name: str
    gpus: tuple[str, ...]  # plan GPU ids, rank order
    device_indices: tuple[int, ...]  # CUDA device index of each GPU on its tray
    first_rank: int

    @property
    def is_leader(self) -> bool:
        return self.index == 0


def tray_of(plan: Plan, gpu: str) -> str:
    return plan.tray_of_gpu(gpu).id


def rank_groups(plan: Plan, instance: Instance) -> tuple[RankGroup, ...]:
    runs = [(tray, tuple(g)) for tray, g in groupby(instance.gpus, key=lambda g: tray_of(plan, g))]
    trays = [tray for tray, _ in runs]
    if len(set(trays)) != len(trays):
        raise TargetError(f"instances[{instance.id}].gpus: the ranks on each tray must be "
                          f"contiguous, got trays in rank order {trays}")
    if set(trays) != set(instance.trays):
        raise TargetError(f"instances[{instance.id}].trays: expected {sorted(trays)} (the trays "
                          f"of its GPUs), got {instance.trays}")
    if len({len(gpus) for _, gpus in runs}) > 1:
        raise TargetError(f"instances[{instance.id}]: every tray must hold the same number of its "
                          f"GPUs, got {[len(gpus) for _, gpus in runs]}")
    groups, first = [], 0
    for index, (tray_id, gpus) in enumerate(runs):
        tray = plan.tray(tray_id)
        groups.append(RankGroup(index, tray_id, tray.node_name, gpus,
                                tuple(tray.gpus.index(g) for g in gpus), first))
        first += len(gpus)
    return tuple(groups)


def gpus_per_node(plan: Plan, instance: Instance) -> int:
    return len(rank_groups(plan, instance)[0].gpus)


def multi_node_nvlink(plan: Plan, instance: Instance) -> bool:
    """NVL72 racks: an NVLink domain spans trays (nodes), so pods need an IMEX channel of a
    ComputeDomain; on HGX each node is its own domain and needs none. (A mixed fleet: the
    instance's group decides.)"""
    return plan.system_of(instance).form == "nvl72"


def nvlink_domain(plan: Plan, instance: Instance) -> str:
    domains = sorted({plan.tray(t).nvlink_domain for t in instance.trays})
    if len(domains) != 1:
        raise TargetError(f"instances[{instance.id}]: an instance stays in one NVLink domain, "
                          f"got {domains}")
    return domains[0]


def claims_channel(plan: Plan, instance: Instance, nodes_per_instance: int) -> bool:
    """Pods claim their ComputeDomain's IMEX channel only when their instance spans trays.

    The DRA driver prepares channel 0 of a node for one ResourceClaim only
    (compute-domain-kubelet-plugin device_state.go, assertImexChannelNotAllocated), and a
    channel claim's config names the ComputeDomain by UID, so no shared claim can be written
    ahead; two pods on a tray each claiming from the template leave one Pending. A single-tray
    instance needs no channel: its collectives stay inside the node, its KV leaves over RDMA."""
    return multi_node_nvlink(plan, instance) and nodes_per_instance > 1

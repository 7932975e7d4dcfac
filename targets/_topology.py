"""Where an instance's ranks run, as the plan records it (compiler.deploy: one rank group per
tray, a Kubernetes node), and which NVLink domain and IMEX channel its pods need."""

from compiler.plan import Instance, Plan
from targets._errors import TargetError


def gpus_per_node(instance: Instance) -> int:
    return len(instance.rank_groups[0].gpus)


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

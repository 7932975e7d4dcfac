"""Serving components: one Kubernetes workload (a DGD component, a LeaderWorkerSet) per
instance, so that its pods' node affinity names that instance's trays and no other: the
placement in plan.yaml (which instance runs where, the Engram shard map, what `--from` keeps)
is what the scheduler does. Replicas of one template would share one affinity over the union of
their trays, and the scheduler could interleave them (bundle review 3, S3-09). Dynamo joins the
components of one role into one backend (dynamo.vllm registers every decode worker as
`backend`, every prefill worker as `prefill`: dynamo/vllm/args.py), and lws/'s router finds
leaders by label, so serving is unchanged. On NVL72 racks a component stays in one NVLink
domain, whose ComputeDomain channel its pods claim. Names are `<instance id>-<shape>`.
"""

from dataclasses import dataclass
from itertools import groupby
from typing import NamedTuple

from compiler.plan import Instance, Plan
from targets._errors import TargetError
from targets._topology import gpus_per_node, multi_node_nvlink, nvlink_domain


@dataclass(frozen=True)
class Component:
    name: str  # DNS label, unique in the plan
    role: str
    shape: str
    domain: str  # the NVLink domain on NVL72 racks, else ""
    instances: tuple[Instance, ...]
    nodes_per_instance: int
    gpus_per_node: int
    node_names: tuple[str, ...]  # the nodes of all its trays, sorted


class _Key(NamedTuple):
    """What a component is: one instance, and what its template is made of."""

    instance: str
    role: str
    shape: str
    domain: str
    group: str  # a mixed fleet's group, else ""
    dp: int
    tp: int
    ep: int
    pp: int
    max_batch: int
    max_batched_tokens: int


def _key(plan: Plan, i: Instance) -> _Key:
    domain = nvlink_domain(plan, i) if multi_node_nvlink(plan, i) else ""
    return _Key(i.id, i.role, i.shape, domain, i.group or "", i.dp, i.tp, i.ep, i.pp,
                i.max_batch, i.max_batched_tokens)


def by_group(plan: Plan, comps: tuple[Component, ...]
             ) -> list[tuple[str | None, list[Component]]]:
    """(router, its components) per router of the plan (`Plan.routes`: its routing groups,
    or a mixed fleet's groups), else (None, all of them): each is served by its own frontend
    or router, so no request is prefilled and decoded under two of them."""
    names = plan.routes
    if names is None:
        return [(None, list(comps))]
    return [(n, [c for c in comps if plan.route_of(c.instances[0]) == n]) for n in names]


def components(plan: Plan) -> tuple[Component, ...]:
    def key(instance: Instance) -> _Key:
        return _key(plan, instance)

    groups = [(k, tuple(g)) for k, g in groupby(sorted(plan.instances, key=key), key=key)]
    out = []
    for k, instances in groups:
        nodes = {len(i.trays) for i in instances}
        per_node = {gpus_per_node(i) for i in instances}
        if len(nodes) > 1 or len(per_node) > 1:
            raise TargetError(f"instances {[i.id for i in instances]} ({k.role} {k.shape}) span "
                              f"different numbers of trays or GPUs per tray")
        node_names = sorted({plan.tray(t).node_name for i in instances for t in i.trays})
        out.append(Component(instances[0].workload, k.role, k.shape, k.domain, instances,
                             nodes.pop(), per_node.pop(), tuple(node_names)))
    return tuple(out)

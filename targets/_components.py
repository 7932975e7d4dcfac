"""Serving components: the instances that one Kubernetes workload template can run.

Instances of one role, shape and batch limits are replicas of one component (a DGD component, a
LeaderWorkerSet): same engine arguments, same GPUs per pod. On NVL72 racks a component also stays
in one NVLink domain, whose ComputeDomain channel its pods claim. Its replicas land on the set of
trays the plan chose for them. Names are `<role>-<shape>`, with the domain and the batch limits
appended only where that name alone would be ambiguous.
"""

from dataclasses import dataclass
from itertools import groupby
from typing import NamedTuple

from compiler.plan import Instance, Plan
from targets._errors import TargetError
from targets._names import dns_label
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
    """What replicas of one component share."""

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
    return _Key(i.role, i.shape, domain, i.group or "", i.dp, i.tp, i.ep, i.pp, i.max_batch,
                i.max_batched_tokens)


def _name(key: _Key, keys: list[_Key]) -> str:
    same_shape = [k for k in keys if (k.role, k.shape) == (key.role, key.shape)]
    parts = [key.role, key.shape]
    if len({k.group for k in same_shape}) > 1 and not key.domain:
        parts.append(key.group)
    if len({k.domain for k in same_shape}) > 1 and key.domain:
        parts.append(key.domain)
    if len([k for k in same_shape if k.domain == key.domain]) > 1:
        parts += [f"b{key.max_batch}", f"t{key.max_batched_tokens}"]
    return dns_label(*parts)


def components(plan: Plan) -> tuple[Component, ...]:
    def key(instance: Instance) -> _Key:
        return _key(plan, instance)

    groups = [(k, tuple(g)) for k, g in groupby(sorted(plan.instances, key=key), key=key)]
    keys = [k for k, _ in groups]
    out = []
    for k, instances in groups:
        nodes = {len(i.trays) for i in instances}
        per_node = {gpus_per_node(plan, i) for i in instances}
        if len(nodes) > 1 or len(per_node) > 1:
            raise TargetError(f"instances {[i.id for i in instances]} ({k.role} {k.shape}) span "
                              f"different numbers of trays or GPUs per tray")
        node_names = sorted({plan.tray(t).node_name for i in instances for t in i.trays})
        out.append(Component(_name(k, keys), k.role, k.shape, k.domain, instances, nodes.pop(),
                             per_node.pop(), tuple(node_names)))
    return tuple(out)

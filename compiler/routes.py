"""Routing groups: which prefill and decode instances one router pairs (the one owner of the
rule).

The routers rackc emits pick a request's prefill instance and its decode instance each on its
own, among the instances they serve: Dynamo 1.6.1's frontend (its KV router: the prefill worker
with the least uncached work, the decode worker by its active blocks; none of its options,
`dynamo/common/configuration/groups/kv_router_args.py`, knows where a worker runs) and
vllm-router (the pods its selectors match). Dynamo's global router picks pools from a grid of
prompt length and latency targets, the prefill pool and the decode pool apart, not by load
(`dynamo/global_router/pool_selection.py`). So a request's KV stays in its NVLink domain only
where its router serves one domain, and the rule is:

- NVL72 racks, more than one: an NVLink domain that holds prefill and decode instances is a
  routing group of its own (named after the domain), whose hand-offs stay on NVLink; the
  domains that hold one role form one shared group (`SHARED`), every hand-off of which leaves
  its domain over the NICs (compiler/perf/handoff.py).
- HGX nodes, more than one: one group; instances take whole nodes (or span them over RDMA), so
  every hand-off is priced as leaving its node.
- One NVLink domain, or aggregated serving (no hand-offs): one group, nothing crosses.
- Racks of one role with none of the other alone to hand off to (instances pinned, or kept
  from the running plan: the solver never places its own so): one group for every instance,
  each hand-off priced as crossing.

The count model chooses rack patterns by this rule (compiler/solve/locality.py), lower records
the groups (`routing.groups`), the prediction prices each (compiler/perf/routed.py) and the
targets serve each by its own frontend or router.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compiler.ids import natural
from compiler.load import Inputs, layout

if TYPE_CHECKING:
    from compiler.perf.routed import RouteLayout
    from compiler.plan import Decision, Plan

# the perf model is imported where a layout is priced, not with the rule: `rackc check` asks
# whether a pinned layout needs its placement (`by_domain`) without loading it

SHARED = "shared"  # the group of the domains that hold one role
ALL = "all"  # the one group of a layout that is not split by domain
BOTH = frozenset({"prefill", "decode"})

# (role, shape name, max_batch, max_batched_tokens): an instance as the perf model groups it
InstanceKey = tuple[str, str, int, int]


@dataclass(frozen=True)
class Route:
    name: str
    domains: tuple[str, ...]  # NVLink domains, in order
    cross: float  # share of its hand-offs whose prefill and decode sit in different domains


def nvlink_domains(inputs: Inputs) -> int:
    """NVLink domains of the hardware: NVL72 racks, HGX nodes."""
    racks, trays = layout(inputs.hardware, inputs.system)
    return trays if inputs.system.form == "hgx" else racks


def by_domain(inputs: Inputs) -> bool:
    """Routing groups follow NVLink domains: NVL72 racks, more than one."""
    return inputs.system.form == "nvl72" and nvlink_domains(inputs) > 1


def base_cross(inputs: Inputs) -> float:
    """The share of hand-offs that cross domains in a group not split by domain: all of them
    between HGX nodes, none inside one domain (or inside an NVL72 domain's own group)."""
    return 1.0 if inputs.system.form != "nvl72" and nvlink_domains(inputs) > 1 else 0.0


def holds_both(roles: Iterable[str]) -> bool:
    return set(roles) >= BOTH


def routes(inputs: Inputs, roles: Mapping[str, set[str]]) -> list[Route]:
    """The routing groups of a layout from the roles each NVLink domain holds (in order)."""
    used = {d: r for d, r in roles.items() if r}
    if not by_domain(inputs) or not any(r & BOTH for r in used.values()):
        return [Route(ALL, tuple(used), base_cross(inputs))]
    own = [Route(d, (d,), 0.0) for d, r in used.items() if holds_both(r)]
    rest = tuple(d for d, r in used.items() if not holds_both(r))
    if rest and not holds_both(set().union(*(used[d] for d in rest))):
        return [Route(ALL, tuple(used), 1.0)]  # racks of one role with none to pair with
    return own + ([Route(SHARED, rest, 1.0)] if rest else [])


def route_layouts(inputs: Inputs, by_dom: Mapping[str, list[InstanceKey]]
                  ) -> tuple[list[Route], list["RouteLayout"]]:
    """The groups of a layout given per NVLink domain, and what each serves for the perf
    model (identical groups once, counted)."""
    from compiler.perf.predict import grouped_layouts
    from compiler.perf.routed import RouteLayout

    found = routes(inputs, {d: {k[0] for k in keys} for d, keys in by_dom.items()})
    counts: dict[RouteLayout, int] = {}
    for r in found:
        layouts = tuple(grouped_layouts(k for d in r.domains for k in by_dom[d]))
        key = RouteLayout(layouts, r.cross)
        counts[key] = counts.get(key, 0) + 1
    return found, [RouteLayout(k.layouts, k.cross, n) for k, n in counts.items()]


def of_instances(inputs: Inputs, placed: Iterable[tuple[str, InstanceKey]]
                 ) -> tuple[list[Route], list["RouteLayout"]]:
    """route_layouts of instances given with their NVLink domain (their first GPU's)."""
    by_dom: dict[str, list[InstanceKey]] = {}
    for domain, key in placed:
        by_dom.setdefault(domain, []).append(key)
    return route_layouts(inputs, {d: by_dom[d] for d in sorted(by_dom, key=natural)})


def of_plan(inputs: Inputs, plan: "Plan") -> tuple[list[Route], list["RouteLayout"]]:
    """The routing groups of a one-system plan's instances."""
    return of_instances(inputs, ((plan.tray(i.trays[0]).nvlink_domain,
                                  (i.role, i.shape, i.max_batch, i.max_batched_tokens))
                                 for i in plan.instances))


def one_route(inputs: Inputs, instances: Iterable[InstanceKey]) -> list["RouteLayout"]:
    """A layout whose placement is not known, served by one group (a pinned layout on one
    domain or on HGX: compiler.pinned)."""
    from compiler.perf.predict import grouped_layouts
    from compiler.perf.routed import RouteLayout

    return [RouteLayout(tuple(grouped_layouts(instances)), base_cross(inputs))]


def decision(found: list[Route]) -> "Decision":
    """Why the plan has several routers (`routing.groups`)."""
    from compiler.plan import Decision

    own = [r.name for r in found if r.name != SHARED]
    shared = next((r for r in found if r.name == SHARED), None)
    value = f"{len(found)} groups: " + ", ".join(own) + (
        f"{', ' if own else ''}{SHARED} ({len(shared.domains)} domains)" if shared else "")
    return Decision(
        path="routing.groups", value=value, source="rule:routing-groups",
        why="Dynamo 1.6.1's KV router and vllm-router pick a request's prefill and its decode "
            "instance each on its own among those they serve, knowing no NVLink domain "
            "(dynamo/common/configuration/groups/kv_router_args.py; Dynamo's global router "
            "picks pools by prompt length and latency targets, not by load: "
            "dynamo/global_router/pool_selection.py), so each NVLink domain that holds prefill "
            "and decode is served by its own frontend and router (its hand-offs stay on "
            "NVLink), and the domains that hold one role by one shared group, whose hand-offs "
            "cross domains over the NICs; the solver priced each group so "
            "(compiler/solve/locality.py)")


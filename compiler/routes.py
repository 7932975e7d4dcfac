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

A router's group is one Dynamo graph, which holds at most `graph.max_components` components
(catalog/engines/dynamo.yaml), its frontend and one per instance: a group of more instances is
dealt into parts that each hold at most that many and every role the group holds (`parts`),
each served by its own frontend: whole NVLink domains where they can be dealt so, else trays
(a part's hand-offs cross domains as its group's do), as many parts as serve most of the group
together (`_deal`); a recompile's kept instances stay in their part. A group no dealing can
split (one tray too full, one role on too few trays) stays whole, and `rackc validate`'s
graph-components (E842) refuses its graph.

The count model chooses rack patterns by this rule (compiler/solve/locality.py), lower records
the groups (`routing.groups`), the prediction prices each (compiler/perf/routed.py) and the
targets serve each by its own frontend or router.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compiler.ids import natural
from compiler.load import Inputs, layout
from compiler.shapes import parse_shape

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
    trays: tuple[str, ...] = ()  # a part of a split domain: only these trays' instances


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


def graph_instances(inputs: Inputs) -> int:
    """The instances one router's graph serves at most: its components less the frontend."""
    return inputs.resolved.engines.dynamo.graph.max_components.value - 1


Unit = tuple[str, str]  # (NVLink domain, tray): the instances whose first GPU is on the tray


def _roles(keys: Iterable[InstanceKey]) -> set[str]:
    return {k[0] for k in keys}


def members(r: Route, units: Mapping[Unit, list[InstanceKey]]) -> list[InstanceKey]:
    """The instances a group serves: those of its domains, or of its trays where it is a part
    of a split domain."""
    return [k for (d, t), keys in units.items()
            if d in r.domains and (not r.trays or t in r.trays) for k in keys]


def _gpus(keys: Iterable[InstanceKey]) -> dict[str, int]:
    """GPUs per role: what a part's share of the group's supply of each role scales with."""
    out: dict[str, int] = {}
    for k in keys:
        out[k[0]] = out.get(k[0], 0) + parse_shape(k[1]).gpus
    return out


EXTRA_PARTS = 2  # parts beyond the fewest that are tried: one more frontend pod each


def _deal(order: list, size: Callable[[object], list[InstanceKey]], count: int, most: int,
          roles: set[str], fixed: Mapping[object, int]) -> list[list] | None:
    """`order` dealt into parts that each hold at most `most` instances and every one of
    `roles` (None: no number of parts does), so that the parts serve together as much of the
    group as they can: a part serves the smallest of its shares of the group's GPUs of each
    role (its supply of each scales with them). From the fewest parts up to EXTRA_PARTS more,
    the dealing that serves most, the fewest parts among equals. Those of `fixed` stay in
    their part (a recompile's kept instances keep their graph); the others, largest first,
    each go to the part whose served share they raise most (ties: the part that lacks most of
    what they bring, then the first)."""
    total = _gpus(key for x in order for key in size(x))

    def served(have: dict[str, int]) -> float:
        return min(have.get(r, 0) / total[r] for r in total)

    first = max(-(-count // most), max(fixed.values(), default=-1) + 1)
    best: tuple[float, list[list]] | None = None
    for k in range(first, min(len(order), first + EXTRA_PARTS) + 1):
        dealt = _deal_into(order, size, k, most, fixed, total, served)
        if dealt is None or any(_roles(key for x in part for key in size(x)) != roles
                                for part in dealt):
            continue
        share = round(sum(served(_gpus(key for x in part for key in size(x)))
                          for part in dealt), 9)
        if best is None or share > best[0]:
            best = (share, dealt)
    return None if best is None else best[1]


def _deal_into(order: list, size: Callable[[object], list[InstanceKey]], k: int, most: int,
               fixed: Mapping[object, int], total: dict[str, int],
               served: Callable[[dict[str, int]], float]) -> list[list] | None:
    dealt: list[list] = [[] for _ in range(k)]
    held = [0] * k
    have: list[dict[str, int]] = [{} for _ in range(k)]
    for x in sorted(order, key=lambda x: (x not in fixed, -len(size(x)))):  # stable
        brings = _gpus(size(x))
        room = [j for j in range(k) if held[j] + len(size(x)) <= most
                and (x not in fixed or j == fixed[x])]
        if not room:
            return None

        def gain(j: int) -> tuple[float, float, int]:
            after = {r: have[j].get(r, 0) + brings.get(r, 0) for r in total}
            lacks = sum(n * (total[r] / k - have[j].get(r, 0)) for r, n in brings.items())
            return served(after) - served(have[j]), lacks, -j
        j = max(room, key=gain)
        dealt[j].append(x)
        held[j] += len(size(x))
        for r, n in brings.items():
            have[j][r] = have[j].get(r, 0) + n
    return dealt


def _part_of(name: str, previous: Iterable[str | None]) -> int | None:
    """The one part `<name>-<k>` a unit's kept instances were served by (its index), if any."""
    was = {p for p in previous if p is not None}
    if len(was) != 1:
        return None
    (old,) = was
    head, _, k = old.rpartition("-")
    return int(k) - 1 if head == name and k.isdigit() and int(k) >= 1 else None


def parts(r: Route, units: Mapping[Unit, list[InstanceKey]], most: int,
          previous: Mapping[Unit, str] | None = None) -> list[Route]:
    """`r` as groups that each hold at most `most` instances and every role `r` holds, named
    `<name>-<k>` (how many: `_deal`): of whole domains where they can be dealt so, else of
    trays; `r` itself where it fits (and was not split before) or cannot be split. Alike
    domains (trays) are next to each other in the order dealt, so that like parts get like
    ones. `previous`: the part that served a tray's kept instances in the plan being
    recompiled, where they stay."""
    previous = previous or {}
    mine = {u: keys for u, keys in units.items() if u[0] in r.domains}
    count = sum(len(keys) for keys in mine.values())
    was_split = any(_part_of(r.name, [previous.get(u)]) is not None for u in mine)
    if count <= most and not was_split:  # a recompile keeps the parts its kept ones were in
        return [r]
    roles = _roles(k for keys in mine.values() for k in keys)
    by_dom: dict[str, list[InstanceKey]] = {}
    for (d, _), keys in mine.items():
        by_dom.setdefault(d, []).extend(keys)
    order = sorted(by_dom, key=lambda d: (sorted(by_dom[d]), natural(d)))
    was = {d: _part_of(r.name, (previous.get(u) for u in mine if u[0] == d)) for d in order}
    if all(was[d] is not None or not any(u in previous for u in mine if u[0] == d)
           for d in order):  # no domain's kept instances were in two parts
        dealt = _deal(order, by_dom.__getitem__, count, most, roles,
                      {d: j for d, j in was.items() if j is not None})
        if dealt is not None:
            return [Route(f"{r.name}-{j + 1}", tuple(sorted(part, key=natural)), r.cross)
                    for j, part in enumerate(dealt)]
    trays = sorted(mine, key=lambda u: (sorted(mine[u]), natural(u[0]), natural(u[1])))
    fixed = {u: j for u in trays if (j := _part_of(r.name, [previous.get(u)])) is not None}
    dealt = _deal(trays, mine.__getitem__, count, most, roles, fixed)
    if dealt is None and fixed:  # the kept parts cannot take what is new: deal afresh
        dealt = _deal(trays, mine.__getitem__, count, most, roles, {})
    if dealt is None:
        return [r]
    return [Route(f"{r.name}-{j + 1}", tuple(sorted({d for d, _ in part}, key=natural)), r.cross,
                  tuple(sorted((t for _, t in part), key=natural)))
            for j, part in enumerate(dealt)]


def route_layouts(inputs: Inputs, units: Mapping[Unit, list[InstanceKey]],
                  previous: Mapping[Unit, str] | None = None
                  ) -> tuple[list[Route], list["RouteLayout"]]:
    """The groups of a layout given per tray, and what each serves for the perf model
    (identical groups once, counted); `previous` as `parts` takes it."""
    roles: dict[str, set[str]] = {}
    for (d, _), keys in units.items():
        roles.setdefault(d, set()).update(_roles(keys))
    most = graph_instances(inputs)
    found = [part for r in routes(inputs, roles) for part in parts(r, units, most, previous)]
    return found, _layouts(found, lambda r: members(r, units))


def _layouts(found: list[Route], served: Callable[[Route], list[InstanceKey]]
             ) -> list["RouteLayout"]:
    from compiler.perf.predict import grouped_layouts
    from compiler.perf.routed import RouteLayout

    counts: dict[RouteLayout, int] = {}
    for r in found:
        key = RouteLayout(tuple(grouped_layouts(served(r))), r.cross)
        counts[key] = counts.get(key, 0) + 1
    return [RouteLayout(k.layouts, k.cross, n) for k, n in counts.items()]


def of_instances(inputs: Inputs, placed: Iterable[tuple[str, str, InstanceKey]],
                 previous: Mapping[Unit, str] | None = None
                 ) -> tuple[list[Route], list["RouteLayout"]]:
    """route_layouts of instances given with the NVLink domain and tray of their first GPU."""
    units: dict[Unit, list[InstanceKey]] = {}
    for domain, tray, key in placed:
        units.setdefault((domain, tray), []).append(key)
    return route_layouts(inputs, {u: units[u] for u in
                                  sorted(units, key=lambda u: (natural(u[0]), natural(u[1])))},
                         previous)


def of_plan(inputs: Inputs, plan: "Plan") -> tuple[list[Route], list["RouteLayout"]]:
    """The routing groups of a one-system plan's instances: those it records (lower dealt
    them, a recompile keeping its kept instances' parts), else the rule's one group."""
    def key(i) -> InstanceKey:
        return i.role, i.shape, i.max_batch, i.max_batched_tokens

    if plan.routing.groups:
        found = [Route(g.name, tuple(g.domains), g.cross_domain_share, tuple(g.trays))
                 for g in plan.routing.groups]
        return found, _layouts(found, lambda r: [key(i) for i in plan.instances
                                                 if plan.route_of(i) == r.name])
    return of_instances(inputs, ((plan.tray(i.trays[0]).nvlink_domain, i.trays[0], key(i))
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

    value = f"{len(found)} groups: " + ", ".join(
        r.name + (f" ({len(r.domains)} domains)" if len(r.domains) > 1 else "") for r in found)
    split = any(r.name not in r.domains and r.name not in (SHARED, ALL) for r in found)
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
            "(compiler/solve/locality.py)" + (
                "; a group of more instances than one Dynamo graph holds (its components, "
                "frontend included, at most catalog/engines/dynamo.yaml graph.max_components) "
                "is dealt into parts that each hold every role it holds, by whole domains "
                "where they can be dealt so, else by tray, as many as serve most of the "
                "group (each part its own graph and frontend; a recompile keeps the kept "
                "instances in their part)" if split else ""))


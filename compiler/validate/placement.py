"""Can the scheduler place every pod of a bundle on the nodes of the rack manifest? A small
CP-SAT model of what kube-scheduler and the DRA allocator enforce per node: each resource's
requests within the node's capacity, one ComputeDomain channel per node, and each host port
bound once per node. Pods of a group are interchangeable, so the model counts pods per (group,
node). When no placement exists, the families of constraints are added one at a time and the
first that makes it impossible is blamed, on the groups whose eligible nodes cannot hold what
is asked of them (Hall's condition), or on every group it constrains when no single set is short.
"""

from dataclasses import dataclass
from fractions import Fraction
from math import ceil, floor

from compiler.cpsat import cp_model
from compiler.validate.pods import Node

SOLVER_SECONDS = 10.0
# Integer units the model counts resources in: milli-CPU, MiB, whole devices.
_UNITS = {"cpu": Fraction(1, 1000), "memory": Fraction(2**20)}


@dataclass(frozen=True)
class Demand:
    """One group of identical pods, as the placement sees it."""

    key: int  # index in the caller's list
    pods: int
    nodes: tuple[int, ...]  # indices of the nodes it may run on
    resources: tuple[tuple[str, Fraction], ...]  # per pod
    channel_template: bool = False  # each pod claims its own channel from a template
    channel_claim: str | None = None  # all pods share this claim (one channel, one node)
    host_ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class Shortfall:
    family: str  # "resource:<name>" | "channel" | "port:<n>"
    keys: tuple[int, ...]  # the groups blamed
    nodes: tuple[int, ...]  # the nodes they may use
    asked: Fraction
    offered: Fraction


def _amount(resource: str, value: Fraction, cap: bool) -> int:
    scaled = value / _UNITS.get(resource, Fraction(1))
    return floor(scaled) if cap else ceil(scaled)


def _families(demands: list[Demand], nodes: list[Node]) -> list[str]:
    resources = sorted({r for d in demands for r, v in d.resources if v > 0 and any(
        r in nodes[n].capacity for n in d.nodes)})
    ports = sorted({p for d in demands for p in d.host_ports})
    channel = any(d.channel_template or d.channel_claim for d in demands)
    return [f"resource:{r}" for r in resources] + (["channel"] if channel else []) + \
        [f"port:{p}" for p in ports]


def _uses(d: Demand, family: str) -> Fraction:
    """What one pod of `d` takes of a family's per-node capacity (a shared claim: see _solve)."""
    kind, _, name = family.partition(":")
    if kind == "resource":
        return dict(d.resources).get(name, Fraction(0))
    if kind == "channel":
        return Fraction(1 if d.channel_template else 0)
    return Fraction(1 if int(name) in d.host_ports else 0)


def _capacity(node: Node, family: str) -> Fraction:
    kind, _, name = family.partition(":")
    return node.capacity.get(name, Fraction(0)) if kind == "resource" else Fraction(1)


def _feasible(demands: list[Demand], nodes: list[Node], families: list[str]) -> bool:
    model = cp_model.CpModel()
    count = {(d.key, n): model.NewIntVar(0, d.pods, f"y{d.key}_{n}") for d in demands
             for n in d.nodes}
    claims = sorted({d.channel_claim for d in demands if d.channel_claim})
    on = {(c, n): model.NewBoolVar(f"z{c}_{n}") for c in claims for n in range(len(nodes))}
    for d in demands:
        model.Add(sum(count[d.key, n] for n in d.nodes) == d.pods)
        if d.channel_claim:  # a claim is allocated on one node; its pods run there
            for n in range(len(nodes)):
                if n in d.nodes:
                    model.Add(count[d.key, n] <= d.pods * on[d.channel_claim, n])
                else:
                    model.Add(on[d.channel_claim, n] == 0)
    for c in claims:
        model.AddExactlyOne(on[c, n] for n in range(len(nodes)))
    for family in families:
        resource = family.partition(":")[2] if family.startswith("resource:") else ""
        for n, node in enumerate(nodes):
            terms = [count[d.key, n] * _amount(resource, _uses(d, family), cap=False)
                     if resource else count[d.key, n] * int(_uses(d, family))
                     for d in demands if n in d.nodes and _uses(d, family) > 0]
            if family == "channel":
                terms += [on[c, n] for c in claims]
            if terms:
                cap = _amount(resource, _capacity(node, family), cap=True) if resource else 1
                model.Add(sum(terms) <= cap)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = SOLVER_SECONDS
    solver.parameters.catch_sigint_signal = False  # its handler would leave ^C at SIG_DFL
    return solver.Solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def _hall(demands: list[Demand], nodes: list[Node], family: str) -> list[Shortfall]:
    out = []
    seen: set[tuple[int, ...]] = set()
    for d in demands:
        if (_uses(d, family) == 0 and not (family == "channel" and d.channel_claim)) \
                or d.nodes in seen:
            continue
        seen.add(d.nodes)
        inside = [e for e in demands if set(e.nodes) <= set(d.nodes)]
        asked = sum((e.pods * _uses(e, family) for e in inside), Fraction(0))
        if family == "channel":
            asked += len({e.channel_claim for e in inside if e.channel_claim})
        offered = sum((_capacity(nodes[n], family) for n in d.nodes), Fraction(0))
        if asked > offered:
            keys = tuple(e.key for e in inside if _uses(e, family) > 0 or
                         (family == "channel" and e.channel_claim))
            out.append(Shortfall(family, keys, d.nodes, asked, offered))
    return out


def shortfalls(demands: list[Demand], nodes: list[Node]) -> list[Shortfall]:
    """Empty when every pod can be placed; else what cannot be held, for the first family of
    constraints that makes placement impossible."""
    families = _families(demands, nodes)
    if _feasible(demands, nodes, families):
        return []
    added: list[str] = []
    for family in families:
        added.append(family)
        if not _feasible(demands, nodes, added):
            found = _hall(demands, nodes, family)
            if found:
                return found
            keys = tuple(d.key for d in demands if _uses(d, family) > 0)
            all_nodes = tuple(sorted({n for d in demands for n in d.nodes}))
            return [Shortfall(family, keys, all_nodes, Fraction(-1), Fraction(-1))]
    return []



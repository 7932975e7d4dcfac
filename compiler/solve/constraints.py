"""One small function per rule of the CP-SAT models (counts, then placement).

Count model: how many instances of each candidate shape. Placement model: which GPUs each
instance takes. Every function adds its rule to `model` and returns nothing; requirement
literals (`lits`) make user requirements switchable for infeasibility explanations.
"""

import functools
import math
from dataclasses import dataclass, field

from compiler.cpsat import cp_model
from compiler.solve import racks
from compiler.solve.problem import Problem, scaled_supply
from compiler.solve.routed_patterns import routed_patterns


@dataclass
class CountVars:
    n: dict[int, cp_model.IntVar]  # candidate index -> instance count
    goodput: cp_model.IntVar
    lits: dict[str, cp_model.IntVar]
    tray_free: dict[str, cp_model.LinearExprT] = field(default_factory=dict)  # tray usable whole
    kept: dict[int, int] = field(default_factory=dict)  # candidate index -> kept instances
    capacity: racks.Capacity | None = None
    aggregated: cp_model.IntVar | None = None  # 1: aggregated serving, 0: prefill + decode
    allowed: frozenset[int] | None = None  # candidates that may have instances (None: all)


def add_tray_availability(m: cp_model.CpModel, v: CountVars, p: Problem) -> None:
    """A tray that an `unavailable` entry touches is whole-tray usable iff no active entry
    touches it; one a kept instance holds a GPU of, never (trays nothing touches: always)."""
    occupied = p.occupied
    for d in p.domains:
        for t in d.trays:
            gpus = set(p.gpus_of(t))
            touching = [v.lits[k] for k, down in sorted(p.unavailable.items()) if down & gpus]
            if occupied & gpus:
                v.tray_free[t] = 0
                continue
            if not touching:
                continue
            free = m.new_bool_var(f"free[{t}]")
            for lit in touching:
                m.add_implication(lit, free.Not())
            m.add_bool_or([free, *touching])
            v.tray_free[t] = free


def add_gpu_capacity(m: cp_model.CpModel, v: CountVars, p: Problem) -> None:
    """Per NVLink domain: whole-tray instances on free trays of one rack, sub-tray instances in
    what is left (aligned blocks of partly available trays count conservatively: every
    unavailable entry active). See compiler/solve/racks.py."""
    counts = [v.n.get(i, 0) for i in range(len(p.candidates))]
    fewer = None
    if p.routed and p.mode != "pinned":  # pinned counts are exact: every pattern counts
        placed = [j for j, it in enumerate(items(p)) if it.trays or it.per_rack]
        fewer = functools.partial(routed_patterns, p, placed, v.allowed)
    v.capacity = racks.add_capacity(m, p, items(p), counts, v.tray_free, fewer)


def items(p: Problem) -> list[racks.Item]:
    """What each candidate takes: whole trays, or GPUs inside one tray; where routing groups
    follow NVLink domains, a sub-tray prefill or decode instance is counted in its rack
    (compiler/solve/locality.py: its rack's roles decide its group)."""
    return [racks.Item(p.whole_trays(c.shape.gpus), c.shape.gpus,
                       p.routed and c.role in ("prefill", "decode"))
            for c in p.candidates]


def add_engram_peer_group(m: cp_model.CpModel, v: CountVars, p: Problem) -> None:
    """Prefill ranks share the Engram tables evenly: with P prefill GPUs each holds
    engram / P, so a prefill shape is usable only if P is large enough for its spare HBM."""
    if p.engram_gib <= 0:
        return
    prefill = [(i, c) for i, c in enumerate(p.candidates) if c.role == "prefill" and i in v.n]
    total = sum(instances_of(v, i) * c.shape.gpus for i, c in prefill)
    for i, c in prefill:
        spare = p.hbm_gib - p.prefill_base_gib(c.shape)
        if spare <= 0:
            m.add(v.n[i] == 0)
            continue
        used = m.new_bool_var(f"uses[{i}]")
        m.add(instances_of(v, i) >= 1).only_enforce_if(used)
        m.add(instances_of(v, i) == 0).only_enforce_if(used.Not())
        m.add(total >= math.ceil(p.engram_gib / spare)).only_enforce_if(used)


def add_slo(m: cp_model.CpModel, v: CountVars, p: Problem) -> None:
    """A candidate that cannot meet an SLO stays unused while that SLO requirement holds (each
    SLO it misses on its own: an explanation names the one it misses); one with no supply that
    misses none (no room for a request) stays unused."""
    for i, c in enumerate(p.candidates):
        if i not in v.n or c.requests_per_s > 0:
            continue
        lits = [v.lits.get(key) for key in c.misses]
        if not lits or any(lit is None for lit in lits):
            m.add(v.n[i] == 0)
            continue
        for lit in lits:
            m.add(v.n[i] == 0).only_enforce_if(lit)


def add_pins(m: cp_model.CpModel, v: CountVars, p: Problem) -> None:
    """Pinned mode: each pinned (role, shape) count equals the sum of its entries while they
    hold (a relaxed entry leaves the count free); nothing unpinned is placed."""
    pinned: dict[tuple[str, str], list] = {}
    for pin in p.pins:
        pinned.setdefault((pin.role, pin.shape.name), []).append(pin)
    for i, c in enumerate(p.candidates):
        if i not in v.n:
            continue
        entries = pinned.get((c.role, c.shape.name), [])
        if not entries:
            m.add(v.n[i] == 0)
            continue
        m.add(instances_of(v, i) == sum(e.count for e in entries)).only_enforce_if(
            [v.lits[e.requirement.key] for e in entries])


def add_serve_something(m: cp_model.CpModel, v: CountVars, p: Problem) -> None:
    """A deployment serves one way: prefill and decode both present, or aggregated instances
    alone (vLLM's disaggregated and aggregated workers do not share a frontend here); where
    both are candidates, `v.aggregated` chooses."""
    def total(role: str) -> cp_model.LinearExpr:
        return sum(instances_of(v, i) for i, c in enumerate(p.candidates)
                   if c.role == role and i in v.n)

    roles = {c.role for c in p.candidates}
    aggregated = m.new_bool_var("aggregated")
    if "aggregated" not in roles:
        m.add(aggregated == 0)
    elif not roles & {"prefill", "decode"}:
        m.add(aggregated == 1)
    v.aggregated = aggregated
    if "aggregated" in roles:
        m.add(total("aggregated") >= 1).only_enforce_if(aggregated)
        m.add(total("aggregated") == 0).only_enforce_if(aggregated.Not())
    if roles & {"prefill", "decode"}:
        for role in ("prefill", "decode"):
            m.add(total(role) >= 1).only_enforce_if(aggregated.Not())
            m.add(total(role) == 0).only_enforce_if(aggregated)


def add_goodput(m: cp_model.CpModel, v: CountVars, p: Problem) -> None:
    """Goodput is the smaller of prefill and decode supply (requests/s at the SLO), or the
    aggregated instances' supply, whichever way the layout serves. Where routing groups
    follow NVLink domains, the P/D goodput is also held to what each group serves
    (compiler/solve/locality.py add_domain_goodput, which implies this bound)."""
    for role in ("prefill", "decode", "aggregated"):
        terms = [(i, c) for i, c in enumerate(p.candidates) if c.role == role and i in v.n]
        if terms:
            supply = sum(instances_of(v, i) * scaled_supply(c.requests_per_s) for i, c in terms)
            serving = v.aggregated if role == "aggregated" else v.aggregated.Not()
            m.add(v.goodput <= supply).only_enforce_if(serving)


def supply(v: CountVars, p: Problem) -> cp_model.LinearExpr:
    """Prefill plus decode supply (CP-SAT units): the tie-break after goodput."""
    return sum(instances_of(v, i) * scaled_supply(c.requests_per_s)
               for i, c in enumerate(p.candidates) if i in v.n)


def instances_of(v: CountVars, i: int) -> cp_model.LinearExprT:
    """Instances of candidate i: new ones plus those kept from the running plan."""
    return v.n[i] + v.kept.get(i, 0)

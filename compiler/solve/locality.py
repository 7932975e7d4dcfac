"""The count model's routing groups (compiler/routes.py), where they follow NVLink domains
(NVL72 racks, more than one): balance against locality.

A domain that holds prefill and decode instances is served by its own router, so it serves
the smaller of its own prefill and decode supply, its hand-offs on NVLink. The domains that
hold one role are served together, every hand-off leaving its domain over the NICs: they
serve the smaller of their prefill and decode supply priced so (`Candidate.remote`,
compiler/perf/handoff.py). The goodput adds both up, so the solver pays for balance across
racks on the NICs and in the shared group's rack granularity, and gets nothing for a rack's
prefill that its own decode cannot take.

Racks counted by pattern (compiler/solve/racks.py) carry constants: a pattern's roles and
supplies are known, so each rack of it adds `min(P, D)` or joins the shared group. Racks
counted directly get indicators of the roles they hold. Prefill and decode instances inside
one tray are counted per rack too (compiler/solve/racks.py `Item.per_rack`), since their rack
decides their group. Where instances are fixed (pinned or kept) and leave racks of one role
with none of the other alone, one router serves every instance (`add_one_group`).
"""

from dataclasses import dataclass, field

from compiler import graph
from compiler.cpsat import cp_model
from compiler.perf.capacity import Candidate
from compiler.solve.constraints import CountVars, instances_of
from compiler.solve.problem import GOODPUT_TOP, Domain, Problem, scaled_supply

ROLES = ("prefill", "decode")


@dataclass
class Domains:
    """What the domains add, gathered once from the capacity model's racks."""

    local: list = field(default_factory=list)  # goodput of the domains serving themselves
    prefill: list = field(default_factory=list)  # the shared group's prefill supply
    decode: list = field(default_factory=list)  # and decode supply
    prefill_only: list = field(default_factory=list)  # racks holding prefill alone
    decode_only: list = field(default_factory=list)  # racks holding decode alone
    one: cp_model.IntVar | None = None  # pinned only: one router for every instance


def _total(m: cp_model.CpModel, terms: list, top: int, name: str) -> cp_model.IntVar:
    """A variable equal to the sum of `terms` (which may be none, or constants)."""
    out = m.new_int_var(0, top, name)
    m.add(out == sum(terms))
    return out


def _supplies(c: Candidate) -> tuple[int, int]:
    """(supply in its own domain's group, in the shared group), CP-SAT units (at least one,
    as every supply: compiler/solve/problem.py scaled_supply)."""
    return scaled_supply(c.requests_per_s), scaled_supply(c.remote)


def gather(m: cp_model.CpModel, v: CountVars, p: Problem) -> Domains:
    """Each rack's contribution: its pattern's constants, or a directly counted rack's
    indicators (`_direct`)."""
    out = Domains()
    cap = v.capacity
    for _, ys in cap.patterns:
        for a, y in ys:
            here = {j: x for j, x in zip(cap.whole, a, strict=True) if x}
            sums = _pattern(p, here)
            if sums["prefill"][1] and sums["decode"][1]:
                out.local.append(min(sums["prefill"][0], sums["decode"][0]) * y)
            elif sums["prefill"][1]:
                out.prefill.append(sums["prefill"][2] * y)
                out.prefill_only.append(y)
            elif sums["decode"][1]:
                out.decode.append(sums["decode"][2] * y)
                out.decode_only.append(y)
    kept = _kept_by_domain(p)
    for d in p.domains:
        if d.id in cap.direct:
            _direct(m, p, cap.direct[d.id], kept.get(d.id, {}), out, d)
    return out


def _pattern(p: Problem, here: dict[int, int]) -> dict[str, tuple[int, int, int]]:
    """Per role: (own supply, instances, shared supply) of a pattern's instances."""
    out = {}
    for role in ROLES:
        mine = [(p.candidates[j], n) for j, n in here.items() if p.candidates[j].role == role]
        out[role] = (sum(_supplies(c)[0] * n for c, n in mine), sum(n for _, n in mine),
                     sum(_supplies(c)[1] * n for c, n in mine))
    return out


def _kept_by_domain(p: Problem) -> dict[str, dict[int, int]]:
    """Kept instances per NVLink domain (their first GPU's), by candidate index."""
    index = {(c.role, c.shape.name): i for i, c in enumerate(p.candidates)}
    out: dict[str, dict[int, int]] = {}
    for k in p.kept:
        here = out.setdefault(graph.nvlink_domain_of(p.graph, k.gpus[0]), {})
        i = index[k.role, k.shape.name]
        here[i] = here.get(i, 0) + 1
    return out


def _direct(m: cp_model.CpModel, p: Problem, here: dict[int, cp_model.IntVar],
            kept: dict[int, int], out: Domains, d: Domain) -> None:
    """One rack counted directly: whether it holds each role (new or kept instances), its own
    goodput (zero unless it holds both), and its supply to the shared group (only while it
    holds that role alone)."""
    name = d.id
    # (candidate, instances, at most): the new ones counted in the rack, then the kept ones
    room = len(d.trays) * d.gpus_per_tray
    terms = [(p.candidates[j], x, room // p.candidates[j].shape.gpus) for j, x in here.items()] \
        + [(p.candidates[i], n, n) for i, n in kept.items()]
    top = sum(max(_supplies(c)) * most for c, _, most in terms)
    has, own, shared = {}, {}, {}
    for role in ROLES:
        mine = [(c, x, most) for c, x, most in terms if c.role == role]
        count = _total(m, [x for _, x, _ in mine], sum(most for _, _, most in mine),
                       f"count[{role},{name}]")
        has[role] = m.new_bool_var(f"has[{role},{name}]")
        m.add(count >= 1).only_enforce_if(has[role])
        m.add(count == 0).only_enforce_if(has[role].Not())
        own[role] = sum(_supplies(c)[0] * x for c, x, _ in mine)
        shared[role] = sum(_supplies(c)[1] * x for c, x, _ in mine)
    local = m.new_int_var(0, top, f"local[{name}]")
    m.add(local <= own["prefill"])
    m.add(local <= own["decode"])
    out.local.append(local)
    for role, other, supply, alone in (("prefill", "decode", out.prefill, out.prefill_only),
                                       ("decode", "prefill", out.decode, out.decode_only)):
        only = m.new_bool_var(f"only[{role},{name}]")
        m.add_bool_and([has[role], has[other].Not()]).only_enforce_if(only)
        m.add_bool_or([has[role].Not(), has[other]]).only_enforce_if(only.Not())
        give = m.new_int_var(0, top, f"shared[{role},{name}]")
        m.add(give <= shared[role])
        m.add(give == 0).only_enforce_if(only.Not())
        supply.append(give)
        alone.append(only)


def add_domain_goodput(m: cp_model.CpModel, v: CountVars, p: Problem, doms: Domains) -> None:
    """P/D goodput = what the domains that hold both roles serve, each on its own, plus the
    smaller of the shared group's prefill and decode supply (its hand-offs over the NICs)."""
    if not p.routed:
        return
    top = GOODPUT_TOP
    pooled = m.new_int_var(0, top, "shared_goodput")
    m.add(pooled <= _total(m, doms.prefill, top, "shared_prefill"))
    m.add(pooled <= _total(m, doms.decode, top, "shared_decode"))
    local = _total(m, doms.local, top, "local_goodput")
    m.add(v.goodput <= local + pooled).only_enforce_if([v.aggregated.Not(), _routed(m, doms)])


def add_shared_roles(m: cp_model.CpModel, v: CountVars, p: Problem, doms: Domains) -> None:
    """The shared group holds both roles or no instance: a rack of prefill alone needs a rack
    of decode alone to hand off to, and the other way round (its router would have none).
    Only where one router serves every instance (`add_one_group`) does it hold one role."""
    if not p.routed:
        return
    racks = len(p.domains)
    present = []
    for role, alone in (("prefill", doms.prefill_only), ("decode", doms.decode_only)):
        racks_alone = _total(m, alone, racks, f"racks_alone[{role}]")
        some = m.new_bool_var(f"some_alone[{role}]")
        m.add(racks_alone >= 1).only_enforce_if(some)
        m.add(racks_alone == 0).only_enforce_if(some.Not())
        present.append(some)
    m.add(present[0] == present[1]).only_enforce_if(_routed(m, doms))
    m.add(present[0] != present[1]).only_enforce_if(_one(m, doms))


def add_one_group(m: cp_model.CpModel, v: CountVars, p: Problem, doms: Domains) -> None:
    """Where instances are fixed (pinned, or kept from the running plan) and leave racks of
    one role with none of the other alone, one router serves every instance
    (compiler.routes), each hand-off priced as crossing racks. A layout the solver places
    freely never needs it."""
    if not p.routed:
        return
    if p.mode != "pinned" and not p.kept:
        m.add(_one(m, doms) == 0)
        return
    for role in ROLES:
        supply = sum(instances_of(v, i) * _supplies(c)[1] for i, c in enumerate(p.candidates)
                     if c.role == role and i in v.n)
        m.add(v.goodput <= supply).only_enforce_if([_one(m, doms), v.aggregated.Not()])


def _one(m: cp_model.CpModel, doms: Domains) -> cp_model.IntVar:
    if doms.one is None:
        doms.one = m.new_bool_var("one_group")
    return doms.one


def _routed(m: cp_model.CpModel, doms: Domains) -> cp_model.IntVar:
    return _one(m, doms).Not()

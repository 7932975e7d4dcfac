"""Phase 2 of the solve: which GPUs each instance takes (CP-SAT).

Instances of one (role, shape) are interchangeable, so the model has no per-instance
variables (no symmetry to break): a sub-tray type (DEP2, TP2, ...) takes free aligned blocks of
GPUs inside one tray; a whole-tray type (TP8 on 4-GPU trays, DEP16, ...) takes trays usable
whole, a multiple of its trays-per-instance inside each NVLink domain (HGX: the RDMA cluster).
Both are `racks.free_blocks`, the blocks the count model counts. Instances are cut from
the chosen blocks and trays afterwards, in GPU order. The objective keeps prefill and decode on
separate trays where possible, then keeps each whole-tray type on contiguous runs of trays.

The fleet decomposes by NVLink domain: the count model says how many instances each rack holds
(compiler/solve/racks.py), and each rack gets its own small model, proven optimal or reported
with its own gap; racks with the same trays, availability and instances share one solve.
"""

from dataclasses import dataclass, replace

from compiler.cpsat import cp_model
from compiler.plan import DomainMemory
from compiler.shapes import Shape
from compiler.solve import racks
from compiler.solve.params import gap, solve
from compiler.solve.problem import Domain, Problem

MIXED_TRAY_COST = 1000
RUN_COST = 10


@dataclass(frozen=True)
class Wanted:
    """One instance to place."""

    role: str
    shape: Shape
    need: DomainMemory  # per memory domain of each of its GPUs


@dataclass(frozen=True)
class Kind:
    """All wanted instances of one role and shape."""

    role: str
    shape: Shape
    count: int


@dataclass
class PlaceVars:
    # kind index -> [(var, tray, GPUs it covers)]: an aligned block (sub-tray) or a whole tray
    options: dict[int, list[tuple[cp_model.IntVar, str, tuple[str, ...]]]]
    per_domain: dict[tuple[int, str], cp_model.IntVar]  # whole-tray instances per domain


@dataclass(frozen=True)
class DomainSolve:
    """One per-rack placement model, and the racks that share its solution."""

    domains: tuple[str, ...]
    status: str
    objective: float
    bound: float
    deterministic_seconds: float

    @property
    def gap(self) -> float:
        return gap(self.objective, self.bound)


@dataclass(frozen=True)
class Placement:
    gpus: list[tuple[str, ...]]  # per wanted instance, in rank order
    status: str
    objective: float  # summed over domains
    bound: float
    deterministic_seconds: float
    domains: list[DomainSolve]


def kinds(wanted: list[Wanted]) -> list[Kind]:
    out: dict[tuple[str, Shape], Kind] = {}
    for w in wanted:
        k = out.get((w.role, w.shape))
        out[w.role, w.shape] = Kind(w.role, w.shape, (k.count if k else 0) + 1)
    return list(out.values())


def _per_tray(p: Problem) -> int:
    return p.domains[0].gpus_per_tray


def add_options(m: cp_model.CpModel, p: Problem, ks: list[Kind]) -> PlaceVars:
    """A kind's options are the free aligned blocks of its size (a whole-tray kind: of a tray's
    size, the trays usable whole): `racks.free_blocks`, the rule the count model counts, so no
    option holds an unavailable GPU or one a kept instance holds."""
    down = racks.down_gpus(p)
    opts: dict[int, list] = {}
    for i, k in enumerate(ks):
        whole = p.whole_trays(k.shape.gpus)
        size = _per_tray(p) if whole else k.shape.gpus
        opts[i] = [(m.new_bool_var(f"{'tray' if whole else 'block'}[{i},{t},{gpus[0]}]"), t,
                    gpus)
                   for d in p.domains for t in d.trays
                   for gpus in racks.free_blocks(p.gpus_of(t), down, size)]
    per_domain = {(i, d.id): m.new_int_var(0, len(d.trays), f"inst[{i},{d.id}]")
                  for i, k in enumerate(ks) if p.whole_trays(k.shape.gpus) for d in p.domains}
    return PlaceVars(opts, per_domain)


def add_shape_on_trays(m: cp_model.CpModel, p: Problem, ks: list[Kind], v: PlaceVars) -> None:
    """A sub-tray instance is one aligned block of one tray; a whole-tray instance takes
    gpus/tray whole trays (TP8 on 4-GPU trays: exactly two; DEP16: four)."""
    for i, k in enumerate(ks):
        if not p.whole_trays(k.shape.gpus):
            m.add(sum(x for x, _, _ in v.options[i]) == k.count)


def add_one_nvlink_domain(m: cp_model.CpModel, p: Problem, ks: list[Kind],
                          v: PlaceVars) -> None:
    """Each whole-tray instance's trays lie in one domain: every domain holds a whole number of
    instances' worth of trays (sub-tray instances live in one tray, hence one domain)."""
    for i, k in enumerate(ks):
        trays = p.whole_trays(k.shape.gpus)
        if not trays:
            continue
        for d in p.domains:
            chosen = [x for x, t, _ in v.options[i] if t in d.trays]
            m.add(sum(chosen) == trays * v.per_domain[i, d.id])
        m.add(sum(v.per_domain[i, d.id] for d in p.domains) == k.count)


def add_gpu_exclusive(m: cp_model.CpModel, v: PlaceVars) -> None:
    """Each GPU serves at most one instance."""
    covering: dict[str, list] = {}
    for opts in v.options.values():
        for x, _, gpus in opts:
            for g in gpus:
                covering.setdefault(g, []).append(x)
    for g in sorted(covering):
        m.add_at_most_one(covering[g])


def add_objective(m: cp_model.CpModel, p: Problem, ks: list[Kind], v: PlaceVars) -> None:
    """Fewest trays shared by prefill and decode, then fewest runs of trays per whole-tray kind,
    then fewest trays in use (sub-tray instances packed together).
    Role flags bound the options from above, and a redundant cut (a role needs at least
    ceil(GPUs / tray) trays) gives the relaxation the mixed-tray lower bound at once."""
    per = _per_tray(p)
    roles = sorted({k.role for k in ks})
    trays = [t for d in p.domains for t in d.trays]
    mixed, flags_of = [], {r: [] for r in roles}
    for t in trays:
        flags = []
        for role in roles:
            here = [x for i, k in enumerate(ks) if k.role == role
                    for x, tt, _ in v.options[i] if tt == t]
            flag = m.new_bool_var(f"role[{t},{role}]")
            for x in here:
                m.add_implication(x, flag)
            flags.append(flag)
            flags_of[role].append(flag)
        if len(flags) > 1:
            mix = m.new_bool_var(f"mixed[{t}]")
            m.add(sum(flags) - 1 <= mix * (len(flags) - 1))
            mixed.append(mix)
    for role in roles:
        gpus = sum(k.count * k.shape.gpus for k in ks if k.role == role)
        m.add(sum(flags_of[role]) >= -(-gpus // per))
    runs = []
    for i, k in enumerate(ks):
        if p.whole_trays(k.shape.gpus):
            on = {t: x for x, t, _ in v.options[i]}  # the trays usable whole
            for a, b in zip([None, *trays], trays, strict=False):
                if b in on:
                    start = m.new_bool_var(f"run[{i},{b}]")
                    m.add(start >= on[b] - on.get(a, 0))
                    runs.append(start)
    used = sum(f for flags in flags_of.values() for f in flags)  # pack sub-tray instances
    m.minimize(MIXED_TRAY_COST * sum(mixed) + RUN_COST * sum(runs) + used)


def gpu_index(p: Problem) -> dict[str, int]:
    gpus = [g for d in p.domains for t in d.trays for g in p.gpus_of(t)]
    return {g: k for k, g in enumerate(gpus)}


def _instances(p: Problem, ks: list[Kind], v: PlaceVars, s: cp_model.CpSolver
               ) -> dict[int, list[tuple[str, ...]]]:
    """Cut each kind's chosen blocks or trays into instances, in GPU order."""
    out = {}
    for i, k in enumerate(ks):
        chosen = [(t, gpus) for x, t, gpus in v.options[i] if s.value(x)]
        per = p.whole_trays(k.shape.gpus)
        if not per:
            out[i] = [gpus for _, gpus in chosen]
            continue
        out[i] = []
        for d in p.domains:
            mine = [gpus for t, gpus in chosen if t in d.trays]
            for j in range(0, len(mine), per):
                out[i].append(tuple(g for gpus in mine[j:j + per] for g in gpus))
    return out


def _place_domain(p: Problem, ks: list[Kind]) -> tuple[dict[int, list[tuple[str, ...]]],
                                                       DomainSolve] | None:
    """One rack's model (p holds that one domain): instances per kind, in GPU order."""
    m = cp_model.CpModel()
    v = add_options(m, p, ks)
    add_shape_on_trays(m, p, ks, v)
    add_one_nvlink_domain(m, p, ks, v)
    add_gpu_exclusive(m, v)
    add_objective(m, p, ks, v)
    s, status, seconds = solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    result = DomainSolve((p.domains[0].id,), s.status_name(status), s.objective_value,
                         s.best_objective_bound, round(seconds, 3))
    return _instances(p, ks, v, s), result


def assign(p: Problem, ks: list[Kind]) -> dict[str, dict[int, int]] | None:
    """Instances of each kind per domain, when no count solution gave them (a feasibility
    model over the same per-rack capacity)."""
    m = cp_model.CpModel()
    down = racks.down_gpus(p)
    busy = {t: 0 for d in p.domains for t in d.trays if down.intersection(p.gpus_of(t))}
    items = [racks.Item(p.whole_trays(k.shape.gpus), k.shape.gpus) for k in ks]
    cap = racks.add_capacity(m, p, items, [k.count for k in ks], busy)
    s, status, _ = solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return racks.split(p, items, [k.count for k in ks], cap, s)


def unplaceable(p: Problem, wanted: list[Wanted]) -> list[str]:
    """Why no placement holds `wanted`, in the placement's own terms: fewer whole trays, or
    free aligned blocks (`racks.free_blocks`), than the instances take. Empty when neither
    explains it. (Memory is no reason here: a kind's need per memory domain is its capacity
    by construction, compiler/solve/memory_map.py, and precheck keeps only shapes whose
    budget holds one maximum-length request.)"""
    ks = kinds(wanted)
    down, per = racks.down_gpus(p), _per_tray(p)
    trays = [t for d in p.domains for t in d.trays]
    free = {d.id: sum(len(racks.free_blocks(p.gpus_of(t), down, per)) for t in d.trays)
            for d in p.domains}
    free_trays = sum(free.values())
    whole = sum(k.count * p.whole_trays(k.shape.gpus) for k in ks)
    out = []
    if whole > free_trays:
        out.append(f"whole-tray instances take {whole} trays with no GPU down or taken; "
                   f"{free_trays} of {len(trays)} are")
    most = max(free.values())
    for k in ks:
        if p.whole_trays(k.shape.gpus) > most:
            out.append(f"{k.role} {k.shape.name} takes {p.whole_trays(k.shape.gpus)} whole "
                       f"trays of one NVLink domain; the most any domain has free is {most}")
    sub = [k for k in ks if not p.whole_trays(k.shape.gpus)]
    for size in sorted({k.shape.gpus for k in sub}):
        blocks = sum(k.count * k.shape.gpus // size for k in sub if k.shape.gpus >= size)
        have = sum(len(racks.free_blocks(p.gpus_of(t), down, size)) for t in trays) \
            - whole * (per // size)
        if blocks > have:
            out.append(f"instances of {size}+ GPUs inside a tray take {blocks} aligned blocks "
                       f"of {size} free GPUs; the trays left have {max(0, have)}")
    return out


def _signature(p: Problem, d: Domain, ks: list[Kind]) -> tuple:
    """Racks with the same trays, availability and instances have the same solution."""
    down = racks.down_gpus(p)
    gpus = [g for t in d.trays for g in p.gpus_of(t)]
    return (len(d.trays), tuple(g in down for g in gpus),
            tuple((k.role, k.shape.name, k.count) for k in ks))


def place(p: Problem, wanted: list[Wanted],
          by_domain: dict[str, dict[tuple[str, str], int]] | None = None) -> Placement | None:
    """One small model per NVLink domain (identical racks solved once). `by_domain`: instances
    of each (role, shape name) per domain, from the count model; else assigned here."""
    ks = kinds(wanted)
    index = {(k.role, k.shape.name): i for i, k in enumerate(ks)}
    if by_domain is None:
        split = assign(p, ks)
        if split is None:
            return None
    else:
        split = {d: {index[key]: n for key, n in here.items()} for d, here in by_domain.items()}
    cut: dict[int, list[tuple[str, ...]]] = {i: [] for i in range(len(ks))}
    solved: dict[tuple, tuple[list[str], dict[int, list[tuple[str, ...]]], int]] = {}
    results: list[DomainSolve] = []
    for d in p.domains:
        here = [(i, replace(ks[i], count=n)) for i, n in sorted(split.get(d.id, {}).items()) if n]
        if not here:
            continue
        sub_ks = [k for _, k in here]
        key = _signature(p, d, sub_ks)
        gpus = [g for t in d.trays for g in p.gpus_of(t)]
        if key in solved:
            r = solved[key][2]
            results[r] = replace(results[r], domains=(*results[r].domains, d.id))
        else:
            got = _place_domain(replace(p, domains=(d,)), sub_ks)
            if got is None:
                return None
            solved[key] = (gpus, got[0], len(results))
            results.append(got[1])
        template, per_kind, _ = solved[key]
        at = {g: k for k, g in enumerate(template)}
        for j, (i, _) in enumerate(here):
            cut[i] += [tuple(gpus[at[g]] for g in inst) for inst in per_kind[j]]
    taken: dict[int, int] = {}
    out = []
    for w in wanted:
        i = index[w.role, w.shape.name]
        out.append(cut[i][taken.get(i, 0)])
        taken[i] = taken.get(i, 0) + 1
    optimal = all(r.status == "OPTIMAL" for r in results)
    return Placement(out, "OPTIMAL" if optimal else "FEASIBLE",
                     sum(r.objective * len(r.domains) for r in results),
                     sum(r.bound * len(r.domains) for r in results),
                     round(sum(r.deterministic_seconds for r in results), 3), results)

"""Phase 1 of the solve: how many instances of each candidate shape (CP-SAT).

Maximises goodput (requests/s at the SLO: the smaller of prefill and decode supply, plus the
aggregated supply), then, among layouts with that goodput, the most spare supply (lower
utilisation, so shorter queues). User requirements enter as assumption literals so that an
infeasible deployment can be explained by the requirements that conflict.
"""

from dataclasses import dataclass, replace

from compiler.cpsat import cp_model
from compiler.solve import constraints as rules
from compiler.solve import locality, racks
from compiler.solve.params import DETERMINISTIC_SECONDS, solve, solver
from compiler.solve.problem import GOODPUT_TOP, SCALE, Problem


@dataclass(frozen=True)
class Counts:
    by_candidate: dict[int, int]  # candidate index -> instances
    by_domain: dict[str, dict[int, int]]  # NVLink domain -> candidate index -> instances
    status: str
    objective: float  # goodput, requests/s
    bound: float
    deterministic_seconds: float


def build(p: Problem, with_objective: bool = True, only: frozenset[int] | None = None
          ) -> tuple[cp_model.CpModel, rules.CountVars]:
    """`only`: the candidate indices that may have instances (the others none)."""
    m = cp_model.CpModel()
    total_gpus = sum(len(d.trays) * d.gpus_per_tray for d in p.domains)
    n = {i: m.new_int_var(0, total_gpus // c.shape.gpus if only is None or i in only else 0,
                          f"n[{i}]")
         for i, c in enumerate(p.candidates)}
    lits = {key: m.new_bool_var(f"req[{key}]") for key in sorted(p.requirements)}
    v = rules.CountVars(n, m.new_int_var(0, GOODPUT_TOP, "goodput"), lits, kept=p.kept_counts(),
                        allowed=only)
    rules.add_tray_availability(m, v, p)
    rules.add_gpu_capacity(m, v, p)
    rules.add_engram_peer_group(m, v, p)
    rules.add_slo(m, v, p)
    if p.mode == "pinned":
        rules.add_pins(m, v, p)
    rules.add_serve_something(m, v, p)
    rules.add_goodput(m, v, p)
    if p.routed:
        doms = locality.gather(m, v, p)
        locality.add_domain_goodput(m, v, p, doms)
        locality.add_shared_roles(m, v, p, doms)
        locality.add_one_group(m, v, p, doms)
    if with_objective:
        m.maximize(v.goodput)
    return m, v


def best_goodput(p: Problem) -> float | None:
    """The goodput solve_counts reaches, without its tie-break or split over racks (what a
    recompile reports a fresh layout would reach); None when the requirements conflict."""
    m, v = build(p)
    for lit in v.lits.values():
        m.add(lit == 1)
    s, status, _ = solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return s.value(v.goodput) / SCALE


def solve_counts(p: Problem) -> Counts | list[str]:
    """The counts, or the keys of a small set of requirements that cannot hold together."""
    found = _best(p, None)
    if found is None:
        return conflicting_requirements(p)
    counts, s, v = found
    totals = [counts.by_candidate.get(i, 0) for i in range(len(p.candidates))]
    return replace(counts, by_domain=racks.split(p, rules.items(p), totals, v.capacity, s))


def best_with(p: Problem, only: frozenset[int], limit: float) -> Counts | None:
    """The counts with instances of the candidates `only` (by index) alone, by the same model
    and tie-break as solve_counts, within `limit` deterministic seconds per phase; None where
    none serve (the decision table: compiler/solve/layouts.py)."""
    found = _best(p, only, limit)
    if found is None:
        return None
    counts, s, v = found
    totals = [counts.by_candidate.get(i, 0) for i in range(len(p.candidates))]
    return replace(counts, by_domain=racks.split(p, rules.items(p), totals, v.capacity, s))


def _best(p: Problem, only: frozenset[int] | None, limit: float | None = None
          ) -> tuple[Counts, cp_model.CpSolver, rules.CountVars] | None:
    m, v = build(p, only=only)
    for lit in v.lits.values():
        m.add(lit == 1)
    limit = DETERMINISTIC_SECONDS if limit is None else limit
    s, status, seconds = solve(m, limit)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    goodput, bound = s.value(v.goodput), s.best_objective_bound
    # tie-break: among layouts with that goodput, the most spare supply (lower utilisation,
    # so shorter queues), rather than idle GPUs
    first = {i: int(s.value(x)) for i, x in v.n.items() if s.value(x)}
    m.add(v.goodput >= goodput)
    m.maximize(rules.supply(v, p))
    s, second, more = solve(m, limit)
    seconds += more
    both = "OPTIMAL" if status == second == cp_model.OPTIMAL else "FEASIBLE"
    # a tie-break cut short by a small limit without a solution keeps the first phase's
    by_candidate = {i: int(s.value(x)) for i, x in v.n.items() if s.value(x)} \
        if second in (cp_model.OPTIMAL, cp_model.FEASIBLE) else first
    return Counts(by_candidate, {}, both, goodput / SCALE, bound / SCALE,
                  round(seconds, 3)), s, v


def _infeasible_with(p: Problem, active: list[str]) -> tuple[bool, list[str]]:
    m, v = build(p, with_objective=False)
    m.add_assumptions([v.lits[k] for k in active])
    for k in set(v.lits) - set(active):
        m.add(v.lits[k] == 0)
    s = solver()
    status = s.solve(m)
    if status != cp_model.INFEASIBLE:
        return False, []
    core = s.sufficient_assumptions_for_infeasibility()
    names = {v.lits[k].index: k for k in active}
    return True, sorted(names[i] for i in core if i in names)


def conflicting_requirements(p: Problem) -> list[str]:
    """Requirements that together make the counts infeasible: CP-SAT's core, then shrunk by
    dropping each member that is not needed (deletion)."""
    infeasible, core = _infeasible_with(p, sorted(p.requirements))
    if not infeasible:
        return []
    for key in list(core):
        trial = [k for k in core if k != key]
        if _infeasible_with(p, trial)[0]:
            core = trial
    return core

"""Phase 1 of the solve: how many instances of each candidate shape (CP-SAT).

Maximises goodput (requests/s at the SLO, the smaller of prefill and decode supply), then uses
as few GPUs as possible for it. User requirements enter as assumption literals so that an
infeasible deployment can be explained by the requirements that conflict.
"""

from dataclasses import dataclass

from compiler.cpsat import cp_model
from compiler.solve import constraints as rules
from compiler.solve import racks
from compiler.solve.params import solver
from compiler.solve.problem import SCALE, Problem


@dataclass(frozen=True)
class Counts:
    by_candidate: dict[int, int]  # candidate index -> instances
    by_domain: dict[str, dict[int, int]]  # NVLink domain -> candidate index -> instances
    status: str
    objective: float  # goodput, requests/s
    bound: float
    deterministic_seconds: float


def build(p: Problem, with_objective: bool = True) -> tuple[cp_model.CpModel, rules.CountVars]:
    m = cp_model.CpModel()
    total_gpus = sum(len(d.trays) * d.gpus_per_tray for d in p.domains)
    n = {i: m.new_int_var(0, total_gpus // c.shape.gpus, f"n[{i}]")
         for i, c in enumerate(p.candidates)}
    lits = {key: m.new_bool_var(f"req[{key}]") for key in sorted(p.requirements)}
    v = rules.CountVars(n, m.new_int_var(0, 10**12, "goodput"), lits, kept=p.kept_counts())
    rules.add_tray_availability(m, v, p)
    rules.add_gpu_capacity(m, v, p)
    rules.add_engram_peer_group(m, v, p)
    rules.add_slo(m, v, p)
    if p.mode == "pinned":
        rules.add_pins(m, v, p)
    rules.add_serve_something(m, v, p)
    rules.add_goodput(m, v, p)
    if with_objective:
        m.maximize(v.goodput)
    return m, v


def solve_counts(p: Problem) -> Counts | list[str]:
    """The counts, or the keys of a small set of requirements that cannot hold together."""
    m, v = build(p)
    for lit in v.lits.values():
        m.add(lit == 1)
    s = solver()
    status = s.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return conflicting_requirements(p)
    goodput, bound, seconds = s.value(v.goodput), s.best_objective_bound, s.deterministic_time
    # tie-break: among layouts with that goodput, the most spare supply (lower utilisation,
    # so shorter queues), rather than idle GPUs
    m.add(v.goodput >= goodput)
    m.maximize(rules.supply(v, p))
    second = s.solve(m)
    both = "OPTIMAL" if status == second == cp_model.OPTIMAL else "FEASIBLE"
    by_candidate = {i: int(s.value(x)) for i, x in v.n.items() if s.value(x)}
    totals = [by_candidate.get(i, 0) for i in range(len(p.candidates))]
    by_domain = racks.split(p, rules.items(p), totals, v.capacity, s)
    return Counts(by_candidate, by_domain, both, goodput / SCALE, bound / SCALE,
                  round(seconds + s.deterministic_time, 3))


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

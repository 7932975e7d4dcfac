"""Deterministic CP-SAT parameters: one worker, fixed seed, deterministic time limit, so the
same inputs give the same solution on any machine."""

from compiler.cpsat import cp_model

DETERMINISTIC_SECONDS = 20.0
SEED = 7
# A search not proven optimal within QUICK_SECONDS stops there when its objective is within
# RELATIVE_GAP of its bound (the plan prints the status, both values and the gap;
# compile_scaling.py's goal is every gap < 1%), else it goes on to DETERMINISTIC_SECONDS. A
# fleet with one GPU down finds its best layout at once and would spend the whole limit
# proving the last 0.2% (64 Vera Rubin racks: 49 CPU s for the layout found in the first).
QUICK_SECONDS = 1.0
RELATIVE_GAP = 0.005


def solver() -> cp_model.CpSolver:
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    s.parameters.random_seed = SEED
    s.parameters.max_deterministic_time = DETERMINISTIC_SECONDS
    s.parameters.linearization_level = 2  # the tray-role cuts need the full LP
    s.parameters.log_search_progress = False
    # OR-Tools' own SIGINT handler would end the search early and let a cut-short solution be
    # written; rackc's CLI handles ^C and SIGTERM itself (exit 130/143, OUT untouched).
    s.parameters.catch_sigint_signal = False
    return s


def solve(m: cp_model.CpModel, limit: float = DETERMINISTIC_SECONDS
          ) -> tuple[cp_model.CpSolver, int, float]:
    """Solve `m` in two stages: QUICK_SECONDS, then, unless that stage proved its solution or
    came within RELATIVE_GAP, a search of the whole `limit` (what a one-stage solve had): the
    solver, CP-SAT's status code and the deterministic seconds both stages took."""
    s = solver()
    s.parameters.max_deterministic_time = min(limit, QUICK_SECONDS)
    code = s.solve(m)
    cut_short = code == cp_model.UNKNOWN or (
        code == cp_model.FEASIBLE and gap(s.objective_value, s.best_objective_bound) > RELATIVE_GAP)
    if limit <= QUICK_SECONDS or not cut_short:
        return s, code, s.deterministic_time
    quick = s.deterministic_time
    s = solver()  # the whole limit again: the same seed retraces the first stage, then on
    s.parameters.max_deterministic_time = limit
    code = s.solve(m)
    return s, code, quick + s.deterministic_time


def gap(objective: float, bound: float) -> float:
    """Relative optimality gap (0 when proven optimal)."""
    return abs(objective - bound) / max(1.0, abs(objective))

"""Deterministic CP-SAT parameters: one worker, fixed seed, deterministic time limit, so the
same inputs give the same solution on any machine."""

from compiler.cpsat import cp_model

DETERMINISTIC_SECONDS = 20.0
SEED = 7


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

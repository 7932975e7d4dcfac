"""Whole layouts besides the chosen one, for the plan's decision table: for each shape the
chosen layout uses (the `MAX_LEFT_OUT` holding the most GPUs), the best layout without that
shape, and where both serving modes were searched (`objective.layout: any`), the best of the
mode not chosen. Each is a re-solve of the count model with its tie-break
(compiler/solve/counts.py), the left-out candidates held at zero instances, so each row
answers "what if not this shape": the layout the chosen one beat.

These re-solves keep nearly the whole candidate space, so CP-SAT solves them about as fast as
the full model (30-40 ms each on one rack; 0.1-4 CPU s each at 16 racks without the limits
here); a model restricted to one prefill and one decode shape could take CP-SAT minutes to
close at 16 racks, so the table does not pair shapes. Each re-solve gets a smaller
deterministic limit than the chosen layout's (`SECONDS`); a row cut short says so. None in
pinned mode (nothing was weighed) or when instances are kept from a running plan (`--from`:
the alternatives would move them).
"""

from dataclasses import dataclass

from compiler.solve.counts import Counts, best_with
from compiler.solve.problem import Problem

SECONDS = 0.5  # CP-SAT deterministic seconds per re-solve
MAX_LEFT_OUT = 3  # chosen shapes re-solved without, those holding the most GPUs first


@dataclass(frozen=True)
class Alternative:
    by_candidate: dict[int, int]  # candidate index -> instances
    by_domain: dict[str, dict[int, int]]  # NVLink domain -> candidate index -> instances
    goodput: float  # the count model's objective, requests/s
    status: str  # CP-SAT's: OPTIMAL, or FEASIBLE when cut short
    without: str  # what was left out, e.g. "decode DEP64" or "disaggregated serving"


def shape_sets(p: Problem, chosen: Counts) -> list[tuple[str, frozenset[int]]]:
    """(what is left out, the candidates allowed) per re-solve, in a stable order."""
    every = frozenset(range(len(p.candidates)))
    out = []
    held = sorted(chosen.by_candidate, key=lambda i: (
        -chosen.by_candidate[i] * p.candidates[i].shape.gpus, p.candidates[i].role,
        p.candidates[i].shape.name))[:MAX_LEFT_OUT]
    for i in sorted(held, key=lambda i: (p.candidates[i].role, p.candidates[i].shape.name)):
        c = p.candidates[i]
        out.append((f"{c.role} {c.shape.name}", every - {i}))
    roles = {c.role for c in p.candidates}
    if "aggregated" in roles and roles & {"prefill", "decode"}:
        aggregated = any(p.candidates[i].role == "aggregated" for i in chosen.by_candidate)
        keep = frozenset(i for i in every
                         if (p.candidates[i].role == "aggregated") != aggregated)
        out.append(("aggregated serving" if aggregated else "disaggregated serving", keep))
    return out


def alternatives(p: Problem, chosen: Counts) -> list[Alternative]:
    """The best layout of each re-solve that serves anything, each layout once (the first
    re-solve that finds it names it)."""
    if p.mode == "pinned" or p.kept:
        return []
    out: list[Alternative] = []
    seen = {tuple(sorted(chosen.by_candidate.items()))}
    for without, only in shape_sets(p, chosen):
        found = best_with(p, only, SECONDS)
        if found is None or not found.by_candidate:
            continue
        key = tuple(sorted(found.by_candidate.items()))
        if key not in seen:
            seen.add(key)
            out.append(Alternative(found.by_candidate, found.by_domain, found.objective,
                                   found.status, without))
    return out

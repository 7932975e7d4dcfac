"""The solver: candidates from the perf model, instance counts, then GPU placement (CP-SAT)."""

from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from compiler.load import Inputs
from compiler.perf.capacity import Candidate
from compiler.precheck import Precheck
from compiler.solve.build import build_problem
from compiler.solve.counts import Counts, solve_counts
from compiler.solve.explain import infeasible, unplaced
from compiler.solve.memory_map import domain_memory
from compiler.solve.place import Placement, Wanted, place, unplaceable
from compiler.solve.problem import Kept, Problem


@dataclass(frozen=True)
class Solution:
    problem: Problem
    counts: Counts  # new instances (kept ones are not counted)
    wanted: list[Wanted]  # new instances, then the kept ones
    candidates: list[Candidate]  # per wanted instance
    placement: Placement  # of the new instances
    gpus: list[tuple[str, ...]]  # per wanted instance
    ids: list[str | None]  # per wanted instance: the kept id, None for a new one

    @property
    def prefill_gpus(self) -> int:
        return sum(w.shape.gpus for w in self.wanted if w.role == "prefill")


def solve(inputs: Inputs, g: nx.Graph, pre: Precheck, kept: Sequence[Kept] = (),
          next_id: dict[str, int] | None = None) -> Solution:
    """`kept`: instances of the running plan that stay (incremental recompile); new instances
    take ids from `next_id` (role -> first unused number) on."""
    return solve_problem(build_problem(inputs, g, pre, kept=kept, next_id=next_id))


def solve_problem(p: Problem) -> Solution:
    """The counts, then the placement, of a built problem (compiler.solve.build)."""
    counts = solve_counts(p)
    if isinstance(counts, list):
        raise infeasible(p, counts, "instance counts")
    chosen = [(p.candidates[i], n) for i, n in sorted(counts.by_candidate.items())]
    prefill_gpus = sum(c.shape.gpus * n for c, n in chosen if c.role == "prefill") + \
        sum(len(k.gpus) for k in p.kept if k.role == "prefill")
    order = {"prefill": 0, "decode": 1, "aggregated": 2}
    chosen.sort(key=lambda cn: (order[cn[0].role], -cn[0].shape.gpus, cn[0].shape.name))
    by_domain = {d: {(p.candidates[i].role, p.candidates[i].shape.name): n
                     for i, n in here.items()} for d, here in counts.by_domain.items()}
    wanted, per_instance = [], []
    for c, n in chosen:
        need = domain_memory(p, c.role, c.shape, prefill_gpus)
        wanted += [Wanted(c.role, c.shape, need)] * n
        per_instance += [c] * n
    placement = place(p, wanted, by_domain)
    if placement is None:
        reasons = unplaceable(p, wanted)
        if reasons:
            raise unplaced(p, reasons)
        # no deletion loop runs over the placement: every pin and unavailable entry, unshrunk
        keys = sorted(k for k in p.requirements if k.startswith(("pin:", "unavailable:")))
        raise infeasible(p, keys, "GPU placement", shrunk=False)
    gpus, ids = list(placement.gpus), [None] * len(wanted)
    index = {(c.role, c.shape.name): c for c in p.candidates}
    for k in p.kept:
        wanted.append(Wanted(k.role, k.shape, domain_memory(p, k.role, k.shape, prefill_gpus)))
        per_instance.append(index[k.role, k.shape.name])
        gpus.append(k.gpus)
        ids.append(k.id)
    return Solution(p, counts, wanted, per_instance, placement, gpus, ids)

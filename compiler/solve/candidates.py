"""Candidate engine shapes per role and what one instance of each sustains at the SLO
(compiler/perf/capacity.py).

The search space is every shape that fits (compiler/precheck.py, what `rackc check` lists),
for prefill, decode and aggregated instances alike, unless the deployment narrows it:
`objective.shapes` names the shapes per role, `objective.layout` picks disaggregated (prefill
+ decode) or aggregated serving. Latency mode serves batch-1 sessions on tensor-parallel
decode, disaggregated.
"""

from compiler.load import Inputs
from compiler.perf.capacity import (
    Candidate,
    aggregated_candidate,
    decode_candidate,
    prefill_candidate,
)
from compiler.perf.serving import Workload
from compiler.precheck import Precheck
from compiler.shapes import Shape

ROLES = {"disaggregated": ("prefill", "decode"), "aggregated": ("aggregated",),
         "any": ("prefill", "decode", "aggregated")}


def searched_roles(inputs: Inputs, mode: str) -> tuple[str, ...]:
    """The roles the count model may use: latency mode is disaggregated (its TP decode
    serves batch-1 sessions); otherwise what objective.layout allows."""
    if mode == "latency":
        return ROLES["disaggregated"]
    return ROLES[inputs.resolved.layout]


def _searched(inputs: Inputs, pre: Precheck, role: str, mode: str) -> list[Shape]:
    fits = pre.feasible("decode" if role == "aggregated" else role)
    user = getattr(inputs.resolved.shape_search, role)
    if user is not None:
        return [s for s in fits if s.name in user]
    if role == "decode" and mode == "latency":
        return [s for s in fits if s.kind == "TP"]
    return fits


def candidates(inputs: Inputs, pre: Precheck, w: Workload, hit: float, mode: str,
               prefill_gpus_guess: int) -> list[Candidate]:
    """Usable and unusable candidates (the latter with `why_not`), in a stable order. An
    aggregated instance is searched only where its shape's decode meets the per-user SLO
    (prompt chunks only slow its steps), up to that decode's batch."""
    roles = searched_roles(inputs, mode)
    out = []
    if "prefill" in roles:
        out += [prefill_candidate(inputs, s, w, hit, prefill_gpus_guess)
                for s in _searched(inputs, pre, "prefill", mode)]
    decode = {s.name: decode_candidate(inputs, s, w, 1 if mode == "latency" else None)
              for s in _searched(inputs, pre, "decode" if "decode" in roles else "aggregated",
                                 mode)}
    if "decode" in roles:
        out += list(decode.values())
    if "aggregated" in roles:
        for s in _searched(inputs, pre, "aggregated", mode):
            d = decode.get(s.name) or decode_candidate(inputs, s, w, None)
            if d.requests_per_s <= 0:
                out.append(Candidate("aggregated", s, 0.0, 0, 0, d.step_us, d.why_not,
                                     misses=d.misses))
                continue
            out.append(aggregated_candidate(inputs, s, w, search_up_to=d.max_batch))
    return out

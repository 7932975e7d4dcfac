"""Build the solver's Problem from the validated inputs: candidates, requirements, pins."""

from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

from compiler import graph
from compiler.ids import gpu_id
from compiler.load import Inputs, layout
from compiler.perf.capacity import Candidate, pinned_candidate
from compiler.perf.predict import pool_tokens, workload
from compiler.perf.serving import prefix_hit_rate
from compiler.precheck import Precheck
from compiler.shapes import parse_shape
from compiler.solve import candidates as cand
from compiler.solve.problem import Kept, Pin, Problem, Requirement, domains

LATENCY_MAX_TRAYS = 2  # SYSTEM.md: the lowest-latency decode is TP8 spread over two trays


def requirements(inputs: Inputs) -> tuple[dict[str, Requirement], dict[str, set[str]]]:
    """User requirements an infeasibility explanation may name, and the GPUs each
    `unavailable` entry takes away."""
    reqs: dict[str, Requirement] = {}
    slo, mode = inputs.resolved.slo, inputs.resolved.objective_mode.value
    if mode != "pinned":
        for key, fields in (("slo", ("tokens_per_s_per_user_p90", "tokens_per_s_per_user_p50")),
                            ("ttft", ("ttft_ms_p90", "ttft_ms_p50"))):
            for f in fields:
                value = getattr(slo, f)
                if value is not None:
                    reqs[key] = Requirement(key, "deployment", ("spec", "slo", f),
                                            f"slo.{f}: {value:g}")
                    break
    for j, pin in enumerate(inputs.resolved.pins):
        key = f"pin:{j:02d}"
        reqs[key] = Requirement(key, "deployment", ("spec", "objective", "instances", j),
                                f"{pin.count} x {pin.role} {pin.shape}")
    down: dict[str, set[str]] = {}
    spec = inputs.hardware.spec
    per = inputs.system.gpus_per_tray
    for k, tray in enumerate(spec.unavailable.trays):
        key = f"unavailable:trays:{k:02d}"
        reqs[key] = Requirement(key, "hardware", ("spec", "unavailable", "trays", k),
                                f"tray {tray} unavailable")
        rack, t = divmod(tray, layout(inputs.hardware, inputs.system)[1])
        down[key] = {gpu_id(inputs.offsets.racks + rack, t, i) for i in range(per)}
    for k, gid in enumerate(spec.unavailable.gpus):
        key = f"unavailable:gpus:{k:02d}"
        reqs[key] = Requirement(key, "hardware", ("spec", "unavailable", "gpus", k),
                                f"GPU {gid} unavailable")
        down[key] = {gid}
    return reqs, down


def _pins(inputs: Inputs, reqs: dict[str, Requirement]) -> list[Pin]:
    """The pinned entries (their shapes were checked by precheck)."""
    return [Pin(entry.role, parse_shape(entry.shape), entry.count, reqs[f"pin:{j:02d}"],
                entry.max_batch, entry.max_batched_tokens)
            for j, entry in enumerate(inputs.resolved.pins)]


def build_problem(inputs: Inputs, g, pre: Precheck, kept: Sequence[Kept] = (),
                  next_id: dict[str, int] | None = None) -> Problem:
    """`kept`: instances that stay (incremental recompile); their shapes join the candidates."""
    reqs, down = requirements(inputs)
    mode = inputs.resolved.objective_mode.value
    w, hit, guess = _candidate_basis(inputs, g)
    if mode == "pinned":
        pins = _pins(inputs, reqs)
        found: dict[tuple[str, str], Candidate] = {}
        for pin in pins:
            key = (pin.role, pin.shape.name)
            if key not in found:
                found[key] = pinned_candidate(inputs, pin.role, pin.shape, w, hit, guess,
                                              pin.max_batch, pin.max_batched_tokens)
        candidates = [found[k] for k in sorted(found)]
    else:
        pins = []
        candidates = cand.candidates(inputs, pre, w, hit, mode, guess)
        if mode == "latency":
            candidates = _fastest_decode(inputs, candidates)
    fresh = Problem(inputs, g, tuple(domains(inputs, g)), tuple(candidates), tuple(pins), mode,
                    MappingProxyType({k: frozenset(v) for k, v in down.items()}),
                    MappingProxyType(dict(reqs)))
    return with_kept(fresh, kept, next_id)


def _candidate_basis(inputs: Inputs, g):
    """(workload, prefix hit rate, the counts' default guess) every candidate is costed at."""
    w = workload(inputs)
    return w, prefix_hit_rate(w, pool_tokens(inputs, [])), \
        max(1, len(graph.available_gpus(g)) // 2)


def with_kept(p: Problem, kept: Sequence[Kept], next_id: dict[str, int] | None) -> Problem:
    """`p` with instances that stay (incremental recompile): their shapes join the
    candidates (pinned at the counts' default guess), new ids start at `next_id`. `p` itself,
    the problem with nothing kept, is what a fresh layout could reach."""
    inputs = p.inputs
    have = {(c.role, c.shape.name) for c in p.candidates}
    extra = []
    if kept and not have >= {(k.role, k.shape.name) for k in kept}:
        w, hit, guess = _candidate_basis(inputs, p.graph)
        for key in sorted({(k.role, k.shape.name) for k in kept} - have):
            shape = next(k.shape for k in kept if (k.role, k.shape.name) == key)
            extra.append(pinned_candidate(inputs, key[0], shape, w, hit, guess))
    return replace(p, candidates=(*p.candidates, *extra), kept=tuple(kept),
                   next_id=MappingProxyType(dict(next_id or {})))


def _fastest_decode(inputs: Inputs, cands: list[Candidate]) -> list[Candidate]:
    """Latency mode: keep the one tensor-parallel decode shape (at most two trays) with the
    shortest batch-1 step; that is the low-latency path for batch-1 sessions."""
    limit = LATENCY_MAX_TRAYS * inputs.system.gpus_per_tray
    decode = [c for c in cands if c.role == "decode" and c.shape.gpus <= limit]
    if not decode:
        return cands
    best = min(decode, key=lambda c: (c.step_us, c.shape.gpus))
    return [c for c in cands if c.role != "decode"] + [best]

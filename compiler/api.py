"""The public entry points the CLI calls: each takes paths/inputs and returns data, no printing
(writing files is compiler.files' job)."""

import itertools
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

from compiler import arch, graph
from compiler.emit_worker import EmitWorker
from compiler.graph import build_graph
from compiler.load import Inputs, display_name, load_inputs
from compiler.lower import lower
from compiler.perf.predict import Layout, curve, predict_layout, workload
from compiler.plan import PLAN_MAX_BYTES, Instance, Plan, Predicted, dump_plan, load_plan
from compiler.precheck import precheck
from compiler.shapes import parse_shape
from compiler.solve import solve
from compiler.targets_registry import targets
from compiler.validate import rules
from schemas.diagnostics import CompileError, Diagnostic
from schemas.reading import FileProblem, read_regular
from schemas.source import decode_utf8

CHECK_KEYS = ("ok", "system", "racks", "trays", "gpus", "gpus_available", "memory_domains",
              "nvlink_domains", "model", "weights_gib", "kv_bytes_per_token", "shapes",
              "diagnostics")


def check(deployment: Path) -> dict:
    """`rackc check`: inputs valid, hardware counted, which shapes fit. Raises CompileError."""
    inputs = load_inputs(deployment)
    g = build_graph(inputs)
    pre = precheck(inputs, g)
    result = {
        "ok": pre.ok,
        "system": inputs.system.name,
        "racks": g.graph["racks"],
        "trays": len(graph.trays(g)),
        "gpus": len(graph.gpus(g)),
        "gpus_available": len(graph.available_gpus(g)),
        "memory_domains": len(graph.memory_domains(g)),
        "nvlink_domains": len(graph.nvlink_domains(g)),
        "model": inputs.model_name,
        "weights_gib": round(arch.weight_bytes(inputs.model.spec) / arch.GIB, 2),
        "kv_bytes_per_token": arch.kv_bytes_per_token(inputs.model.spec,
                                                      inputs.resolved.kv_cache_dtype.value),
        "shapes": [f.to_dict() for f in pre.fits],
        "diagnostics": [d.to_dict() for d in pre.diagnostics],
    }
    if not pre.ok:
        raise CompileError(pre.diagnostics, exit_code=3, result=result)
    return result


def failed_check(error: CompileError) -> dict:
    """The JSON form of a check that stopped at bad input: every key, nothing known."""
    if error.result is not None:
        return error.result
    out: dict = dict.fromkeys(CHECK_KEYS)
    out.update(ok=False, shapes=[], diagnostics=[d.to_dict() for d in error.diagnostics])
    return out


def read_plan(path: Path) -> Plan:
    """A plan.yaml written by `rackc compile`, or a diagnostic."""
    file = display_name(path)
    try:
        text = decode_utf8(read_regular(path, PLAN_MAX_BYTES), file)
        return load_plan(text, file)
    except FileProblem as problem:
        raise CompileError([Diagnostic("error", problem.code, file, 0, 0, "",
                                       f"{problem.expected} (a plan.yaml)", problem.got,
                                       "run `rackc compile ... -o OUT` first")]) from None
    except (ValueError, TypeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0]
        raise CompileError([Diagnostic("error", "E701", file, 0, 0, "",
                                       "a plan.yaml written by rackc compile", first,
                                       "pass OUT/plan.yaml")]) from None


def diff_plans(a: Plan, b: Plan) -> list[str]:
    """Human-readable differences: instances added, removed or moved; metrics that changed."""
    out = []
    ia, ib = {i.id: i for i in a.instances}, {i.id: i for i in b.instances}
    for key in sorted(set(ia) | set(ib)):
        x, y = ia.get(key), ib.get(key)
        if x is None:
            out.append(f"+ {key}: {y.shape} on {','.join(y.trays)}")
        elif y is None:
            out.append(f"- {key}: {x.shape} on {','.join(x.trays)}")
        elif (x.shape, x.gpus, x.max_batch) != (y.shape, y.gpus, y.max_batch):
            out.append(f"~ {key}: {x.shape} on {','.join(x.trays)} (batch {x.max_batch}) -> "
                       f"{y.shape} on {','.join(y.trays)} (batch {y.max_batch})")
    for key in sorted(set(a.memory) | set(b.memory)):
        if a.memory.get(key) != b.memory.get(key):
            out.append(f"~ memory.{key}: {_mem(a.memory.get(key))} -> {_mem(b.memory.get(key))}")
    pa = a.predicted.model_dump() if a.predicted else {}
    pb = b.predicted.model_dump() if b.predicted else {}
    for key, va in pa.items():
        vb = pb.get(key)
        if isinstance(va, int | float) and va != vb:
            out.append(f"~ predicted.{key}: {va} -> {vb}")
    if a.solver.status != b.solver.status or a.solver.objective != b.solver.objective:
        out.append(f"~ solver: {a.solver.status} {a.solver.objective} -> "
                   f"{b.solver.status} {b.solver.objective}")
    return out


def _mem(m: object) -> str:
    if m is None:
        return "unused"
    return ", ".join(f"{k} {v:g}" for k, v in m.model_dump().items() if v)


UNBOUNDED_CONCURRENCY = 1e9


@dataclass(frozen=True)
class CompileResult:
    plan: Plan
    artifacts: dict[str, str | bytes]  # path relative to OUT -> content
    seconds: dict[str, float]  # wall time per phase, for build_info only
    input_files: tuple[Path, ...] = ()  # what was read, which `-o` must never replace


def layouts(instances: list[Instance]) -> list[Layout]:
    """Instances grouped by (role, shape, batch limits) for the perf model."""
    counts = Counter((i.role, i.shape, i.max_batch, i.max_batched_tokens) for i in instances)
    return [Layout(role, parse_shape(shape), n, batch,
                   tokens if role == "prefill" else None)
            for (role, shape, batch, tokens), n in sorted(counts.items())]


def predicted(inputs: Inputs, plan: Plan, goodput: float | None) -> Predicted:
    """Metrics at the operating point: in throughput mode, unless the user fixed the
    concurrency, demand is unbounded and admission stops at the SLO goodput. The prefix cache
    is the plan's pool (its DRAM segments after the host budget)."""
    groups = layouts(plan.instances)
    w = workload(inputs)
    if inputs.deployment.spec.objective.mode == "throughput" and \
            inputs.deployment.spec.workload.concurrency is None:
        w = replace(w, concurrency=UNBOUNDED_CONCURRENCY)
    pool = plan.kv_pool.total_gib if plan.kv_pool.enabled else None
    p = predict_layout(inputs, groups, w, max_requests_per_s=goodput, pool_gib=pool)
    return Predicted(**asdict(p), curve=curve(inputs, groups, pool_gib=pool))


def compile(deployment: Path, only: tuple[str, ...] | None = None,
            emitter: EmitWorker | None = None) -> CompileResult:
    """Load, check, solve, lower, predict and emit (in `emitter`'s process when given, with
    the same result), then hold what was emitted to the enforced controller-level rules.
    Raises CompileError (exit 2 or 3)."""
    clock = {"start": time.perf_counter()}
    inputs = load_inputs(deployment)
    g = build_graph(inputs)
    pre = precheck(inputs, g)
    if not pre.ok:
        raise CompileError(pre.diagnostics, exit_code=3)
    clock["loaded"] = time.perf_counter()
    sol = solve(inputs, g, pre)
    clock["solved"] = time.perf_counter()
    draft = lower(inputs, g, sol)
    plan = draft.model_copy(update={
        "predicted": predicted(inputs, draft, None if sol.problem.mode == "pinned"
                               else sol.counts.objective)})
    clock["planned"] = time.perf_counter()
    artifacts: dict[str, str | bytes] = {"plan.yaml": dump_plan(plan)}
    if emitter is not None:
        artifacts.update(emitter.emit(plan, only))
    else:
        for name, emit in targets().items():
            if only is None or name in only:
                artifacts.update(emit(plan))
    broken = rules.check(plan, artifacts, rules.ENFORCED)
    if broken:  # the bundle would not start: a rackc defect or inputs the targets cannot serve
        raise CompileError(broken, exit_code=3)
    clock["emitted"] = time.perf_counter()
    names = list(clock)
    seconds = {b: round(clock[b] - clock[a], 4) for a, b in itertools.pairwise(names)}
    return CompileResult(plan, dict(sorted(artifacts.items())), seconds, inputs.files)

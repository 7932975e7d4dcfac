"""The public entry points the CLI calls: each takes paths/inputs and returns data, no printing
(writing files is compiler.files' job)."""

import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from compiler import arch, graph
from compiler.graph import build_graph
from compiler.ids import next_numbers
from compiler.load import Inputs, display_name, invented_node_names, load_fleet
from compiler.plan import (
    Plan,
    dump_plan,
)
from compiler.plan_file import read_plan
from compiler.precheck import precheck
from schemas.diagnostics import CompileError, Diagnostic, did_you_mean

if TYPE_CHECKING:
    from compiler.emit_worker import EmitWorker
    from compiler.simulate.runner import Options

# The solver (OR-Tools), the perf model, the emitters and the bundle rules are imported by the
# functions that use them, so that `rackc check`, `explain` and `diff` load none of them.

CHECK_KEYS = ("ok", "system", "racks", "trays", "gpus", "gpus_available", "memory_domains",
              "nvlink_domains", "model", "weights_gib", "kv_bytes_per_token",
              "state_bytes_per_request", "shapes", "diagnostics")


def check(deployment: Path) -> dict:
    """`rackc check`: inputs valid, hardware counted, which shapes fit. Raises CompileError.
    A mixed fleet: the groups' counts added up, each shape named with its group."""
    results = [_check(inputs) for inputs in load_fleet(deployment)]
    if len(results) == 1:
        result, diagnostics = results[0]
    else:
        result = dict(results[0][0])
        names = [r["group"] for r, _ in results]
        result.update(ok=all(r["ok"] for r, _ in results),
                      system=" + ".join(dict.fromkeys(r["system"] for r, _ in results)),
                      shapes=[{"group": n, **f} for n, (r, _) in zip(names, results, strict=True)
                              for f in r["shapes"]],
                      diagnostics=[d for r, _ in results for d in r["diagnostics"]])
        for key in ("racks", "trays", "gpus", "gpus_available", "memory_domains",
                    "nvlink_domains"):
            result[key] = sum(r[key] for r, _ in results)
        diagnostics = [d for _, ds in results for d in ds]
    result.pop("group")
    if not result["ok"]:
        raise CompileError(diagnostics, exit_code=3, result=result)
    return result


def _check(inputs: Inputs) -> tuple[dict, list[Diagnostic]]:
    g = build_graph(inputs)
    pre = precheck(inputs, g)
    return {
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
        # the linear-attention layers' state, held per request whatever its length
        "state_bytes_per_request": arch.state_bytes_per_request(inputs.model.spec),
        "shapes": [f.to_dict() for f in pre.fits],
        "diagnostics": [d.to_dict() for d in pre.diagnostics],
        "group": inputs.hardware.metadata.name,
    }, list(pre.diagnostics)


def failed_check(error: CompileError) -> dict:
    """The JSON form of a check that stopped at bad input: every key, nothing known."""
    if error.result is not None:
        return error.result
    out: dict = dict.fromkeys(CHECK_KEYS)
    out.update(ok=False, shapes=[], diagnostics=[d.to_dict() for d in error.diagnostics])
    return out


def diff_plans(a: Plan, b: Plan) -> list[str]:
    """Human-readable differences: instances matched by GPU set (stopped, started, moved,
    renamed or reconfigured), memory domains and metrics that changed."""
    from compiler import incremental

    out = []
    same, stopped, started, moved = incremental.match(a, b)
    out += [f"- {x.id}: {x.shape} on {','.join(x.trays)}" for x in stopped]
    out += [f"+ {y.id}: {y.shape} on {','.join(y.trays)}" for y in started]
    out += [f"~ {x.id}: {x.shape} on {','.join(x.trays)} -> {y.shape} on {','.join(y.trays)}"
            for x, y in moved]
    for x, y in same:
        if (x.id, x.shape, x.max_batch) != (y.id, y.shape, y.max_batch):
            out.append(f"~ {x.id}: {x.shape} on {','.join(x.trays)} (batch {x.max_batch}) -> "
                       f"{y.id}: {y.shape} (batch {y.max_batch}), same GPUs")
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




@dataclass(frozen=True)
class CompileResult:
    plan: Plan
    artifacts: dict[str, str | bytes]  # path relative to OUT -> content
    seconds: dict[str, float]  # wall time per phase, for build_info only
    input_files: tuple[Path, ...] = ()  # what was read, which `-o` must never replace
    # `--from`: the goodput a fresh compile (free to move every instance) would reach
    fresh_goodput: float | None = None
    warnings: tuple[Diagnostic, ...] = ()  # W510: SLOs the prediction misses


def _plan(inputs: Inputs, base: Plan | None, unavailable: str | None,
          clock: dict[str, float], restore: str | None = None,
          next_id: dict[str, int] | None = None) -> tuple[Plan, float | None]:
    """One system's plan (a mixed fleet: one group's, its instances numbered from `next_id`
    on), and with `base` the goodput a fresh compile would reach."""
    from compiler import incremental
    from compiler.lower import lower
    from compiler.predicted_plan import with_prediction
    from compiler.solve import solve, solve_problem
    from compiler.solve.build import build_problem, with_kept
    from compiler.solve.counts import best_goodput

    if base is not None or unavailable:
        inputs = incremental.with_failures(
            inputs, base, incremental.parse_ids(unavailable, inputs) if unavailable else [],
            incremental.parse_ids(restore, inputs, "--restore") if restore else [])
    g = build_graph(inputs)
    if base is not None:
        incremental.check_base(base, inputs, g)
    pre = precheck(inputs, g)
    if not pre.ok:
        raise CompileError(pre.diagnostics, exit_code=3)
    clock.setdefault("loaded", time.perf_counter())
    fresh = None
    if base is not None:
        incremental.check_kept(base, inputs, pre, g)
        nothing_kept = build_problem(inputs, g, pre)  # its candidates serve both solves
        sol = solve_problem(with_kept(nothing_kept, incremental.kept(base, g),
                                      incremental.next_ids(base)))
        fresh = best_goodput(nothing_kept)  # what moving every instance could reach
    else:
        sol = solve(inputs, g, pre, (), next_id)
    clock.setdefault("solved", time.perf_counter())
    return with_prediction(inputs, sol, lower(inputs, g, sol), g), fresh


def compile(deployment: Path, only: tuple[str, ...] | None = None,
            emitter: "EmitWorker | None" = None, base: Plan | None = None,
            unavailable: str | None = None, restore: str | None = None,
            kernels: str = "vllm") -> CompileResult:
    """Load, check, solve, lower, predict and emit (in `emitter`'s process when given, with
    the same result), then hold what was emitted to the enforced controller-level rules.
    `base`: the running plan whose instances stay where their GPUs are all still available;
    `unavailable`: GPU, tray or rack ids that failed (compiler.incremental); `restore`: ids
    the old plan had down that are repaired; `kernels`: whose measured kernels the perf
    model uses (`predict --kernels`; the targets run vLLM).
    Raises CompileError (exit 2 or 3)."""
    from compiler.preflight import with_notices

    clock = {"start": time.perf_counter()}
    fleet = load_fleet(deployment, kernels)
    if len(fleet) > 1 and (base is not None or unavailable):
        raise CompileError([Diagnostic(
            "error", "E703", "<argument>", 0, 0, "--from" if base is not None else "--unavailable",
            "a recompile of a one-system plan", "a mixed fleet",
            "compile the fleet afresh with the failed hardware under its group's `unavailable:`")])
    plan, fresh, warnings = _fleet_plan(fleet, base, unavailable, restore, clock)
    inputs = fleet[0]
    plan = with_notices(plan, inputs.resolved.engines)
    clock["planned"] = time.perf_counter()
    artifacts = _emitted(plan, only, emitter)
    clock["emitted"] = time.perf_counter()
    names = list(clock)
    seconds = {b: round(clock[b] - clock[a], 4) for a, b in itertools.pairwise(names)}
    return CompileResult(plan, dict(sorted(artifacts.items())), seconds, inputs.files, fresh,
                         tuple(warnings))


def _fleet_plan(fleet: tuple[Inputs, ...], base: Plan | None, unavailable: str | None,
                restore: str | None, clock: dict[str, float]
                ) -> tuple[Plan, float | None, list[Diagnostic]]:
    """The plan of one system or of a mixed fleet (each group numbering its instances on
    from the groups before it), the goodput a fresh compile reaches (`--from`), and the
    warnings about the layouts and the node names."""
    from compiler import prediction
    from compiler.fleet import merge
    from compiler.perf.predict import instance_layouts

    if len(fleet) == 1:
        plan, fresh = _plan(fleet[0], base, unavailable, clock, restore)
        plans = [plan]
    else:
        plans = []
        for group in fleet:
            numbers = next_numbers(i.id for p in plans for i in p.instances)
            plans.append(_plan(group, None, None, clock, next_id=numbers)[0])
        plan, fresh = merge(fleet, plans), None
    warnings = [d for inputs, p in zip(fleet, plans, strict=True)
                for d in prediction.warnings(inputs, instance_layouts(p.instances), p.predicted)]
    warnings += [d for group in fleet for d in invented_node_names(group)]
    return plan, fresh, warnings


def _emitted(plan: Plan, only: tuple[str, ...] | None, emitter: "EmitWorker | None"
             ) -> dict[str, str | bytes]:
    """plan.yaml and the targets' files (in `emitter`'s process when given), held to the
    enforced controller-level rules: exit 3 where the bundle would not start."""
    from compiler.targets_registry import targets
    from compiler.validate import rules

    if emitter is not None:
        emitter.start(plan, only)  # the child emits the targets while plan.yaml is written
        artifacts: dict[str, str | bytes] = {"plan.yaml": dump_plan(plan)}
        artifacts.update(emitter.result())
    else:
        artifacts = {"plan.yaml": dump_plan(plan)}
        for emit in targets(only).values():
            artifacts.update(emit(plan))
    broken = rules.check(plan, artifacts, rules.ENFORCED)
    if broken:  # the bundle would not start: a rackc defect or inputs the targets cannot serve
        raise CompileError(broken, exit_code=3)
    return artifacts


def simulate(plan_path: Path, deployment: Path, opts: "Options") -> dict:
    """`rackc simulate`: replay a workload against the plan compiled from `deployment`
    (compiler.simulate); metrics per routing policy beside the plan's closed-form ones.
    Raises CompileError (exit 2) on a plan of other inputs, a bad trace, policy or fault."""
    from compiler.simulate.router import POLICIES
    from compiler.simulate.runner import simulate as run

    plan = read_plan(plan_path)
    fleet = load_fleet(deployment)
    inputs = fleet[0]
    systems = sorted(h.system for h in plan.fleet)
    if inputs.resolved.digest != plan.inputs_digest \
            or systems != sorted(i.system.name for i in fleet):
        raise CompileError([Diagnostic(
            "error", "E751", display_name(plan_path), 0, 0, "inputs_digest",
            f"the plan `rackc compile {display_name(deployment)}` writes",
            f"a plan of other inputs ({plan.inputs_digest[:12]})",
            "recompile, or pass the deployment this plan was compiled from")])
    bad = [p for p in opts.policies if p not in POLICIES]
    if bad:
        raise CompileError([Diagnostic("error", "E753", "<argument>", 0, 0, "--policy",
                                       " | ".join(POLICIES), repr(bad[0]),
                                       did_you_mean(bad[0], POLICIES))])
    results, outcomes = run(inputs, plan, opts, fleet if plan.mixed else ())
    closed = plan.predicted.model_dump(mode="json", include=set(CLOSED_FORM_KEYS)) \
        if plan.predicted else None
    return {"results": results, "outcomes": outcomes, "closed_form": closed}


CLOSED_FORM_KEYS = ("ttft_ms_p50", "ttft_ms_p90", "tpot_ms_p50", "tokens_per_s_per_user_p50",
                    "tokens_per_s_per_user_p90", "requests_per_s", "prefix_hit_rate")

"""Recompile from a running plan after hardware fails (`rackc compile --from OLD/plan.yaml
--unavailable ID,...`), and say what changes between two plans.

The failed hardware joins the deployment's `unavailable` list; every instance of the old plan
whose GPUs are all still available is kept with its id and GPUs (the solver places only new
instances, on what is left, and counts the kept supply toward goodput); new instances take ids
the old plan never used. Plans are compared by GPU set: an instance on the same GPUs is the same
instance whatever its id.
"""

import hashlib
from dataclasses import replace

from compiler import graph
from compiler.ids import gpu_id, natural, next_numbers, parse_instance, parse_part
from compiler.load import Inputs, layout
from compiler.plan import Instance, Plan
from compiler.precheck import shape_fit_problem
from compiler.shapes import parse_shape
from compiler.solve.problem import Kept
from schemas.diagnostics import CompileError, Diagnostic
from schemas.rack import Unavailable


def _bad(got: str, expected: str, hint: str, flag: str = "--unavailable") -> CompileError:
    return CompileError([Diagnostic("error", "E205", "<argument>", 0, 0, flag,
                                    expected, got, hint)])


def parse_ids(text: str, inputs: Inputs, flag: str = "--unavailable") -> list[str]:
    """GPU ids of `--unavailable` (or `--restore`): GPUs `r0-t07-g2`, trays `r0-t07`, racks
    `r3`."""
    racks, trays = layout(inputs.hardware, inputs.system)
    per = inputs.system.gpus_per_tray
    out: list[str] = []
    for item in (x.strip() for x in text.split(",")):
        part = parse_part(item)
        if part is None:
            raise _bad(repr(item), "a GPU r0-t07-g2, a tray r0-t07 or a rack r3",
                       "use the ids of plan.yaml (its hardware.groups' trays)", flag)
        r, t, g = part
        if r >= racks or (t is not None and t >= trays) or (g is not None and g >= per):
            raise _bad(repr(item), f"an id within r<0..{racks - 1}>-t<00..{trays - 1:02d}>-"
                       f"g<0..{per - 1}>", "the hardware has no such rack, tray or GPU", flag)
        for tt in [t] if t is not None else range(trays):
            out += [gpu_id(r, tt, g)] if g is not None else \
                [gpu_id(r, tt, k) for k in range(per)]
    return out


def down_in_file(inputs: Inputs) -> set[str]:
    """The GPUs the Rack/Cluster file itself marks unavailable (its trays' and its GPUs)."""
    _, trays = layout(inputs.hardware, inputs.system)
    down = inputs.hardware.spec.unavailable
    return {*down.gpus, *(gpu_id(i // trays, i % trays, k) for i in down.trays
                          for k in range(inputs.system.gpus_per_tray))}


def with_failures(inputs: Inputs, base: Plan | None, failed: list[str],
                  restored: list[str] = ()) -> Inputs:
    """The inputs with the failed GPUs (and those the old plan already had down, less the
    `restored` ones: repaired) unavailable; the digest covers them. Restoring a GPU the file
    itself marks down, or leaving no GPU up, is the argument's fault (E205)."""
    old = base.hardware.unavailable_gpus if base is not None else []
    spec = inputs.hardware.spec
    in_file = down_in_file(inputs)
    kept_down = sorted(set(restored) & in_file, key=natural)
    if kept_down:
        raise _bad(f"{kept_down[0]}, which {inputs.sources['hardware'].file} marks unavailable",
                   "a GPU the old plan had down",
                   "remove it from the file's spec.unavailable instead", "--restore")
    extra = sorted({g for g in [*old, *failed] if g not in in_file} - set(restored),
                   key=natural)
    if not extra:
        return inputs
    racks, trays = layout(inputs.hardware, inputs.system)
    if len(in_file | set(extra)) >= racks * trays * inputs.system.gpus_per_tray > len(in_file):
        flag = "--unavailable" if failed else "--from"
        raise _bad(f"every GPU down ({len(set(extra))} by {flag})", "at least one GPU left up",
                   "drop ids from --unavailable, or --restore repaired ones", flag)
    down = Unavailable(trays=list(spec.unavailable.trays), gpus=[*spec.unavailable.gpus, *extra])
    hardware = inputs.hardware.model_copy(
        update={"spec": spec.model_copy(update={"unavailable": down})})
    digest = hashlib.sha256("\0".join([inputs.resolved.digest, *extra]).encode()).hexdigest()
    return replace(inputs, hardware=hardware, resolved=replace(inputs.resolved, digest=digest))


def check_base(base: Plan, inputs: Inputs, g) -> None:
    """The old plan must describe this hardware (same system, trays and GPUs)."""
    have = [(t.id, tuple(t.gpus)) for t in base.hardware.trays]
    want = [(t, tuple(graph.gpus_of_tray(g, t))) for t in graph.trays(g)]
    if base.hardware.system != inputs.system.name or have != want:
        raise CompileError([Diagnostic(
            "error", "E703", "<argument>", 0, 0, "--from",
            f"a plan of this hardware ({inputs.system.name}, {len(want)} trays)",
            f"{base.hardware.system}, {len(have)} trays",
            "pass the plan.yaml compiled from this deployment")])


def check_kept(base: Plan, inputs: Inputs, pre, g) -> None:
    """Every instance the old plan runs on hardware still up must be one this deployment could
    run: a hand-edited shape (a TP1 of a model that needs eight GPUs, stages for decode) is
    refused, not kept."""
    up = set(graph.available_gpus(g))
    for n, i in enumerate(base.instances):
        if not up.issuperset(i.gpus):
            continue
        problem, ok = shape_fit_problem(inputs, list(pre.fits), i.role, i.shape, len(up))
        if problem:
            raise CompileError([Diagnostic(
                "error", "E704", "<argument>", 0, 0, f"--from instances[{n}] ({i.id})",
                f"a {i.role} shape this deployment runs ({', '.join(sorted(ok)[:4])})",
                f"{i.shape}: {problem}", "pass the plan.yaml rackc compiled, not an edited one")])


def kept(base: Plan, g) -> list[Kept]:
    """The old plan's instances whose GPUs are all still available."""
    up = set(graph.available_gpus(g))
    return [Kept(i.id, i.role, parse_shape(i.shape), tuple(i.gpus), base.route_of(i))
            for i in base.instances if up.issuperset(i.gpus)]


def next_ids(base: Plan) -> dict[str, int]:
    """Per role, the first id number the old plan never used."""
    return next_numbers(i.id for i in base.instances)


def match(a: Plan, b: Plan) -> tuple[list[tuple[Instance, Instance]], list[Instance],
                                     list[Instance], list[tuple[Instance, Instance]]]:
    """(same GPU set, stopped, started, moved): instances match by GPU set first; an unmatched
    pair that shares an id has moved."""
    by_gpus = {tuple(i.gpus): i for i in b.instances}
    same, left = [], []
    for x in a.instances:
        y = by_gpus.pop(tuple(x.gpus), None)
        (same.append((x, y)) if y is not None else left.append(x))
    rest = {i.id: i for i in b.instances if tuple(i.gpus) in by_gpus}
    moved = [(x, rest.pop(x.id)) for x in left if x.id in rest]
    moved_ids = {x.id for x, _ in moved}
    stopped = [x for x in left if x.id not in moved_ids]
    started = sorted(rest.values(), key=lambda i: parse_instance(i.id))
    return same, stopped, started, moved


def _where(i: Instance) -> str:
    return f"{i.shape} on {','.join(i.trays)}"


def _router(plan: Plan, i: Instance) -> str:
    route = plan.route_of(i)
    return "the plan's one router" if route is None else route


def changes(a: Plan, b: Plan) -> list[str]:
    """What stops, starts and moves from plan a to plan b: instances, Engram shards, pool
    segments; then the predicted metrics before and after."""
    same, stopped, started, moved = match(a, b)
    out = [f"- stop {x.id}: {_where(x)}" for x in stopped]
    out += [f"+ start {y.id}: {_where(y)}" for y in started]
    out += [f"~ move {x.id}: {_where(x)} -> {_where(y)}" for x, y in moved]
    out += [f"~ {x.id} -> {y.id}: same GPUs, {_where(x)} (batch {x.max_batch}) -> "
            f"{_where(y)} (batch {y.max_batch})" for x, y in same
            if (x.id, x.shape, x.max_batch, x.max_batched_tokens) !=
            (y.id, y.shape, y.max_batch, y.max_batched_tokens)]
    # a kept instance whose router changes leaves one Dynamo graph for another: its pods
    # restart under the other graph (compiler/routes.py keeps them where it can)
    regrouped = [(x, y) for x, y in same if a.route_of(x) != b.route_of(y)]
    out += [f"~ regroup {y.id}: routing group {_router(a, x)} -> {_router(b, y)} (its pods "
            "restart in the other graph)" for x, y in regrouped]
    out.append(f"instances: {len(same)} keep their GPUs, {len(stopped)} stop, "
               f"{len(started)} start, {len(moved)} move"
               + (f", {len(regrouped)} change routing group" if regrouped else ""))
    sa = {(s.group, s.table, s.shard): s for s in a.engram_shards}
    sb = {(s.group, s.table, s.shard): s for s in b.engram_shards}
    kept_shards = sum(1 for k, s in sa.items() if sb.get(k) == s)
    gone = sum(1 for k in sa if k not in sb)
    new = sum(1 for k in sb if k not in sa)
    if sa or sb:
        out.append(f"engram shards: {kept_shards} stay, {len(sa) - kept_shards - gone} move or "
                   f"resize, {gone} stop, {new} start")
    pa = {(s.kind, s.location): s.gib for s in a.kv_pool.segments}
    pb = {(s.kind, s.location): s.gib for s in b.kv_pool.segments}
    if pa or pb:
        out.append(f"pool segments: {sum(1 for k in pa if pb.get(k) == pa[k])} stay, "
                   f"{sum(1 for k in pa if k in pb and pb[k] != pa[k])} resize, "
                   f"{sum(1 for k in pa if k not in pb)} stop, "
                   f"{sum(1 for k in pb if k not in pa)} start "
                   f"({a.kv_pool.total_gib:g} -> {b.kv_pool.total_gib:g} GiB)")
    return out


METRICS = ("goodput_requests_per_s", "tokens_per_s_per_user_p90", "ttft_ms_p90",
           "total_tokens_per_s_per_gpu", "output_tokens_per_s_per_gpu", "prefix_hit_rate")


SURVIVOR_COST = 0.03  # goodput given up for keeping instances in place, beyond which we say so


def survivor_cost(plan: Plan, fresh: float | None) -> list[str]:
    """A warning, printed before the changes, when keeping the running instances where they
    are reaches more than SURVIVOR_COST less goodput than a fresh layout would."""
    kept = plan.solver.objective
    if not fresh or kept >= fresh * (1 - SURVIVOR_COST):
        return []
    return [f"warning: keeping the running instances in place gives {kept:g} requests/s; a "
            f"fresh layout (moving instances) would give {fresh:g} "
            f"(keeping them costs {(fresh - kept) / fresh:.0%})",
            "  hint: compile without --from (and with the failed hardware under the file's "
            "spec.unavailable) for the fresh layout; both are printed below"]


def metrics(a: Plan, b: Plan, fresh: float | None = None) -> list[str]:
    """Predicted metrics before -> after (and what a fresh compile's counts would reach)."""
    out = [f"goodput: {a.solver.objective:g} -> {b.solver.objective:g} requests/s" + (
        f" (a fresh compile, moving instances, would reach {fresh:g})"
        if fresh is not None and fresh > b.solver.objective + 1e-6 else "")]
    pa = a.predicted.model_dump() if a.predicted else {}
    pb = b.predicted.model_dump() if b.predicted else {}
    for key in METRICS[1:]:
        va, vb = pa.get(key), pb.get(key)
        if va is not None or vb is not None:
            out.append(f"{key}: {va} -> {vb}")
    return out

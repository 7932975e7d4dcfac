"""`rackc predict` of a pinned layout without the solver, the lowering or any emitter.

A pinned layout fixes the instance counts; where on the GPUs they go does not change what the
perf model predicts (it depends on the shapes, counts and batch limits only), except on NVL72
racks, more than one, whose routing groups follow the racks (compiler.routes), so this path
loads, prechecks and predicts, importing neither OR-Tools, networkx nor the targets. When the pins
might not fit (more GPUs pinned than available, or GPUs marked unavailable), or on such racks,
it returns None
and the caller compiles in full, so a placement that cannot hold is still reported.
"""

from pathlib import Path
from typing import TYPE_CHECKING

from compiler.load import layout, load_inputs
from compiler.precheck import precheck_counts
from compiler.shapes import parse_shape
from schemas.diagnostics import CompileError

if TYPE_CHECKING:
    from compiler.load import Inputs
    from compiler.plan import Predicted
    from schemas.diagnostics import Diagnostic


def predict_pinned(deployment: Path, kernels: str = "vllm"
                   ) -> "tuple[Predicted, list[Diagnostic]] | None":
    """predict_loaded of the deployment's inputs; `kernels`: whose measured kernels to
    predict with (compiler.load.load_fleet)."""
    return predict_loaded(load_inputs(deployment, kernels))


def predict_loaded(inputs: "Inputs") -> "tuple[Predicted, list[Diagnostic]] | None":
    """The plan's `predicted` block for a pinned deployment, as `compile` computes it, and its
    warnings about the layout (W510, W511); None when the deployment is not pinned, its
    placement needs the solver to be checked, its instances are more than one Dynamo graph
    serves (compiler/routes.py deals them into parts by where they run), or its prefix pool
    is the DRAM store (each tray's segment is what the host budget leaves beside the engines
    placed there, so it depends on the placement)."""
    from compiler import routes

    r = inputs.resolved
    unavailable = inputs.hardware.spec.unavailable
    if r.objective_mode.value != "pinned" or unavailable.trays or unavailable.gpus \
            or inputs.resolved.kv_pool_dram.value or routes.by_domain(inputs):
        return None
    from compiler import prediction  # the perf model: only for a pinned layout (`check`)
    from compiler.perf.capacity import pinned_candidate
    from compiler.perf.predict import grouped_layouts, pool_tokens, workload
    from compiler.perf.serving import prefix_hit_rate

    racks, trays = layout(inputs.hardware, inputs.system)
    available = racks * trays * inputs.system.gpus_per_tray  # none marked unavailable
    pre = precheck_counts(inputs, available)
    if not pre.ok:
        raise CompileError(pre.diagnostics, exit_code=3)
    pins = [(e, parse_shape(e.shape)) for e in r.pins]
    if sum(shape.gpus * e.count for e, shape in pins) > available \
            or sum(e.count for e, _ in pins) > routes.graph_instances(inputs):
        return None  # more instances than one router's graph: its parts follow the placement
    w = workload(inputs)
    hit = prefix_hit_rate(w, pool_tokens(inputs, []))
    guess = max(1, available // 2)  # as the solver's problem builder guesses it
    found = {}
    instances = []
    for e, shape in pins:
        c = found.get((e.role, shape.name))
        if c is None:
            c = found[(e.role, shape.name)] = pinned_candidate(
                inputs, e.role, shape, w, hit, guess, e.max_batch, e.max_batched_tokens)
        instances += [(e.role, shape.name, c.max_batch, c.max_batched_tokens)] * e.count
    metrics = prediction.predict(inputs, routes.one_route(inputs, instances), available)
    return metrics, prediction.warnings(inputs, grouped_layouts(instances), metrics)

"""Pass 3: arithmetic before the solver. Which engine shapes could hold the model at all?

For each candidate shape and role: weights per GPU, plus one maximum-length request's KV, plus
the Engram share (prefill: tables spread over every available GPU, the best a peer group can do;
decode: over the instance's own GPUs), plus workspace, against usable HBM; weights offloaded to
host memory leave HBM, and must fit in the tray's DRAM beside the OS and the engine processes.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from compiler import arch
from compiler.load import Inputs
from compiler.memory import gpu_budget, requests_that_fit
from compiler.shapes import Shape, candidate_shapes, parse_shape, shape_problem
from schemas.diagnostics import Diagnostic
from schemas.source import format_path

if TYPE_CHECKING:
    import networkx as nx

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class ShapeFit:
    role: str
    shape: Shape
    weights_gib_per_gpu: float
    total_gib_per_gpu: float
    fits: bool

    def to_dict(self) -> dict:
        return {"role": self.role, "shape": self.shape.name, "gpus": self.shape.gpus,
                "weights_gib_per_gpu": round(self.weights_gib_per_gpu, 2), "fits": self.fits}


@dataclass(frozen=True)
class Precheck:
    fits: tuple[ShapeFit, ...]
    diagnostics: tuple[Diagnostic, ...]

    @property
    def ok(self) -> bool:
        return not any(d.severity == "error" for d in self.diagnostics)

    def feasible(self, role: str) -> list[Shape]:
        return [f.shape for f in self.fits if f.role == role and f.fits]


def precheck(inputs: Inputs, g: "nx.Graph") -> Precheck:
    from compiler import graph

    return precheck_counts(inputs, len(graph.available_gpus(g)))


def precheck_counts(inputs: Inputs, available: int) -> Precheck:
    """`precheck` given the number of available GPUs (no topology graph needed)."""
    model, system = inputs.model.spec, inputs.system
    capacity = system.gpu.hbm_gib.value
    fits = []
    pipeline = inputs.resolved.engines.vllm.pipeline
    shapes = candidate_shapes(model, system, max(available, 1), pipeline)
    for name in _named(inputs):  # a pinned or named shape outside the usual sizes (EP48)
        shape = parse_shape(name)
        if shape and shape not in shapes and \
                shape_problem(shape, model, system, max(available, 1), pipeline) is None:
            shapes.append(shape)
    for shape in shapes:
        for role in ROLES if shape.pp == 1 else ("prefill",):  # stages serve prefill only
            share = max(available, 1) if role == "prefill" else shape.gpus
            mem = gpu_budget(inputs, role, shape, share)
            fits.append(ShapeFit(role, shape, mem.weights_gib, mem.total_gib, mem.fits))
    diagnostics = (_diagnose(inputs, fits, available, capacity)
                   + _check_pins(inputs, fits, available) + _check_offload(inputs)
                   + _check_operating_points(inputs, fits))
    return Precheck(tuple(fits), tuple(diagnostics))


def _check_offload(inputs: Inputs) -> list[Diagnostic]:
    """Every GPU of a tray may offload what a weight offload asks for: that must fit in the
    tray's DRAM beside the node reserve and the engine processes (compiler.host_memory). A
    prefetch offload given as layer groups is sized per shape: the host budget holds it."""
    r, gpus = inputs.resolved, inputs.system.gpus_per_tray
    room = r.dram_gib_per_tray.value - r.host.reserved_gib - gpus * r.host.process_gib_per_rank
    src = inputs.sources["deployment"]
    out = []
    asks = {c.value.field: c.value for c in r.weight_offload if c.value is not None}
    for field, ask in sorted(asks.items(), key=lambda kv: str(kv[0])):
        if ask.gib_per_gpu is None or gpus * ask.gib_per_gpu <= room:
            continue
        path = (*field, "gib_per_gpu")
        pos = src.locate(path)
        out.append(Diagnostic("error", "E303", src.file, pos.line, pos.column, format_path(path),
                              f"at most {room / gpus:.1f} GiB per GPU ({gpus} GPUs share "
                              f"{room:.1f} GiB of a tray's DRAM)", f"{ask.gib_per_gpu:g}",
                              "offload less, or only the experts the HBM cannot hold"))
    return out


def _check_operating_points(inputs: Inputs, fits: list[ShapeFit]) -> list[Diagnostic]:
    """E304: the KV of an operating point's batch at its context fits in the KV cache of one
    rank of its shape (compiler.memory's budget), where the shape itself fits (E302 else)."""
    r, out = inputs.resolved, []
    fitting = {(f.role, f.shape.name) for f in fits if f.fits}
    for choice in r.operating_points:
        point = choice.value
        shape = parse_shape(point.shape)
        if shape is None or (point.role, point.shape) not in fitting:
            continue
        most, budget = requests_that_fit(inputs, point.role, shape,
                                         engram_gpus(inputs, point.role, shape),
                                         point.context_tokens)
        if point.batch_per_rank <= most:
            continue
        src = inputs.sources["deployment"]
        path = ("spec", "objective", "instances", point.entry, "operating_point",
                "batch_per_rank")
        pos = src.locate(path)
        per = budget.request_kv_gib(point.context_tokens)
        out.append(Diagnostic(
            "error", "E304", src.file, pos.line, pos.column, format_path(path),
            f"at most {most} requests per rank at {point.context_tokens} tokens of context "
            f"on {point.shape} {point.role} ({budget.kv_gib:.1f} GiB of KV cache per GPU, "
            f"{per:.3f} GiB per request)", str(point.batch_per_rank),
            f"lower batch_per_rank to {most} or the context" if most else
            "not one request of this context fits: shorten context_tokens, use fp8 KV "
            "(serving.kv_cache_dtype) or a shape with more GPUs"))
    return out


def engram_gpus(inputs: Inputs, role: str, shape: Shape) -> int:
    """GPUs a pinned role's Engram tables are spread over, as the perf model spreads them
    (compiler.perf.predict.groups): prefill over every prefill GPU, decode its own."""
    if role != "prefill":
        return shape.gpus
    return sum(s.gpus * e.count for e in inputs.resolved.pins if e.role == "prefill"
               and (s := parse_shape(e.shape)) is not None)


def _named(inputs: Inputs) -> list[str]:
    """Shape names the deployment writes: its pins and objective.shapes."""
    r = inputs.resolved
    return [e.shape for e in r.pins] + [
        n for role in ROLES for n in getattr(r.shape_search, role) or []]


def _check_pins(inputs: Inputs, fits: list[ShapeFit], available: int) -> list[Diagnostic]:
    """Each pinned shape, and each shape named in objective.shapes, exists for the model and
    fits in HBM (role aggregated: as decode)."""
    r = inputs.resolved
    named = [(("instances", j, "shape"), entry.role, entry.shape)
             for j, entry in enumerate(r.pins)]
    for role in ROLES:
        named += [(("shapes", role, j), role, name)
                  for j, name in enumerate(getattr(r.shape_search, role) or [])]
    src = inputs.sources["deployment"]
    out = []
    for where, role, name in named:
        problem, ok = shape_fit_problem(inputs, fits, role, name, available)
        if problem:
            path = ("spec", "objective", *where)
            pos = src.locate(path)
            examples = ", ".join(sorted(ok, key=lambda n: (len(n), n))[:4]) or "none fits"
            out.append(Diagnostic("error", "E302", src.file, pos.line, pos.column,
                                  format_path(path), f"a {role} shape that fits ({examples})",
                                  repr(name), problem))
    return out


def pool_problem(inputs: Inputs) -> str | None:
    """Why a pipelined instance cannot run beside this deployment's Mooncake pool, or None."""
    if not inputs.resolved.kv_pool_dram.value:
        return None
    fact = inputs.resolved.engines.vllm.pipeline.store_connector
    return (f"with serving.kv_pool.dram the engines load {fact.value}, which takes no pipeline "
            "stages in vLLM 0.33 (catalog/engines/vllm-0.33.yaml pipeline.store_connector); set "
            "kv_pool.dram: false or use a shape without PPm")


def shape_fit_problem(inputs: Inputs, fits: list[ShapeFit], role: str, name: str,
                       available: int) -> tuple[str | None, set[str]]:
    """Why the shape `name` cannot serve `role`, or None; and the shapes that could."""
    asked, role = role, "decode" if role == "aggregated" else role
    ok = {f.shape.name for f in fits if f.role == role and f.fits}
    shape = parse_shape(name)
    if shape is None:
        return ("TPnEPm needs m = n (experts spread over the tensor-parallel ranks), PPm "
                "m >= 2"), ok
    problem = shape_problem(shape, inputs.model.spec, inputs.system, max(available, 1),
                            inputs.resolved.engines.vllm.pipeline)
    if problem is None and shape.pp > 1 and role != "prefill":
        problem = ("pipeline stages serve prefill only (rackc does not model decode through "
                   f"stages); use {shape.name.rsplit('PP', 1)[0]} for {asked}")
    if problem is None and shape.pp > 1:
        problem = pool_problem(inputs)
    if problem is None and shape.name not in ok:
        problem = "its weights, KV and Engram share do not fit in HBM"
    return problem, ok


def _diagnose(inputs: Inputs, fits: list[ShapeFit], available: int,
              capacity: float) -> list[Diagnostic]:
    src = inputs.sources["hardware"]
    if available == 0:
        pos = src.locate(("spec", "unavailable"))
        return [Diagnostic("error", "E301", src.file, pos.line, pos.column, "spec.unavailable",
                           "at least one available GPU", "every GPU unavailable",
                           "remove entries from spec.unavailable")]
    out = []
    for role in ROLES:
        if any(f.fits for f in fits if f.role == role):
            continue
        best = min((f for f in fits if f.role == role), key=lambda f: f.total_gib_per_gpu,
                   default=None)
        dsrc = inputs.sources["deployment"]
        pos = dsrc.locate(("spec", "model"))
        need = f"{best.total_gib_per_gpu:.1f} GiB per GPU at best ({best.shape.name})" \
            if best else "no usable engine shape"
        weights = arch.weight_bytes(inputs.model.spec) / arch.GIB
        out.append(Diagnostic(
            "error", "E301", dsrc.file, pos.line, pos.column, "spec.model",
            f"a {role} shape within {capacity:.1f} GiB per GPU", need,
            f"{inputs.model_name} has {weights:.0f} GiB of weights; use more GPUs, a smaller "
            "dtype, a shorter serving.max_model_len, or engram_placement: dram"))
    return out

"""Why a generated input's exit 2 or 3 is right, checked apart from the pass that gave it.

The property tests (test_properties.py) draw racks, models and deployments, and accept a
refusal only where every diagnostic is justified here:

* exit 2 (invalid input): the diagnostic's code, file and field are one the generator can make
  invalid, and the drawn values there really contradict each other (`INVALID`, written from
  the inputs alone);
* exit 3 (valid input that cannot be served), by the diagnostic's own claim: every GPU down
  (counted from the drawn hardware); no shape of a role fitting in HBM, or a named shape that
  does not fit (its need recomputed with compiler.memory, the memory rule's owner), or that
  cannot exist on this model and hardware (each reason checked from the numbers it names); and
  for the solver's E501, the brute-force count oracle (tests/oracles.py) finding no counts
  while the requirements the diagnostics name hold, and the compiler still refusing the
  deployment once the SLOs not named are dropped. The oracle enumerates every count vector,
  so the generator keeps such inputs small (1-3 trays a rack, 1-2 HGX nodes).
"""

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from compiler import api, catalog
from compiler.load import Inputs, load_inputs
from compiler.memory import gpu_budget
from compiler.precheck import ROLES
from compiler.shapes import Shape, candidate_shapes, parse_shape
from schemas.diagnostics import CompileError, Diagnostic
from schemas.source import format_path
from tests.builders import problem_at
from tests.oracles import CountOracle


def justify(case: dict, deployment: Path, exc: CompileError) -> None:
    """Fail unless `exc` is the right refusal of the generated `case` (written to
    `deployment`)."""
    assert exc.exit_code in (2, 3) and exc.diagnostics
    if exc.exit_code == 2:
        for d in exc.diagnostics:
            assert _invalid(case, d), f"exit 2 for an input the generator made valid: {d.render()}"
        return
    solver = [d for d in exc.diagnostics if d.code == "E501"]
    if solver:
        _no_counts(case, deployment, solver)
    inputs = load_inputs(deployment) if len(solver) < len(exc.diagnostics) else None
    for d in exc.diagnostics:
        if d.code != "E501":
            assert _infeasible(case, inputs, d), f"exit 3 not borne out: {d.render()}"


# --- exit 2: the drawn input contradicts itself -------------------------------------------

def _drawn(case: dict) -> dict:
    """The spec of the generated model (model.yaml)."""
    return case["generated"]["spec"]


def _model(case: dict) -> dict:
    """The model's spec as drawn (a generated one) or as the catalog has it."""
    if case["generated"] is not None:
        return _drawn(case)
    return catalog.model(case["model"]).spec.model_dump()


def _lengths_over_context(case: dict) -> bool:
    w, profile = case["workload"], catalog.workload(case["workload"]["profile"])
    isl, osl = w.get("isl", profile.isl.value), w.get("osl", profile.osl.value)
    return isl + osl > _model(case)["max_context_tokens"]


def _kernel_refuses(block: int) -> bool:
    """Some attention backend's kernel blocks do not divide `block` (which one the model
    takes is the resolver's choice)."""
    kernels = catalog.engines().vllm.attention.kernel_block_sizes.values()
    return any(all(block % k for k in kernel.value) for kernel in kernels)


def _tray_out_of_range(case: dict, index: int) -> bool:
    return case["hardware"]["unavailable"]["trays"][index] >= _trays(case)


def _pool(case: dict) -> dict:
    return (case["serving"] or {}).get("kv_pool", {})


# (code, file, field with its index as [i]) -> does the drawn case contradict itself there?
INVALID: dict[tuple[str, str, str], Callable[[dict, int], bool]] = {
    ("E104", "model.yaml", "spec.attention.kv_heads"):
        lambda c, _: _drawn(c)["attention"]["kv_heads"] > _drawn(c)["attention"]["heads"],
    ("E104", "model.yaml", "spec.dense_layers"):
        lambda c, _: _drawn(c)["dense_layers"] > _drawn(c)["layers"]
        or ("moe" not in _drawn(c) and _drawn(c)["dense_layers"] != _drawn(c)["layers"]),
    ("E104", "model.yaml", "spec.dense_intermediate"):
        lambda c, _: _drawn(c)["dense_intermediate"] == 0
        and ("moe" not in _drawn(c) or _drawn(c)["dense_layers"] > 0),
    ("E104", "model.yaml", "spec.moe.top_k"):
        lambda c, _: _drawn(c)["moe"]["top_k"] > _drawn(c)["moe"]["experts"],
    ("E104", "deployment.yaml", "spec.serving.kv_pool.dram_fraction"):
        lambda c, _: _pool(c)["dram"] and _pool(c)["dram_fraction"] == 0,
    ("E105", "deployment.yaml", "spec.serving.kv_pool.hbm"):
        lambda c, _: _pool(c)["hbm"] and not _pool(c)["dram"],
    ("E104", "deployment.yaml", "spec.serving.max_model_len"):
        lambda c, _: not {"isl", "osl"} & set(c["workload"]) and _lengths_over_context(c),
    ("E104", "deployment.yaml", "spec.workload.isl"):
        lambda c, _: "isl" in c["workload"] and _lengths_over_context(c),
    ("E104", "deployment.yaml", "spec.workload.osl"):
        lambda c, _: "isl" not in c["workload"] and _lengths_over_context(c),
    ("E105", "deployment.yaml", "spec.serving.block_size"):
        lambda c, _: _kernel_refuses(c["serving"]["block_size"]),
    ("E205", "rack.yaml", "spec.unavailable.trays[i]"): _tray_out_of_range,
}


def _invalid(case: dict, d: Diagnostic) -> bool:
    index = re.search(r"\[(\d+)\]", d.path)
    field = re.sub(r"\[\d+\]", "[i]", d.path)
    check = INVALID.get((d.code, Path(d.file).name, field))
    return check is not None and check(case, int(index[1]) if index else -1)


# --- exit 3: the drawn hardware cannot serve the drawn deployment --------------------------

def _trays(case: dict) -> int:
    hw = case["hardware"]
    return hw.get("racks", 1) * (hw["nodes"] if "nodes" in hw else hw["trays"])


def available_gpus(case: dict) -> int:
    """GPUs of the drawn hardware less the unavailable trays and GPUs, counted from the case."""
    per = 8 if case["system"].startswith("hgx") else 4
    down = case["hardware"].get("unavailable", {})
    trays = {t for t in down.get("trays", []) if t < _trays(case)}
    gpus = {g for g in down.get("gpus", []) if int(g.split("-t")[1][:2]) not in trays}
    return per * (_trays(case) - len(trays)) - len(gpus)


def _fits(inputs: Inputs, role: str, shape: Shape, available: int) -> bool:
    """compiler.memory's verdict: prefill spreads Engram over every available GPU, decode over
    its own (precheck's rule); an aggregated instance is sized as decode."""
    role = "decode" if role == "aggregated" else role
    return gpu_budget(inputs, role, shape, available if role == "prefill" else shape.gpus).fits


def _no_shape_fits(inputs: Inputs, role: str, available: int) -> bool:
    pipeline = inputs.resolved.engines.vllm.pipeline
    shapes = candidate_shapes(inputs.model.spec, inputs.system, available, pipeline)
    return not any(_fits(inputs, role, s, available) for s in shapes)


@dataclass(frozen=True)
class _Named:
    """A shape the deployment names for `role`, on hardware with `available` GPUs."""

    inputs: Inputs
    name: str
    role: str
    available: int

    @property
    def shape(self) -> Shape:
        return parse_shape(self.name)


# a named shape's reason not to exist (precheck.shape_fit_problem's texts) -> does it hold?
SHAPE_CLAIMS: list[tuple[str, Callable[[_Named, re.Match], bool]]] = [
    (r"its weights, KV and Engram share do not fit in HBM$",
     lambda n, m: not _fits(n.inputs, n.role, n.shape, n.available)),
    (r"TPnEPm needs m = n", lambda n, m: bool(re.fullmatch(r"TP(\d+)EP(?!\1$)\d+", n.name))),
    (r".* has no experts to spread", lambda n, m: n.inputs.model.spec.moe is None
        and n.shape.ep > 1),
    (r"(\d+) experts do not split evenly over EP(\d+)",
     lambda n, m: n.inputs.model.spec.moe.slots == int(m[1]) and n.shape.ep == int(m[2])
        and int(m[1]) % int(m[2]) != 0),
    (r"needs (\d+) GPUs, the hardware has (\d+)$",
     lambda n, m: n.shape.gpus == int(m[1]) > int(m[2]) == max(n.available, 1)),
    (r"(\d+) attention heads do not split over TP(\d+)$",
     lambda n, m: n.inputs.model.spec.attention.heads == int(m[1]) and n.shape.tp == int(m[2])
        and int(m[1]) % int(m[2]) != 0),
    (r"(\d+) GPUs are not whole trays of (\d+)$",
     lambda n, m: n.inputs.system.gpus_per_tray == int(m[2]) < int(m[1])
        and int(m[1]) % int(m[2]) != 0),
    (r"(\d+) GPUs do not tile a tray of (\d+)",
     lambda n, m: n.shape.gpus == int(m[1]) < int(m[2]) == n.inputs.system.gpus_per_tray
        and int(m[2]) % int(m[1]) != 0),
]


def _shape_refused(case: dict, inputs: Inputs, d: Diagnostic) -> bool:
    """E302: a shape the deployment names, for its role, cannot be served."""
    where = re.fullmatch(r"spec\.objective\.(?:instances\[(\d+)\]\.shape|shapes\.(\w+)\[\d+\])",
                         d.path)
    role = where[2] or case["objective"]["instances"][int(where[1])]["role"]
    named = _Named(inputs, d.got.strip("'"), role, available_gpus(case))
    for pattern, holds in SHAPE_CLAIMS:
        m = re.match(pattern, d.hint)
        if m:
            return holds(named, m)
    return False


def _infeasible(case: dict, inputs: Inputs, d: Diagnostic) -> bool:
    if d.code == "E301" and d.path == "spec.unavailable":
        return available_gpus(case) == 0
    if d.code == "E301" and d.path == "spec.model":
        role = next(r for r in ROLES if d.expected.startswith(f"a {r} shape"))
        return _no_shape_fits(inputs, role, available_gpus(case))
    if d.code == "E302":
        return _shape_refused(case, inputs, d)
    return False


def _no_counts(case: dict, deployment: Path, diagnostics: list[Diagnostic]) -> None:
    """E501: the count oracle finds no counts while the named requirements hold (none named:
    the hardware cannot hold both roles, whatever the requirements); and the deployment
    without the SLOs not named still cannot be served (the oracle takes a candidate's missed
    SLO from its role, so this asks the compiler again)."""
    p = problem_at(deployment)
    named = {d.path for d in diagnostics}
    core = frozenset(k for k, r in p.requirements.items() if format_path(r.path) in named)
    shown = "\n".join(d.render() for d in diagnostics)
    assert not CountOracle(p).feasible(core), \
        f"exit 3 where the brute-force count oracle finds counts:\n{shown}"
    slo = case["slo"] or {}
    kept = {k: v for k, v in slo.items() if f"spec.slo.{k}" in named}
    if kept != slo:
        try:
            api.compile(_with_slo(deployment, kept), only=())
        except CompileError as exc:
            assert exc.exit_code == 3, exc.diagnostics[0].render()
        else:
            raise AssertionError(f"served once the SLOs not named are dropped:\n{shown}")


def _with_slo(deployment: Path, slo: dict) -> Path:
    """A copy of the deployment's folder whose deployment asks for `slo` alone."""
    root = deployment.parent.with_name(deployment.parent.name + "-named-slo")
    shutil.copytree(deployment.parent, root)
    doc = yaml.safe_load(deployment.read_text())
    doc["spec"]["slo"] = slo
    if not slo:
        del doc["spec"]["slo"]
    (root / deployment.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return root / deployment.name

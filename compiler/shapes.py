"""Engine shapes: how one vLLM instance spreads a model over its GPUs.

DEPn: data-parallel attention with expert parallelism over n GPUs (each rank a DP rank).
TPn: tensor parallelism over n GPUs, experts sliced by columns.
TPnEPn: tensor-parallel attention with experts distributed whole (vLLM --enable-expert-parallel).
"""

import re
from dataclasses import dataclass

from compiler.catalog.system import System
from schemas.model import ModelSpec

_SHAPE = re.compile(r"^(?:DEP(?P<dep>[0-9]+)|TP(?P<tp>[0-9]+)(?:EP(?P<ep>[0-9]+))?)$")

DEP_SIZES = (2, 4, 8, 16, 32, 64, 72)
TP_SIZES = (1, 2, 4, 8, 16)
TPEP_SIZES = (4, 8, 16)


@dataclass(frozen=True, order=True)
class Shape:
    name: str
    gpus: int
    dp: int
    tp: int
    ep: int

    @property
    def kind(self) -> str:
        return "DEP" if self.dp > 1 else ("TPEP" if self.ep > 1 else "TP")


def parse_shape(name: str) -> Shape | None:
    m = _SHAPE.match(name)
    if not m:
        return None
    if m["dep"]:
        n = int(m["dep"])
        return Shape(name, n, n, 1, n) if n >= 1 else None
    tp = int(m["tp"])
    ep = int(m["ep"]) if m["ep"] else 1
    if tp < 1 or ep not in (1, tp):
        return None
    return Shape(name, tp, 1, tp, ep)


def shape_problem(shape: Shape, model: ModelSpec, system: System, total_gpus: int) -> str | None:
    """Why `shape` cannot be used for this model on this system, or None."""
    if shape.ep > 1 and not model.moe:
        return f"{model.architecture} has no experts to spread (use TPn)"
    if shape.ep > 1 and model.moe and model.moe.slots % shape.ep:
        return (f"{model.moe.slots} experts do not split evenly over EP{shape.ep} (redundant "
                "experts, serving.redundant_experts, can make them)")
    if shape.gpus > total_gpus:
        return f"needs {shape.gpus} GPUs, the hardware has {total_gpus}"
    domain = int(system.rack.nvlink_domain_gpus.value)
    if shape.tp > domain:
        return f"TP{shape.tp} exceeds the {domain}-GPU NVLink domain"
    if system.form == "nvl72" and shape.gpus > domain:
        return f"an instance stays inside one {domain}-GPU NVLink domain"
    per_tray = system.gpus_per_tray
    if shape.gpus > per_tray and shape.gpus % per_tray:
        return f"{shape.gpus} GPUs are not whole trays of {per_tray}"
    if shape.tp > 1 and model.attention.heads % shape.tp:
        return f"{model.attention.heads} attention heads do not split over TP{shape.tp}"
    return None


def candidate_shapes(model: ModelSpec, system: System, total_gpus: int) -> list[Shape]:
    names = [f"TP{n}" for n in TP_SIZES]
    if model.moe:
        names += [f"DEP{n}" for n in DEP_SIZES] + [f"TP{n}EP{n}" for n in TPEP_SIZES]
    shapes = [parse_shape(n) for n in names]
    ok = [s for s in shapes if s and shape_problem(s, model, system, total_gpus) is None]
    return sorted(ok, key=lambda s: (s.kind, s.gpus))

"""Engine shapes: how one vLLM instance spreads a model over its GPUs.

DEPn: data-parallel attention with expert parallelism over n GPUs (each rank a DP rank).
TPn: tensor parallelism over n GPUs, experts sliced by columns.
TPnEPn: tensor-parallel attention with experts distributed whole (vLLM --enable-expert-parallel).
...PPm (TPnPPm, TPnEPnPPm): m pipeline stages (vLLM --pipeline-parallel-size), each stage a TPn
(or TPnEPn) over its own GPUs holding its share of the layers (`stage_layers`); the instance has
n x m GPUs, rank r on stage r // n (vLLM's DP x PP x TP rank layout). Stages may span HGX nodes
(the activations cross the scale-out NIC) and stay inside one NVLink domain on NVL72. rackc
serves prefill with them (a long prompt's chunks fill the pipeline); DEPnPPm parses but is
refused (catalog/engines/vllm-0.33.yaml pipeline.with_data_parallel).
"""

import re
from dataclasses import dataclass

from compiler.catalog.engine import Pipeline
from compiler.catalog.system import System
from schemas.model import ModelSpec

_SHAPE = re.compile(r"^(?:DEP(?P<dep>[0-9]+)|TP(?P<tp>[0-9]+)(?:EP(?P<ep>[0-9]+))?)"
                    r"(?:PP(?P<pp>[0-9]+))?$")

DEP_SIZES = (2, 4, 8, 16, 32, 64, 72)
TP_SIZES = (1, 2, 4, 8, 16)
TPEP_SIZES = (4, 8, 16)


@dataclass(frozen=True, order=True)
class Shape:
    name: str
    gpus: int  # dp x tp x pp
    dp: int
    tp: int
    ep: int  # the expert-parallel group of one stage (dp x tp ranks)
    pp: int = 1  # pipeline stages

    @property
    def kind(self) -> str:
        return "DEP" if self.dp > 1 else ("TPEP" if self.ep > 1 else "TP")

    @property
    def stage_gpus(self) -> int:
        """GPUs of one pipeline stage (all of them without PP)."""
        return self.gpus // self.pp


def parse_shape(name: str) -> Shape | None:
    m = _SHAPE.match(name)
    if not m:
        return None
    pp = int(m["pp"]) if m["pp"] else 1
    if pp < 1 or (m["pp"] and pp == 1):  # PP1 is the shape without the suffix
        return None
    if m["dep"]:
        n = int(m["dep"])
        return Shape(name, n * pp, n, 1, n, pp) if n >= 1 else None
    tp = int(m["tp"])
    ep = int(m["ep"]) if m["ep"] else 1
    if tp < 1 or ep not in (1, tp):
        return None
    return Shape(name, tp * pp, 1, tp, ep, pp)


def stage_layers(layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM 0.33 splits them (distributed/utils.py
    get_pp_indices): layers // pp each, the remainder one each to the stages before the last,
    from the second-to-last backwards (the first and last also hold the embedding and the LM
    head)."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


def stage_layer_mix(model: ModelSpec, pp: int) -> list[tuple[int, int, int]]:
    """(layers, dense layers, sliding-window layers) of each pipeline stage: the dense layers
    come first in the model (first_k_dense_replace); sliding layers, whose order the Model
    does not record, are spread evenly."""
    out, first = [], 0
    total, sliding = model.layers, model.attention.sliding_layers
    for n in stage_layers(total, pp):
        dense = max(0, min(first + n, model.dense_layers) - first)
        window = round(sliding * (first + n) / total) - round(sliding * first / total)
        out.append((n, dense, window))
        first += n
    return out


def shape_problem(shape: Shape, model: ModelSpec, system: System, total_gpus: int,
                  pipeline: Pipeline) -> str | None:
    """Why `shape` cannot be used for this model on this system, or None; `pipeline`: what
    the engine pipelines (catalog/engines/vllm-<release>.yaml, through compiler.resolve)."""
    if shape.pp > 1:
        problem = _pipeline_problem(shape, model, pipeline)
        if problem:
            return problem
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
    if shape.gpus < per_tray and per_tray % shape.gpus:  # compiler/solve/racks.py free_blocks
        return (f"{shape.gpus} GPUs do not tile a tray of {per_tray}: an instance inside a "
                "tray takes an aligned block of a size that divides it")
    if shape.tp > 1 and model.attention.heads % shape.tp:
        return f"{model.attention.heads} attention heads do not split over TP{shape.tp}"
    la = model.linear_attention
    if shape.tp > 1 and la and la.heads % shape.tp:  # kimi_k3/nvidia/kda.py l.613
        return f"{la.heads} linear-attention heads do not split over TP{shape.tp}"
    return None


def _pipeline_problem(shape: Shape, model: ModelSpec, pipeline: Pipeline) -> str | None:
    if shape.dp > 1 and not pipeline.with_data_parallel.value:
        return (f"rackc does not lay out data-parallel ranks with pipeline stages (use "
                f"TP{shape.dp}EP{shape.dp}PP{shape.pp} or TP{shape.dp}PP{shape.pp})")
    if model.layers < shape.pp:
        return f"{model.layers} layers do not split over {shape.pp} pipeline stages"
    hybrid = model.attention.sliding_layers or model.linear_attention or \
        model.architecture in pipeline.hybrid_kv_architectures.value
    if hybrid and pipeline.kv_transfer_full_attention_only.value:
        why = (f"{model.attention.sliding_layers} sliding-window layers"
               if model.attention.sliding_layers else
               "the linear-attention layers' state" if model.linear_attention else
               f"{model.architecture}'s compressed attention caches")
        return ("rackc pipelines prefill only where every layer is full attention, the layout "
                f"vLLM 0.33's NIXL connectors hand off from stages ({why} make the KV layout "
                "hybrid)")
    if model.architecture not in pipeline.architectures.value:
        return (f"{model.architecture} is not among the architectures whose vLLM 0.33 class "
                "implements SupportsPP (catalog/engines/vllm-0.33.yaml pipeline.architectures)")
    return None


def candidate_shapes(model: ModelSpec, system: System, total_gpus: int, pipeline: Pipeline
                     ) -> list[Shape]:
    names = [f"TP{n}" for n in TP_SIZES]
    if model.moe:
        names += [f"DEP{n}" for n in DEP_SIZES] + [f"TP{n}EP{n}" for n in TPEP_SIZES]
    shapes = [parse_shape(n) for n in names]
    ok = [s for s in shapes if s and shape_problem(s, model, system, total_gpus, pipeline) is None]
    return sorted(ok, key=lambda s: (s.kind, s.gpus))

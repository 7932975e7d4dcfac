"""Weight offload per instance: which decoder weights vLLM keeps in pinned host memory, the
flags that ask for it and the GPU buffers it costs. The one rule: the memory budget
(compiler.memory), the perf model (compiler.perf.offload) and lower (the Instance, and through
it the host budget and the flags) read `of`; what the deployment asks of each role and pinned
shape is resolved once (compiler.resolve).

Both backends offload only what vLLM's offloaders are given: each pipeline stage's own decoder
layers (catalog/engines/vllm-<release>.yaml offload.wrapped), and with UVA the vision tower
(offload.towers). UVA takes whole parameters in load order up to `--cpu-offload-gb` per GPU
(offload.uva_reads). Prefetch keeps the last `num_in_group` of every `group_size` layers of a
stage in host memory, skipping layers with no parameter `--offload-params` names
(offload.prefetch_layers), and copies them into `prefetch_step` slots of every distinct
offloaded parameter, GPU buffers allocated with the weights (offload.prefetch_buffers). Given a
size instead of groups, rackc offloads one layer of every g, the most compute between copies,
with the largest g that offloads at least that much (`_pick_groups`).
"""

from dataclasses import dataclass

from compiler import arch
from compiler.catalog import engine
from compiler.choice import Choice
from compiler.resolve import OffloadAsk
from compiler.shapes import Shape, stage_layers
from schemas.model import ModelSpec
from schemas.source import format_path

GIB = arch.GIB
RULE = "rule:offload-groups"


@dataclass(frozen=True)
class StageOffload:
    """One GPU of a pipeline stage (the whole instance without stages)."""

    layers: int  # decoder layers of the stage
    host_gib: float  # weights kept in pinned host memory
    buffer_gib: float = 0.0  # prefetch: the GPU buffers the copies land in
    offloaded: tuple[int, ...] = ()  # prefetch: stage-local index of each offloaded layer
    layer_gib: tuple[float, ...] = ()  # prefetch: what each of them copies per forward pass
    tower_gib: float = 0.0  # UVA: of host_gib, the vision tower (read only where images run)


@dataclass(frozen=True)
class Offload:
    backend: str  # uva | prefetch
    experts_only: bool
    stages: tuple[StageOffload, ...]
    group_size: int = 0  # prefetch
    num_in_group: int = 0
    prefetch_step: int = 0

    @property
    def host_gib(self) -> float:
        """Per GPU of the heaviest stage: `--cpu-offload-gb`, and the host budget's figure."""
        return max(s.host_gib for s in self.stages)

    @property
    def buffer_gib(self) -> float:
        return max(s.buffer_gib for s in self.stages)

    @property
    def params(self) -> list[str]:
        """`--cpu-offload-params` / `--offload-params`: name segments (empty: any)."""
        return ["experts"] if self.experts_only else []


def layer_gib(model: ModelSpec, shape: Shape, layer: int) -> tuple[float, float]:
    """(routed experts, the rest) of decoder layer `layer` per GPU, split as
    compiler.memory.stage_weight_parts_gib splits the stage: attention and dense FFN by TP; a
    MoE layer's routed experts (with their EPLB replicas) over the stage's GPUs, its shared
    experts and router by TP."""
    p = arch.params(model)
    weights = arch.dtype_bytes(model, "weights") / shape.tp / GIB
    rest = p.attention / model.layers
    if model.moe is None or layer < model.dense_layers:
        return 0.0, (rest + p.dense_ffn / max(1, model.dense_layers)) * weights
    n_moe = arch.moe_layers(model)
    replicas = model.moe.slots / model.moe.experts if shape.ep > 1 else 1.0
    experts = p.routed_experts / n_moe * replicas * arch.dtype_bytes(model, "experts") \
        / shape.stage_gpus / GIB
    latent = p.latent_proj / n_moe * arch.dtype_bytes(model, "weights") / GIB  # every rank's
    return experts, (rest + (p.shared_experts + p.router) / n_moe) * weights + latent


def of(inputs, role: str, shape: Shape) -> Offload | None:
    """What an instance of `role` and `shape` offloads (None: nothing), computed once per
    inputs, role and shape."""
    ask = inputs.resolved.offload_ask(role, shape.name)
    if ask is None:
        return None
    key = (ask, shape)
    if key not in inputs.offloads:
        r = inputs.resolved
        towers = r.engines.vllm.offload.towers
        tower = arch.params(inputs.model.spec).vision * arch.WEIGHT_BYTES["bf16"] / shape.tp \
            / GIB if r.loads_vision and towers[ask.backend].value else 0.0
        inputs.offloads[key] = offload_of(ask, inputs.model.spec, shape, tower)
    return inputs.offloads[key]


def offload_of(ask: OffloadAsk, model: ModelSpec, shape: Shape, tower_gib: float = 0.0
               ) -> Offload:
    """`ask` on `shape`; `tower_gib`: the vision tower per GPU where the backend offloads it
    (on the first stage)."""
    sizes = [_offloadable(layer_gib(model, shape, i), ask.experts_only)
             for i in range(model.layers)]
    counts = stage_layers(model.layers, shape.pp)
    spans = [(sum(counts[:s]), n) for s, n in enumerate(counts)]  # (first layer, layers)
    if ask.backend == "uva":
        return Offload("uva", ask.experts_only, tuple(
            _uva_stage(ask.gib_per_gpu or 0.0, sizes[f:f + n],
                       0.0 if ask.experts_only or s else tower_gib)
            for s, (f, n) in enumerate(spans)))
    step = ask.prefetch_step or 1
    if ask.group_size is not None:
        groups = (ask.group_size, ask.num_in_group or 1)
    else:
        groups = _pick_groups(ask.gib_per_gpu or 0.0, sizes, spans)
    return _prefetch(ask.experts_only, model, shape, sizes, spans, groups, step)


def _uva_stage(asked: float, sizes: list[float], tower_gib: float) -> StageOffload:
    """UVA on one stage: whole parameters in construction order up to `asked` GiB, the vision
    tower's first (vLLM builds it before the language model: models/qwen3_vl_moe.py l.255 and
    l.284, kimi_k25.py l.349 and l.375, each wrapped as it is built, interfaces.py l.400-407),
    then the decoder layers'."""
    tower = min(asked, tower_gib)
    layers = min(asked - tower, sum(sizes))
    return StageOffload(len(sizes), round(layers + tower, 3), tower_gib=round(tower, 3))


def _offloadable(parts: tuple[float, float], experts_only: bool) -> float:
    return parts[0] if experts_only else sum(parts)


def _picked(sizes: list[float], spans: list[tuple[int, int]], groups: tuple[int, int]
            ) -> list[list[int]]:
    """Each stage's offloaded layers (stage-local): the last n of every g, those with weights
    to offload."""
    g, n = groups
    return [[i for i in range(count) if i % g >= g - n and sizes[first + i] > 0]
            for first, count in spans]


def _prefetch(experts_only: bool, model: ModelSpec, shape: Shape, sizes: list[float],
              spans: list[tuple[int, int]], groups: tuple[int, int], step: int) -> Offload:
    stages = []
    for (first, count), picked in zip(spans, _picked(sizes, spans, groups), strict=True):
        slot = _buffer_slot_gib(model, shape, [first + i for i in picked], experts_only)
        stages.append(StageOffload(
            count, round(sum(sizes[first + i] for i in picked), 3),
            round(step * slot, 3) if picked else 0.0, tuple(picked),
            tuple(sizes[first + i] for i in picked)))
    return Offload("prefetch", experts_only, tuple(stages), *groups, step)


def _buffer_slot_gib(model: ModelSpec, shape: Shape, layers: list[int],
                     experts_only: bool) -> float:
    """One buffer slot: every distinct offloaded parameter once. Layers of one kind (dense or
    MoE) share parameter names and shapes; the attention is common to both kinds."""
    kinds = {model.moe is not None and i >= model.dense_layers: i for i in layers}
    slot = sum(_offloadable(layer_gib(model, shape, i), experts_only) for i in kinds.values())
    if len(kinds) == 2 and not experts_only:
        slot -= arch.params(model).attention / model.layers \
            * arch.dtype_bytes(model, "weights") / shape.tp / GIB
    return slot


def _pick_groups(asked: float, sizes: list[float], spans: list[tuple[int, int]]
                 ) -> tuple[int, int]:
    """The layer groups that offload at least `asked` GiB on every stage, from the most spread
    family that can: one layer of every g (g - 1 layers to hide each copy), else all but one
    of every g (one layer per group to hide a copy), else every layer; within the family, the
    fewest bytes."""
    longest = max(n for _, n in spans)
    for family in ([(g, 1) for g in range(2, longest + 1)],
                   [(g, g - 1) for g in range(3, longest + 1)]):
        fits = []
        for groups in family:
            hosts = [sum(sizes[first + i] for i in picked)
                     for (first, _), picked in zip(spans, _picked(sizes, spans, groups),
                                                   strict=True)]
            if min(hosts) >= asked - 1e-9:
                fits.append((max(hosts), -groups[0], groups))
        if fits:
            return min(fits)[2]
    return (1, 1)


def decision(o: Offload, ask: OffloadAsk, offload_facts: engine.Offload) -> Choice[str]:
    """The instance's offload as a decision (lower prefixes `instances.<id>.`); the groups are
    rackc's (`rule:offload-groups`) when the deployment gave a size."""
    what = f"{o.host_gib:g} GiB per GPU in pinned host memory" + \
        (" (routed experts)" if o.experts_only else "")
    where = format_path(ask.field)
    if o.backend == "uva":
        return Choice("weight_offload", f"uva: {what}", "user",
                      f"{where}: read over the GPU-CPU link on every use, in every forward "
                      f"pass ({offload_facts.uva_reads.source}); of the decoder layers "
                      f"({offload_facts.wrapped.source})")
    layers = max(len(s.offloaded) for s in o.stages)
    value = (f"prefetch: group {o.group_size}, {o.num_in_group} per group, step "
             f"{o.prefetch_step}: {layers} layers, {what}, {o.buffer_gib:g} GiB of GPU buffers")
    why = (f"the last {o.num_in_group} of every {o.group_size} decoder layers "
           f"({offload_facts.prefetch_layers.source}), each copied {o.prefetch_step} offloaded "
           f"layer(s) ahead while the layers between compute "
           f"({offload_facts.prefetch_schedule.source}; {offload_facts.prefetch_join.source}), "
           f"into GPU buffers ({offload_facts.prefetch_buffers.source})")
    if ask.group_size is None:
        return Choice("weight_offload", value, RULE,
                      f"{where} asks for {ask.gib_per_gpu:g} GiB per GPU: the most spread "
                      f"layer groups that offload at least that (one of every g layers, else "
                      f"all but one of every g), with the fewest bytes; {why}")
    return Choice("weight_offload", value, "user", f"{where}; {why}")

"""The time a step spends on offloaded weights, its breakdown's `weight_offload`
(compiler.offload says what each instance offloads; the step models add it).

UVA (catalog/engines/vllm-0.33.yaml offload.uva_reads): the kernels read the offloaded weights
from pinned host memory over the GPU-CPU link (comm.host_link_bytes_per_us, the system's
`c2c_gbytes_per_s`) on every use, in every forward pass, and nothing overlaps the read. Of
offloaded routed experts only those that receive a token are read: of E expert slots, r routed
copies touch E (1 - (1 - 1/E)^r) on average (the tokens of every DP rank under DEP).

Prefetch (offload.prefetch_schedule, offload.prefetch_join) is replayed layer by layer as the
engine runs a forward pass: each layer of a stage computes for an equal share of the stage's
decoder-layer time (assumed: its dense and MoE layers differ); an offloaded layer first waits
for its copy; after offloaded layer k computes, the copy of offloaded layer k + prefetch_step
(wrapping to the next pass as vLLM's `_get_next_prefetch_index` does) starts on the one copy
stream once that stream is free, and moves the whole layer (whatever its tokens route to) at
the link's bandwidth; the copies started for the next pass are joined before the step ends, as
a CUDA graph does (an eager step could hide them under the next one's first layers; that is
not counted). The step pays the waiting: with prefetch_step 1, per offloaded layer,
max(0, its copy - the compute of the layers since the offloaded layer before it). The copy
stream is busy whenever the compute waits, so the wait never exceeds the copies, nor UVA's read
of the same bytes.
"""

import math
from typing import TYPE_CHECKING

from compiler import arch
from compiler.catalog.system import System
from compiler.offload import StageOffload
from compiler.perf import comm
from compiler.shapes import Shape
from schemas.model import ModelSpec

if TYPE_CHECKING:
    from compiler.perf.step import PerfContext


def offload_us(ctx: "PerfContext", shape: Shape, tokens: int, layers_us: float,
               stage: int = 0, vision: bool = False) -> float:
    """What the offloaded weights of pipeline stage `stage` add to a step of `tokens` tokens per
    DP rank whose decoder layers compute for `layers_us`; `vision`: the step runs the vision
    tower (a prefill chunk with images), so its offloaded weights are read too."""
    off = ctx.offload
    if off is None:
        return 0.0
    held = off.stages[stage]
    if off.backend == "uva":
        host_gib = held.host_gib if vision else held.host_gib - held.tower_gib
        return uva_us(ctx.system, ctx.model, shape, host_gib, off.experts_only, tokens)
    rate = comm.host_link_bytes_per_us(ctx.system)
    return prefetch_wait_us(held, off.prefetch_step, layers_us / max(1, held.layers),
                            [gib * arch.GIB / rate for gib in held.layer_gib])


def uva_us(system: System, model: ModelSpec, shape: Shape, host_gib: float,
           experts_only: bool, tokens: int) -> float:
    """The forward pass's reads of `host_gib` offloaded over the host link."""
    if not host_gib:
        return 0.0
    nbytes = host_gib * arch.GIB
    moe = model.moe
    if experts_only and moe:
        routed = tokens * moe.top_k * (shape.dp if shape.dp > 1 else 1)
        nbytes *= 1 - (1 - 1 / moe.slots) ** routed
    return comm.transfer_us(system, nbytes, "c2c")


def next_prefetch(index: int, step: int, count: int) -> int:
    """The offloaded layer whose copy starts after offloaded layer `index` computes: `step`
    ahead, kept on its own buffer slot at the wrap (vLLM model_executor/offloader/prefetch.py
    _get_next_prefetch_index)."""
    following = (index + step) % count
    if step < count and following % step != index % step:
        following = index % step
    return following


def prefetch_wait_us(held: StageOffload, step: int, layer_us: float,
                     copy_us: list[float]) -> float:
    """The compute stream's waits for copies over one forward pass of the stage's
    `held.layers` layers, each computing `layer_us`, with `copy_us` per offloaded layer."""
    count = len(held.offloaded)
    if not count:
        return 0.0
    which = {layer: k for k, layer in enumerate(held.offloaded)}
    # the first `step` offloaded layers were copied before the pass (the last one's join)
    ready = [0.0 if k < step else math.inf for k in range(count)]
    clock = stream = waited = 0.0
    for layer in range(held.layers):
        k = which.get(layer)
        if k is not None:
            wait = max(0.0, ready[k] - clock)
            waited, clock = waited + wait, clock + wait
        clock += layer_us
        if k is not None:
            after = next_prefetch(k, step, count)
            stream = max(clock, stream) + copy_us[after]
            ready[after] = stream
    return waited + max(0.0, stream - clock)

"""The time offloaded weights add to a step (compiler.perf.offload), held to oracles: prefetch
never costs more than UVA's read of the same bytes; with enough compute between offloaded
layers it costs nothing; with none it costs every copy; with prefetch_step 1 it is, per
offloaded layer, max(0, its copy - the compute since the offloaded layer before it)."""

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler import arch
from compiler.load import load_inputs
from compiler.offload import StageOffload, offload_of
from compiler.perf import comm
from compiler.perf.offload import next_prefetch, prefetch_wait_us
from compiler.perf.predict import context
from compiler.perf.step import decode_step, prefill_step
from compiler.resolve import OffloadAsk
from compiler.shapes import parse_shape
from tests.builders import write_case

DEP8 = parse_shape("DEP8")


def _stage(layers: int, group: int, per_group: int) -> StageOffload:
    picked = tuple(i for i in range(layers) if i % group >= group - per_group)
    return StageOffload(layers, 0.0, offloaded=picked, layer_gib=(1.0,) * len(picked))


def _prefetch(group: int, step: int = 1) -> OffloadAsk:
    return OffloadAsk("prefetch", None, False, group, 1, step, ())


@pytest.fixture(scope="module", params=["hgx-h200", "gb200-nvl72"])
def ctx(request, tmp_path_factory):
    """DeepSeek-V3 on DEP8, behind PCIe (H200) or NVLink-C2C (GB200)."""
    hgx = request.param.startswith("hgx")
    path = write_case(tmp_path_factory.mktemp(request.param), system=request.param,
                      model="deepseek-v3", kind="Cluster" if hgx else "Rack",
                      hardware={"nodes": 1} if hgx else None)
    return context(load_inputs(path), 8, "prefill", DEP8)


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 96), group=st.integers(1, 12), per_group=st.integers(1, 12),
       step=st.integers(1, 6), layer_us=st.floats(0, 100), copy_us=st.floats(0, 500))
def test_the_waits_never_exceed_the_copies(layers, group, per_group, step, layer_us, copy_us):
    """The compute stream waits only while a copy it needs is under way on the one copy
    stream, so it waits at most as long as all the copies take."""
    held = _stage(layers, group, min(group, per_group))
    copies = [copy_us] * len(held.offloaded)
    assert 0 <= prefetch_wait_us(held, step, layer_us, copies) <= sum(copies) + 1e-6


@settings(max_examples=100, deadline=None)
@given(group=st.integers(2, 12), layer_us=st.floats(0, 100), copy_us=st.floats(0, 500))
def test_step_one_waits_for_what_the_layers_between_do_not_hide(group, layer_us, copy_us):
    """The closed form of prefetch_step 1: each copy starts when the offloaded layer before
    it has computed (the previous pass's last one for the first, joined at the step's end)."""
    held = _stage(61, group, 1)
    picked = held.offloaded
    gaps = [b - a - 1 for a, b in itertools.pairwise(picked)] + [61 - 1 - picked[-1]]
    want = sum(max(0.0, copy_us - gap * layer_us) for gap in gaps)
    assert prefetch_wait_us(held, 1, layer_us, [copy_us] * len(picked)) == \
        pytest.approx(want, abs=1e-6)


def test_enough_compute_hides_every_copy_and_none_hides_nothing():
    held = _stage(61, 4, 1)
    copies = [30.0] * len(held.offloaded)
    assert prefetch_wait_us(held, 1, 30.0, copies) == 0.0  # a layer's compute hides a copy
    assert prefetch_wait_us(held, 1, 0.0, copies) == pytest.approx(sum(copies))
    assert prefetch_wait_us(held, 1, 0.01, copies) == pytest.approx(sum(copies), rel=0.01)
    # copies started two offloaded layers ahead overlap more compute
    assert prefetch_wait_us(held, 2, 4.0, copies) < prefetch_wait_us(held, 1, 4.0, copies)


def test_the_next_copy_keeps_its_buffer_slot_at_the_wrap():
    """vLLM's _get_next_prefetch_index: 7 offloaded layers on 3 slots; offloaded layer 5
    refills slot 2 with layer 2 of the next pass, not layer 1."""
    assert [next_prefetch(k, 3, 7) for k in range(7)] == [3, 4, 5, 6, 1, 2, 0]


@pytest.mark.parametrize("group,step", [(2, 1), (4, 1), (8, 1), (4, 2), (1, 1)])
def test_prefetch_is_never_slower_than_uva_for_the_same_bytes(ctx, group, step):
    """Whole layers (not experts only, which UVA reads only where tokens route)."""
    m = ctx.model
    pre = offload_of(_prefetch(group, step), m, DEP8)
    uva = offload_of(OffloadAsk("uva", pre.host_gib, False, None, None, None, ()), m, DEP8)
    assert uva.host_gib == pytest.approx(pre.host_gib)
    for run in (lambda c: decode_step(c, DEP8, 64, 4096),
                lambda c: prefill_step(c, DEP8, 16384, 4096, 0)):
        paid = {name: run(replace(ctx, offload=o)).breakdown["weight_offload"]
                for name, o in (("uva", uva), ("prefetch", pre))}
        assert paid["uva"] > 0 and paid["prefetch"] <= paid["uva"], paid


def test_a_long_prefill_chunk_hides_the_copies_a_decode_step_cannot(ctx):
    """16K tokens per rank compute for longer than a layer's copy takes, even over PCIe; a
    decode step of 64 requests does not, and pays at most the copies."""
    pre = offload_of(_prefetch(4), ctx.model, DEP8)
    c = replace(ctx, offload=pre)
    assert "weight_offload" not in prefill_step(c, DEP8, 16384, 4096, 0).breakdown
    copies = sum(g * arch.GIB for g in pre.stages[0].layer_gib) \
        / comm.host_link_bytes_per_us(ctx.system)
    assert 0 < decode_step(c, DEP8, 64, 4096).breakdown["weight_offload"] <= copies + 1e-6


def test_uva_offloads_the_vision_tower_first_and_reads_it_only_where_images_run(tmp_path):
    """vLLM builds (and UVA wraps) Qwen3-VL's tower before its language model, so a budget
    smaller than both takes the tower whole; the tower runs in prefill chunks with images and
    never in decode steps, so only those read it over the host link."""
    path = write_case(tmp_path, system="hgx-h200", model="qwen3-vl-235b-a22b", kind="Cluster",
                      hardware={"nodes": 1},
                      workload={"profile": "fixed", "images_per_request": 1,
                                "tokens_per_image": 256})
    tp8 = parse_shape("TP8")
    inputs = load_inputs(path)
    vision_gib = arch.params(inputs.model.spec).vision * arch.WEIGHT_BYTES["bf16"] / 8 / arch.GIB
    assert vision_gib > 0.05
    small = offload_of(OffloadAsk("uva", vision_gib / 2, False, None, None, None, ()),
                       inputs.model.spec, tp8, vision_gib)
    assert small.stages[0].tower_gib == pytest.approx(vision_gib / 2, abs=1e-3)
    both = offload_of(OffloadAsk("uva", vision_gib + 1.0, False, None, None, None, ()),
                      inputs.model.spec, tp8, vision_gib)
    assert both.stages[0].tower_gib == pytest.approx(vision_gib, abs=1e-3)
    assert both.host_gib == pytest.approx(vision_gib + 1.0, abs=1e-3)
    c = replace(context(inputs, 8, "aggregated", tp8), offload=both)
    text_only = replace(c, image_token_share=0.0)
    one_gib_us = comm.transfer_us(c.system, arch.GIB, "c2c")
    decode = decode_step(c, tp8, 64, 4096).breakdown["weight_offload"]
    assert decode <= 1.0 * one_gib_us + 1e-6  # the decoder layers' GiB at most, no tower
    with_images = prefill_step(c, tp8, 8192, 4096, 0).breakdown
    without = prefill_step(text_only, tp8, 8192, 4096, 0).breakdown
    assert with_images["vision"] > 0 and "vision" not in without
    assert with_images["weight_offload"] == pytest.approx(
        comm.transfer_us(c.system, (vision_gib + 1.0) * arch.GIB, "c2c"), rel=1e-3)
    assert without["weight_offload"] == pytest.approx(one_gib_us, rel=1e-3)

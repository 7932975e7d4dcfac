"""serving.weight_offload (every role's; UVA, vLLM --cpu-offload-gb): weights kept in host
memory leave the HBM budget, are pinned in the tray's DRAM, are read over the GPU-CPU link
every step, and reach the engine as flags. Per role, per pinned entry and the prefetch backend:
tests/compile/test_offload_per_role.py."""

from pathlib import Path

import pytest

from compiler import api, arch
from compiler.load import load_inputs
from compiler.memory import gpu_budget, weight_parts_gib
from compiler.perf import comm
from compiler.perf.predict import context
from compiler.perf.step import decode_step, prefill_step
from compiler.pinned import predict_pinned
from compiler.precheck import precheck_counts
from compiler.shapes import parse_shape
from schemas.diagnostics import CompileError
from tests.builders import write_case

DEP4 = parse_shape("DEP4")
PINS = {"mode": "pinned", "instances": [{"role": "prefill", "shape": "DEP4", "count": 1},
                                        {"role": "decode", "shape": "DEP4", "count": 1}]}


def _h200(tmp_path: Path, offload: dict | None, **kw) -> Path:
    serving = {"weight_offload": offload} if offload else None
    return write_case(tmp_path, system="hgx-h200", model="deepseek-v3", kind="Cluster",
                      hardware={"nodes": 1}, serving=serving, **kw)


def test_offloaded_experts_let_dep4_hold_deepseek_v3_on_h200(tmp_path: Path):
    plain = load_inputs(_h200(tmp_path / "plain", None))
    offload = load_inputs(_h200(tmp_path / "offload", {"gib_per_gpu": 80,
                                                       "experts_only": True}))
    assert DEP4 not in precheck_counts(plain, 8).feasible("decode")
    assert DEP4 in precheck_counts(offload, 8).feasible("decode")
    before = gpu_budget(plain, "decode", DEP4, 4)
    after = gpu_budget(offload, "decode", DEP4, 4)
    assert after.offload_gib == 80
    assert after.weights_gib == pytest.approx(before.weights_gib - 80, abs=1e-9)


def test_offload_is_capped_at_the_weights_it_may_take(tmp_path: Path):
    inputs = load_inputs(_h200(tmp_path, {"gib_per_gpu": 500, "experts_only": True}))
    experts, _ = weight_parts_gib(inputs.model.spec, DEP4)
    assert gpu_budget(inputs, "decode", DEP4, 4).offload_gib == pytest.approx(experts, abs=1e-3)


def test_offloaded_weights_are_pinned_flagged_and_streamed(tmp_path: Path):
    path = _h200(tmp_path, {"gib_per_gpu": 80, "experts_only": True}, objective=PINS,
                 workload={"profile": "fixed", "isl": 1024, "osl": 128})
    result = api.compile(path, only=("vllm",))
    plan = result.plan
    assert {(i.weight_offload.backend, i.offload_gib, tuple(i.weight_offload.params))
            for i in plan.instances} == {("uva", 80.0, ("experts",))}
    (tray,) = plan.host_memory.values()
    assert tray.weights_gib == 8 * 80.0
    # each pod's memory request holds its ranks' pinned weights (compiler.site)
    assert all(plan.pod_size(i.id).resources.memory_gib >= 4 * 80 for i in plan.instances)
    launch = "\n".join(v for k, v in result.artifacts.items()
                       if k.startswith("vllm/decode-00/") and isinstance(v, str))
    assert "--offload-backend uva \\\n  --cpu-offload-gb 80 \\\n  --cpu-offload-params experts " \
        "\\\n" in launch
    # every decode step reads the touched offloaded experts over PCIe
    decode = plan.predicted.breakdown["decode"]
    assert decode["weight_offload"] > decode["moe_experts"]
    # the fast pinned path (`rackc predict`) sizes and costs the offload alike
    fast, _ = predict_pinned(path)
    assert fast.output_tokens_per_s_per_gpu == plan.predicted.output_tokens_per_s_per_gpu


def test_offload_read_is_the_touched_share_over_the_host_link(tmp_path: Path):
    inputs = load_inputs(_h200(tmp_path, {"gib_per_gpu": 80, "experts_only": True}))
    ctx = context(inputs, 4, "decode", DEP4)
    full = comm.transfer_us(inputs.system, 80 * arch.GIB, "c2c")
    one = decode_step(ctx, DEP4, 1, 1024).breakdown["weight_offload"]
    routed = 1 * 8 * 4  # one token per DP rank, top-8, all four ranks' tokens
    slots = inputs.model.spec.moe.slots
    want = comm.transfer_us(inputs.system, 80 * arch.GIB * (1 - (1 - 1 / slots) ** routed),
                            "c2c")
    assert one == pytest.approx(want) and one < full
    assert prefill_step(ctx, DEP4, 16384, 1024, 0).breakdown["weight_offload"] == \
        pytest.approx(full, rel=1e-6)


def test_all_weights_offload_without_experts_only(tmp_path: Path):
    path = _h200(tmp_path, {"gib_per_gpu": 80}, objective=PINS)
    plan = api.compile(path, only=()).plan
    assert {(i.offload_gib, tuple(i.weight_offload.params)) for i in plan.instances} == \
        {(80.0, ())}


def test_expert_offload_of_a_dense_model_is_refused(tmp_path: Path):
    path = write_case(tmp_path, system="hgx-h200", model="llama-3.1-70b", kind="Cluster",
                      hardware={"nodes": 1},
                      serving={"weight_offload": {"gib_per_gpu": 10, "experts_only": True}})
    with pytest.raises(CompileError) as info:
        load_inputs(path)
    assert [d.code for d in info.value.diagnostics] == ["E105"]

"""What users can pin besides counts: per-rank batch limits and token budgets, and the
workload's length spread."""

from pathlib import Path

import pytest

from compiler import api
from compiler.load import load_inputs
from compiler.perf.predict import workload
from compiler.pinned import predict_pinned
from schemas.diagnostics import CompileError
from tests.builders import write_case


def _pins(**limits) -> dict:
    return {"mode": "pinned", "instances": [
        {"role": "prefill", "shape": "DEP2", "count": 2, **limits.get("prefill", {})},
        {"role": "decode", "shape": "DEP8", "count": 1, **limits.get("decode", {})}]}


def test_pinned_batch_limit_and_chunk_reach_the_plan(tmp_path: Path):
    path = write_case(tmp_path, hardware={"trays": 4}, objective=_pins(
        prefill={"max_batched_tokens": 4096, "max_batch": 8}, decode={"max_batch": 1500}),
        workload={"profile": "fixed", "isl": 256, "osl": 64})  # KV for 1,500 fits
    plan = api.compile(path, only=()).plan
    by_role = {i.role: i for i in plan.instances}
    assert by_role["prefill"].max_batched_tokens == 4096 and by_role["prefill"].max_batch == 8
    assert by_role["decode"].max_batch == 1500  # beyond rackc's default cap of 1,024
    fast, _ = predict_pinned(path)
    assert next(r for r in fast.instances if r.role == "prefill").chunk_tokens == 4096
    assert next(r for r in fast.instances if r.role == "decode").batch <= 1500


def test_pins_of_one_shape_must_agree_on_limits(tmp_path: Path):
    objective = _pins()
    objective["instances"].append({"role": "decode", "shape": "DEP8", "count": 1,
                                   "max_batch": 64})
    path = write_case(tmp_path, hardware={"trays": 6}, objective=objective)
    with pytest.raises(CompileError) as info:
        load_inputs(path)
    d = info.value.diagnostics[0]
    assert d.code == "E105" and d.path == "spec.objective.instances[2]"


def test_length_spread_overrides_the_profile(tmp_path: Path):
    path = write_case(tmp_path, workload={"profile": "chat", "isl_cv": 0.0, "osl_cv": 2.5})
    w = workload(load_inputs(path))
    assert (w.isl_cv, w.osl_cv) == (0.0, 2.5)


def test_checkpoint_overrides_the_models_dtypes_and_repository(tmp_path: Path):
    """An NVFP4 checkpoint of DeepSeek-R1 served without copying the Model: the weights
    shrink, the plan names the checkpoint and its expert dtype."""
    from compiler import arch
    base = write_case(tmp_path / "base", system="hgx-b200", model="deepseek-r1",
                      hardware={"trays": 1})
    fp4 = write_case(tmp_path / "fp4", system="hgx-b200", model="deepseek-r1",
                     hardware={"trays": 1}, serving={"checkpoint": {
                         "hf_id": "nvidia/DeepSeek-R1-FP4", "experts": "fp4"}})
    a, b = load_inputs(base), load_inputs(fp4)
    assert b.model.spec.dtypes.experts == "fp4"
    assert b.model.spec.dtypes.weights == a.model.spec.dtypes.weights
    assert arch.weight_bytes(b.model.spec) < 0.7 * arch.weight_bytes(a.model.spec)
    plan = api.compile(fp4, only=()).plan
    assert (plan.model.hf_id, plan.model.experts_dtype) == ("nvidia/DeepSeek-R1-FP4", "fp4")


def test_redundant_experts_let_ep48_serve_256_experts(tmp_path: Path):
    """EPLB: 256 + 32 replicas split over EP48 (6 per rank); without them DEP48 is refused."""
    objective = {"mode": "pinned", "instances": [
        {"role": "decode", "shape": "DEP48", "count": 1},
        {"role": "prefill", "shape": "DEP8", "count": 3}]}
    plain = write_case(tmp_path / "plain", system="gb200-nvl72", model="deepseek-v3",
                       objective=objective)
    with pytest.raises(CompileError) as info:
        api.compile(plain, only=())
    assert "256 experts do not split evenly over EP48" in str(info.value.diagnostics[0].got) \
        + info.value.diagnostics[0].hint + info.value.diagnostics[0].expected
    eplb = write_case(tmp_path / "eplb", system="gb200-nvl72", model="deepseek-v3",
                      objective=objective, serving={"redundant_experts": 32})
    result = api.compile(eplb, only=("vllm",))
    assert result.plan.model.redundant_experts == 32
    launch = "\n".join(v for k, v in result.artifacts.items()
                       if k.startswith("vllm/decode-00/") and isinstance(v, str))
    assert "--enable-eplb" in launch and '{"num_redundant_experts":32}' in launch

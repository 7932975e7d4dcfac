"""The engine policy of one instance (compiler.engine_policy): one function for the solver's
candidates, the memory budget, lower's instances and another release's kernels."""

import pytest

from compiler import engine_policy
from compiler.choice import CAPABILITY
from compiler.shapes import parse_shape
from tests.unit.test_resolve import inputs


def test_nvfp4_experts_keep_the_cutedsl_kernel_and_mxfp4_fall_back(tmp_path):
    """Only MXFP4 checkpoints (V4.1, gpt-oss) leave SYSTEM.md's NVFP4 CuTe-DSL kernel."""
    r = inputs(tmp_path, "gb300-nvl72", "deepseek-v4.1-flash").resolved
    vllm, fmt = r.engines.vllm, r.expert_format.value
    assert fmt == "mxfp4"
    standard = engine_policy.moe_backend(vllm, fmt, True, "blackwell", "deepep_high_throughput")
    batched = engine_policy.moe_backend(vllm, fmt, True, "blackwell", "deepep_low_latency")
    assert (standard.value, batched.value) == ("flashinfer_trtllm", "marlin")
    assert standard.source == batched.source == CAPABILITY
    fp8 = inputs(tmp_path, "gb300-nvl72", "deepseek-v3").resolved
    assert engine_policy.moe_backend(fp8.engines.vllm, fp8.expert_format.value, True,
                                     "blackwell", "deepep_low_latency").value == "deep_gemm"


@pytest.mark.parametrize(("role", "shape", "backend", "mnnvl"), [
    ("decode", "DEP16", "deepep_low_latency", True),
    ("prefill", "DEP16", "allgather_reducescatter", False),
    ("prefill", "DEP4", "deepep_high_throughput", False),
    ("decode", "TP4", None, False),
])
def test_dispatch_follows_role_and_trays(tmp_path, role, shape, backend, mnnvl):
    """Decode dispatches on DeepEP low-latency, told to use MNNVL across trays; prefill on
    DeepEP high-throughput inside a tray, on NCCL across trays of one domain; a TP instance
    has no dispatch; only DeepEP allocates buffers (catalog/engines/vllm-0.33.yaml all2all)."""
    i = inputs(tmp_path, "gb300-nvl72", "deepseek-v3", "{kv_cache_dtype: fp8}", trays=8)
    policy = engine_policy.of(i, role, parse_shape(shape))
    assert policy.all2all_backend == backend
    assert bool(policy.env.value) == mnnvl
    assert (policy.buffers_gib > 0) == (backend or "").startswith("deepep")
    assert policy.batched_experts == (backend == "deepep_low_latency")


def test_connectors_ride_together_with_the_pool(tmp_path):
    r = inputs(tmp_path, "vera-rubin-nvl72", "deepseek-v4.1-flash").resolved
    vllm = r.engines.vllm
    alone = engine_policy.kv_connectors(vllm, "decode", pool=False)
    both = engine_policy.kv_connectors(vllm, "decode", pool=True)
    assert len(alone.value) == 1 and len(both.value) == 2
    assert engine_policy.kv_connectors(vllm, "aggregated", pool=False).value == []
    assert set(engine_policy.connector_env(vllm, alone.value)) <= \
        set(engine_policy.connector_env(vllm, both.value))

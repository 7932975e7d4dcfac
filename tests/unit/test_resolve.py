"""The resolve pass: defaults and engine choices made once, each with its decision."""

from pathlib import Path

import pytest

from compiler.choice import CAPABILITY
from compiler.load import load_inputs

RACK = ("apiVersion: rackc.dev/v1alpha1\nkind: Rack\nmetadata: {{name: r}}\n"
        "spec: {{system: {system}, trays: {trays}}}\n")
DEPLOYMENT = ("apiVersion: rackc.dev/v1alpha1\nkind: Deployment\nmetadata: {{name: d}}\n"
              "spec:\n  rack: rack.yaml\n  model: {model}\n  workload: {{profile: chat}}\n"
              "  serving: {serving}\n")


def inputs(tmp_path: Path, system: str, model: str, serving: str = "{}", trays: int = 2):
    (tmp_path / "rack.yaml").write_text(RACK.format(system=system, trays=trays))
    (tmp_path / "deployment.yaml").write_text(DEPLOYMENT.format(model=model, serving=serving))
    return load_inputs(tmp_path / "deployment.yaml")


def test_dense_mla_on_blackwell_takes_the_trtllm_ragged_prefill(tmp_path):
    r = inputs(tmp_path, "gb200-nvl72", "deepseek-v3", "{kv_cache_dtype: fp8}").resolved
    assert r.attention_backend.value == "FLASHINFER_MLA"
    assert r.attention_options.value == {"mla_prefill_backend": "TRTLLM_RAGGED",
                                         "use_prefill_query_quantization": "true"}


def test_hopper_and_sparse_mla_take_no_attention_options(tmp_path):
    assert inputs(tmp_path, "hgx-h200", "deepseek-v3").resolved.attention_options.value == {}
    r = inputs(tmp_path, "vera-rubin-nvl72", "deepseek-v4.1-flash").resolved
    assert r.attention_options.value == {}
    assert (r.block_size.value, r.block_size.source) == (128, "rule:kernel-block")


@pytest.mark.parametrize(("system", "block"), [("hgx-h200", 64), ("gb300-nvl72", 128)])
def test_block_size_follows_the_kernel_of_the_gpu(tmp_path, system, block):
    assert inputs(tmp_path, system, "deepseek-v4.1-flash").resolved.block_size.value == block


def test_engine_fallbacks_are_decisions(tmp_path):
    r = inputs(tmp_path, "vera-rubin-nvl72", "deepseek-v4.1-flash",
               "{kv_pool: {dram: true, hbm: true}}").resolved
    assert (r.kv_pool_hbm.value, r.kv_pool_hbm.source) == (False, CAPABILITY)
    assert (r.engram_prefill.value, r.engram_prefill.source) == ("host", CAPABILITY)
    assert r.engram_decode.value == "hbm"
    paths = [c.path for c in r.choices()]
    assert len(paths) == len(set(paths))

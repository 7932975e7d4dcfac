"""Every catalog number has a source; derived sizes match REFERENCE-DATA.md."""

import pytest
import yaml

from compiler import arch, catalog
from compiler.catalog.system import Sourced

# REFERENCE-DATA.md B2: KV-cache bytes per token (whole model, one copy)
KV_TABLE = {
    ("deepseek-v3", "bf16"): 70_272, ("deepseek-v3", "fp8"): 35_136,
    ("deepseek-r1", "bf16"): 70_272, ("deepseek-r1", "fp8"): 35_136,
    ("deepseek-v3.2", "fp8"): 48_068,
    ("kimi-k2", "bf16"): 70_272, ("kimi-k2", "fp8"): 35_136,
    ("qwen3-235b-a22b", "bf16"): 192_512, ("qwen3-235b-a22b", "fp8"): 96_256,
    ("qwen3-30b-a3b", "bf16"): 98_304, ("qwen3-30b-a3b", "fp8"): 49_152,
    ("glm-4.5", "bf16"): 376_832, ("glm-4.5", "fp8"): 188_416,
    ("llama-3.1-70b", "bf16"): 327_680, ("llama-3.1-70b", "fp8"): 163_840,
    ("gpt-oss-120b", "bf16"): 36_864, ("gpt-oss-120b", "fp8"): 18_432,
    # not in B2: 62 layers x K and V x 8 heads x 128 x 2 bytes (config.json)
    ("minimax-m2.5", "bf16"): 253_952, ("minimax-m2.5", "fp8"): 126_976,
    # not in B2: 78 layers' latent (FP8 + 4 FP32 scales + BF16 rope: 656 B, BF16: 1,152 B)
    # plus the index key (FP8 + one FP32 scale: 132 B in either) on the 21 indexer layers
    ("glm-5.2", "fp8"): 78 * 656 + 21 * 132, ("glm-5.2", "bf16"): 78 * 1152 + 21 * 132,
}

# REFERENCE-DATA.md B: total / active parameters (billions)
PARAMS = {
    "deepseek-v3": (671, 37), "deepseek-v3.2": (671, 37), "kimi-k2": (1000, 32),
    "qwen3-235b-a22b": (235, 22), "qwen3-30b-a3b": (30, 3), "glm-4.5": (355, 32),
    "llama-3.1-70b": (70, 70), "gpt-oss-120b": (117, 5.1),
    "minimax-m2.5": (230, 10),  # vLLM recipe models/MiniMaxAI/MiniMax-M2.5.yaml: 230B / 10B
    "glm-5.2": (743, 39),  # vLLM recipe models/zai-org/GLM-5.2.yaml: 743B / 39B
}


@pytest.mark.parametrize(("model", "dtype"), sorted(KV_TABLE))
def test_kv_bytes_per_token_match_reference_table(model: str, dtype: str):
    assert arch.kv_bytes_per_token(catalog.model(model).spec, dtype) == KV_TABLE[model, dtype]


def test_gpt_oss_sliding_layers_are_capped_per_request():
    spec = catalog.model("gpt-oss-120b").spec
    assert arch.kv_window_bytes_per_request(spec, "bf16") == 36_864 * 128


def test_deepseek_v3_attention_and_experts_match_b3():
    spec = catalog.model("deepseek-v3").spec
    assert round(arch.attention_params_per_layer(spec) / 1e6, 1) == 187.1
    assert round(arch.params(spec).routed_experts / 1e9, 1) == 653.9


@pytest.mark.parametrize("model", sorted(PARAMS))
def test_total_and_active_parameters(model: str):
    spec = catalog.model(model).spec
    total, active = PARAMS[model]
    assert arch.params(spec).total / 1e9 == pytest.approx(total, rel=0.04)
    assert arch.active_params(spec) / 1e9 == pytest.approx(active, rel=0.06)


def test_catalog_has_what_the_issue_lists():
    assert set(catalog.system_names()) >= {"vera-rubin-nvl72", "gb300-nvl72", "gb200-nvl72",
                                           "hgx-h200", "hgx-b200", "hgx-b300"}
    assert set(catalog.model_names()) >= {
        "deepseek-v4.1-flash", "deepseek-v3", "deepseek-r1", "deepseek-v3.2", "kimi-k2",
        "qwen3-235b-a22b", "qwen3-30b-a3b", "glm-4.5", "llama-3.1-70b", "gpt-oss-120b",
        "minimax-m3", "kimi-k3"}  # issue 16: the source system's (tests/unit/test_model_*.py)
    assert set(catalog.workload_names()) == {"fixed", "chat", "agentx"}


def _sourced_leaves(obj: object) -> list[object]:
    if isinstance(obj, Sourced):
        return [obj]
    fields = getattr(type(obj), "model_fields", {})
    return [leaf for f in fields for leaf in _sourced_leaves(getattr(obj, f))]


@pytest.mark.parametrize("name", catalog.system_names())
def test_every_system_number_has_a_source(name: str):
    system = catalog.system(name)
    leaves = _sourced_leaves(system)
    assert len(leaves) >= 25
    for leaf in leaves:
        assert leaf.source.startswith(("REFERENCE-DATA.md", "SYSTEM.md", "assumed", "measured"))


@pytest.mark.parametrize("name", catalog.workload_names())
def test_every_workload_number_has_a_source(name: str):
    for leaf in _sourced_leaves(catalog.workload(name)):
        assert leaf.source


def _facts(node, path=""):
    """(path, source) of every sourced fact in an engine capability file."""
    if isinstance(node, dict):
        if "source" in node:
            yield path, node["source"]
        for key, value in node.items():
            if key != "source":
                yield from _facts(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _facts(value, f"{path}[{i}]")


ENGINE_SOURCE_FILES = __import__("re").compile(
    r"([\w./]+\.(?:py|cpp|so|go|rs)|\.dist-info/METADATA)")


@pytest.mark.parametrize("name", catalog.ENGINE_FILES)
def test_every_engine_fact_names_its_source(name: str):
    facts = list(_facts(yaml.safe_load(catalog.engine_text(name))))
    assert facts
    for path, source in facts:
        assert source.startswith("assumed") or ENGINE_SOURCE_FILES.search(source) or \
            "SYSTEM.md" in source, (path, source)


# The venv (tests/conformance/make_venvs.sh) holding each release's vLLM
RELEASE_VENVS = {"0.33": ".venv-vllm033", "0.31": ".venv-dyn161"}


@pytest.mark.parametrize("release", catalog.VLLM_RELEASES)
def test_vllm_facts_cite_files_of_their_own_release(release: str):
    """Each release's fact set cites files of that release (0.33: the conformance venv's vLLM;
    0.31: the vLLM Dynamo 1.6.1 pins, in the Dynamo venv), and says so in its version key."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = sorted(root.glob(f"{RELEASE_VENVS[release]}/lib/python*/site-packages/vllm"))
    if not found:
        pytest.skip("the pinned vLLM venv is not built (tests/conformance/make_venvs.sh)")
    vllm = found[0]
    assert f"version = '{release}." in (vllm / "_version.py").read_text()
    cited = {m for _, s in _facts(yaml.safe_load(catalog.engine_text(f"vllm-{release}")))
             for m in ENGINE_SOURCE_FILES.findall(s)}
    assert cited
    missing = [c for c in cited if not (vllm / c).is_file()]
    assert not missing, missing

"""Property tests: any valid rack/model/workload either compiles to a plan whose invariants
hold, or stops with diagnostics (exit 2 or 3) that tests/compile/verdicts.py bears out (the
input is invalid there, or cannot be served: the compile tests' exit 3 from the solver checked
against a brute-force count oracle, so their racks are small), never a crash; shuffled input
keys give the same plan."""

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import api
from compiler.load import load_inputs
from schemas.diagnostics import CompileError
from schemas.source import load_yaml_text
from tests.builders import write_case
from tests.compile.verdicts import justify
from tests.invariants import check_plan

# trays per rack (HGX: nodes) drawn for `rackc check`, and for compiles, whose exit 3 the
# brute-force count oracle checks (it enumerates every count vector: small racks only)
SYSTEMS = {"vera-rubin-nvl72": 18, "gb300-nvl72": 18, "gb200-nvl72": 18, "hgx-h200": 4,
           "hgx-b200": 4, "hgx-b300": 4}
SMALL = {system: 2 if system.startswith("hgx") else 3 for system in SYSTEMS}
MODELS = ["qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b", "llama-3.1-70b",
          "deepseek-v4.1-flash", "glm-4.5"]


@st.composite
def cases(draw):
    system = draw(st.sampled_from(sorted(SMALL)))
    trays = draw(st.integers(1, SMALL[system]))
    per = 8 if system.startswith("hgx") else 4
    down = draw(st.lists(st.tuples(st.integers(0, trays - 1), st.integers(0, per - 1)),
                         max_size=3, unique=True))
    hardware = {"trays": trays}
    if down:
        hardware["unavailable"] = {"gpus": [f"r0-t{t:02d}-g{g}" for t, g in down]}
    workload = {"profile": draw(st.sampled_from(["fixed", "chat", "agentx"]))}
    slo = draw(st.one_of(st.none(), st.builds(lambda r: {"tokens_per_s_per_user_p90": r},
                                              st.sampled_from([5.0, 20.0, 60.0]))))
    return dict(system=system, model=draw(st.sampled_from(MODELS)), hardware=hardware,
                workload=workload, slo=slo, generated=None)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_compiles_or_explains(tmp_path_factory, case):
    _compiles_or_explains(_write(tmp_path_factory.mktemp("case"), case), case)


@pytest.mark.parametrize("example", ["vr-nvl72-deepseek-v4.1-flash", "hgx-h200-deepseek-v3"])
def test_key_order_does_not_change_the_plan(tmp_path: Path, example: str):
    src = Path(__file__).resolve().parents[2] / "examples" / example
    for f in src.glob("*.yaml"):
        doc = yaml.safe_load(f.read_text())
        doc["spec"] = dict(reversed(list(doc["spec"].items())))
        (tmp_path / f.name).write_text(yaml.safe_dump(dict(reversed(list(doc.items()))),
                                                      sort_keys=False))
    a = api.compile(src / "deployment.yaml", only=()).plan.model_copy(
        update={"inputs_digest": ""})
    b = api.compile(tmp_path / "deployment.yaml", only=()).plan.model_copy(
        update={"inputs_digest": ""})
    assert a == b


# --- generated racks, models and deployments: compiles or diagnoses, never a traceback --------

ROLES_SHAPES = ["DEP2", "DEP4", "DEP8", "DEP16", "DEP32", "TP1", "TP2", "TP4", "TP8", "TP8EP8",
                "TP4EP4", "DEP3", "TP8EP4"]


@st.composite
def models(draw) -> dict:
    """Model documents with plausible and some contradictory architecture numbers."""
    heads = draw(st.sampled_from([8, 16, 32, 64, 128]))
    layers = draw(st.integers(1, 96))
    spec: dict = {
        "architecture": "GeneratedForCausalLM", "hf_id": "org/generated",
        "hidden_size": draw(st.sampled_from([1024, 2048, 4096, 7168])), "layers": layers,
        "dense_layers": draw(st.integers(0, layers + 2)),
        "dense_intermediate": draw(st.sampled_from([0, 4096, 18432])),
        "vocab_size": draw(st.sampled_from([32000, 151936])),
        "max_context_tokens": draw(st.sampled_from([8192, 32768, 131072])),
        "attention": {"kind": "gqa", "heads": heads,
                      "kv_heads": draw(st.sampled_from([1, 4, 8, heads, heads * 2])),
                      "head_dim": draw(st.sampled_from([64, 128]))},
        "dtypes": {"weights": draw(st.sampled_from(["bf16", "fp8"])),
                   "experts": draw(st.sampled_from(["bf16", "fp8", "fp4"])),
                   "kv_cache": draw(st.sampled_from(["bf16", "fp8"]))},
    }
    if draw(st.booleans()):
        experts = draw(st.sampled_from([8, 64, 128, 256]))
        spec["moe"] = {"experts": experts, "top_k": draw(st.integers(1, experts + 1)),
                       "shared_experts": draw(st.integers(0, 2)),
                       "expert_intermediate": draw(st.sampled_from([512, 2048]))}
    return {"apiVersion": "rackc.dev/v1alpha1", "kind": "Model",
            "metadata": {"name": "generated"}, "spec": spec}


@st.composite
def deployments(draw, sizes: dict[str, int]) -> dict:
    """write_case arguments: hardware (Rack or Cluster of up to `sizes[system]` trays or
    nodes, overrides, unavailable parts), a catalog or generated model, workload overrides,
    SLOs, serving options, objectives."""
    system = draw(st.sampled_from(sorted(sizes)))
    hgx = system.startswith("hgx")
    kind = draw(st.sampled_from(["Rack", "Cluster"]))
    trays = draw(st.integers(1, sizes[system]))
    hardware: dict = {"trays": trays}
    if kind == "Cluster":
        hardware = {"nodes": trays} if hgx else {"racks": draw(st.integers(1, 2)),
                                                 "trays": trays}
    if draw(st.booleans()):
        hardware["unavailable"] = {"trays": draw(st.lists(st.integers(0, trays), max_size=2,
                                                          unique=True))}
    if draw(st.booleans()):
        hardware[draw(st.sampled_from(["dram_gib_per_tray", "nic_gbps_per_gpu"]))] = \
            draw(st.sampled_from([1.0, 100.0, 3200.0]))
    workload = {"profile": draw(st.sampled_from(["fixed", "chat", "agentx"]))}
    for key, values in (("isl", [1, 512, 8192]), ("osl", [1, 128, 2048]),
                        ("concurrency", [1, 64, 4096])):
        if draw(st.booleans()):
            workload[key] = draw(st.sampled_from(values))
    slo = draw(st.fixed_dictionaries({}, optional={
        "tokens_per_s_per_user_p90": st.sampled_from([0.01, 5.0, 60.0, 9999.0]),
        "ttft_ms_p90": st.sampled_from([1.0, 300.0, 3_600_000.0])}))
    serving = draw(st.fixed_dictionaries({}, optional={
        "kv_pool": st.fixed_dictionaries({"dram": st.booleans(), "hbm": st.booleans(),
                                          "dram_fraction": st.sampled_from([0.0, 0.5, 1.0])}),
        "block_size": st.sampled_from([16, 64, 256]),
        "kv_cache_dtype": st.sampled_from(["fp8", "bf16"]),
        "engram_placement": st.sampled_from(["hbm", "dram"])}))
    objective = draw(st.one_of(
        st.none(),
        st.builds(lambda m, p, d: {"mode": m, "shapes": {"prefill": p, "decode": d}},
                  st.sampled_from(["throughput", "latency"]),
                  st.lists(st.sampled_from(ROLES_SHAPES), min_size=1, max_size=2),
                  st.lists(st.sampled_from(ROLES_SHAPES), min_size=1, max_size=2)),
        st.builds(lambda p, d, n: {"mode": "pinned", "instances": [
            {"role": "prefill", "shape": p, "count": n}, {"role": "decode", "shape": d,
                                                          "count": 1}]},
                  st.sampled_from(ROLES_SHAPES), st.sampled_from(ROLES_SHAPES),
                  st.integers(1, 3))))
    generated = draw(st.one_of(st.none(), models()))
    return dict(system=system, kind=kind, hardware=hardware, workload=workload,
                slo=slo or None, serving=serving or None, objective=objective,
                model=draw(st.sampled_from(MODELS)) if generated is None else "model.yaml",
                generated=generated)


def _write(root: Path, case: dict) -> Path:
    case = dict(case)
    generated = case.pop("generated")
    path = write_case(root, **case)
    if generated is not None:
        (root / "model.yaml").write_text(yaml.safe_dump(generated, sort_keys=False))
    return path


def _diagnosed(exc: CompileError) -> None:
    assert exc.exit_code in (2, 3) and exc.diagnostics
    for d in exc.diagnostics:
        assert d.code and d.expected and d.got and d.file and d.line >= 0
        d.render().encode("utf-8", "backslashreplace")


def _compiles_or_explains(path: Path, case: dict) -> None:
    try:
        plan = api.compile(path, only=()).plan
    except CompileError as exc:
        _diagnosed(exc)
        justify(case, path, exc)
        return
    check_plan(plan, load_inputs(path).model.spec if case["generated"] else None)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=deployments(SYSTEMS))
def test_generated_inputs_check_or_diagnose(tmp_path_factory, case):
    path = _write(tmp_path_factory.mktemp("gen"), case)
    try:
        api.check(path)
    except CompileError as exc:
        _diagnosed(exc)
        justify(case, path, exc)


@settings(max_examples=24, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=deployments(SMALL))
def test_generated_inputs_compile_to_plans_that_keep_their_invariants(tmp_path_factory, case):
    _compiles_or_explains(_write(tmp_path_factory.mktemp("gen"), case), case)


def test_an_explanation_names_the_slo_that_is_missed(tmp_path: Path):
    """One tray holds one deepseek-v3 instance, so only aggregated serving fits; it meets
    5 tokens/s per user (the deployment compiles with that SLO alone), but no TTFT of 1 ms."""
    case = dict(system="gb200-nvl72", kind="Rack", hardware={"trays": 1},
                workload={"profile": "fixed"}, model="deepseek-v3", generated=None,
                slo={"tokens_per_s_per_user_p90": 5.0, "ttft_ms_p90": 1.0})
    _compiles_or_explains(_write(tmp_path, case), case)


YAMLISH = st.lists(st.sampled_from([*"ab:-[]{}&*!<>|?,'\"#%@` \n\t09.", "<<", "!!int ", "- ",
                                    ": ", "\n  ", "2024-13-45", "9" * 5000, "\\ud800"]),
                   max_size=60).map("".join)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=YAMLISH)
def test_any_text_loads_or_diagnoses(text: str):
    try:
        load_yaml_text(text, "f.yaml")
    except CompileError as exc:
        assert exc.diagnostics and all(d.code.startswith("E0") for d in exc.diagnostics)


NUMBERS = st.one_of(st.integers(), st.integers(min_value=10**300, max_value=10**4000),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                    st.text(max_size=5))
NUMBER_FIELDS = [("slo", "tokens_per_s_per_user_p90"), ("slo", "ttft_ms_p50"),
                 ("workload", "isl"), ("workload", "concurrency"), ("serving", "block_size"),
                 ("serving", "max_model_len")]


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(NUMBER_FIELDS), value=NUMBERS)
def test_any_number_in_any_field_is_accepted_or_refused_at_that_field(tmp_path_factory, where,
                                                                      value):
    block, field = where
    extra = {block: {field: value, **({"profile": "chat"} if block == "workload" else {})}}
    path = write_case(tmp_path_factory.mktemp("num"), model="qwen3-30b-a3b", **extra)
    try:
        api.check(path)
    except CompileError as exc:
        _diagnosed(exc)
        assert any(d.path.startswith(f"spec.{block}") for d in exc.diagnostics)

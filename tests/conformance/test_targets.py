"""What the targets emit, checked by the real tools (docs/targets.md): vLLM 0.33's parser and
engine config, Dynamo 1.6.1's parsers, Mooncake's config loaders, kubernetes-validate, the CRD
schemas (harness.crd_dir) and `kubectl kustomize`."""

import functools
from pathlib import Path

import pytest
import yaml

from compiler import catalog
from tests.targets import emitted
from targets import dynamo
from tests.targets.fixtures import ALL_CASES, FLEET_EXAMPLES, POOL_CASES, compiled_plan

from . import harness

pytestmark = pytest.mark.conformance

CASES = sorted(ALL_CASES)

# The HF model types of the cases' models; V4.1's config nests the text model.
MODEL_TYPES = {"deepseek-v3": ("deepseek_v3", False), "deepseek-v4.1-flash": ("deepseek_v41", True)}
# Which layers carry Engram tables is not in the catalog; vLLM only needs some to accept
# --engram-config (a model without them is refused).
ENGRAM_LAYER_IDS = [1, 15]


def hf_config(model_name: str) -> dict:
    """A config.json written from the catalog entry: what vLLM needs to pick the model class and
    to check the emitted flags against the model (experts, heads, context). No
    quantization_config (see harness.check_vllm_engine_config)."""
    spec = catalog.model(model_name).spec
    attention, moe = spec.attention, spec.moe
    text = {
        "hidden_size": spec.hidden_size, "num_hidden_layers": spec.layers,
        "vocab_size": spec.vocab_size, "max_position_embeddings": spec.max_context_tokens,
        "intermediate_size": spec.dense_intermediate, "first_k_dense_replace": spec.dense_layers,
        "num_attention_heads": attention.heads, "num_key_value_heads": attention.kv_heads,
        "q_lora_rank": attention.q_lora_rank, "kv_lora_rank": attention.kv_lora_rank,
        "qk_rope_head_dim": attention.qk_rope_head_dim,
        "qk_nope_head_dim": attention.head_dim - attention.qk_rope_head_dim,
        "v_head_dim": attention.v_head_dim,
        "n_routed_experts": moe.experts, "num_experts_per_tok": moe.top_k,
        "n_shared_experts": moe.shared_experts, "moe_intermediate_size": moe.expert_intermediate,
    }
    if spec.engram:
        text["engram_layer_ids"] = ENGRAM_LAYER_IDS
    model_type, nested = MODEL_TYPES[model_name]
    head = {"architectures": [spec.architecture], "model_type": model_type}
    return {**head, "text_config": text} if nested else {**head, **text}


@functools.cache
def plan_of(case: str):
    return ALL_CASES[case]()


@functools.cache
def files(case: str) -> dict[str, str]:
    return emitted.emit_all(plan_of(case))


def refused(case: str, folder: str) -> bool:
    """The Dynamo targets emit nothing for a plan Dynamo cannot serve (S3-02), nor lws/ for a
    P/D plan its router cannot serve (`Plan.lws_refused`): say so, and there is nothing
    further to check."""
    plan = plan_of(case)
    if not ((folder in ("k8s", "dynamo") and plan.site.engines["dynamo"].refused)
            or (folder == "lws" and plan.lws_refused)):
        return False
    assert not any(p.startswith(f"{folder}/") for p in files(case))
    return True


def assert_all_ok(results: list[harness.Result]) -> None:
    bad = [f"{' '.join(r.argv[:3])} ...: {r.error} inexact={list(r.inexact_flags)}"
           for r in results if not r.ok]
    assert not bad, "\n".join(bad)


def vllm_serve_lines(case: str) -> list[list[str]]:
    out = files(case)
    lines = [s.argv for s in emitted.scripts(out)]
    for lws in emitted.of_kind(emitted.documents(out, "lws"), "LeaderWorkerSet"):
        lines += emitted.lws_lines(lws).values()
    return lines


@pytest.mark.parametrize("case", CASES)
def test_vllm_lines_parse_with_vllm_033(case):
    lines = vllm_serve_lines(case)
    assert lines
    assert_all_ok(harness.check_vllm_lines(lines))


def without_reasoning_parser(argv: list[str]) -> list[str]:
    """The engine config loads the tokenizer for a reasoning parser; the config-only model folder
    has none (the parser's name is checked by parsing and against the registries below)."""
    if "--reasoning-parser" not in argv:
        return argv
    at = argv.index("--reasoning-parser")
    return argv[:at] + argv[at + 2:]


@pytest.mark.parametrize("case", CASES)
def test_vllm_engine_config_builds(case):
    """One line per component (its leader), through vLLM's engine config for the model."""
    leaders = {}
    for script in emitted.scripts(files(case)):
        if "--headless" not in script.argv:
            argv = without_reasoning_parser(script.argv)
            leaders.setdefault(tuple(argv), argv)
    config = hf_config(ALL_CASES[case]().model.name)
    results = [harness.check_vllm_engine_config(argv, config) for argv in leaders.values()]
    assert_all_ok(results)


@pytest.mark.parametrize("case", CASES)
def test_dynamo_lines_parse_with_dynamo_161(case):
    if refused(case, "dynamo"):
        return
    graphs = emitted.documents(files(case), "dynamo")  # one per fleet group
    assert graphs
    for dgd in graphs:
        lines = list(emitted.dynamo_lines(dgd).values())
        assert {line[2] for line in lines} == {"dynamo.frontend", "dynamo.vllm"}
        assert_all_ok(harness.check_dynamo_lines(lines))


def test_dynamo_worker_imports_under_the_vllm_its_target_names():
    """S3-03: `python3 -m dynamo.vllm` imports dynamo.vllm.main, which needs helpers of one vLLM
    release; the plan says which, and the venv holds that release."""
    engines = plan_of("vr-nvl72-deepseek-v4.1-flash").site.engines
    answer = harness.check_dynamo_imports([catalog.engines().dynamo.worker.import_check.value])
    assert answer["errors"] == {}
    assert answer["vllm"] == engines["dynamo"].vllm


@pytest.mark.parametrize(("case", "folder"), [(c, f) for f in ("k8s", "lws", "mooncake")
                                              for c in (POOL_CASES if f == "mooncake" else CASES)])
def test_builtin_kinds_pass_kubernetes_validate(case, folder):
    if refused(case, folder):
        return
    docs = [d for d in emitted.documents(files(case), folder) if not emitted.is_custom(d)]
    assert docs
    assert harness.validate_builtin(docs) == []


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("folder", ["k8s", "lws", "dynamo"])
def test_custom_resources_match_their_crds(case, folder):
    harness.require_crds()
    if refused(case, folder):
        return
    docs = [d for d in emitted.documents(files(case), folder) if emitted.is_custom(d)]
    assert docs
    assert [e for d in docs for e in harness.validate_custom(d)] == []


@pytest.mark.parametrize("case", FLEET_EXAMPLES)
def test_fleet_graphs_match_their_crd(case):
    """The fleet examples' graphs only (their other targets repeat the small examples')."""
    harness.require_crds()
    graphs = dynamo.graph_deployments(compiled_plan(case))
    assert [e for g in graphs for e in harness.validate_custom(g)] == []


def write(out: dict[str, str], root: Path) -> None:
    for path, text in out.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("folder", ["k8s", "lws"])
def test_bundle_builds_with_kustomize_and_validates(case, folder, tmp_path):
    harness.require_crds()
    if refused(case, folder):
        return
    out = files(case)
    write(out, tmp_path)
    built = list(yaml.safe_load_all(harness.kustomize_build(tmp_path / folder)))
    assert len(built) == len(emitted.documents(out, folder))
    assert harness.validate_manifests(built) == []


@pytest.mark.parametrize("case", POOL_CASES)
def test_mooncake_client_configs_load_in_vllm(case):
    clients = {p: t for p, t in files(case).items() if p.startswith("mooncake/clients/")}
    assert clients
    problems = {p: harness.check_mooncake_client_config(yaml.safe_load(t))
                for p, t in clients.items()}
    assert problems == {p: [] for p in clients}


def test_eplb_flags_parse_with_vllm_033(tmp_path):
    """Redundant experts (serving.redundant_experts) reach vLLM as --enable-eplb and an
    --eplb-config its parser takes."""
    from compiler import api
    from tests.builders import write_case
    path = write_case(tmp_path, system="gb200-nvl72", model="deepseek-v3",
                      objective={"mode": "pinned", "instances": [
                          {"role": "decode", "shape": "DEP48", "count": 1},
                          {"role": "prefill", "shape": "DEP8", "count": 3}]},
                      serving={"redundant_experts": 32})
    out = api.compile(path, only=("vllm",)).artifacts
    lines = [s.argv for s in emitted.scripts(out)]
    assert any("--enable-eplb" in argv for argv in lines)
    assert_all_ok(harness.check_vllm_lines(lines))


def test_weight_offload_flags_parse_with_vllm_033_and_dynamo_161(tmp_path):
    """Offloaded weights reach vLLM per instance: prefill's (serving.weight_offload, UVA) as
    --offload-backend uva, --cpu-offload-gb and --cpu-offload-params, decode's
    (weight_offload_per_role, prefetch) as --offload-backend prefetch and its groups, which its
    parser takes (vllm/config/offload.py OffloadConfig), and so do Dynamo's workers."""
    from compiler import api
    from tests.builders import write_case
    path = write_case(tmp_path, system="hgx-h200", model="deepseek-v3", kind="Cluster",
                      hardware={"nodes": 1},
                      objective={"mode": "pinned", "instances": [
                          {"role": "decode", "shape": "DEP4", "count": 1},
                          {"role": "prefill", "shape": "DEP4", "count": 1}]},
                      serving={"weight_offload": {"gib_per_gpu": 80, "experts_only": True},
                               "weight_offload_per_role": {"decode": {
                                   "backend": "prefetch", "gib_per_gpu": 80,
                                   "experts_only": True}}})
    out = api.compile(path, only=("vllm", "dynamo")).artifacts
    lines = [s.argv for s in emitted.scripts(out)]
    [dgd] = emitted.documents(out, "dynamo")
    workers = [w for w in emitted.dynamo_lines(dgd).values() if w[2] == "dynamo.vllm"]
    assert lines and workers and all(
        ("--cpu-offload-gb" in argv and "--cpu-offload-params" in argv)
        != ("--offload-group-size" in argv and "--offload-params" in argv)
        for argv in lines + workers)
    assert {argv[argv.index("--offload-backend") + 1] for argv in lines + workers} == \
        {"uva", "prefetch"}
    assert_all_ok(harness.check_vllm_lines(lines))
    assert_all_ok(harness.check_dynamo_lines(workers))


def test_pipeline_stages_parse_and_build_with_vllm_033(tmp_path):
    """Pipelined prefill (TPnPPm, TPnEPnPPm) reaches vLLM as --pipeline-parallel-size with the
    mp launch over --nnodes where stages span nodes; every line parses, each leader's engine
    config builds (world size over nodes, layers over stages, the model's PP support), and
    Dynamo's workers parse too."""
    from compiler import api
    from tests.builders import write_case
    path = write_case(tmp_path, system="hgx-h200", model="deepseek-v3", kind="Cluster",
                      hardware={"nodes": 4},
                      workload={"profile": "fixed", "isl": 65536, "osl": 1024},
                      objective={"mode": "pinned", "instances": [
                          {"role": "prefill", "shape": "TP8EP8PP2", "count": 1},
                          {"role": "prefill", "shape": "TP4PP2", "count": 1},
                          {"role": "decode", "shape": "TP8", "count": 1}]},
                      serving={"kv_cache_dtype": "fp8", "max_model_len": 70000})
    out = api.compile(path, only=("vllm", "dynamo")).artifacts
    lines = [s.argv for s in emitted.scripts(out)]
    staged = [argv for argv in lines if "--pipeline-parallel-size" in argv]
    assert len(staged) == 3 and sum("--nnodes" in argv for argv in staged) == 2
    assert_all_ok(harness.check_vllm_lines(lines))
    config = hf_config("deepseek-v3")
    leaders = [without_reasoning_parser(a) for a in staged if "--headless" not in a]
    assert len(leaders) == 2
    assert_all_ok([harness.check_vllm_engine_config(a, config) for a in leaders])
    assert not emitted.documents(out, "dynamo")  # Dynamo 1.6.1 takes no push connector


REGISTRY = """
import json, re, sys
names = {}
if sys.argv[1] == "vllm":
    import vllm.reasoning, vllm.tool_parsers
    for kind, module in (("tool_call", vllm.tool_parsers), ("reasoning", vllm.reasoning)):
        text = open(module.__file__).read()
        names[kind] = re.findall(r'^\\s+"([A-Za-z0-9_.-]+)": \\(', text, re.M)
else:
    from dynamo._core import get_reasoning_parser_names, get_tool_parser_names
    names = {"tool_call": list(get_tool_parser_names()),
             "reasoning": list(get_reasoning_parser_names())}
print(json.dumps(names))
"""


@functools.cache
def registry(engine: str) -> dict[str, list[str]]:
    import json
    import subprocess
    venv = harness.VLLM_VENV if engine == "vllm" else harness.DYNAMO_VENV
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"{venv.name} not built (tests/conformance/make_venvs.sh)")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", REGISTRY, engine],
                         capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("engine", ["vllm", "dynamo"])
def test_catalog_parsers_exist_in_each_engines_registry(engine):
    """Every parser name the catalog gives a model is one the pinned engine registers."""
    from compiler import site

    names = registry(engine)
    for model in catalog.model_names():
        parsers = site.parsers(model)
        for kind in ("tool_call", "reasoning"):
            name = getattr(parsers, f"{engine}_{kind}")
            assert name is None or name in names[kind], (model, kind, name)


def test_a_moe_backend_only_033_has_reaches_dynamo_as_031s_own_pick():
    """vllm-0.33.yaml loads MXFP4 experts with flashinfer_moe_ep_cutedsl and vllm-0.31.yaml has
    no such name: 0.33's parser takes it, 0.31's refuses it, and a plan that chose it reaches
    the Dynamo workers as 0.31's own pick (compiler.engine_releases), which 0.31 parses."""
    from compiler.engine_releases import release_run
    from compiler.load import load_inputs
    from targets import TARGETS

    example = "vr-nvl72-deepseek-v4.1-flash"
    plan = ALL_CASES[example]()
    only_033 = "flashinfer_moe_ep_cutedsl"
    assert only_033 in catalog.engines().release("0.33").moe.accepts["mxfp4"].value
    assert only_033 not in catalog.engines().release("0.31").moe.accepts["mxfp4"].value
    instances = [i.model_copy(update={"moe_backend": only_033}) if i.role == "prefill" else i
                 for i in plan.instances]
    inputs = load_inputs(Path(__file__).resolve().parents[2] / "examples" / example
                         / "deployment.yaml")
    run = release_run(inputs, "dynamo", plan.site.engines["dynamo"].vllm, instances)
    assert run.refused is None and {k.moe_backend for k in run.kernels} == {"flashinfer_trtllm"}
    engines = {**plan.site.engines,
               "dynamo": plan.site.engines["dynamo"].model_copy(update={"kernels": run.kernels})}
    planted = plan.model_copy(update={"instances": instances, "site": plan.site.model_copy(
        update={"engines": engines})})
    out = {**TARGETS["vllm"](planted), **TARGETS["dynamo"](planted)}
    vllm_lines = [s.argv for s in emitted.scripts(out) if only_033 in s.argv]
    [dgd] = emitted.documents(out, "dynamo")
    workers = [w for w in emitted.dynamo_lines(dgd).values() if w[2] == "dynamo.vllm"]
    assert vllm_lines and workers and not any(only_033 in w for w in workers)
    assert_all_ok(harness.check_vllm_lines(vllm_lines))
    assert_all_ok(harness.check_dynamo_lines(workers))
    as_033 = [[only_033 if a == "flashinfer_trtllm" else a for a in w] for w in workers
              if "flashinfer_trtllm" in w]
    assert as_033 and not any(r.ok for r in harness.check_dynamo_lines(as_033))

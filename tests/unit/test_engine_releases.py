"""The plan's kernels under the vLLM release a target runs (issue 18, compiler.engine_releases):
kept where that release has them, that release's own pick where it has another, else refused
naming both releases and the fact. Each test plants a choice one release has and the other
lacks (read from the two fact sets, catalog/engines/vllm-0.33.yaml and vllm-0.31.yaml)."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from compiler import catalog, site
from compiler.catalog.engine import Vllm
from compiler.engine_releases import RULE, ReleaseRun, hybrid_refusal, release_run
from compiler.load import load_inputs
from compiler.plan import ReleaseKernels, WeightOffload
from targets import TARGETS
from tests.targets.fixtures import compiled_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VR = "vr-nvl72-deepseek-v4.1-flash"
ENGINES = catalog.engines()
V033, V031 = ENGINES.release("0.33.0"), ENGINES.release("0.31.0")


@pytest.fixture(scope="module")
def inputs():
    return load_inputs(EXAMPLES / VR / "deployment.yaml")


def _plan_instance(role: str, **update):
    [first] = [i for i in compiled_plan(VR).instances if i.id == f"{role}-00"]
    return first.model_copy(update=update)


def _with(inputs, release: str, edit):
    """The inputs with one release's fact set edited (`edit` changes its dict)."""
    data = ENGINES.vllm_releases[release].model_dump(mode="json")
    edit(data)
    releases = {**ENGINES.vllm_releases, release: Vllm.model_validate(data)}
    engines = ENGINES.model_copy(update={"vllm_releases": releases,
                                         "vllm": releases[catalog.PLAN_VLLM]})
    return dataclasses.replace(inputs, resolved=dataclasses.replace(inputs.resolved,
                                                                    engines=engines))


def _run(inputs, *instances) -> ReleaseRun:
    return release_run(inputs, "dynamo", "0.31.0", list(instances))


def test_the_plans_own_release_changes_nothing(inputs):
    plan = compiled_plan(VR)
    assert release_run(inputs, "vllm", "0.33.0", plan.instances) == ReleaseRun([], None, [])
    # every example choice is one 0.31 has: Dynamo runs the plan's kernels
    assert _run(inputs, *plan.instances) == ReleaseRun([], None, [])


def test_a_moe_backend_031_lacks_takes_031s_own_pick(inputs):
    """0.33 loads MXFP4 experts with flashinfer_moe_ep_cutedsl, 0.31 has no such name."""
    assert "flashinfer_moe_ep_cutedsl" in V033.moe.accepts["mxfp4"].value
    assert "flashinfer_moe_ep_cutedsl" not in V031.moe.accepts["mxfp4"].value
    planted = _plan_instance("prefill", moe_backend="flashinfer_moe_ep_cutedsl")
    run = _run(inputs, planted)
    assert run.refused is None
    assert run.kernels == [ReleaseKernels(instance="prefill-00",
                                          all2all_backend=planted.all2all_backend,
                                          moe_backend="flashinfer_trtllm", env=planted.env)]
    [d] = run.decisions
    assert (d.path, d.value, d.source) == ("site.engines.dynamo.kernels[prefill-00].moe_backend",
                                           "flashinfer_trtllm", RULE)
    assert "vLLM 0.31 has no --moe-backend flashinfer_moe_ep_cutedsl" in d.why


def test_a_moe_backend_031_lacks_with_no_pick_of_its_own_is_refused(inputs):
    def drop(data):
        data["moe"]["accepts"]["mxfp4"]["value"] = ["triton"]
    run = _run(_with(inputs, "0.31", drop), _plan_instance("prefill"))
    assert run.kernels == [] and run.decisions == []
    assert "--moe-backend flashinfer_trtllm does not run mxfp4 experts in vLLM 0.31" in run.refused
    assert "vLLM 0.33 (the plan's) and vLLM 0.31 (the target's)" in run.refused


def test_an_all2all_backend_031_lacks_takes_031s_own_pick(inputs):
    """0.33 added `passthrough` (config/parallel.py All2AllBackend); 0.31 dispatches decode by
    its own decode fact."""
    assert "passthrough" in V033.all2all.backends.value
    assert "passthrough" not in V031.all2all.backends.value
    planted = _plan_instance("decode", all2all_backend="passthrough")
    run = _run(inputs, planted)
    assert run.refused is None
    [k] = run.kernels
    assert (k.all2all_backend, k.moe_backend) == (V031.all2all.decode.value,
                                                 planted.moe_backend)
    assert k.env == {"VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL": "1"}  # 0.31's MNNVL switch
    assert [d.path for d in run.decisions] == [
        "site.engines.dynamo.kernels[decode-00].all2all_backend"]


def test_speculative_options_031_lacks_are_refused(inputs):
    """0.33's RejectionSampleMethod has `fly`, 0.31's does not (config/speculative.py)."""
    def fly(data):
        data["speculative"]["options"]["dspark"]["value"]["rejection_sample_method"] = "fly"
    run = _run(_with(inputs, "0.33", fly), _plan_instance("decode"))
    assert "serving.speculative dspark's options" in run.refused
    assert "'fly'" in run.refused and "vLLM 0.31" in run.refused and "vLLM 0.33" in run.refused


def test_a_kernel_block_031_cannot_run_is_refused(inputs):
    def block(data):
        data["attention"]["kernel_block_sizes"]["FLASHINFER_MLA_SPARSE_DSV41"]["value"] = [256]
    run = _run(_with(inputs, "0.31", block), _plan_instance("decode"))
    assert "serving.block_size 128 is no multiple of FLASHINFER_MLA_SPARSE_DSV41's kernel " \
           "blocks [256] in vLLM 0.31" in run.refused


def test_a_linear_backend_031_lacks_is_refused(inputs):
    assert inputs.resolved.linear_backend.value == "deep_gemm"

    def drop(data):
        data["linear"]["backends"]["value"].remove("deep_gemm")
    run = _run(_with(inputs, "0.31", drop), _plan_instance("decode"))
    assert "serving.linear_backend deep_gemm is not in vLLM 0.31's" in run.refused


def test_a_connector_reading_other_env_in_031_is_refused(inputs):
    def env(data):
        data["kv_connectors"]["env"]["NixlConnector"]["value"] = ["VLLM_NIXL_OTHER_HOST"]
    run = _run(_with(inputs, "0.31", env), _plan_instance("decode"))
    assert "instances[decode-00]: NixlConnector reads ['VLLM_NIXL_OTHER_HOST'] in vLLM 0.31" \
        in run.refused


def test_a_release_without_a_fact_set_is_refused(inputs):
    run = release_run(inputs, "dynamo", "0.29.0", [_plan_instance("decode")])
    assert run.refused.startswith("rackc has no fact set for vLLM 0.29.0")


def test_the_release_refusal_reaches_the_plan(inputs):
    plan = compiled_plan(VR)
    runs = site.engine_runs(inputs.resolved.engines, inputs.resolved.site.images, "0.33.0",
                            plan.instances, ReleaseRun([], "why", []),
                            plan.model.expert_format)
    assert runs["dynamo"].refused == "why" and runs["vllm"].refused is None


def _moe_flags(doc) -> list[str]:
    if isinstance(doc, dict):
        return [f for v in doc.values() for f in _moe_flags(v)]
    if isinstance(doc, list):
        if "--moe-backend" in doc:
            return [doc[doc.index("--moe-backend") + 1]]
        return [f for v in doc for f in _moe_flags(v)]
    return []


def test_the_dynamo_target_renders_its_releases_kernels_and_vllm_the_plans():
    plan = compiled_plan(VR)
    prefill = next(i for i in plan.instances if i.role == "prefill")
    own = ReleaseKernels(instance=prefill.id, all2all_backend=prefill.all2all_backend,
                         moe_backend="marlin", env=prefill.env)
    engines = dict(plan.site.engines)
    engines["dynamo"] = engines["dynamo"].model_copy(update={"kernels": [own]})
    planted = plan.model_copy(update={"site": plan.site.model_copy(update={"engines": engines})})
    dgd = yaml.safe_load(TARGETS["dynamo"](planted)["dynamo/dgd.yaml"])
    workers = {c["type"]: _moe_flags(c) for c in dgd["spec"]["components"]
               if c["type"] != "frontend"}
    assert set(workers["prefill"]) == {"marlin"} and set(workers["decode"]) == {"marlin"}
    assert prefill.moe_backend == "flashinfer_trtllm"
    before = yaml.safe_load(TARGETS["dynamo"](plan)["dynamo/dgd.yaml"])
    assert {f for c in before["spec"]["components"] if c["type"] == "prefill"
            for f in _moe_flags(c)} == {"flashinfer_trtllm"}
    scripts = TARGETS["vllm"](planted)
    assert any("--moe-backend flashinfer_trtllm" in t for t in scripts.values())


@pytest.mark.parametrize(("section", "key", "value"), [
    ("memory", "redundancy_gib", 0.5), ("engram", "shard_across_instances", True),
    ("pipeline", "stage_tensors", 3)])
def test_a_fact_the_plan_was_sized_by_that_031_does_otherwise_is_refused(
        inputs, section, key, value):
    def edit(data):
        data[section][key]["value"] = value
    run = _run(_with(inputs, "0.31", edit), _plan_instance("decode"))
    assert run.refused.startswith(f"vLLM 0.31's {section}.{key} is {value} (")
    assert "vLLM 0.33 (the plan's)" in run.refused


PREFETCH = WeightOffload(backend="prefetch", gib_per_gpu=40.0, group_size=4, num_in_group=1,
                         prefetch_step=1, buffer_gib=2.0)


def test_an_offloading_instance_runs_where_the_release_offloads_alike(inputs):
    """0.31's offloaders are 0.33's (model_executor/offloader/, config/offload.py): the Dynamo
    target runs a prefetch instance as the plan does."""
    assert V031.offload.backends.value == V033.offload.backends.value
    assert _run(inputs, _plan_instance("decode", weight_offload=PREFETCH)).refused is None


def test_an_offload_backend_031_lacks_is_refused(inputs):
    def drop(data):
        data["offload"]["backends"]["value"] = ["uva"]
    lacking = _with(inputs, "0.31", drop)
    assert _run(lacking, _plan_instance("decode")).refused is None  # offloads nothing
    run = _run(lacking, _plan_instance("decode", weight_offload=PREFETCH))
    assert "instances[decode-00] offloads weights with the prefetch backend, which vLLM 0.31 " \
           "lacks" in run.refused and "vLLM 0.33 (the plan's)" in run.refused


def test_an_offload_the_plan_was_timed_by_that_031_does_otherwise_is_refused(inputs):
    def edit(data):
        data["offload"]["towers"]["prefetch"]["value"] = True
    run = _run(_with(inputs, "0.31", edit), _plan_instance("decode", weight_offload=PREFETCH))
    assert "vLLM 0.31's offload.towers is not the plan's" in run.refused


def test_a_release_that_raises_a_hybrid_models_block_elsewhere_is_refused():
    """Kimi K3's engines run the block 0.33 raises its KDA state's to at the smallest TP; 0.31
    raises it the same way, a release with another alignment would run another block than the
    plan's router hashes in."""
    kimi = load_inputs(Path(__file__).resolve().parents[1] / "inputs" / "gb300-kimi-k3"
                       / "deployment.yaml")
    tps = [SimpleNamespace(tp=8), SimpleNamespace(tp=16)]
    assert hybrid_refusal(kimi, V031, tps) is None

    def wider(data):
        data["attention"]["hybrid_mla_block"]["value"] = 1024
    edited = _with(kimi, "0.31", wider)
    refused = hybrid_refusal(edited, edited.resolved.engines.release("0.31.0"), tps)
    assert refused.startswith("vLLM 0.31 raises the KV block to 2048 tokens, the plan's "
                              "engines and router run 1536")

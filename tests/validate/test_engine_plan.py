"""engine-matches-plan: a bundle's engines run with the plan's numbers. Each test plants a
defect of bundle review 3 back into a compiled example and checks that the rule names it, on
every way the bundle starts an engine (launch scripts, the DGD, the LeaderWorkerSets)."""

import json

import pytest
import yaml

from compiler.validate import rules

from .bundles import VR, compiled

RULE = "engine-matches-plan"
SCRIPT = "vllm/prefill-00/r0-t16.sh"
DGD = "k8s/dynamo-graph.yaml"
LWS = "lws/leaderworkersets.yaml"


def _fired(plan, files) -> list[rules.Finding]:
    return rules.findings(plan, files, [RULE])


def _edit_text(files, path: str, old: str, new: str) -> None:
    text = files[path]
    assert old in text, (path, old)
    files[path] = text.replace(old, new)


def test_the_compiled_example_matches_its_plan():
    plan, files = compiled(VR)
    engines = [e for b in rules.context(plan, files).bundles for e in b.engines]
    assert len(engines) >= 2 * len(plan.instances)  # DGD and LWS engines, all matched
    assert not _fired(plan, files)


@pytest.mark.parametrize("path", [SCRIPT, DGD, LWS])
def test_a_memory_utilization_above_the_plans_is_named(path):
    """S3-11: 0.99 leaves less than the plan's reserve for NCCL and the CUDA context."""
    plan, files = compiled(VR)
    util = plan.instance("prefill-00").gpu_memory_utilization
    files[path] = files[path].replace(f"{util:.2f}", "0.99", 1) if path == SCRIPT else \
        _flag_value(files[path], "--gpu-memory-utilization", "0.99")
    found = _fired(plan, files)
    assert any(f.file == path and "--gpu-memory-utilization 0.99" in f.got for f in found), found


def test_speculative_config_without_the_plans_sampling_is_named():
    """S3-13: the recipe's probabilistic drafting and block rejection, dropped."""
    plan, files = compiled(VR)
    spec = plan.serving.speculative
    assert spec is not None and spec.options
    bare = json.dumps({"method": spec.method, "num_speculative_tokens": spec.draft_tokens},
                      separators=(",", ":"), sort_keys=True)
    full = json.dumps({"method": spec.method, "num_speculative_tokens": spec.draft_tokens,
                       **spec.options}, separators=(",", ":"), sort_keys=True)
    text = files[SCRIPT]
    assert full in text
    files[SCRIPT] = text.replace(full, bare)
    found = _fired(plan, files)
    assert any(f.file == SCRIPT and "speculative" in f.expected for f in found), found


def test_a_text_only_engine_that_loads_the_vision_tower_is_named():
    """S3-15: without --language-model-only the ViT takes HBM the plan gave the KV cache."""
    plan, files = compiled(VR)
    assert plan.serving.language_model_only
    _edit_text(files, SCRIPT, "  --language-model-only \\\n", "")
    found = _fired(plan, files)
    assert any(f.file == SCRIPT and "--language-model-only" in f.expected for f in found), found


def test_an_engine_of_no_instance_is_named():
    plan, files = compiled(VR)
    files["vllm/prefill-07/r0-t16.sh"] = files[SCRIPT]
    found = _fired(plan, files)
    assert any(f.file == "vllm/prefill-07/r0-t16.sh" and f.got == "none matches"
               for f in found), found


def _flag_value(text: str, flag: str, value: str) -> str:
    """Replace the value after `flag` in the first args list that has it."""
    docs = list(yaml.safe_load_all(text))

    def walk(x):
        if isinstance(x, list):
            for k, v in enumerate(x):
                if v == flag and k + 1 < len(x):
                    x[k + 1] = value
                    return True
                if walk(v):
                    return True
        elif isinstance(x, dict):
            return any(walk(v) for v in x.values())
        return False

    assert any(walk(d) for d in docs)
    return yaml.safe_dump_all(docs, sort_keys=False)


def test_a_startup_probe_shorter_than_the_cold_start_is_named():
    """S3-14: the kubelet would restart an engine still loading its checkpoint."""
    plan, files = compiled(VR)
    docs = list(yaml.safe_load_all(files[LWS]))
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    leader["startupProbe"]["failureThreshold"] = 210  # 2100 s, the review's figure
    files[LWS] = yaml.safe_dump_all(docs, sort_keys=False)
    found = _fired(plan, files)
    assert any(f.file == LWS and "startupProbe" in f.expected and f.got.startswith("2100 s")
               for f in found), found


def test_an_image_other_than_the_plans_is_named():
    """S3-03: a Dynamo runtime "rebuilt with vLLM 0.33" is not the image the plan's facts are
    for; the DGD's workers must run the plan's."""
    plan, files = compiled(VR)
    image = plan.site.images.dynamo
    files[DGD] = files[DGD].replace(image, image + "-vllm0.33")
    found = _fired(plan, files)
    assert any(f.file == DGD and image in f.expected for f in found), found

"""Weight offload per role and per pinned entry, with either of vLLM's backends: each instance's
own offload sizes its memory budget (the prefetch backend's GPU buffers included), is pinned
in its tray's DRAM, reaches its engine as that instance's flags, and is what `rackc validate`
holds the emitted flags to."""

from pathlib import Path

import pytest

from compiler import api, offload
from compiler.load import load_inputs
from compiler.memory import gpu_budget, stage_weight_parts_gib
from compiler.shapes import parse_shape
from compiler.validate import rules
from tests.builders import write_case
from tests.targets import emitted

DEP4 = parse_shape("DEP4")
EXPERTS_80 = {"gib_per_gpu": 80, "experts_only": True}
# prefill reads its experts over PCIe (UVA), decode prefetches them a layer ahead
SERVING = {"weight_offload": EXPERTS_80,
           "weight_offload_per_role": {"decode": {"backend": "prefetch", **EXPERTS_80}}}
PINS = {"mode": "pinned", "instances": [{"role": "prefill", "shape": "DEP4", "count": 1},
                                        {"role": "decode", "shape": "DEP4", "count": 1}]}


def _case(tmp_path: Path, serving: dict = SERVING, objective: dict = PINS) -> Path:
    return write_case(tmp_path, system="hgx-h200", model="deepseek-v3", kind="Cluster",
                      hardware={"nodes": 1}, serving=serving, objective=objective,
                      workload={"profile": "fixed", "isl": 1024, "osl": 128})


def test_each_roles_budget_holds_its_own_offload(tmp_path: Path):
    inputs = load_inputs(_case(tmp_path))
    uva, pre = offload.of(inputs, "prefill", DEP4), offload.of(inputs, "decode", DEP4)
    assert (uva.backend, uva.host_gib, uva.buffer_gib) == ("uva", 80.0, 0.0)
    # the most spread groups that offload 80 GiB: one MoE layer of every 2 is 29 x 2.625 GiB,
    # too little; two of every 3 (layers 4, 5, 7, 8, ...: the dense 1 and 2 hold no experts)
    assert (pre.backend, pre.group_size, pre.num_in_group, pre.prefetch_step) == \
        ("prefetch", 3, 2, 1)
    layer = offload.layer_gib(inputs.model.spec, DEP4, 10)[0]
    assert pre.stages[0].offloaded[:4] == (4, 5, 7, 8)
    assert pre.host_gib == pytest.approx(len(pre.stages[0].offloaded) * layer, abs=1e-3)
    assert pre.buffer_gib == pytest.approx(layer, abs=1e-3)  # one slot of one MoE layer
    held = sum(stage_weight_parts_gib(inputs.model.spec, DEP4)[0])
    prefill, decode = gpu_budget(inputs, "prefill", DEP4, 8), gpu_budget(inputs, "decode",
                                                                         DEP4, 4)
    assert prefill.weights_gib == pytest.approx(held - 80, abs=1e-6)
    assert decode.weights_gib == pytest.approx(held - pre.host_gib + pre.buffer_gib, abs=1e-6)
    assert (prefill.offload_gib, decode.offload_gib) == (80.0, pre.host_gib)


def test_each_instance_is_flagged_pinned_and_validated_with_its_own_offload(tmp_path: Path):
    result = api.compile(_case(tmp_path), only=("vllm",))
    plan, files = result.plan, dict(result.artifacts)
    offloads = {i.role: i.weight_offload for i in plan.instances}
    assert offloads["prefill"].backend == "uva" and offloads["decode"].backend == "prefetch"
    (tray,) = plan.host_memory.values()
    assert tray.weights_gib == pytest.approx(4 * 80 + 4 * offloads["decode"].gib_per_gpu)
    flags = {s.instance: s for s in emitted.scripts(files)}
    prefill, decode = flags["prefill-00"], flags["decode-00"]
    assert (prefill.flag("--offload-backend"), prefill.flag("--cpu-offload-gb"),
            prefill.flag("--cpu-offload-params")) == ("uva", "80", "experts")
    assert prefill.flag("--offload-group-size") is None
    assert (decode.flag("--offload-backend"), decode.flag("--offload-group-size"),
            decode.flag("--offload-num-in-group"), decode.flag("--offload-prefetch-step"),
            decode.flag("--offload-params")) == ("prefetch", "3", "2", "1", "experts")
    assert decode.flag("--cpu-offload-gb") is None
    decisions = {d.path: d for d in plan.decisions}
    assert decisions["instances.decode-00.weight_offload"].source == "rule:offload-groups"
    assert decisions["weight_offload.decode"].source == "user"
    # the prefetch copies hide behind no compute here (a copy of 2.6 GiB over PCIe takes
    # ~55 ms, a decode layer ~1 ms), so decode pays them, and UVA's reads pay prefill
    assert plan.predicted.breakdown["decode"]["weight_offload"] > 0
    assert not rules.findings(plan, files, ["engine-matches-plan"])


@pytest.mark.parametrize("old,new,expected", [
    ("--offload-group-size 3", "--offload-group-size 4", "--offload-group-size 3"),
    ("--offload-backend prefetch", "--offload-backend uva", "--offload-backend prefetch"),
    ("  --offload-prefetch-step 1 \\\n",
     "  --offload-prefetch-step 1 \\\n  --cpu-offload-gb 99 \\\n", "no --cpu-offload-gb"),
])
def test_a_decode_engine_offloading_otherwise_than_its_instance_is_named(
        tmp_path: Path, old: str, new: str, expected: str):
    """A flag planted back into the prefetch instance's launch script: its weights would sit
    elsewhere than the memory map says, or cost another time than predicted."""
    result = api.compile(_case(tmp_path), only=("vllm",))
    files = dict(result.artifacts)
    [path] = [p for p in files if p.startswith("vllm/decode-00/")]
    assert old in files[path]
    files[path] = files[path].replace(old, new)
    found = rules.findings(result.plan, files, ["engine-matches-plan"])
    assert [f.file for f in found] == [path] and expected in found[0].expected, found


def test_a_pinned_entrys_offload_replaces_its_roles(tmp_path: Path):
    """objective.instances[].weight_offload replaces the role's for that role and shape only."""
    pins = {"mode": "pinned", "instances": [
        {"role": "prefill", "shape": "DEP4", "count": 1},
        {"role": "decode", "shape": "DEP4", "count": 1,
         "weight_offload": {"backend": "prefetch", "group_size": 2, "experts_only": True}}]}
    inputs = load_inputs(_case(tmp_path, {"weight_offload": EXPERTS_80}, pins))
    r = inputs.resolved
    assert r.offload_ask("prefill", "DEP4").backend == "uva"
    assert r.offload_ask("decode", "DEP4").group_size == 2
    assert r.offload_ask("decode", "DEP8").backend == "uva"  # the role's, not the entry's
    assert {c.path: c.source for c in r.weight_offload} == {
        "weight_offload.prefill": "user", "weight_offload.decode": "user",
        "weight_offload.decode.DEP4": "user"}
    pre = offload.of(inputs, "decode", DEP4)
    # every second layer, the dense layer 1 skipped: layers 3, 5, ..., 59
    assert pre.stages[0].offloaded == tuple(range(3, 61, 2))

"""The plan is what the engines run (issue 10): each compiled example holds only what the pinned
vLLM, Dynamo and Mooncake can do, the targets emit exactly that, and the fallbacks say so."""

from pathlib import Path

import pytest
import yaml

from compiler import api, catalog
from compiler.choice import CAPABILITY
from compiler.perf import handoff
from compiler.perf.predict import context
from schemas.diagnostics import CompileError
from targets import TARGETS
from targets import report as report_target
from tests.targets import emitted
from tests.targets.fixtures import compiled_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VR, GB300, H200 = ("vr-nvl72-deepseek-v4.1-flash", "gb300-nvl72-deepseek-v4.1-flash",
                   "hgx-h200-deepseek-v3")
ENGINES = catalog.engines()


def scripts(example: str):
    return emitted.scripts(TARGETS["vllm"](compiled_plan(example)))


def dgd(example: str) -> dict:
    return yaml.safe_load(TARGETS["dynamo"](compiled_plan(example))["dynamo/dgd.yaml"])


def test_block_size_is_a_multiple_of_the_sparse_mla_kernel_block():
    """Defect 6: V4.1's FLASHINFER_MLA_SPARSE_DSV41 runs 128-token kernel blocks; 64 fails."""
    kernel = ENGINES.vllm.attention.kernel_block_sizes["FLASHINFER_MLA_SPARSE_DSV41"].value
    for example in (VR, GB300):
        plan = compiled_plan(example)
        assert plan.serving.attention_backend == "FLASHINFER_MLA_SPARSE_DSV41"
        blocks = {s.flag("--block-size") for s in scripts(example)}
        assert blocks == {str(plan.serving.block_size)}
        assert all(plan.serving.block_size % k == 0 for k in kernel) and kernel == [128]
        [frontend] = [c for c in dgd(example)["spec"]["components"] if c["type"] == "frontend"]
        args = frontend["podTemplate"]["spec"]["containers"][0]["args"]
        assert args[args.index("--kv-cache-block-size") + 1] == str(plan.serving.block_size)


def test_a_block_size_the_kernel_cannot_run_is_refused(tmp_path: Path):
    for name in ("rack.yaml", "deployment.yaml"):
        doc = yaml.safe_load((EXAMPLES / VR / name).read_text())
        if name == "deployment.yaml":
            doc["spec"]["serving"]["block_size"] = 64
        (tmp_path / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(CompileError) as err:
        api.check(tmp_path / "deployment.yaml")
    [d] = err.value.diagnostics
    assert (d.code, d.path, d.got) == ("E105", "spec.serving.block_size", "64")
    assert "FLASHINFER_MLA_SPARSE_DSV41" in d.hint


def test_moe_backend_loads_the_checkpoints_experts():
    """Defect 7: native V4.1 experts load as MXFP4, which flashinfer_cutedsl refuses; decode's
    DeepEP low-latency dispatch needs a batched-layout MXFP4 kernel. The draft inherits."""
    m = ENGINES.vllm.moe
    for example in (VR, GB300):
        plan = compiled_plan(example)
        assert plan.model.expert_format == "mxfp4"
        for s in scripts(example):
            inst = plan.instance(s.instance)
            backend = s.flag("--moe-backend")
            assert backend == inst.moe_backend and backend in m.accepts["mxfp4"].value
            if inst.all2all_backend == "deepep_low_latency":
                assert backend in m.batched["mxfp4"].value
            assert "moe_backend" not in (s.flag("--speculative-config") or "")
        paths = {d.path for d in plan.decisions}
        assert "speculative.moe_backend" in paths


def test_multi_tray_deepep_low_latency_runs_over_mnnvl():
    """Defect 4: without VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL=1 the cross-tray EP group uses RDMA."""
    for example in (VR, GB300):
        plan = compiled_plan(example)
        multi = [i for i in plan.instances
                 if i.all2all_backend == "deepep_low_latency" and len(i.trays) > 1]
        assert multi
        for s in scripts(example):
            want = "1" if plan.instance(s.instance) in multi else None
            assert s.env.get("VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL") == want
        # the decode workers running DeepEP low-latency across trays (a TP8EP8 decode the
        # solver may also choose runs no DeepEP)
        # one component per instance, named <instance id>-<shape>
        names = {f"{i.id}-{i.shape.lower()}" for i in multi if i.role == "decode"}
        decode = [c for c in dgd(example)["spec"]["components"]
                  if c["type"] == "decode" and c["name"] in names]
        assert decode
        for c in decode:
            [container] = c["podTemplate"]["spec"]["containers"]
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env.get("VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL") == "1"


@pytest.mark.parametrize("example", [VR, GB300, H200])
def test_gpu_memory_utilization_leaves_the_engines_reserve(example: str):
    """Defect 12: CUDA context, NCCL and NIXL live outside vLLM's budget; DeepEP's buffers
    inside it (as workspace), before the KV cache."""
    plan = compiled_plan(example)
    reserve = ENGINES.vllm.memory.nixl_gib.value
    for inst in plan.instances:
        for gpu in inst.gpus:
            doms = [m for d, m in plan.memory.items() if d.startswith(gpu + "-")]
            cap = sum(m.capacity_gib for m in doms)
            reserved = sum(m.reserved_gib for m in doms)
            assert reserved > reserve
            assert inst.gpu_memory_utilization <= (cap - reserved) / cap + 1e-3
            assert inst.gpu_memory_utilization < 0.99
    utils = {s.flag("--gpu-memory-utilization") for s in scripts(example)}
    assert utils == {f"{i.gpu_memory_utilization:.2f}" for i in plan.instances}


@pytest.mark.parametrize("example", [VR, GB300, H200])
def test_what_a_tray_pins_fits_in_its_host_memory(example: str):
    """Defect 13: the GB300 prefill trays pinned 841 of 894 GiB (pool half of DRAM plus two
    host copies of the Engram tables) with nothing left for processes and the OS."""
    plan = compiled_plan(example)
    for tray, h in plan.host_memory.items():
        pinned = h.pool_gib + h.engram_gib + h.process_gib + h.reserved_gib
        assert pinned <= h.capacity_gib + 1e-6, tray
        assert h.process_gib > 0
    pool = {s.location: s.gib for s in plan.kv_pool.segments if s.kind == "dram"}
    assert pool == {t: h.pool_gib for t, h in plan.host_memory.items()}


@pytest.mark.parametrize("example", [VR, GB300, H200])
def test_pods_memory_requests_fit_the_trays_allocatable(example: str):
    """The GB300 prefill trays asked 2 x 425 GiB of 894 GiB: within capacity, over what the
    scheduler allocates once the kubelet's reserves and the GPU nodes' DaemonSets are off."""
    plan = compiled_plan(example)
    reserve = plan.site.host_reserved_gib
    [decision] = [d for d in plan.decisions if d.path == "site.host.reserved_gib_per_tray"]
    assert decision.why.startswith("assumed") and float(decision.value) == reserve
    size = {p.instance: p.resources.memory_gib for p in plan.site.pods}
    for tray, h in plan.host_memory.items():
        assert h.reserved_gib == reserve == pytest.approx(max(32.0, 0.1 * h.capacity_gib))
        asked = sum(size[i.id] for i in plan.instances if tray in i.trays)
        assert asked <= h.capacity_gib - reserve, tray


def test_gb300_prefill_trays_trim_the_pool_and_say_so():
    plan = compiled_plan(GB300)
    prefill_trays = {t for i in plan.instances if i.role == "prefill" for t in i.trays}
    assert all(plan.host_memory[t].engram_gib > 0 for t in prefill_trays)
    trimmed = {d.path.split(".")[-1] for d in plan.decisions if d.source == "rule:host-memory"}
    # (with DEP2 prefill every tray held two host copies and was trimmed; the solver's DEP16
    # prefill holds one per tray, which leaves the pool whole: the rule must say exactly which)
    assert trimmed == {t for t in prefill_trays if plan.host_memory[t].pool_gib < 447}


@pytest.mark.parametrize("example", [VR, GB300])
def test_plan_and_report_model_no_hbm_pool_and_no_prefill_hbm_engram(example: str):
    """Defect 15: vLLM 0.33's Mooncake store takes no HBM segment and its Engram groups stay
    inside one instance, so the plan holds neither, and says why."""
    plan = compiled_plan(example)
    assert all(s.kind == "dram" for s in plan.kv_pool.segments)
    prefill = {d for i in plan.instances if i.role == "prefill" for g in i.gpus
               for d in plan.memory if d.startswith(g + "-")}
    assert prefill and all(plan.memory[d].pool_gib == 0 and plan.memory[d].engram_gib == 0
                           for d in prefill)
    assert not [s for s in plan.engram_shards if s.group == "prefill"]
    capability = {d.path for d in plan.decisions if d.source == CAPABILITY}
    assert "engram.prefill" in capability
    asked_hbm_pool = yaml.safe_load((EXAMPLES / example / "deployment.yaml").read_text())[
        "spec"]["serving"]["kv_pool"]["hbm"]
    assert ("kv_pool.hbm" in capability) == asked_hbm_pool
    report = report_target.performance_md(plan)
    assert "## Engine fallbacks" in report and "engram.prefill" in report
    assert plan.predicted.breakdown["prefill"]["engram"] > 0  # read from host memory


def test_explain_gives_the_chunk_the_solver_chose():
    for example in (VR, GB300, H200):
        plan = compiled_plan(example)
        for inst in (i for i in plan.instances if i.role == "prefill"):
            [d] = [d for d in plan.decisions if d.path == f"instances.{inst.id}.max_batched_tokens"]
            assert d.value == str(inst.max_batched_tokens)
            assert f"{inst.max_batched_tokens:,} sustains" in d.why


def test_kv_transfer_uses_the_racks_nic_override(tmp_path: Path):
    for name in ("cluster.yaml", "deployment.yaml"):
        doc = yaml.safe_load((EXAMPLES / H200 / name).read_text())
        if name == "cluster.yaml":
            doc["spec"]["nic_gbps_per_gpu"] = 100
        (tmp_path / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    from compiler.load import load_inputs

    slow = load_inputs(tmp_path / "deployment.yaml")
    fast = load_inputs(EXAMPLES / H200 / "deployment.yaml")
    assert slow.resolved.nic_gbps_per_gpu.value == 100
    t_slow = handoff.handoff_us(context(slow, 8), 8192, cross=1.0)
    t_fast = handoff.handoff_us(context(fast, 8), 8192, cross=1.0)
    assert t_slow > 3 * t_fast


def test_inputs_digest_covers_the_catalog(monkeypatch):
    from compiler.load import load_inputs

    path = EXAMPLES / VR / "deployment.yaml"
    before = load_inputs(path).resolved.digest
    real = catalog.engine_text
    monkeypatch.setattr(catalog, "engine_text",
                        lambda name: real(name) + ("#\n" if name == "mooncake" else ""))
    assert load_inputs(path).resolved.digest != before


@pytest.mark.parametrize("example", [VR, GB300, H200])
def test_launch_scripts_set_what_the_connectors_read(example: str):
    plan = compiled_plan(example)
    for s in scripts(example):
        inst = plan.instance(s.instance)
        assert inst.kv_connectors == ["NixlConnector", "MooncakeStoreConnector"]
        assert set(inst.connector_env) <= set(s.env), s.instance
        assert all(n in s.flag("--kv-transfer-config") for n in inst.kv_connectors)

"""The targets' own rules: names, the YAML writer, flag choices per system, and the plans they
refuse (with the field and the reason)."""

import pytest
import yaml

from compiler.names import DNS_LABEL, MAX_LABEL, dns_label
from targets import TARGETS
from targets._components import components
from targets._engine import engine_args
from targets._errors import TargetError
from targets._yaml import dump_yaml
from tests.targets import emitted
from tests.targets.fixtures import compiled_plan

VR, H200 = "vr-nvl72-deepseek-v4.1-flash", "hgx-h200-deepseek-v3"
H200_PP = "hgx-h200-x4-deepseek-v3-128k-pp"  # TP8 decode on Hopper
PINNED = "vr-nvl72-pinned-site"  # DEP2 prefill two per tray, TP8 decode over two trays


def test_dns_label_sanitises_model_names():
    assert dns_label("DeepSeek-V4.1-Flash", "prefill", "DEP2") == "deepseek-v4-1-flash-prefill-dep2"
    assert dns_label("a_b..c-", "", "-d") == "a-b-c-d"


def test_dns_label_shortens_long_names_with_a_stable_hash():
    long_a, long_b = "x" * 70 + "a", "x" * 70 + "b"
    a, b = dns_label(long_a), dns_label(long_b)
    assert len(a) == MAX_LABEL and DNS_LABEL.match(a) and a != b
    assert a == dns_label(long_a)


def test_yaml_quotes_what_yaml_1_1_reads_as_booleans():
    text = dump_yaml({"kind": "K", "apiVersion": "v1", "a": ["y", "n", "yes", "on", "x"]})
    assert text.splitlines()[:2] == ["apiVersion: v1", "kind: K"]
    assert "- 'y'" in text and "- 'n'" in text and "- 'yes'" in text and "- x" in text
    assert yaml.safe_load(text)["a"] == ["y", "n", "yes", "on", "x"]


def flags(plan, role: str) -> list[str]:
    [component, *_] = [c for c in components(plan) if c.role == role]
    return engine_args(plan, component, "vllm")


def value(argv: list[str], flag: str) -> str | None:
    return emitted.flag_value(argv, flag)


def test_rubin_kernels_and_all2all_are_the_plans():
    plan = compiled_plan(VR)
    for role in ("prefill", "decode"):
        [first, *_] = [c for c in components(plan) if c.role == role]
        argv, instance = engine_args(plan, first, "vllm"), first.instances[0]
        assert value(argv, "--all2all-backend") == instance.all2all_backend
        assert value(argv, "--moe-backend") == instance.moe_backend
    prefill, decode = flags(plan, "prefill"), flags(plan, "decode")
    assert value(prefill, "--moe-backend") == "flashinfer_trtllm"  # MXFP4, standard layout
    assert value(decode, "--all2all-backend") == "deepep_low_latency"
    assert value(decode, "--moe-backend") == "marlin"  # MXFP4, DeepEP LL's batched layout
    assert value(decode, "--block-size") == "128"
    assert value(decode, "--linear-backend") == "deep_gemm"  # FP8 dense weights
    assert value(decode, "--attention-backend") == "FLASHINFER_MLA_SPARSE_DSV41"
    assert value(decode, "--kv-cache-dtype") == "fp8"
    assert '"method":"dspark"' in value(decode, "--speculative-config")


def test_hopper_kernels_and_dense_mla():
    plan = compiled_plan(H200)
    prefill, decode = flags(plan, "prefill"), flags(plan, "decode")
    assert value(prefill, "--all2all-backend") == "deepep_high_throughput"
    assert value(decode, "--all2all-backend") == "deepep_low_latency"
    assert value(decode, "--moe-backend") == "deep_gemm"
    assert value(decode, "--attention-backend") == "FLASHMLA"
    assert not [f for f in decode if f.startswith("-ac.")]  # TRT-LLM ragged is Blackwell-only
    assert '"method":"mtp"' in value(decode, "--speculative-config")
    tp = flags(compiled_plan(H200_PP), "decode")  # TP8: no expert parallelism, no all2all
    assert value(tp, "--tensor-parallel-size") == "8"
    assert "--all2all-backend" not in tp and "--enable-expert-parallel" not in tp


def test_tp8_over_two_trays_uses_vllm_multinode_flags():
    plan = compiled_plan(PINNED)
    [tp8, *_] = [i for i in plan.instances if i.tp == 8 and len(i.trays) == 2]
    scripts = [s for s in emitted.scripts(TARGETS["vllm"](plan)) if s.instance == tp8.id]
    leader, worker = sorted(scripts, key=lambda s: "--headless" in s.argv)
    assert [leader.flag("--nnodes"), leader.flag("--node-rank")] == ["2", "0"]
    assert [worker.flag("--nnodes"), worker.flag("--node-rank")] == ["2", "1"]
    assert leader.flag("--master-addr") == worker.flag("--master-addr") == \
        plan.tray(tp8.trays[0]).node_name
    assert leader.flag("--master-port") == "29500"


def plan_with(plan, **changes):
    return plan.model_copy(update=changes)


def test_engram_config_is_the_instances_placement():
    scripts = emitted.scripts(TARGETS["vllm"](compiled_plan(VR)))
    prefill = [s for s in scripts if s.instance.startswith("prefill")]
    decode = [s for s in scripts if s.instance.startswith("decode")]
    assert prefill and all(s.flag("--engram-config") == '{"cpu_offload":true}' for s in prefill)
    assert decode and all(s.flag("--engram-config") ==
                          '{"cpu_offload":false,"embedding_across_dp":true}' for s in decode)


def test_refuses_an_instance_holding_another_group():
    plan = compiled_plan(VR)
    shards = [s.model_copy(update={"group": "prefill"}) for s in plan.engram_shards]
    with pytest.raises(TargetError, match=r"engram_shards: instance decode-00 .*'decode-00'"):
        TARGETS["vllm"](plan_with(plan, engram_shards=shards))


def test_refuses_a_vllm_release_the_targets_write_no_flags_for():
    """Each target writes the flags of the release it runs (site.engines): 0.31 under Dynamo,
    0.33 in the vllm image; another one is refused, naming it."""
    plan = compiled_plan(H200)
    assert TARGETS["dynamo"](plan) and plan.site.engines["dynamo"].vllm == "0.31.0"
    engines = dict(plan.site.engines)
    engines["dynamo"] = engines["dynamo"].model_copy(update={"vllm": "0.30.0"})
    other = plan.model_copy(update={"site": plan.site.model_copy(update={"engines": engines})})
    with pytest.raises(TargetError, match=r"site\.engines\.dynamo\.vllm: .* got 0\.30\.0"):
        TARGETS["dynamo"](other)
    assert TARGETS["vllm"](other)


def test_refuses_a_router_block_size_unlike_the_engines():
    plan = compiled_plan(H200)
    routing = plan.routing.model_copy(update={"block_size": 32})
    with pytest.raises(TargetError, match=r"routing\.block_size"):
        TARGETS["k8s"](plan_with(plan, routing=routing))


def test_refuses_dram_segments_where_no_engine_runs():
    plan = compiled_plan(PINNED)
    [tray, *_] = sorted({t.id for t in plan.hardware.trays} -
                        {t for i in plan.instances for t in i.trays})
    idle = plan.kv_pool.segments[0].model_copy(update={"location": tray})
    pool = plan.kv_pool.model_copy(update={"segments": [*plan.kv_pool.segments, idle]})
    with pytest.raises(TargetError, match=tray):
        TARGETS["mooncake"](plan_with(plan, kv_pool=pool))


def test_each_instance_is_its_own_component():
    """S3-09: a component's pods are pinned to one instance's trays, whatever it shares with
    other instances (here: batch limits, and a tray)."""
    plan = compiled_plan(PINNED)
    instances = [i.model_copy(update={"max_batch": 4}) if i.id in ("prefill-00", "prefill-01")
                 else i for i in plan.instances]
    comps = components(plan_with(plan, instances=instances))
    assert {c.name: [i.id for i in c.instances] for c in comps} == {
        f"{i.id}-{i.shape.lower()}": [i.id] for i in plan.instances}
    for c in comps:
        assert c.node_names == tuple(sorted(plan.tray(t).node_name for t in c.instances[0].trays))

"""What the site must supply (compiler/preflight.py): named as warnings, never a failure."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compiler import api, catalog, preflight

ROOT = Path(__file__).resolve().parents[2]
VR = ROOT / "examples" / "vr-nvl72-deepseek-v4.1-flash"


def notices(plan):
    return preflight.notices(plan, catalog.engines())


def _plan(tmp_path: Path, images: dict | None = None, serving: dict | None = None):
    for name in ("rack.yaml", "deployment.yaml"):
        doc = yaml.safe_load((VR / name).read_text())
        if name == "deployment.yaml" and images:
            doc["spec"].setdefault("site", {}).setdefault("images", {}).update(images)
        if name == "deployment.yaml" and serving:
            doc["spec"].setdefault("serving", {}).update(serving)
        (tmp_path / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return api.compile(tmp_path / "deployment.yaml", only=()).plan


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    return _plan(tmp_path_factory.mktemp("stock"))


def test_the_stock_dynamo_runtime_carries_another_vllm(stock):
    [n] = [n for n in notices(stock) if n.path == "site.images.dynamo"]
    assert "0.31.0" in n.problem and stock.serving.vllm_version in n.problem


def test_nccl_of_groups_spanning_nodes_is_named_until_the_user_sets_the_reserve(tmp_path,
                                                                               stock):
    """S3-11: the reserve outside --gpu-memory-utilization holds NCCL at a per-GPU figure not
    measured on 64-rank MNNVL groups: named, with the knob that settles it."""
    [n] = [n for n in notices(stock) if n.path == "serving.gpu_reserve_gib"]
    assert "decode-00: 64 ranks" in n.problem and "0.98" in n.problem
    measured = _plan(tmp_path, serving={"gpu_reserve_gib": 12.0})
    assert not [n for n in notices(measured) if n.path == "serving.gpu_reserve_gib"]
    used = {i.gpu_memory_utilization for i in measured.instances}
    assert used == {0.95}  # (268.2 - 12) / 268.2 = 0.955.., rounded down


def test_a_pd_plan_without_a_router_gets_no_lws_bundle(tmp_path, stock):
    """Fresh review 5, R5-01/R5-02: without a router every request reaches a decode engine,
    which prefills it in its decode token budget while the prefill instances idle."""
    from targets import lws

    assert stock.lws_refused is None and lws.emit(stock)
    assert not any(n.path == "site.images.router" for n in notices(stock))
    unrouted = _plan(tmp_path, images={"router": None})
    assert "prefill instances would stay idle" in unrouted.lws_refused
    assert lws.emit(unrouted) == {}
    [n] = [n for n in notices(unrouted) if n.path == "site.images.router"]
    assert n.target == "lws" and n.problem.startswith("not emitted") and "k8s/" in n.hint


def test_the_pods_without_gpus_need_a_node_off_the_rack(stock):
    """Fresh review 5, R5-03: they keep off every node of the manifest."""
    k8s, lws = [n for n in notices(stock) if n.path == "site.scheduling"]
    assert (k8s.target, lws.target) == ("k8s", "lws")
    assert all("off the 18 nodes" in n.problem and "the Mooncake master: 4 CPU" in n.problem
               and "stay Pending" in n.hint for n in (k8s, lws))
    assert "Dynamo's frontend: 8 CPU" in k8s.problem and "vllm-router: 8 CPU" in lws.problem


def test_the_scripts_name_their_peers_by_node_name(stock):
    """Fresh review 5, R5-05: the names vLLM hands to the peers must resolve on the hosts."""
    [n] = [n for n in notices(stock) if n.path == "rack.node_names"]
    assert n.target == "vllm" and "--data-parallel-address" in n.problem


def test_a_router_image_settles_its_notice_but_no_image_makes_dynamo_run_vllm_033(
        tmp_path: Path):
    """S3-03: dynamo.vllm 1.6.1 imports a helper vLLM 0.33 renamed, so a rebuilt image is no
    remedy: the notice says which vLLM the workers run and that a 0.33 rebuild cannot start."""
    plan = _plan(tmp_path, {"dynamo": "registry.example/dynamo-vllm:0.33.0-dyn1.6.1",
                            "router": "registry.example/vllm-router:0.1.9"})
    paths = {n.path for n in notices(plan)}
    assert "site.images.router" not in paths
    [n] = [n for n in notices(plan) if n.path == "site.images.dynamo"]
    assert "run vLLM 0.31.0" in n.problem and "cannot import dynamo.vllm" in n.hint
    assert plan.site.engines["dynamo"].vllm == "0.31.0"


def test_the_cluster_prerequisites_are_named(stock):
    by_path = {n.path: n for n in notices(stock)}
    assert "Pod Security privileged" in by_path["site.security"].problem
    assert "IPC_LOCK" in by_path["site.security"].problem
    assert "site.rdma.hca_names" in by_path  # HCA discovery on multi-rail trays (S3-17)
    assert "one Mooncake master" in by_path["site"].problem  # a single point (S3-16)
    assert any(n.target == "vllm" and "Kubernetes Service" in n.problem
               for n in notices(stock))  # the scripts' master address (S3-08)


def test_compile_prints_them_as_warnings_and_succeeds(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "compile",
                           str(VR / "deployment.yaml"), "-o", str(tmp_path / "out"),
                           "--targets", "lws"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "warning[W901] lws/ site.scheduling" in proc.stderr
    assert "site.images.dynamo" not in proc.stderr  # k8s/ was not asked for


def test_the_plan_records_them_and_the_report_reads_the_plan(stock):
    """The report lists the plan's notices (targets read only the plan), whatever the
    catalog says now."""
    from targets import report

    assert stock.notices == notices(stock) and stock.notices
    assert "## Before you deploy" in report.performance_md(stock)
    quiet = stock.model_copy(update={"notices": []})
    assert "## Before you deploy" not in report.performance_md(quiet)
    assert "W901" not in report.emit(quiet)["report/index.html"]


def test_several_shapes_of_a_role_are_one_dynamo_routing_pool(stock):
    from compiler.plan import Plan

    assert not [n for n in notices(stock) if n.path == "objective.shapes"]  # one shape a role
    decode = stock.instance("decode-00")
    other = decode.model_copy(update={"id": "decode-01", "shape": "DEP32"})
    mixed = Plan.model_validate({**stock.model_dump(), "instances": [
        i.model_dump() for i in (*stock.instances, other)]})
    [n] = [n for n in notices(mixed) if n.path == "objective.shapes"]
    assert "DEP32, DEP64" in n.problem and "decode" in n.problem


def test_grove_names_over_the_budget_are_named(stock):
    """Fresh review R4-02: graph + component + `<component>-ldr` over 45 characters."""
    from compiler.preflight import GROVE_NAME_BUDGET

    decode = stock.instance("decode-00")
    exact = len(stock.serving.name) + 2 * len(decode.workload) + len("-ldr")
    assert exact <= GROVE_NAME_BUDGET  # the example fits (45 of 45)
    assert not [n for n in notices(stock) if n.path == "metadata.name"]
    longer = stock.model_copy(update={"serving": stock.serving.model_copy(
        update={"name": stock.serving.name + "-x"})})
    [n] = [n for n in notices(longer) if n.path == "metadata.name"]
    assert f"{decode.workload}: {exact + 2}" in n.problem


def test_the_token_sentence_names_the_pods_that_mount_one(stock):
    """Fresh review R4-03: the frontend and Dynamo's workers mount theirs."""
    [n] = [n for n in notices(stock) if n.path == "site.security"]
    assert "frontend" in n.problem and "dynamo-engine" in n.problem


def test_a_pipelined_prefill_gets_no_lws_bundle_behind_vllm_router():
    """Fresh router review RR-01/RR-02: vllm-router 0.1.17 rebuilds the push hand-off without
    the prefill's pp_size, so decode would read one stage's KV; the PP example gets no lws/."""
    from targets import lws

    plan = api.compile(ROOT / "examples" / "hgx-h200-x4-deepseek-v3-128k-pp" / "deployment.yaml",
                       only=()).plan
    assert plan.site.images.router and any(i.pp > 1 for i in plan.instances)
    assert "pp_size" in plan.lws_refused and lws.emit(plan) == {}
    [n] = [n for n in notices(plan) if n.path == "site.images.router"]
    assert "kv_transfer_params" in n.hint and "k8s/" not in n.hint  # Dynamo refuses it too

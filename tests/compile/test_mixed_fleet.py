"""Mixed fleets: a Cluster of groups of different systems compiles to one plan whose instances
each stay in one group and carry that group's system settings; one pool and one router."""

import json
import re
from pathlib import Path

import pytest
import yaml

from compiler import api
from compiler.plan import Fleet
from schemas.diagnostics import CompileError
from tests.invariants import check_plan

ROOT = Path(__file__).resolve().parents[2]
MIXED = ROOT / "examples" / "mixed-gb300-vr-deepseek-v4.1-flash" / "deployment.yaml"
HGX = ROOT / "examples" / "hgx-h200-deepseek-v3" / "deployment.yaml"

VR_AND_HGX = """\
apiVersion: rackc.dev/v1alpha1
kind: Cluster
metadata:
  name: mixed
spec:
  groups:
    - name: vr-a
      system: vera-rubin-nvl72
      racks: 1
      unavailable:
        gpus: [r0-t03-g1]
    - name: h200
      system: hgx-h200
      nodes: 4
      unavailable:
        gpus: [r1-t02-g5]
"""


@pytest.fixture(scope="module")
def mixed():
    return api.compile(MIXED)


@pytest.fixture(scope="module")
def vr_and_hgx(tmp_path_factory):
    """Two racks' worth of forms: a Vera Rubin NVL72 rack beside four HGX H200 nodes (the
    H200 example's deployment), with one GPU down in each group, named by plan ids."""
    folder = tmp_path_factory.mktemp("vr-hgx")
    (folder / "cluster.yaml").write_text(VR_AND_HGX)
    (folder / "deployment.yaml").write_text(
        HGX.read_text().replace("rack: rack.yaml", "rack: cluster.yaml"))
    return api.compile(folder / "deployment.yaml")


def _attention_backend(artifacts: dict, instance: str) -> str:
    script = next(v for k, v in sorted(artifacts.items()) if k.startswith(f"vllm/{instance}/"))
    return re.search(r"--attention-backend ([A-Z0-9_]+)", script)[1]


@pytest.mark.parametrize("case", ["mixed", "vr_and_hgx"])
def test_instances_stay_in_their_group_and_fit_its_system(case, request):
    result = request.getfixturevalue(case)
    plan = result.plan
    check_plan(plan)  # includes: no instance straddles groups, each names its group
    assert isinstance(plan.hardware, Fleet) and len(plan.fleet) == 2
    for inst in plan.instances:
        hw = plan.hardware_of(inst.trays[0])
        per_domain = hw.hbm_gib_per_gpu / hw.domains_per_gpu
        for gpu in inst.gpus:  # its memory map is its system's HBM
            for d in range(hw.domains_per_gpu):
                assert plan.memory[f"{gpu}-d{d}"].capacity_gib == pytest.approx(per_domain, 0.01)
        backend = _attention_backend(result.artifacts, inst.id)
        assert backend == plan.serving_of(inst).attention_backend
    # ids stay unique across groups: racks count on, so every GPU and tray id is one GPU's
    trays = [t.id for t in plan.hardware.trays]
    assert len(trays) == len(set(trays))
    racks = [sorted({t.id.split("-")[0] for t in hw.trays}) for hw in plan.fleet]
    assert racks[0] == ["r0"] and racks[1] == ["r1"]
    assert len({i.id for i in plan.instances}) == len(plan.instances)


def test_the_router_and_the_pool_span_the_fleet(mixed):
    plan, artifacts = mixed.plan, mixed.artifacts
    dgd = yaml.safe_load(artifacts["dynamo/dgd.yaml"])
    comps = dgd["spec"]["components"]
    assert [c["type"] for c in comps].count("frontend") == 1
    assert sum(c["replicas"] for c in comps if c["type"] != "frontend") == len(plan.instances)
    pool_trays = {s.location.split("-")[0] for s in plan.kv_pool.segments}
    assert pool_trays == {"r0", "r1"}
    clients = [k for k in artifacts if k.startswith("mooncake/clients/")]
    nodes = {t.node_name for t in plan.hardware.trays}
    assert {Path(k).stem for k in clients} <= nodes
    assert {n.split("-t")[0] for n in (Path(k).stem for k in clients)} == {"gb300-a", "vr-a"}
    # each group serves its own share; the fleet's goodput is their sum
    groups = plan.hardware.groups
    assert plan.predicted.requests_per_s == pytest.approx(
        sum(g.predicted.requests_per_s for g in groups), abs=0.01)


def test_each_group_keeps_its_system_settings(vr_and_hgx):
    plan, artifacts = vr_and_hgx.plan, vr_and_hgx.artifacts
    vr, hgx = plan.hardware.groups
    assert (vr.hardware.arch, hgx.hardware.arch) == ("arm64", "amd64")
    assert vr.hardware.unavailable_gpus == ["r0-t03-g1"]
    assert hgx.hardware.unavailable_gpus == ["r1-t02-g5"]  # the plan's id, as written
    used = {g for i in plan.instances for g in i.gpus}
    assert not used & {"r0-t03-g1", "r1-t02-g5"}
    dgd = yaml.safe_load(artifacts["dynamo/dgd.yaml"])
    for c in dgd["spec"]["components"]:
        if c["type"] == "frontend":
            continue
        selector = c["podTemplate"]["spec"]["nodeSelector"]
        names = {t["values"][0] for term in c["podTemplate"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            for t in term["matchFields"]}
        group = vr if any(n.startswith("vr-a-") for n in names) else hgx
        assert selector == {"kubernetes.io/arch": group.hardware.arch,
                            **group.hardware.node_labels}
        # ComputeDomain channels on the NVL72 rack only, for instances that span trays
        claims = bool(c["podTemplate"]["spec"].get("resourceClaims"))
        assert claims == (group is vr and "multinode" in c)


def test_recompile_of_a_mixed_fleet_is_refused_with_a_diagnostic(tmp_path):
    with pytest.raises(CompileError) as exc:
        api.compile(MIXED, only=(), unavailable="r0-t00")
    [d] = exc.value.diagnostics
    assert d.code == "E703" and d.path == "--unavailable"


def test_group_ids_outside_the_group_are_blamed_on_the_group(tmp_path):
    (tmp_path / "cluster.yaml").write_text(VR_AND_HGX.replace("r1-t02-g5", "r0-t02-g5"))
    (tmp_path / "deployment.yaml").write_text(
        HGX.read_text().replace("rack: rack.yaml", "rack: cluster.yaml"))
    with pytest.raises(CompileError) as exc:
        api.check(tmp_path / "deployment.yaml")
    [d] = exc.value.diagnostics
    assert (d.code, d.path, d.line) == ("E205", "spec.groups[1].unavailable.gpus[0]", 16)


def test_rackc_check_of_a_mixed_fleet_reports_every_group(capsys):
    """`rackc check` adds the pinned-layout warnings of each group (it once asked for one
    system and crashed on a fleet)."""
    from compiler import cli

    assert cli.main(["check", str(MIXED), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["racks"] == 2
    assert {s["group"] for s in result["shapes"]} == {"gb300-a", "vr-a"}


def test_a_fleet_beyond_the_gpus_of_64_racks_is_refused(tmp_path):
    """Groups may each hold 64 racks, but together no more GPUs than a one-system cluster
    (E211), so compile time and memory stay bounded (benchmarks/bounded.py)."""
    groups = "".join(f"    - {{name: g{i}, system: gb300-nvl72, racks: {n}}}\n"
                     for i, n in enumerate((40, 25)))
    (tmp_path / "cluster.yaml").write_text(
        VR_AND_HGX.split("  groups:\n")[0] + "  groups:\n" + groups)
    (tmp_path / "deployment.yaml").write_text(
        MIXED.read_text().replace("rack: cluster.yaml", f"rack: {tmp_path / 'cluster.yaml'}"))
    with pytest.raises(CompileError) as exc:
        api.check(tmp_path / "deployment.yaml")
    [d] = exc.value.diagnostics
    assert (d.code, d.path) == ("E211", "spec.groups") and "4680 GPUs" in d.got
    (tmp_path / "cluster.yaml").write_text((tmp_path / "cluster.yaml").read_text()
                                           .replace("racks: 25", "racks: 24"))
    assert api.check(tmp_path / "deployment.yaml")["gpus"] == 64 * 72

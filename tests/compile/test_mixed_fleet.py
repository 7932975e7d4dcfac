"""Mixed fleets: a Cluster of groups of different systems compiles to one plan whose instances
each stay in one group and carry that group's system settings; one pool and one router."""

import json
import re
from pathlib import Path

import pytest
import yaml

from compiler import api, catalog, cli, fleet, site
from compiler.ids import natural
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
def group_plans():
    """The groups' own plans, as the mixed example's compile hands them to compiler.fleet."""
    return []


@pytest.fixture(scope="module")
def mixed(group_plans):
    real = fleet.merge
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fleet, "merge", lambda f, plans: group_plans.extend(plans) or real(f, plans))
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
    assert plan.mixed and len(plan.fleet) == 2
    for inst in plan.instances:
        hw = plan.system_of(inst)
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


def test_each_group_has_its_own_router_and_the_pool_spans_the_fleet(mixed):
    """One DynamoGraphDeployment per group (the operator gives each its own Dynamo namespace):
    a frontend that routes only over its group's workers, so no P/D pair crosses groups."""
    plan, artifacts = mixed.plan, mixed.artifacts
    graphs = list(yaml.safe_load_all(artifacts["dynamo/dgd.yaml"]))
    assert len(graphs) == len(plan.hardware.groups) == 2
    by_workload = {i.workload: i for i in plan.instances}
    for graph, group in zip(graphs, sorted(g.name for g in plan.hardware.groups), strict=True):
        assert graph["metadata"]["name"].endswith(group)
        comps = graph["spec"]["components"]
        assert [c["type"] for c in comps].count("frontend") == 1
        assert {by_workload[c["name"]].group for c in comps if c["type"] != "frontend"} \
            == {group}
    workers = [c for g in graphs for c in g["spec"]["components"] if c["type"] != "frontend"]
    assert sum(c["replicas"] for c in workers) == len(plan.instances)
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


def test_the_plan_and_report_say_each_group_is_routed_on_its_own(mixed):
    """Each group is predicted with its own P/D pairs and routed by its own frontend: the plan
    records it (a decision) and the report says how to split traffic over the frontends."""
    [d] = [d for d in mixed.plan.decisions if d.path == "routing.groups"]
    assert d.value == "one frontend and router per group" and "GetDynamoNamespace" in d.why
    report = mixed.artifacts["report/performance.md"]
    deploy = report[report.index("## Before you deploy"):]
    assert "own Dynamo graph and frontend" in deploy and "routing.groups" in deploy
    assert all(g.name in deploy for g in mixed.plan.hardware.groups)


def test_every_instance_keeps_its_decisions_under_its_own_id(mixed, group_plans, tmp_path,
                                                              capsys):
    """No decision is dropped, and none is left under the id a group used before merging: the
    groups' plans already have the fleet's ids; their settings are named by group."""
    plan = mixed.plan
    assert len(group_plans) == len(plan.hardware.groups) == 2
    # and the fleet's own: how P/D pairs across groups are routed
    assert len(plan.decisions) == sum(len(p.decisions) for p in group_plans) + 1
    paths = [d.path for d in plan.decisions]
    assert len(paths) == len(set(paths))
    for own, group in zip(group_plans, plan.hardware.groups, strict=True):
        assert {i.id for i in own.instances} == {i.id for i in plan.instances
                                                 if i.group == group.name}
        for d in own.decisions:
            own_id = d.path.startswith(("instances.", "kv_pool.segments."))
            named = d if own_id else d.model_copy(
                update={"path": f"groups.{group.name}.{d.path}"})
            assert named in plan.decisions
    ids = {i.id for i in plan.instances}
    assert {p.split(".")[1] for p in paths if p.startswith("instances.")} == ids
    for inst in plan.instances:
        assert f"instances.{inst.id}" in paths
    (tmp_path / "plan.yaml").write_text(mixed.artifacts["plan.yaml"])
    last = max((i.id for i in plan.instances if i.group == "vr-a"), key=natural)
    assert last.startswith("prefill-") and natural(last)[1] > 0
    capsys.readouterr()
    assert cli.main(["explain", str(tmp_path / "plan.yaml"), f"instances.{last}"]) == 0
    assert capsys.readouterr().out.startswith(f"instances.{last} = ")
    # a group setting by its plain path: every group's
    assert cli.main(["explain", str(tmp_path / "plan.yaml"), "serving.block_size"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" = ")[0] for line in out] == [
        "groups.gb300-a.serving.block_size", "groups.vr-a.serving.block_size"]


def test_each_group_keeps_its_system_settings(vr_and_hgx):
    plan, artifacts = vr_and_hgx.plan, vr_and_hgx.artifacts
    vr, hgx = plan.hardware.groups
    assert (vr.hardware.arch, hgx.hardware.arch) == ("arm64", "amd64")
    assert vr.hardware.unavailable_gpus == ["r0-t03-g1"]
    assert hgx.hardware.unavailable_gpus == ["r1-t02-g5"]  # the plan's id, as written
    used = {g for i in plan.instances for g in i.gpus}
    assert not used & {"r0-t03-g1", "r1-t02-g5"}
    graphs = list(yaml.safe_load_all(artifacts["dynamo/dgd.yaml"]))  # one per group
    for c in (c for dgd in graphs for c in dgd["spec"]["components"]):
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


def _vera_rubin_first(folder: Path, fraction: float) -> Path:
    """The mixed example with its groups swapped (Vera Rubin, 1397 GiB a tray, first) and the
    DRAM pool asking `fraction` of each tray."""
    cluster = yaml.safe_load((MIXED.parent / "cluster.yaml").read_text())
    cluster["spec"]["groups"].reverse()
    (folder / "cluster.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False))
    pool = "kv_pool: {dram: true, hbm: false"
    text = MIXED.read_text().replace(pool + "}", f"{pool}, dram_fraction: {fraction}}}")
    assert f"dram_fraction: {fraction}" in text
    (folder / "deployment.yaml").write_text(text)
    return folder / "deployment.yaml"


def test_each_node_has_its_own_groups_reserve(tmp_path):
    """A GB300 tray (894 GiB) keeps the reserve of its own DRAM, not the Vera Rubin group's
    before it: its pods, sized against its own allocatable, fit (they failed E826 when the
    first group's reserve was applied to every node)."""
    from compiler.validate import pods

    result = api.compile(_vera_rubin_first(tmp_path, 0.55), only=("k8s",))
    plan = result.plan
    vr, gb300 = plan.hardware.groups
    assert (vr.hardware.system, gb300.hardware.system) == ("vera-rubin-nvl72", "gb300-nvl72")
    assert vr.host_reserved_gib > gb300.host_reserved_gib
    allocatable = {n.tray: n.capacity[pods.MEMORY] / 2**30 for n in pods.nodes(plan)}
    assert plan.host_memory  # every tray running engines: the budget's capacity less reserve
    for tray, host in plan.host_memory.items():
        assert float(allocatable[tray]) == pytest.approx(host.capacity_gib - host.reserved_gib)


PINNED = """\
  objective:
    mode: pinned
    instances:
      - {role: prefill, shape: DEP8, count: 1}
      - {role: decode, shape: DEP8, count: 1}
"""


def _pinned(folder: Path, groups: int) -> Path:
    """The mixed example with its layout pinned, over its first `groups` groups."""
    cluster = yaml.safe_load((MIXED.parent / "cluster.yaml").read_text())
    cluster["spec"]["groups"] = cluster["spec"]["groups"][:groups]
    (folder / "cluster.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False))
    text = re.sub(r"  objective:\n(    .*\n)+", PINNED, MIXED.read_text())
    assert "mode: pinned" in text and "mode: throughput" not in text
    (folder / "deployment.yaml").write_text(text)
    return folder / "deployment.yaml"


def test_pinned_counts_on_a_mixed_fleet_are_refused(tmp_path):
    """Each group would place every pin (twice the counts on two groups): refused, at the
    deployment's objective.mode, by check and compile alike."""
    deployment = _pinned(tmp_path, 2)
    for run in (api.check, lambda p: api.compile(p, only=("vllm",))):
        with pytest.raises(CompileError) as exc:
            run(deployment)
        [d] = exc.value.diagnostics
        assert (d.code, d.path, d.line) == ("E211", "spec.objective.mode", 15)
        assert d.file.endswith("deployment.yaml")
        assert "gb300-nvl72, vera-rubin-nvl72" in d.got


def test_pinned_counts_on_one_group_are_placed_once(tmp_path):
    result = api.compile(_pinned(tmp_path, 1), only=("vllm",))
    assert sorted((i.role, i.shape) for i in result.plan.instances) == [
        ("decode", "DEP8"), ("prefill", "DEP8")]


def test_a_one_system_plan_is_a_fleet_of_one_group():
    """One shape of hardware for every plan: the accessors answer for one system as for a
    mixed fleet, and the one group leaves serving and the prediction to the plan."""
    from compiler.plan import load_plan

    golden = ROOT / "tests" / "golden" / "hgx-h200-deepseek-v3" / "plan" / "plan.yaml"
    plan = load_plan(golden.read_text())
    [group] = plan.hardware.groups
    assert not plan.mixed and group.name == "h200"
    assert (group.serving, group.predicted, group.host_reserved_gib) == (None, None, None)
    assert plan.hardware.system == group.hardware.system == "hgx-h200"
    for inst in plan.instances:
        assert plan.system_of(inst) is group.hardware and inst.group is None
        assert plan.serving_of(inst) is plan.serving
    assert plan.host_reserved_gib_of(group.hardware) == plan.site.host_reserved_gib


HGX_PAIR = """\
apiVersion: rackc.dev/v1alpha1
kind: Cluster
metadata:
  name: hgx
spec:
  groups:
    - name: h200
      system: hgx-h200
      nodes: 4
    - name: b200
      system: hgx-b200
      nodes: 4
"""
PP = ROOT / "examples" / "hgx-h200-x4-deepseek-v3-128k-pp" / "deployment.yaml"


def test_a_fleet_with_pipelined_prefill_gets_its_report(tmp_path):
    """Review 3's F3: the report read the plan's hardware form, which a fleet has only per
    group (exit 70). The PP example over H200 and B200 nodes, its pins (E211) made a search
    of the same shapes: each group's pipelined prefill is described with its own links."""
    (tmp_path / "cluster.yaml").write_text(HGX_PAIR)
    text = re.sub(r"  objective:\n(    .*\n)+", "  objective:\n    mode: throughput\n"
                  "    layout: disaggregated\n"
                  "    shapes: {prefill: [TP8EP8PP2], decode: [TP8]}\n", PP.read_text())
    assert "rack: cluster.yaml" in text and "mode: pinned" not in text
    (tmp_path / "deployment.yaml").write_text(text)
    result = api.compile(tmp_path / "deployment.yaml", only=("report",))
    prefill = [i for i in result.plan.instances if i.role == "prefill"]
    assert {i.group for i in prefill} == {"h200", "b200"} and all(i.pp == 2 for i in prefill)
    report = result.artifacts["report/performance.md"]
    for inst in prefill:
        assert f"### {inst.id}: TP8EP8PP2, 2 pipeline stages" in report


def test_rackc_check_of_a_mixed_fleet_exits_0(capsys):
    """`check` predicted pinned layouts through the one-system loader, which refuses a fleet
    (E210): the mixed example's check ended in a traceback (exit 70)."""
    assert cli.main(["check", str(MIXED)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: gb300-nvl72 + vera-rubin-nvl72, 2 rack(s)")


def test_a_reserve_the_user_sets_settles_the_nccl_notice_of_every_group(mixed):
    """preflight finds the reserve's decision under each group's name, as under the plain
    path of a one-system plan."""
    from compiler.preflight import notices

    plan = mixed.plan
    named = [d.path for d in plan.decisions if d.path.endswith(".memory.reserved_gib")]
    assert named == ["groups.gb300-a.memory.reserved_gib", "groups.vr-a.memory.reserved_gib"]
    assert [n for n in notices(plan, catalog.engines()) if n.path == "serving.gpu_reserve_gib"]
    user = plan.model_copy(update={"decisions": [
        d.model_copy(update={"source": "user"}) if d.path in named else d
        for d in plan.decisions]})
    assert not [n for n in notices(user, catalog.engines()) if n.path == "serving.gpu_reserve_gib"]


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
    (E212), so compile time and memory stay bounded (benchmarks/bounded.py)."""
    groups = "".join(f"    - {{name: g{i}, system: gb300-nvl72, racks: {n}}}\n"
                     for i, n in enumerate((40, 25)))
    (tmp_path / "cluster.yaml").write_text(
        VR_AND_HGX.split("  groups:\n")[0] + "  groups:\n" + groups)
    (tmp_path / "deployment.yaml").write_text(
        MIXED.read_text().replace("rack: cluster.yaml", f"rack: {tmp_path / 'cluster.yaml'}"))
    with pytest.raises(CompileError) as exc:
        api.check(tmp_path / "deployment.yaml")
    [d] = exc.value.diagnostics
    assert (d.code, d.path) == ("E212", "spec.groups") and "4680 GPUs" in d.got
    (tmp_path / "cluster.yaml").write_text((tmp_path / "cluster.yaml").read_text()
                                           .replace("racks: 25", "racks: 24"))
    assert api.check(tmp_path / "deployment.yaml")["gpus"] == 64 * 72


NVL72_AND_HGX = """\
apiVersion: rackc.dev/v1alpha1
kind: Cluster
metadata:
  name: small
spec:
  groups:
    - name: gba
      system: gb200-nvl72
      racks: 4
      trays: 4
    - name: hgx
      system: hgx-b300
      nodes: 1
"""


def _fleet_case(root: Path, cluster: str, name: str, router: bool = True) -> Path:
    """A Cluster and a Deployment of Qwen3-30B-A3B on it (the vllm-router image set)."""
    (root / "cluster.yaml").write_text(cluster)
    site = {"site": {"images": {"router": "vllm-router:0.1.17"}}} if router else {}
    dep = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Deployment",
           "metadata": {"name": name},
           "spec": {"rack": "cluster.yaml", "model": "qwen3-30b-a3b",
                    "workload": {"profile": "fixed"}, **site}}
    (root / "deployment.yaml").write_text(yaml.safe_dump(dep, sort_keys=False))
    return root / "deployment.yaml"


def test_every_groups_kind_of_pod_runs_as_its_security_says(tmp_path):
    """GB200 racks whose engines register KV memory with their NICs beside an HGX node whose
    engines do not: the fleet's site lists both kinds (the HGX pods' securityContext was a
    KeyError, exit 70), and the namespace's level admits them all."""
    result = api.compile(_fleet_case(tmp_path, NVL72_AND_HGX, "small"))
    plan = result.plan
    registers = {g: {p.resources.registers_memory for p in plan.site.pods
                     if plan.instance(p.instance).group == g} for g in ("gba", "hgx")}
    assert registers == {"gba": {True}, "hgx": {False}}  # P/D on the racks, aggregated on HGX
    assert {"engine", "dynamo-engine", "engine-rdma", "dynamo-engine-rdma"} <= \
        set(plan.site.security)
    assert plan.site.pod_security_level == site.pod_security_level(plan.site.security)
    assert any(p.startswith("dynamo/") for p in result.artifacts)


def test_a_group_named_like_another_groups_routing_group_is_refused_at_its_name(tmp_path):
    """Four GB200 racks route by rack (routing groups gba-nvl0, ..., gba-shared); a GB300
    group named `gba-nvl0` would share a Dynamo graph (`<deployment>-gba-nvl0`) with the first
    group's rack: E210 at the group's name (bundle review 12: a group named `nvl0` compiled
    into node-gpus errors of duplicated components)."""
    cluster = NVL72_AND_HGX.replace(
        "name: hgx\n      system: hgx-b300\n      nodes: 1",
        "name: gba-nvl0\n      system: gb300-nvl72\n      racks: 1\n      trays: 4")
    with pytest.raises(CompileError) as err:
        api.compile(_fleet_case(tmp_path, cluster, "clash"), only=())
    [d] = err.value.diagnostics
    assert d.code == "E210" and d.path == "spec.groups[1].name" and "'gba-nvl0'" in d.got
    assert d.line == NVL72_AND_HGX.splitlines().index("    - name: hgx") + 1


def test_two_groups_each_split_to_fit_dynamos_graphs_keep_apart(tmp_path):
    """Two one-rack GB300 groups of Qwen3-30B-A3B: each group's instances are more than one
    Dynamo graph holds, so each is dealt into parts, named after its group (both were
    `all-1`, `all-2`, refused as a name clash: bundle review 13)."""
    cluster = NVL72_AND_HGX.replace(
        "name: gba\n      system: gb200-nvl72\n      racks: 4\n      trays: 4",
        "name: gba\n      system: gb300-nvl72\n      racks: 1").replace(
        "name: hgx\n      system: hgx-b300\n      nodes: 1",
        "name: gbb\n      system: gb300-nvl72\n      racks: 1")
    result = api.compile(_fleet_case(tmp_path, cluster, "two", router=False))
    names = [g.name for g in result.plan.routing.groups]
    assert len(names) == len(set(names)) >= 4
    assert {n.split("-")[0] for n in names} == {"gba", "gbb"}
    graphs = [d for d in yaml.safe_load_all(result.artifacts["dynamo/dgd.yaml"])]
    assert sorted(g["metadata"]["name"] for g in graphs) == sorted(f"two-{n}" for n in names)

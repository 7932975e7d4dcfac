"""Routing groups on NVL72 racks (compiler/routes.py): a rack that holds prefill and decode
serves its own requests, its own frontend and router pairing only its instances; the racks of
one role share one; each is priced so, and a fleet of racks laid out alike predicts per rack
what one rack does (no free gain from balancing over the fleet)."""

from pathlib import Path

import pytest
import yaml

from compiler import api, incremental
from compiler.validate import rules
from tests.builders import write_case

DGD = "dynamo/dgd.yaml"
K8S_DGD = "k8s/dynamo-graph.yaml"  # what `rackc validate` reads (the k8s/ bundle)
LWS = "lws/leaderworkersets.yaml"


def _case(root: Path, racks: int, objective: dict | None = None) -> Path:
    path = write_case(root, kind="Cluster", hardware={"racks": racks, "trays": 4},
                      objective=objective)
    dep = yaml.safe_load(path.read_text())
    dep["spec"]["site"] = {"images": {"router": "vllm-router:0.1.17"}}
    path.write_text(yaml.safe_dump(dep, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def eight(tmp_path_factory):
    """Eight GB200 racks of four trays: two serve themselves, six of one role share a router."""
    result = api.compile(_case(tmp_path_factory.mktemp("eight"), 8))
    return result.plan, dict(result.artifacts)


def _domain(plan, instance) -> str:
    return plan.tray(instance.trays[0]).nvlink_domain


def test_a_rack_that_holds_both_roles_is_its_own_routing_group(eight):
    """The racks of one role share a router; there are 26 of their instances, more than one
    Dynamo graph holds besides its frontend, and one rack holds every prefill, so the shared
    group is dealt by tray into two parts that each hold both roles."""
    plan, _ = eight
    groups = plan.routing.groups
    assert {g.name for g in groups} >= {"shared-1", "shared-2"} and len(groups) >= 3
    for g in groups:
        roles = {d: {i.role for i in plan.instances if _domain(plan, i) == d} for d in g.domains}
        if g.name.startswith("shared"):
            assert g.cross_domain_share == 1.0
            assert all(len(r) == 1 for r in roles.values())  # one role per rack
            mine = [i for i in plan.instances if plan.route_of(i) == g.name]
            assert {i.role for i in mine} == {"prefill", "decode"} and len(mine) <= 24
            assert g.trays and {t for i in mine for t in i.trays} <= set(g.trays)
        else:
            assert g.domains == [g.name] and g.cross_domain_share == 0.0
            assert roles[g.name] == {"prefill", "decode"}
    assert sum(g.requests_per_s for g in groups) == pytest.approx(plan.solver.objective,
                                                                  rel=1e-6)
    [d] = [d for d in plan.decisions if d.path == "routing.groups"]
    assert d.source == "rule:routing-groups"


def test_each_router_pairs_only_its_groups_instances(eight):
    plan, files = eight
    nodes = {t.node_name: plan.route_of_tray(t) for t in plan.hardware.trays}
    graphs = list(yaml.safe_load_all(files[DGD]))
    assert len(graphs) == len(plan.routing.groups)
    for graph in graphs:
        found = {nodes[term["matchFields"][0]["values"][0]]
                 for c in graph["spec"]["components"] if c["type"] in ("prefill", "decode")
                 for term in c["podTemplate"]["spec"]["affinity"]["nodeAffinity"][
                     "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]}
        assert len(found) == 1 and graph["metadata"]["name"].endswith(found.pop())
    routers = [d for d in yaml.safe_load_all(files[LWS]) if d["kind"] == "Deployment"]
    assert len(routers) == len(plan.routing.groups)
    for router in routers:
        args = router["spec"]["template"]["spec"]["containers"][0]["args"]
        group = router["metadata"]["labels"]["rackc.dev/group"]
        assert args.count(f"rackc.dev/group={group}") == 2  # prefill and decode selectors
    assert not rules.findings(plan, files, ["pd-within-group"])


def test_a_graph_over_two_routing_groups_is_refused(eight):
    plan, files = eight
    graphs = list(yaml.safe_load_all(files[K8S_DGD]))
    moved = next(c for c in graphs[1]["spec"]["components"] if c["type"] == "decode")
    graphs[1]["spec"]["components"].remove(moved)
    graphs[0]["spec"]["components"].append(moved)
    merged = {**files, K8S_DGD: yaml.safe_dump_all(graphs, sort_keys=False)}
    [finding] = rules.findings(plan, merged, ["pd-within-group"])
    assert finding.where.startswith("DynamoGraphDeployment")
    assert "routing group" in finding.expected


def test_racks_laid_out_alike_predict_alike_per_rack(tmp_path: Path):
    """One rack and two racks of the same per-rack layout (pinned): the same goodput and the
    same prediction per rack; their hand-offs stay in each rack."""
    def compiled(racks: int):
        pins = [{"role": "prefill", "shape": "DEP4", "count": racks},
                {"role": "decode", "shape": "DEP8", "count": racks},
                {"role": "decode", "shape": "DEP4", "count": racks}]
        path = _case(tmp_path / str(racks), racks, {"mode": "pinned", "instances": pins})
        return api.compile(path, only=()).plan

    one, two = compiled(1), compiled(2)
    assert [g.name for g in two.routing.groups] == ["nvl0", "nvl1"]
    assert two.solver.objective == pytest.approx(2 * one.solver.objective, rel=1e-9)
    p1, p2 = one.predicted, two.predicted
    assert p2.requests_per_s == pytest.approx(2 * p1.requests_per_s, rel=1e-4)
    for key in ("ttft_ms_p50", "ttft_ms_p90", "tokens_per_s_per_user_p90",
                "output_tokens_per_s_per_gpu", "prefill_utilisation"):
        assert getattr(p2, key) == pytest.approx(getattr(p1, key), rel=1e-3), key


def test_a_group_split_to_fit_dynamos_graphs_says_what_the_split_costs(tmp_path: Path):
    """Eight HGX B300 nodes of Qwen3-30B-A3B: 38 instances in the one group of HGX nodes, more
    than one Dynamo graph holds, every prefill on two nodes. The parts serve less than the one
    pool the solver counted: the plan's goodput is what they sustain together, and the warning
    gives both figures (bundle review 12: the report's headline kept the solver's)."""
    path = write_case(tmp_path, system="hgx-b300", kind="Cluster", hardware={"nodes": 8})
    result = api.compile(path)
    plan = result.plan
    groups = plan.routing.groups
    assert [g.name for g in groups] == ["all-1", "all-2"]
    assert all(sum(plan.route_of(i) == g.name for i in plan.instances) <= 24 for g in groups)
    assert plan.goodput == pytest.approx(sum(g.requests_per_s for g in groups))
    assert plan.goodput < plan.solver.objective
    [notice] = [n for n in plan.notices if n.path == "cluster"]
    assert f"{plan.goodput:g}" in notice.problem and f"{plan.solver.objective:g}" in notice.problem
    assert f"goodput {plan.goodput:g} requests/s" in result.artifacts["report/performance.md"]


def test_a_recompile_keeps_each_kept_instance_in_its_graph(tmp_path: Path):
    """Eight racks whose shared group is dealt into two parts; a tray fails: every instance
    kept in place stays in the part (the Dynamo graph) that served it, since moving one would
    restart it under the other graph (bundle review 12: 9 kept decode instances swapped
    graphs while the diff said nothing moved)."""
    path = _case(tmp_path, 8)
    old = api.compile(path, only=()).plan
    assert any(g.name == "shared-2" for g in old.routing.groups)
    # r5-t03: a decode rack's tray; r0-t00: the prefill tray, after which the shared group
    # holds 24 instances, few enough for one graph, yet its parts stay (bundle review 13: 22
    # kept instances changed graph)
    for down in ("r5-t03", "r0-t00"):
        new = api.compile(path, only=(), base=old, unavailable=down).plan
        kept = {i.id for i in old.instances} & {i.id for i in new.instances}
        assert kept
        by_id = {i.id: i for i in new.instances}
        assert all(old.route_of(i) == new.route_of(by_id[i.id]) for i in old.instances
                   if i.id in kept), down
        assert not [line for line in incremental.changes(old, new) if "regroup" in line]


def test_a_split_takes_as_many_parts_as_serve_most(tmp_path: Path):
    """One GB300 rack of Qwen3-30B-A3B: 42 instances, 12 prefill on three trays. Two parts (the
    fewest) cannot each get a like share of the prefill trays and served 11% less than the
    group; three serve all of it (bundle review 13)."""
    plan = api.compile(write_case(tmp_path, system="gb300-nvl72"), only=()).plan
    assert [g.name for g in plan.routing.groups] == ["all-1", "all-2", "all-3"]
    assert plan.goodput == pytest.approx(plan.solver.objective, rel=1e-6)


def test_a_pinned_layout_of_more_instances_than_a_graph_is_predicted_as_compiled(tmp_path):
    """`rackc predict` of a pinned layout that compile deals into parts gives compile's
    figures (it used to price the layout as one router: 654 against 608 requests/s)."""
    from compiler.pinned import predict_loaded
    from compiler.load import load_inputs

    pins = {"mode": "pinned", "instances": [{"role": "prefill", "shape": "TP4", "count": 3},
                                            {"role": "decode", "shape": "TP1", "count": 40}]}
    path = write_case(tmp_path, objective=pins)
    assert predict_loaded(load_inputs(path)) is None  # placed by compile first


def test_compile_prints_the_goodput_the_report_states(tmp_path: Path, capsys):
    """One figure called goodput: the CLI's summary line and the report's headline (both
    Plan.goodput). The DeepSeek-V3 example at 60 tokens/s per user: the count model's 4.53
    requests/s against the operating point's 4.529, printed one on each before (issue 17's
    verifier)."""
    import shutil

    from compiler.cli import main

    folder = tmp_path / "ex"
    shutil.copytree(Path(__file__).resolve().parents[2] / "examples" / "hgx-h200-deepseek-v3",
                    folder)
    dep = yaml.safe_load((folder / "deployment.yaml").read_text())
    dep["spec"]["slo"] = {"tokens_per_s_per_user_p90": 60}
    (folder / "deployment.yaml").write_text(yaml.safe_dump(dep, sort_keys=False))
    out = tmp_path / "out"
    assert main(["compile", str(folder / "deployment.yaml"), "-o", str(out)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("compiled"))
    headline = (out / "report" / "performance.md").read_text().splitlines()[2]
    figure = line.split("goodput ")[1].split()[0]
    assert f"goodput {figure} requests/s" in headline

"""One small CP-SAT test per rule, on tiny racks."""

from pathlib import Path

import pytest

from compiler.graph import build_graph
from compiler.load import load_inputs
from compiler.plan import DomainMemory
from compiler.precheck import precheck
from compiler.shapes import parse_shape
from compiler.solve import solve
from compiler.solve.counts import solve_counts
from compiler.solve.place import Wanted, place
from schemas.diagnostics import CompileError
from tests.builders import problem_at, write_case

pytestmark = pytest.mark.solver


NEED = DomainMemory(weights_gib=10.0, kv_gib=0, engram_gib=0, pool_gib=0, workspace_gib=0,
                    reserved_gib=175.0, capacity_gib=185.0)  # placement reads no memory


def _wanted(*shapes: str, role: str = "decode") -> list[Wanted]:
    return [Wanted(role, parse_shape(s), NEED) for s in shapes]


def test_gpu_exclusive(tmp_path: Path):
    p = problem_at(write_case(tmp_path, hardware={"trays": 1}))
    two = place(p, _wanted("DEP2", "DEP2"))
    assert two is not None and not set(two.gpus[0]) & set(two.gpus[1])
    assert place(p, _wanted("DEP2", "DEP2", "DEP2")) is None


def test_sub_tray_instance_takes_one_aligned_block_of_one_tray(tmp_path: Path):
    p = problem_at(write_case(tmp_path, hardware={"trays": 2}))
    (gpus,) = place(p, _wanted("DEP2")).gpus
    assert gpus in {("r0-t00-g0", "r0-t00-g1"), ("r0-t00-g2", "r0-t00-g3"),
                    ("r0-t01-g0", "r0-t01-g1"), ("r0-t01-g2", "r0-t01-g3")}


def test_tp8_takes_exactly_two_whole_trays(tmp_path: Path):
    p = problem_at(write_case(tmp_path, hardware={"trays": 3}))
    (gpus,) = place(p, _wanted("TP8")).gpus
    trays = {g.rsplit("-", 1)[0] for g in gpus}
    assert len(gpus) == 8 and len(trays) == 2


def test_instance_stays_in_one_nvlink_domain(tmp_path: Path):
    p = problem_at(write_case(tmp_path, kind="Cluster", hardware={"racks": 2, "trays": 1}))
    assert place(p, _wanted("DEP8")) is None
    (gpus,) = place(p, _wanted("DEP4")).gpus
    assert len({g.split("-")[0] for g in gpus}) == 1


def test_unavailable_gpus_unused(tmp_path: Path):
    p = problem_at(write_case(tmp_path, hardware={"trays": 1, "unavailable": {
        "gpus": ["r0-t00-g1"]}}))
    (gpus,) = place(p, _wanted("DEP2")).gpus
    assert gpus == ("r0-t00-g2", "r0-t00-g3")
    assert place(p, _wanted("DEP2", "DEP2")) is None


def test_identical_instances_are_ordered(tmp_path: Path):
    p = problem_at(write_case(tmp_path, hardware={"trays": 2}))
    got = place(p, _wanted("DEP2", "DEP2", "DEP2"))
    firsts = [g[0] for g in got.gpus]
    assert firsts == sorted(firsts)


def test_pins_fix_the_counts(tmp_path: Path):
    path = write_case(tmp_path, hardware={"trays": 4}, objective={"mode": "pinned", "instances": [
        {"role": "prefill", "shape": "DEP2", "count": 3},
        {"role": "decode", "shape": "DEP8", "count": 1}]})
    p = problem_at(path)
    counts = solve_counts(p)
    got = {(p.candidates[i].role, p.candidates[i].shape.name): n
           for i, n in counts.by_candidate.items()}
    assert got == {("prefill", "DEP2"): 3, ("decode", "DEP8"): 1}


def test_slo_excludes_shapes_that_miss_it(tmp_path: Path):
    p = problem_at(write_case(tmp_path, hardware={"trays": 4},
                            slo={"tokens_per_s_per_user_p90": 9_999.0}))
    assert all(c.requests_per_s == 0 for c in p.candidates if c.role == "decode")
    assert isinstance(solve_counts(p), list)


def test_goodput_is_the_smaller_supply(tmp_path: Path):
    p = problem_at(write_case(tmp_path, hardware={"trays": 4},
                            objective={"layout": "disaggregated"}))
    counts = solve_counts(p)
    supply = {"prefill": 0.0, "decode": 0.0}
    for i, n in counts.by_candidate.items():
        c = p.candidates[i]
        supply[c.role] += n * c.requests_per_s
    assert counts.status == "OPTIMAL"
    assert counts.objective == pytest.approx(min(supply.values()), rel=1e-3)


def test_serves_prefill_and_decode(tmp_path: Path):
    p = problem_at(write_case(tmp_path, hardware={"trays": 1},
                            objective={"layout": "disaggregated"}))
    counts = solve_counts(p)
    roles = {p.candidates[i].role for i in counts.by_candidate}
    assert roles == {"prefill", "decode"}


def test_engram_peer_group_is_large_enough(tmp_path: Path):
    path = write_case(tmp_path, system="vera-rubin-nvl72", model="deepseek-v4.1-flash",
                      workload={"profile": "agentx"}, objective={"layout": "disaggregated"})
    inputs = load_inputs(path)
    g = build_graph(inputs)
    sol = solve(inputs, g, precheck(inputs, g))
    prefill = [w for w in sol.wanted if w.role == "prefill"]
    gpus = sum(w.shape.gpus for w in prefill)
    spare = sol.problem.hbm_gib - sol.problem.prefill_base_gib(prefill[0].shape)
    assert gpus * spare >= sol.problem.engram_gib


def test_pinned_overcommit_is_explained(tmp_path: Path):
    path = write_case(tmp_path, hardware={"trays": 2, "unavailable": {"trays": [1]}},
                      objective={"mode": "pinned", "instances": [
                          {"role": "prefill", "shape": "DEP2", "count": 1},
                          {"role": "decode", "shape": "DEP4", "count": 1}]})
    inputs = load_inputs(path)
    g = build_graph(inputs)
    with pytest.raises(CompileError) as info:
        solve(inputs, g, precheck(inputs, g))
    assert info.value.exit_code == 3
    assert {d.path for d in info.value.diagnostics} == {"spec.unavailable.trays[0]"}
    assert info.value.diagnostics[0].file.endswith("rack.yaml")


def test_pins_that_overcommit_the_rack_are_named(tmp_path: Path):
    path = write_case(tmp_path, hardware={"trays": 2}, objective={"mode": "pinned", "instances": [
        {"role": "prefill", "shape": "DEP2", "count": 1},
        {"role": "decode", "shape": "DEP4", "count": 2}]})
    inputs = load_inputs(path)
    g = build_graph(inputs)
    with pytest.raises(CompileError) as info:
        solve(inputs, g, precheck(inputs, g))
    assert {d.path for d in info.value.diagnostics} == {"spec.objective.instances[1]"}
    assert info.value.diagnostics[0].line == 16


def test_every_shape_check_lists_is_searched_in_every_role(tmp_path: Path):
    path = write_case(tmp_path, system="hgx-h200", model="deepseek-v3", kind="Cluster",
                      hardware={"nodes": 2}, workload={"profile": "chat"},
                      slo={"tokens_per_s_per_user_p90": 20, "ttft_ms_p90": 2000})
    p = problem_at(path)
    fits = {f.shape.name for f in precheck(p.inputs, p.graph).fits if f.fits}
    assert fits >= {"DEP8", "DEP16", "TP8", "TP8EP8"}
    for role in ("prefill", "decode", "aggregated"):
        assert {c.shape.name for c in p.candidates if c.role == role} == fits, role


@pytest.mark.parametrize(("objective", "roles"), [
    ({"layout": "disaggregated"}, {"prefill", "decode"}),
    ({"layout": "aggregated"}, {"aggregated"}),
    ({"shapes": {"decode": ["DEP8"], "prefill": ["DEP4"], "aggregated": []}},
     {"prefill", "decode"})])
def test_the_deployment_narrows_the_search(tmp_path: Path, objective: dict, roles: set):
    path = write_case(tmp_path, system="gb200-nvl72", model="qwen3-30b-a3b",
                      hardware={"trays": 4}, objective=objective)
    p = problem_at(path)
    assert {c.role for c in p.candidates} == roles
    shapes = objective.get("shapes")
    if shapes:
        assert {(c.role, c.shape.name) for c in p.candidates} == {
            ("decode", "DEP8"), ("prefill", "DEP4")}
    sol = solve(p.inputs, p.graph, precheck(p.inputs, p.graph))
    assert {w.role for w in sol.wanted} == roles


def test_serving_is_aggregated_or_disaggregated_never_both(tmp_path: Path):
    path = write_case(tmp_path, system="gb200-nvl72", model="qwen3-30b-a3b",
                      hardware={"trays": 2})
    p = problem_at(path)
    assert {c.role for c in p.candidates} == {"prefill", "decode", "aggregated"}
    sol = solve(p.inputs, p.graph, precheck(p.inputs, p.graph))
    roles = {w.role for w in sol.wanted}
    assert roles in ({"aggregated"}, {"prefill", "decode"})


def _pinned_cluster(tmp_path: Path, racks: int, trays: int, decode: int, **hardware):
    return write_case(tmp_path, kind="Cluster", hardware={"racks": racks, "trays": trays,
                                                          **hardware},
                      objective={"mode": "pinned", "instances": [
                          {"role": "prefill", "shape": "DEP2", "count": 1},
                          {"role": "decode", "shape": "DEP8", "count": decode}]})


def test_whole_tray_instances_fit_each_rack_not_the_fleet(tmp_path: Path):
    # 3 racks of 3 trays: 9 free trays hold 4 two-tray DEP8 in total, but each rack only one
    ok = problem_at(_pinned_cluster(tmp_path / "ok", 3, 3, 3))
    counts = solve_counts(ok)
    assert not isinstance(counts, list)
    dep8 = next(i for i, c in enumerate(ok.candidates) if c.shape.name == "DEP8")
    assert sorted(here.get(dep8, 0) for here in counts.by_domain.values()) == [1, 1, 1]
    assert isinstance(solve_counts(problem_at(_pinned_cluster(tmp_path / "no", 3, 3, 4))), list)


def test_a_touched_rack_counts_only_its_free_trays(tmp_path: Path):
    # rack 1 loses a tray (index 3 = r1-t00): it still holds one DEP8, rack 0 one
    p = problem_at(_pinned_cluster(tmp_path / "a", 2, 3, 2, unavailable={"trays": [3]}))
    assert not isinstance(solve_counts(p), list)
    p = problem_at(_pinned_cluster(tmp_path / "b", 2, 3, 2, unavailable={"trays": [3, 4]}))
    assert isinstance(solve_counts(p), list)


def test_counts_grow_linearly_with_identical_racks(tmp_path: Path):
    def goodput(racks: int) -> float:
        path = write_case(tmp_path / str(racks), kind="Cluster",
                          hardware={"racks": racks, "trays": 4})
        return solve_counts(problem_at(path)).objective

    one, four, eight = goodput(1), goodput(4), goodput(8)
    # never less than the racks alone; a rack serves its own requests unless it holds one
    # role (compiler/solve/locality.py), and racks of one role balance each other a little
    # better the more there are of them (here 2.7% from 4 racks to 8), nothing more
    assert four >= 4 * one * 0.999
    assert 2 * four * 0.999 <= eight <= 2 * four * 1.05


def test_each_rack_is_placed_by_its_own_model(tmp_path: Path):
    path = write_case(tmp_path, kind="Cluster", hardware={"racks": 3, "trays": 4,
                                                          "unavailable": {"gpus": ["r2-t01-g3"]}})
    inputs = load_inputs(path)
    g = build_graph(inputs)
    sol = solve(inputs, g, precheck(inputs, g))
    solves = sol.placement.domains
    assert sorted(d for r in solves for d in r.domains) == ["nvl0", "nvl1", "nvl2"]
    assert any("nvl2" in r.domains and len(r.domains) == 1 for r in solves)
    assert all(r.status == "OPTIMAL" and r.gap == 0 for r in solves)


def test_sub_tray_room_counts_single_free_gpus(tmp_path: Path):
    """A tray with one GPU left still holds a one-GPU instance; a two-GPU one needs an aligned
    free pair (7 of 8 unavailable used to count no room at all)."""
    down = [f"r0-t00-g{i}" for i in range(1, 8)]
    pin = {"mode": "pinned", "instances": [{"role": "aggregated", "shape": "TP1", "count": 1}]}
    path = write_case(tmp_path / "one", system="hgx-h200", model="qwen3-32b", kind="Cluster",
                      hardware={"nodes": 1, "unavailable": {"gpus": down}}, objective=pin)
    inputs = load_inputs(path)
    g = build_graph(inputs)
    sol = solve(inputs, g, precheck(inputs, g))
    assert sol.gpus == [("r0-t00-g0",)]
    two = {**pin, "instances": [{"role": "aggregated", "shape": "TP2", "count": 1}]}
    apart = write_case(tmp_path / "apart", system="hgx-h200", model="qwen3-32b", kind="Cluster",
                       hardware={"nodes": 1, "unavailable": {"gpus": [
                           f"r0-t00-g{i}" for i in (1, 3, 4, 5, 6, 7)]}}, objective=two)
    assert isinstance(solve_counts(problem_at(apart)), list)  # g0 and g2 are no aligned pair


def test_an_unreachable_slo_names_the_best_value_and_where(tmp_path: Path):
    path = write_case(tmp_path, hardware={"trays": 4}, slo={"tokens_per_s_per_user_p90": 9_999})
    inputs = load_inputs(path)
    g = build_graph(inputs)
    with pytest.raises(CompileError) as info:
        solve(inputs, g, precheck(inputs, g))
    [d] = [d for d in info.value.diagnostics if d.path == "spec.slo.tokens_per_s_per_user_p90"]
    assert "the best any searched layout reaches is" in d.hint
    best = float(d.hint.split("reaches is ")[1].split()[0])
    assert 0 < best < 9_999 and "at batch 1" in d.hint


def test_each_stated_slo_gets_its_best_value_where_one_alone_conflicts(tmp_path: Path):
    """Both SLOs out of reach: the shrunk set names one of them (either alone conflicts), and
    the hint still gives the best value of each (issue 17's verifier: the TTFT one was left
    out)."""
    path = write_case(tmp_path, hardware={"trays": 4},
                      slo={"tokens_per_s_per_user_p90": 9_999, "ttft_ms_p90": 0.001})
    inputs = load_inputs(path)
    g = build_graph(inputs)
    with pytest.raises(CompileError) as info:
        solve(inputs, g, precheck(inputs, g))
    for d in info.value.diagnostics:
        assert "(tokens_per_s_per_user_p90)" in d.hint and "(ttft_ms_p90)" in d.hint, d.hint
        assert d.hint.count("the best any searched layout reaches is") == 2


def test_the_problem_is_frozen(tmp_path: Path):
    """A Problem is built once; a variant (one domain, the kept instances) is a new one."""
    import dataclasses

    p = problem_at(write_case(tmp_path, hardware={"trays": 1, "unavailable": {
        "gpus": ["r0-t00-g1"]}}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.mode = "latency"  # type: ignore[misc]
    assert isinstance(p.candidates, tuple) and isinstance(p.domains, tuple)
    with pytest.raises(TypeError):
        p.requirements["x"] = p.requirements[next(iter(p.requirements))]  # type: ignore[index]
    with pytest.raises(AttributeError):
        next(iter(p.unavailable.values())).add("r0-t00-g0")  # type: ignore[attr-defined]


def test_placement_names_why_it_fails(tmp_path: Path):
    """Placement explains its own infeasibility: more aligned blocks than the free GPUs form;
    a placement that exists has no reason."""
    from compiler.solve.place import unplaceable

    p = problem_at(write_case(tmp_path, hardware={"trays": 1, "unavailable": {
        "gpus": ["r0-t00-g1"]}}))
    assert unplaceable(p, _wanted("DEP2")) == []
    blocks = unplaceable(p, _wanted("DEP2", "DEP2"))
    assert place(p, _wanted("DEP2", "DEP2")) is None
    assert blocks == ["instances of 2+ GPUs inside a tray take 2 aligned blocks of 2 free "
                      "GPUs; the trays left have 1"]


def _knapsack():
    """A multi-constraint knapsack that CP-SAT proves in about 0.02 deterministic seconds."""
    from compiler.cpsat import cp_model

    m = cp_model.CpModel()
    xs = [m.new_int_var(0, 5, f"x{i}") for i in range(60)]
    for k in range(3):
        m.add(sum(((i * 7919 + k * 104729) % 1000 + 500) * x for i, x in enumerate(xs))
              <= 250000 + k * 1111)
    m.maximize(sum(((i * 6151) % 997 + 700) * x for i, x in enumerate(xs)))
    return m


def test_a_search_stops_early_only_within_the_gap(monkeypatch):
    """The two-stage solve: past QUICK_SECONDS it stops with a solution within RELATIVE_GAP
    of its bound (FEASIBLE: the plan shows the gap), else it searches on, also when the
    first stage found nothing yet; a search proven within the limit is OPTIMAL."""
    from compiler.cpsat import cp_model
    from compiler.solve import params

    s, code, _ = params.solve(_knapsack())
    assert code == cp_model.OPTIMAL
    best = s.objective_value
    monkeypatch.setattr(params, "QUICK_SECONDS", 1e-3)
    monkeypatch.setattr(params, "RELATIVE_GAP", 0.01)
    s, code, seconds = params.solve(_knapsack())
    assert code == cp_model.FEASIBLE and s.objective_value < best and seconds < 2e-3
    assert 0 < params.gap(s.objective_value, s.best_objective_bound) <= 0.01
    monkeypatch.setattr(params, "RELATIVE_GAP", 0.0)  # nothing short of the proof
    s, code, seconds = params.solve(_knapsack())
    assert code == cp_model.OPTIMAL and s.objective_value == best and seconds > 1e-3
    monkeypatch.setattr(params, "QUICK_SECONDS", 1e-4)  # no solution yet: searches on
    s, code, _ = params.solve(_knapsack())
    assert code == cp_model.OPTIMAL and s.objective_value == best


def test_placement_names_a_whole_tray_instance_no_domain_holds(tmp_path: Path):
    from compiler.solve.place import unplaceable

    p = problem_at(write_case(tmp_path, kind="Cluster", hardware={"racks": 2, "trays": 1}))
    assert place(p, _wanted("TP8")) is None
    assert unplaceable(p, _wanted("TP8")) == [
        "decode TP8 takes 2 whole trays of one NVLink domain; the most any domain has free is 1"]

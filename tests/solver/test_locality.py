"""One small CP-SAT test per rule of the routing groups in the count model
(compiler/solve/locality.py, compiler/routes.py), on GB200 racks of a few trays (4 GPUs each)
with the candidates cut down to a prefill and a decode shape of chosen supplies."""

from dataclasses import replace
from pathlib import Path

import pytest

from compiler import routes
from compiler.cpsat import cp_model
from compiler.solve import racks
from compiler.solve.counts import build, solve_counts
from compiler.solve.params import solver
from compiler.solve.problem import Problem
from tests.builders import problem_at, write_case

pytestmark = pytest.mark.solver


def _only(p: Problem, prefill: tuple[str, float, float], decode: tuple[str, float, float]
          ) -> Problem:
    """`p` with one prefill and one decode candidate: (shape, own supply, supply with every
    hand-off across racks)."""
    out = []
    for role, (shape, own, remote) in (("prefill", prefill), ("decode", decode)):
        c = next(c for c in p.candidates if (c.role, c.shape.name) == (role, shape))
        out.append(replace(c, requests_per_s=own, remote_requests_per_s=remote, misses=()))
    return replace(p, candidates=tuple(out))


def _cluster(tmp_path: Path, racks_: int, trays: int, **hardware) -> Problem:
    return problem_at(write_case(tmp_path, kind="Cluster",
                                 hardware={"racks": racks_, "trays": trays, **hardware}))


def test_sub_tray_instances_are_counted_in_their_rack(tmp_path: Path):
    """Two one-tray racks, DEP2 prefill and decode: each rack serves its own requests with one
    of each (2 requests/s); racks of one role would hand off across racks at half the supply."""
    p = _only(_cluster(tmp_path, 2, 1), ("DEP2", 1.0, 0.5), ("DEP2", 1.0, 0.5))
    got = solve_counts(p)
    assert got.objective == pytest.approx(2.0)
    assert got.by_domain == {"nvl0": {0: 1, 1: 1}, "nvl1": {0: 1, 1: 1}}


def test_a_rack_serves_only_what_its_own_decode_takes(tmp_path: Path):
    """Prefill three times the decode supply: balanced over the fleet one prefill and three
    decode instances would serve 3, but a rack's prefill beyond its own decode serves nothing,
    and racks of one role serve 2 here: 2 in all."""
    p = _only(_cluster(tmp_path, 2, 2), ("DEP4", 3.0, 3.0), ("DEP4", 1.0, 1.0))
    got = solve_counts(p)
    assert got.objective == pytest.approx(2.0)
    # the hand-offs across racks cost their supply: racks serving themselves win
    p = _only(_cluster(tmp_path / "slow", 2, 2), ("DEP4", 3.0, 0.4), ("DEP4", 1.0, 1.0))
    got = solve_counts(p)
    assert got.objective == pytest.approx(2.0)
    assert all(here == {0: 1, 1: 1} for here in got.by_domain.values())


def _holds(p: Problem, layout: dict[str, dict[int, int]]) -> bool:
    """Whether the count model (every requirement holding) admits these instances per rack
    (racks counted directly: each touched by an unavailable GPU)."""
    m, v = build(p, with_objective=False)
    for lit in v.lits.values():
        m.add(lit == 1)
    for dom, here in v.capacity.direct.items():
        for j, x in here.items():
            m.add(x == layout.get(dom, {}).get(j, 0))
    return solver().solve(m) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def test_a_rack_of_one_role_needs_a_rack_of_the_other(tmp_path: Path):
    # a GPU down on each rack's last tray: two whole trays each, racks counted directly
    p = _only(_cluster(tmp_path, 2, 3, unavailable={"gpus": ["r0-t02-g0", "r1-t02-g0"]}),
              ("DEP4", 1.0, 1.0), ("DEP4", 1.0, 1.0))
    assert set(p.domains[0].trays) == {"r0-t00", "r0-t01", "r0-t02"}
    assert _holds(p, {"nvl0": {0: 1, 1: 1}, "nvl1": {0: 1, 1: 1}})
    assert _holds(p, {"nvl0": {0: 1}, "nvl1": {1: 1}})
    assert not _holds(p, {"nvl0": {0: 1, 1: 1}, "nvl1": {1: 1}})  # nvl1's decode: no prefill
    assert not _holds(p, {"nvl0": {0: 1, 1: 1}, "nvl1": {0: 2}})  # nvl1's prefill: no decode


def test_pinned_racks_of_one_role_share_one_router(tmp_path: Path):
    """One prefill and three decode instances pinned on two racks of two trays: a rack holds
    decode alone with no rack of prefill alone, so one router serves every instance."""
    path = write_case(tmp_path, kind="Cluster", hardware={"racks": 2, "trays": 2},
                      objective={"mode": "pinned", "instances": [
                          {"role": "prefill", "shape": "DEP4", "count": 1},
                          {"role": "decode", "shape": "DEP4", "count": 3}]})
    p = problem_at(path)
    got = solve_counts(p)
    assert not isinstance(got, list)
    prefill = next(c for c in p.candidates if c.role == "prefill")
    decode = next(c for c in p.candidates if c.role == "decode")
    assert got.objective == pytest.approx(min(prefill.remote, 3 * decode.remote), rel=1e-5)
    assert routes.routes(p.inputs, {"nvl0": {"prefill", "decode"}, "nvl1": {"decode"}}) == [
        routes.Route(routes.ALL, ("nvl0", "nvl1"), 1.0)]


def test_routing_groups_follow_the_racks(tmp_path: Path):
    p = _cluster(tmp_path, 3, 2)
    both, one = {"prefill", "decode"}, routes.BOTH
    assert routes.routes(p.inputs, {"nvl0": set(both), "nvl1": {"prefill"}, "nvl2": {"decode"}}
                         ) == [routes.Route("nvl0", ("nvl0",), 0.0),
                               routes.Route(routes.SHARED, ("nvl1", "nvl2"), 1.0)]
    assert [r.name for r in routes.routes(p.inputs, {d: set(one) for d in ("nvl0", "nvl2")})
            ] == ["nvl0", "nvl2"]
    assert routes.routes(p.inputs, {"nvl0": {"aggregated"}, "nvl1": {"aggregated"}}) == [
        routes.Route(routes.ALL, ("nvl0", "nvl1"), 0.0)]


def test_the_fewer_patterns_reach_the_same_goodput(tmp_path: Path, monkeypatch):
    """Three identical racks of two trays: every pattern (957, sub-tray prefill and decode
    counted per rack) and the ones routed_patterns keeps give one goodput."""
    p = _cluster(tmp_path, 3, 2)
    every = solve_counts(p)
    monkeypatch.setattr(racks, "MAX_PATTERNS", 100)
    racks.patterns.cache_clear()
    _, v = build(p)
    [(doms, ys)] = v.capacity.patterns
    assert len(doms) == 3 and len(ys) < 100  # the class is counted by the fewer patterns
    fewer = solve_counts(p)
    racks.patterns.cache_clear()
    assert fewer.status == every.status == "OPTIMAL"
    assert fewer.objective == pytest.approx(every.objective, abs=1e-6)

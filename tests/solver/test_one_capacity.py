"""One capacity rule for both solver phases (racks.free_blocks): the counts never refuse what
placement can hold, a split that cannot honour the counts is a bug and not a verdict, and an
exit 3 says honestly whether its requirements were shrunk. The F4 cases are the reproductions
of the maintainers' code review 3 (section 0, F4), where the phases disagreed."""

from pathlib import Path

import pytest

from compiler import api
from compiler.cpsat import cp_model
from compiler.solve import racks
from schemas.diagnostics import CompileError
from schemas.source import format_path
from tests.builders import problem_at, write_case
from tests.oracles import CountOracle

pytestmark = pytest.mark.solver


def _pinned(*entries: tuple[str, str, int]) -> dict:
    return {"mode": "pinned",
            "instances": [{"role": r, "shape": s, "count": n} for r, s, n in entries]}


def _f4_tp1(root: Path) -> Path:
    """One HGX H200 node (8 GPUs), g1 down: 7 free GPUs for 7 TP1 instances."""
    return write_case(root, system="hgx-h200", model="qwen3-32b", kind="Cluster",
                      hardware={"nodes": 1, "unavailable": {"gpus": ["r0-t00-g1"]}},
                      objective=_pinned(("prefill", "TP1", 3), ("decode", "TP1", 4)))


def _f4_tp4(root: Path) -> Path:
    """Two nodes, g1 and g5 of node 0 down: neither aligned block of 4 on node 0 is free, so
    node 1's two blocks cannot hold three TP4 instances."""
    return write_case(root, system="hgx-h200", model="qwen3-32b", kind="Cluster",
                      hardware={"nodes": 2, "unavailable": {"gpus": ["r0-t00-g1",
                                                                     "r0-t00-g5"]}},
                      objective=_pinned(("prefill", "TP4", 2), ("decode", "TP4", 1)))


def test_free_blocks_are_the_aligned_blocks_with_nothing_down():
    gpus = ["g0", "g1", "g2", "g3"]
    assert racks.free_blocks(gpus, {"g1"}, 1) == [("g0",), ("g2",), ("g3",)]
    assert racks.free_blocks(gpus, {"g1"}, 2) == [("g2", "g3")]
    assert racks.free_blocks(gpus, {"g1"}, 4) == []  # not usable whole
    assert racks.free_blocks(gpus, set(), 4) == [tuple(gpus)]
    assert racks.free_blocks(gpus, {"g0", "g3"}, 2) == []  # g1, g2 are no aligned pair


def test_f4_tp1_instances_beside_an_unavailable_gpu_compile(tmp_path: Path):
    plan = api.compile(_f4_tp1(tmp_path), only=()).plan
    roles = sorted(i.role for i in plan.instances)
    assert roles == ["decode"] * 4 + ["prefill"] * 3
    taken = [g for i in plan.instances for g in i.gpus]
    assert sorted(taken) == sorted(f"r0-t00-g{k}" for k in (0, 2, 3, 4, 5, 6, 7))


def test_f4_tp4_names_a_minimal_conflict(tmp_path: Path):
    """Exit 3 from the counts, naming requirements that conflict together, each of them needed:
    checked against the brute-force count oracle, not the solver's own deletion loop."""
    path = _f4_tp4(tmp_path)
    with pytest.raises(CompileError) as info:
        api.compile(path, only=())
    assert info.value.exit_code == 3
    p = problem_at(path)
    key_of = {format_path(r.path): k for k, r in p.requirements.items()}
    named = frozenset(key_of[d.path] for d in info.value.diagnostics)
    assert named == {"pin:00", "unavailable:gpus:00"}
    assert all("shrunk by deletion" in d.hint for d in info.value.diagnostics)
    oracle = CountOracle(p)
    assert not oracle.feasible(named)
    for k in named:
        assert oracle.feasible(named - {k}), f"{k} is not needed for the conflict"


def test_an_unexplained_placement_failure_is_not_called_minimal(tmp_path: Path, monkeypatch):
    """A placement that finds nothing (its time limit, say) with no reason of its own names
    every pin and unavailable entry, and says the set is not minimised."""
    import compiler.solve

    path = _f4_tp1(tmp_path)
    monkeypatch.setattr(compiler.solve, "place", lambda *args: None)
    with pytest.raises(CompileError) as info:
        api.compile(path, only=())
    paths = sorted(d.path for d in info.value.diagnostics)
    assert paths == ["spec.objective.instances[0]", "spec.objective.instances[1]",
                     "spec.unavailable.gpus[0]"]
    assert all("not minimised" in d.hint and "shrunk" not in d.hint
               for d in info.value.diagnostics)


def test_a_split_that_cannot_honour_the_counts_is_a_bug(tmp_path: Path):
    """The split fills exactly the room the count model holds; more is an internal error, not
    an exit 3 (place.assign no longer turns it into "infeasible")."""
    p = problem_at(write_case(tmp_path, hardware={"trays": 1}))
    items = [racks.Item(0, 2)]
    m = cp_model.CpModel()
    cap = racks.add_capacity(m, p, items, [2], {})
    s = cp_model.CpSolver()
    assert s.solve(m) == cp_model.OPTIMAL
    assert racks.split(p, items, [2], cap, s) == {p.domains[0].id: {0: 2}}
    with pytest.raises(RuntimeError, match="a bug in rackc"):
        racks.split(p, items, [3], cap, s)


def test_an_instance_that_does_not_tile_a_tray_is_refused_not_miscounted(tmp_path: Path):
    """Three-GPU instances (TP1PP3) on 8-GPU nodes: aligned blocks of 3 leave 2 GPUs of each
    tray, which the count model's 'an instance of g GPUs covers g / s blocks' cannot hold (code
    review of 2026-12-05: the counts held 5, the split found room for 4, exit 70). Such a
    shape is E302, named for the tray it cannot tile."""
    path = write_case(tmp_path, system="hgx-h200", model="qwen3-32b", kind="Cluster",
                      hardware={"nodes": 2},
                      objective=_pinned(("prefill", "TP1PP3", 5), ("decode", "TP1", 1)))
    with pytest.raises(CompileError) as info:
        api.compile(path, only=())
    d = info.value.diagnostics[0]
    assert d.code == "E302" and "do not tile a tray of 8" in d.hint, d

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
from tests.builders import write_case
from tests.solver.test_constraints import _problem

pytestmark = pytest.mark.solver


def _pinned(*entries: tuple[str, str, int]) -> dict:
    return {"mode": "pinned",
            "instances": [{"role": r, "shape": s, "count": n} for r, s, n in entries]}


def _f4_tp1(root: Path) -> Path:
    """One HGX H200 node (8 GPUs), g1 down: 7 free GPUs for 7 TP1 instances."""
    return write_case(root, system="hgx-h200", model="qwen3-32b", kind="Cluster",
                      hardware={"nodes": 1, "unavailable": {"gpus": ["r0-t00-g1"]}},
                      objective=_pinned(("prefill", "TP1", 3), ("decode", "TP1", 4)))


def test_free_blocks_are_the_aligned_blocks_with_nothing_down():
    gpus = ["g0", "g1", "g2", "g3"]
    assert racks.free_blocks(gpus, {"g1"}, 1) == [("g0",), ("g2",), ("g3",)]
    assert racks.free_blocks(gpus, {"g1"}, 2) == [("g2", "g3")]
    assert racks.free_blocks(gpus, {"g1"}, 4) == []  # not usable whole
    assert racks.free_blocks(gpus, set(), 4) == [tuple(gpus)]
    assert racks.free_blocks(gpus, {"g0", "g3"}, 2) == []  # g1, g2 are no aligned pair


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
    p = _problem(write_case(tmp_path, hardware={"trays": 1}))
    items = [racks.Item(0, 2)]
    m = cp_model.CpModel()
    cap = racks.add_capacity(m, p, items, [2], {})
    s = cp_model.CpSolver()
    assert s.solve(m) == cp_model.OPTIMAL
    assert racks.split(p, items, [2], cap, s) == {p.domains[0].id: {0: 2}}
    with pytest.raises(RuntimeError, match="a bug in rackc"):
        racks.split(p, items, [3], cap, s)

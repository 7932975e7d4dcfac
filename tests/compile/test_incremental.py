"""Incremental recompile after a failure (`--from OLD/plan.yaml --unavailable ...`): every
instance still whole keeps its id and GPUs, the new plan is valid, diff matches by GPU set."""

import subprocess
import sys
from pathlib import Path

import pytest

from compiler import api, incremental
from compiler.load import load_inputs
from schemas.diagnostics import CompileError
from tests.builders import write_case
from tests.invariants import check_plan


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> tuple[Path, object]:
    """Three GB200 racks of six trays, compiled fresh."""
    path = write_case(tmp_path_factory.mktemp("fleet"), kind="Cluster",
                      hardware={"racks": 3, "trays": 6})
    return path, api.compile(path, only=()).plan


def _recompile(fleet, ids: str):
    path, old = fleet
    new = api.compile(path, only=(), base=old, unavailable=ids).plan
    check_plan(new)
    return old, new


@pytest.mark.parametrize("ids", ["r1-t02-g1", "r0-t03", "r2", "r0-t00-g0,r1-t05"])
def test_untouched_instances_keep_their_ids_and_gpus(fleet, ids: str):
    old, new = _recompile(fleet, ids)
    down = set(new.hardware.unavailable_gpus)
    assert down >= set(incremental.parse_ids(ids, load_inputs(fleet[0])))
    by_id = {i.id: i for i in new.instances}
    for inst in old.instances:
        if down.isdisjoint(inst.gpus):
            assert by_id[inst.id].gpus == inst.gpus, inst.id
        else:
            assert inst.id not in by_id  # ids of stopped instances are not reused
    assert not any(down.intersection(i.gpus) for i in new.instances)


def test_a_lost_rack_stops_its_instances_and_nothing_else(fleet):
    old, new = _recompile(fleet, "r2")
    same, stopped, started, moved = incremental.match(old, new)
    assert {t for i in stopped for t in i.trays} <= {f"r2-t{t:02d}" for t in range(6)}
    assert stopped and not started and not moved
    assert len(same) == len(old.instances) - len(stopped)
    sources = {d.path: d.source for d in new.decisions}
    assert all(sources[f"instances.{y.id}"] == "rule:kept" for _, y in same)


def test_freed_gpus_are_used_again(fleet):
    old, new = _recompile(fleet, "r1-t02-g1")
    _, stopped, started, _ = incremental.match(old, new)
    assert stopped and started
    used = lambda plan: sum(len(i.gpus) for i in plan.instances)  # noqa: E731
    assert used(new) >= used(old) - len(stopped[0].gpus) + 1


def test_failures_accumulate_from_the_old_plan(fleet):
    path, _ = fleet
    _, first = _recompile(fleet, "r0-t01")
    second = api.compile(path, only=(), base=first, unavailable="r1-t01-g3").plan
    check_plan(second)
    assert {"r0-t01-g0", "r1-t01-g3"} <= set(second.hardware.unavailable_gpus)


@pytest.mark.parametrize("ids", ["r9", "r0-t06", "r0-t00-g7", "gpu3"])
def test_unknown_ids_are_diagnosed(fleet, ids: str):
    path, old = fleet
    with pytest.raises(CompileError) as info:
        api.compile(path, only=(), base=old, unavailable=ids)
    assert info.value.diagnostics[0].code == "E205"
    assert info.value.diagnostics[0].path == "--unavailable"


def test_a_plan_of_other_hardware_is_refused(fleet, tmp_path: Path):
    _, old = fleet
    other = write_case(tmp_path, kind="Cluster", hardware={"racks": 2, "trays": 6})
    with pytest.raises(CompileError) as info:
        api.compile(other, only=(), base=old)
    assert info.value.diagnostics[0].code == "E703"


def test_diff_matches_instances_by_gpu_set(fleet):
    old, new = _recompile(fleet, "r0-t03")
    renamed = old.model_copy(update={"instances": [
        i.model_copy(update={"id": f"{i.role}-{90 + k:02d}"})
        for k, i in enumerate(old.instances)]})
    lines = api.diff_plans(renamed, renamed.model_copy(update={"instances": old.instances}))
    assert lines and all("same GPUs" in line for line in lines)
    _, stopped, started, _ = incremental.match(old, new)
    lines = api.diff_plans(old, new)
    assert sum(line.startswith("- ") for line in lines) == len(stopped)
    assert sum(line.startswith("+ ") for line in lines) == len(started)


def test_cli_prints_what_stops_starts_and_moves(fleet, tmp_path: Path):
    path, _ = fleet
    run = lambda *a: subprocess.run([sys.executable, "-m", "compiler.cli", *a],  # noqa: E731
                                    capture_output=True, text=True, check=False)
    assert run("compile", str(path), "-o", str(tmp_path / "old"), "--targets",
               "report").returncode == 0
    proc = run("compile", str(path), "--from", str(tmp_path / "old" / "plan.yaml"),
               "--unavailable", "r0-t03", "-o", str(tmp_path / "new"), "--targets", "report")
    assert proc.returncode == 0, proc.stderr
    assert "- stop " in proc.stdout and "keep their GPUs" in proc.stdout
    assert "goodput: " in proc.stdout and " -> " in proc.stdout


def test_unavailable_without_a_running_plan_is_a_fresh_compile_without_them(fleet):
    path, _ = fleet
    plan = api.compile(path, only=(), unavailable="r1,r0-t02-g0").plan
    check_plan(plan)
    assert not any(t.startswith("r1-") for i in plan.instances for t in i.trays)
    assert {"r0-t02-g0", "r1-t05-g3"} <= set(plan.hardware.unavailable_gpus)
    assert plan.instances[0].id.endswith("-00")


def test_kept_shapes_the_search_would_not_pick_stay(tmp_path: Path):
    pinned = write_case(tmp_path / "pinned", kind="Cluster", hardware={"racks": 2, "trays": 4},
                        objective={"mode": "pinned", "instances": [
                            {"role": "prefill", "shape": "DEP2", "count": 2},
                            {"role": "decode", "shape": "TP4", "count": 2}]})
    old = api.compile(pinned, only=()).plan
    free = write_case(tmp_path / "free", kind="Cluster", hardware={"racks": 2, "trays": 4})
    new = api.compile(free, only=(), base=old, unavailable="r1-t03-g0").plan
    check_plan(new)
    kept = {i.id: i.gpus for i in new.instances}
    assert all(kept.get(i.id) == i.gpus for i in old.instances if "r1-t03-g0" not in i.gpus)
    assert any(i.shape == "TP4" for i in new.instances)


def test_a_recompiled_bundle_still_fits_every_tray(tmp_path: Path):
    """After a GPU of a decode tray fails, new DEP2 prefill instances run alone or in pairs on
    the freed trays; one pod template serves them all, so their pool segments per rank are the
    same and the bundle passes every controller-level rule (compile enforces them)."""
    vr = Path(__file__).resolve().parents[2] / "examples" / "vr-nvl72-deepseek-v4.1-flash"
    old = api.compile(vr / "deployment.yaml", only=()).plan
    new = api.compile(vr / "deployment.yaml", base=old, unavailable="r0-t07-g2")
    per_rank = {}
    for inst in new.plan.instances:
        for tray in inst.trays:
            ranks = sum(1 for i in new.plan.instances for g in i.gpus
                        if g.startswith(tray + "-"))
            per_rank.setdefault((inst.role, inst.shape), set()).add(
                round(new.plan.host_memory[tray].pool_gib / ranks, 3))
    assert all(len(v) == 1 for v in per_rank.values()), per_rank
    check_plan(new.plan)


def test_restored_gpus_come_back_and_running_instances_stay(fleet):
    path, old = fleet
    down = api.compile(path, only=(), base=old, unavailable="r0-t01").plan
    back = api.compile(path, only=(), base=down, restore="r0-t01").plan
    check_plan(back)
    assert not any(g.startswith("r0-t01-") for g in back.hardware.unavailable_gpus)
    same, stopped, _, moved = incremental.match(down, back)
    assert not stopped and not moved and len(same) == len(down.instances)


def test_restoring_what_the_file_marks_down_blames_the_argument(tmp_path: Path):
    path = write_case(tmp_path, kind="Cluster", hardware={"racks": 2, "trays": 6,
                                                          "unavailable": {"trays": [1]}})
    old = api.compile(path, only=()).plan
    with pytest.raises(CompileError) as info:
        api.compile(path, only=(), base=old, restore="r0-t01")
    (d,) = info.value.diagnostics
    assert (d.code, d.path) == ("E205", "--restore") and "spec.unavailable" in d.hint


def test_every_gpu_down_by_the_argument_blames_the_argument(tmp_path: Path):
    path = write_case(tmp_path, kind="Cluster", hardware={"racks": 1, "trays": 6})
    old = api.compile(path, only=()).plan
    with pytest.raises(CompileError) as info:
        api.compile(path, only=(), base=old, unavailable="r0")
    (d,) = info.value.diagnostics
    assert (d.code, d.file, d.path) == ("E205", "<argument>", "--unavailable")


def test_a_costly_survivor_layout_is_said_first():
    plan = type("P", (), {"solver": type("S", (), {"objective": 232.0})()})()
    [warning, hint] = incremental.survivor_cost(plan, 559.0)
    assert "--from" in hint
    assert "232" in warning and "559" in warning and "costs 58%" in warning
    assert incremental.survivor_cost(plan, 235.0) == []


def test_the_fresh_goodput_is_the_counts_goodput_without_the_tie_break():
    """A recompile reports what a fresh layout would reach from the goodput solve alone
    (solve_counts' tie-break and split over racks are not needed for that number)."""
    from compiler.graph import build_graph
    from compiler.load import load_fleet
    from compiler.precheck import precheck
    from compiler.solve.build import build_problem
    from compiler.solve.counts import best_goodput, solve_counts

    [inputs] = load_fleet(Path(__file__).resolve().parents[2] / "examples"
                          / "hgx-h200-deepseek-v3" / "deployment.yaml")
    g = build_graph(inputs)
    pre = precheck(inputs, g)
    assert best_goodput(build_problem(inputs, g, pre)) == \
        solve_counts(build_problem(inputs, g, pre)).objective

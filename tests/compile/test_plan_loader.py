"""A plan read back (`compile --from`, `explain`, `diff`) is an input like any other: a
hand-edited plan that contradicts itself is a diagnostic at its line, never a traceback or a
compile with two instances in one launch folder."""

from pathlib import Path

import pytest
import yaml

from compiler import cli
from compiler.plan import load_plan
from schemas.diagnostics import CompileError

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "hgx-h200-x16-deepseek-v3" / "plan" / "plan.yaml"
TEXT = GOLDEN.read_text()
PLAN = load_plan(TEXT)
FIRST, SECOND = PLAN.instances[0], PLAN.instances[1]


def edited(old: str, new: str) -> str:
    """The plan with the first `old` among its instances replaced."""
    start = TEXT.index("\ninstances:\n")
    assert old in TEXT[start:]
    return TEXT[:start] + TEXT[start:].replace(old, new, 1)


def errors(text: str) -> list[tuple[int, str, str]]:
    with pytest.raises(CompileError) as info:
        load_plan(text, "plan.yaml")
    assert all(d.code == "E701" and d.file == "plan.yaml" and d.line > 0
               for d in info.value.diagnostics)
    return [(d.line, d.path, f"{d.expected} | {d.got}") for d in info.value.diagnostics]


def error(text: str) -> tuple[int, str, str]:
    return errors(text)[0]


def line_of(text: str, needle: str) -> int:
    return text[:text.index(needle)].count("\n") + 1


def test_two_instances_with_one_id():
    text = edited(f"- id: {SECOND.id}\n", f"- id: {FIRST.id}\n")
    line, path, said = error(text)
    assert path == "instances[1].id" and "again" in said
    second = text.index(f"- id: {FIRST.id}\n", text.index(f"- id: {FIRST.id}\n") + 1)
    assert line == text[:second].count("\n") + 1


@pytest.mark.parametrize(("old", "new", "path"), [
    (f"- id: {FIRST.id}\n", "- id: decode\n", "instances[0].id"),
    (f"- id: {FIRST.id}\n", "- id: prefill-00x\n", "instances[0].id"),
    (f"  shape: {FIRST.shape}\n", "  shape: DEP999x\n", "instances[0].shape"),
    (f"  shape: {FIRST.shape}\n", "  shape: TP2\n", "instances[0].shape"),
    (f"  - {FIRST.gpus[0]}\n", "  - r9-t99-g9\n", "instances[0].gpus[0]"),
    (f"  - {FIRST.gpus[1]}\n", f"  - {FIRST.gpus[0]}\n", "instances[0].gpus[1]"),
    (f"  max_batch: {FIRST.max_batch}\n", "  max_batch: lots\n", "instances[0].max_batch"),
    (f"  role: {FIRST.role}\n", "  role: both\n", "instances[0].role"),
])
def test_edits_that_contradict_the_plan(old: str, new: str, path: str):
    line, got_path, _ = error(edited(old, new))
    assert got_path == path
    assert line >= line_of(TEXT, "instances:")


def test_a_gpu_of_another_instance():
    found = errors(edited(f"  - {SECOND.gpus[0]}\n", f"  - {FIRST.gpus[0]}\n"))
    assert any(path == "instances[1].gpus[0]" and FIRST.id in said for _, path, said in found)


def test_compile_from_a_hand_edited_plan_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture):
    plan = tmp_path / "plan.yaml"
    plan.write_text(edited(f"- id: {SECOND.id}\n", f"- id: {FIRST.id}\n"))
    code = cli.main(["compile", str(ROOT / "examples" / "hgx-h200-x16-deepseek-v3" /
                                    "deployment.yaml"), "-o", str(tmp_path / "out"),
                     "--from", str(plan)])
    assert code == 2 and "E701" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_compile_never_writes_over_the_plan_it_recompiles_from(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture):
    from compiler import output_dir

    out = tmp_path / "out"
    output_dir.write_output(out, {"plan.yaml": TEXT})
    code = cli.main(["compile", str(ROOT / "examples" / "hgx-h200-x16-deepseek-v3" /
                                    "deployment.yaml"), "-o", str(out),
                     "--from", str(out / "plan.yaml")])
    assert code == 2 and "a folder holding" in capsys.readouterr().err
    assert (out / "plan.yaml").read_text() == TEXT


def test_a_kept_instance_of_a_shape_the_deployment_cannot_run_is_refused():
    from compiler import api

    doc = PLAN.model_dump(mode="json")
    doc["instances"][0].update(shape="TP1", dp=1, tp=1, ep=1, pp=1,
                               gpus=FIRST.gpus[:1], trays=FIRST.trays[:1])
    doc["instances"][0]["rank_groups"] = [{**doc["instances"][0]["rank_groups"][0],
                                           "gpus": FIRST.gpus[:1],
                                           "cuda_devices": FIRST.rank_groups[0].cuda_devices[:1]}]
    doc["instances"][0]["workload"] = doc["instances"][0]["id"] + "-tp1"
    doc["instances"][0].pop("stage_layers", None)
    base = load_plan(yaml.safe_dump(doc, sort_keys=False))  # consistent in itself
    with pytest.raises(CompileError) as info:
        api.compile(ROOT / "examples" / "hgx-h200-x16-deepseek-v3" / "deployment.yaml",
                    only=(), base=base)
    (d,) = info.value.diagnostics
    assert d.code == "E704" and d.path.startswith("--from instances[0]") and "TP1" in d.got


def test_a_gpu_id_twice_in_the_hardware_is_blamed_at_its_line():
    """The hardware is a fleet of groups (one here): the second tray's first GPU renamed to
    the first tray's is placed at its own line under hardware.groups."""
    first, second = PLAN.fleet[0].trays[:2]
    old = f"    - {second.gpus[0]}\n"
    at = TEXT.index(old)
    text = TEXT[:at] + f"    - {first.gpus[0]}\n" + TEXT[at + len(old):]
    found = errors(text)
    line, path, said = found[0]
    assert path == "hardware.groups[0].hardware.trays[1].gpus[0]" and "second time" in said
    assert line == line_of(TEXT, old)

"""Golden files: what each target emits for each case, kept in tests/golden/<case>/<target>/.

A missing, extra or different file fails with a unified diff. `pytest --update-goldens`
rewrites the case's target folder from the current output and still fails, so a rewrite is
always a deliberate, reviewed step. The cases are the compiled examples (the fleet-sized ones
are summarised instead: tests/compile/test_golden_fleet.py).
"""

import difflib
import shutil
from pathlib import Path

import pytest

from targets import TARGETS
from tests.targets.fixtures import EXAMPLE_CASES, FLEET_EXAMPLES

pytestmark = pytest.mark.golden

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def golden_files(folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        return {}
    root = folder.parent
    return {p.relative_to(root).as_posix(): p.read_text()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def differences(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    out = []
    for path in sorted(set(expected) | set(actual)):
        if path not in actual:
            out.append(f"extra golden file (no longer emitted): {path}")
        elif path not in expected:
            out.append(f"missing golden file (newly emitted): {path}")
        elif expected[path] != actual[path]:
            out.append("".join(difflib.unified_diff(
                expected[path].splitlines(keepends=True), actual[path].splitlines(keepends=True),
                fromfile=f"golden/{path}", tofile=f"emitted/{path}")))
    return out


def rewrite(folder: Path, actual: dict[str, str]) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    for path, text in actual.items():
        target = folder.parent / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def check_golden(folder: Path, actual: dict[str, str], update_goldens: bool) -> None:
    """Fail with the differences from the golden folder; with --update-goldens, rewrite it
    and still fail."""
    found = differences(golden_files(folder), actual)
    if update_goldens:
        rewrite(folder, actual)
        pytest.fail(f"rewrote {folder.relative_to(GOLDEN.parent)} ({len(found)} differences); "
                    "rerun without --update-goldens")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("case", sorted(EXAMPLE_CASES))
def test_golden(case, target, update_goldens):
    folder = GOLDEN / case / target
    actual = TARGETS[target](EXAMPLE_CASES[case]())
    check_golden(folder, actual, update_goldens)


def produced_folders() -> set[str]:
    """Every `<case>/<folder>` some golden test writes: the targets of each case, the plan and
    report of each compiled example (tests/compile/test_golden_plan.py), the summary of each
    fleet-sized example (tests/compile/test_golden_fleet.py)."""
    return ({f"{c}/{t}" for c in EXAMPLE_CASES for t in TARGETS}
            | {f"{c}/{t}" for c in EXAMPLE_CASES for t in ("plan", "report")}
            | {f"{c}/summary" for c in FLEET_EXAMPLES})


def test_no_golden_is_an_orphan():
    """A golden folder or file no test produces (a renamed example, a dropped target) would
    sit unchecked: every entry under tests/golden is a `<case>/<folder>` of a golden test."""
    found = {p.relative_to(GOLDEN).as_posix() for p in GOLDEN.glob("*/*")}
    stray = sorted(p.name for p in GOLDEN.iterdir() if not p.is_dir())
    stray += sorted(p.relative_to(GOLDEN).as_posix() for p in GOLDEN.glob("*/*")
                    if not p.is_dir())
    assert not stray, f"files outside a case's folders: {stray}"
    # the reverse need not hold: a target that emits nothing for a case writes no folder
    # (and check_golden names every file a test emits that its folder lacks)
    assert not found - produced_folders(), f"orphans: {sorted(found - produced_folders())}"

"""benchmarks/anchors/cases.yaml stays expressible: every case loads as the deployment
benchmarks/anchors.py writes, and cases plus the rows recorded as not expressible cover the
35 rows of AIConfigurator's silicon_refs.csv once each."""

import importlib.util
from pathlib import Path

import pytest

from compiler.load import load_inputs

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("anchors", ROOT / "benchmarks" / "anchors.py")
anchors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(anchors)
DOC = anchors.load()


def test_every_row_is_a_case_or_says_why_not():
    rows = [c["row"] for c in DOC["cases"]] + [r for x in DOC["not_expressible"]
                                               for r in x["rows"]]
    assert sorted(rows) == list(range(35))
    assert all(x["why"] for x in DOC["not_expressible"])


@pytest.mark.parametrize("case", DOC["cases"], ids=lambda c: c["id"])
def test_each_case_loads_as_written(case: dict, tmp_path: Path):
    inputs = load_inputs(anchors.write(case, tmp_path))
    assert inputs.deployment.spec.objective.mode == "pinned"
    assert inputs.deployment.spec.workload.concurrency == case["workload"]["concurrency"]
    assert anchors.kernels_for(case, "own") in (anchors.engine(case), "vllm")

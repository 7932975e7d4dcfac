"""Every document a decision cites ships with rackc under docs/, with the section it names."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted((ROOT / "tests" / "golden").glob("*/plan/plan.yaml"))
CITED = re.compile(r"\b([A-Z][A-Z-]+\.md)(?: ([A-D][0-9]))?")


def _headings(doc: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^#+ ([A-D][0-9]?)[. ]", doc, re.MULTILINE)}


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.parent.parent.name)
def test_cited_documents_and_sections_ship_in_docs(plan: Path):
    text = plan.read_text()
    cited = {(m.group(1), m.group(2)) for m in CITED.finditer(text)}
    assert cited, "the plan cites no document (the test would check nothing)"
    for name, section in sorted(cited, key=str):
        doc = ROOT / "docs" / name
        assert doc.is_file(), f"{plan.parent.parent.name} cites {name}, not in docs/"
        if section:
            assert section in _headings(doc.read_text()), f"{name} has no section {section}"

"""docs/rule-owners.md names the one file that owns each rule: every file it names exists, and
every function, class or constant it names beside a file (`path` (`name`, ...)) is defined
there, so the page cannot send a maintainer to a file or name that moved."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "rule-owners.md"
PATH = re.compile(r"`((?:compiler|schemas|targets|tests)/[\w/]+\.(?:py|yaml|md))`")
NAMED = re.compile(r"`((?:compiler|schemas|targets)/[\w/]+\.py)` \(([^)]*)\)")
IDENT = re.compile(r"`([A-Za-z_]\w*)(?:\.\w+)?`")


def _defined(path: Path) -> set[str]:
    """Names a module defines at its top level or as class members."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return out


def test_every_file_the_page_names_exists():
    missing = sorted({p for p in PATH.findall(DOC.read_text()) if not (ROOT / p).exists()})
    assert not missing, f"docs/rule-owners.md names files that do not exist: {missing}"


@pytest.mark.parametrize("path,names", sorted(set(NAMED.findall(DOC.read_text()))))
def test_every_name_beside_a_file_is_defined_there(path: str, names: str):
    wanted = set(IDENT.findall(names))
    missing = sorted(wanted - _defined(ROOT / path))
    assert not missing, f"docs/rule-owners.md: {path} does not define {missing}"

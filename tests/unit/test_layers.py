"""One door per fact, as imports: the targets read only the plan (`compiler.plan`, and the
listening-port table `compiler.ports`, which imports nothing), the validator never runs the
compile pipeline (`compiler.api`), and its node model reads the plan's capacities, never the
catalog."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    """Modules a file imports, at module level or in a function (relative ones resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            out.add(module)
            out |= {f"{module}.{a.name}" for a in node.names}
    return out


def _ours(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in ("compiler", "schemas")}


# what targets may import of the compiler: the plan, and the tables and formats that import
# nothing of ours (ports, the DNS-label rule, the id formats)
LEAVES = ("compiler.ports", "compiler.names", "compiler.ids")
TARGETS_READ = ("compiler.plan", *LEAVES, "compiler.simulate.compare")


@pytest.mark.parametrize("module", LEAVES)
def test_the_leaf_tables_import_nothing_of_ours(module: str):
    assert not _ours(_imports(ROOT / (module.replace(".", "/") + ".py")))


def test_the_simulated_comparison_reads_only_the_plan_and_the_run_report():
    path = ROOT / "compiler" / "simulate" / "compare.py"
    assert _ours(_imports(path)) <= {"compiler.plan", "compiler.plan.Predicted",
                                     "compiler.simulate.report",
                                     "compiler.simulate.report.WARM_SHARE"}


@pytest.mark.parametrize("path", sorted((ROOT / "targets").glob("*.py")), ids=lambda p: p.name)
def test_targets_import_only_the_plan(path: Path):
    extra = {m for m in _ours(_imports(path)) if m != "compiler"
             and not any(m == r or m.startswith(r + ".") for r in TARGETS_READ)}
    assert not extra, f"{path.name} imports {sorted(extra)}"


@pytest.mark.parametrize("path", sorted((ROOT / "compiler" / "validate").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_validator_does_not_run_the_compiler(path: Path):
    modules = _imports(path)
    assert not {m for m in modules if m == "compiler.api" or m.startswith("compiler.api.")}
    if path.name in ("pods.py", "placement.py"):  # the node model: the plan's capacities
        assert not {m for m in modules if m.split(".")[:2] == ["compiler", "catalog"]}

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
# nothing of ours (ports, the DNS-label rule, the id formats, YAML text with its data)
LEAVES = ("compiler.ports", "compiler.names", "compiler.ids", "compiler.documents")
TARGETS_READ = ("compiler.plan", *LEAVES, "compiler.simulate.compare")


@pytest.mark.parametrize("module", LEAVES)
def test_the_leaf_tables_import_nothing_of_ours(module: str):
    assert not _ours(_imports(ROOT / (module.replace(".", "/") + ".py")))


def test_the_simulated_comparison_reads_only_the_plan_and_the_steady_state_window():
    path = ROOT / "compiler" / "simulate" / "compare.py"
    assert _ours(_imports(path)) <= {"compiler.plan", "compiler.plan.Predicted",
                                     "compiler.simulate.window",
                                     "compiler.simulate.window.WARM_SHARE"}


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


# where the deployment file and the engine catalog are read: everything later reaches them
# through compiler.resolve.Resolved (the CLI's `args.deployment` is its argument, a path)
READS_DEPLOYMENT = ("compiler/load.py", "compiler/resolve.py")
READS_ENGINES = ("compiler/resolve.py", "compiler/catalog/__init__.py")


def _sources() -> list[Path]:
    return sorted(p for d in ("compiler", "targets") for p in (ROOT / d).rglob("*.py"))


def _reads(path: Path, attribute: str) -> list[int]:
    """Lines that read `attribute` of anything but the CLI's parsed arguments."""
    tree = ast.parse(path.read_text(), str(path))
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and n.attr == attribute
            and not (isinstance(n.value, ast.Name) and n.value.id == "args")]


def test_only_load_and_resolve_read_the_deployment():
    found = {str(p.relative_to(ROOT)): lines for p in _sources()
             if str(p.relative_to(ROOT)) not in READS_DEPLOYMENT
             and (lines := _reads(p, "deployment"))}
    assert not found, f"read the deployment past compiler.resolve: {found}"


def test_only_resolve_reads_the_engine_catalog():
    found = {}
    for p in _sources():
        name = str(p.relative_to(ROOT))
        imported = "compiler.catalog.engines" in _imports(p)
        calls = [n.lineno for n in ast.walk(ast.parse(p.read_text(), name))
                 if isinstance(n, ast.Call) and (
                     (isinstance(n.func, ast.Attribute) and n.func.attr == "engines"
                     and isinstance(n.func.value, ast.Name) and n.func.value.id == "catalog")
                     or (imported and isinstance(n.func, ast.Name) and n.func.id == "engines"))]
        if calls and name not in READS_ENGINES:
            found[name] = calls
    assert not found, f"read the engine catalog past compiler.resolve: {found}"


# the passes that run before lowering: the solver and the perf model it prices layouts with
EARLY = ("compiler/solve", "compiler/perf")
LATER_PASSES = ("compiler.prediction", "compiler.predicted_plan", "compiler.lower",
                "compiler.api", "compiler.deploy", "compiler.targets_registry")


@pytest.mark.parametrize("path", sorted(p for d in EARLY for p in (ROOT / d).glob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_solver_and_perf_model_import_no_later_pass(path: Path):
    later = {m for m in _imports(path)
             if any(m == x or m.startswith(x + ".") for x in LATER_PASSES)}
    assert not later, f"{path.relative_to(ROOT)} imports {sorted(later)}"


def test_fleet_merge_reads_no_catalog():
    """Each group's plan carries its system; merging the groups reads no input twice."""
    path = ROOT / "compiler" / "fleet.py"
    assert not {m for m in _imports(path) if m.split(".")[:2] == ["compiler", "catalog"]}

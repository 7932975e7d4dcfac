import os
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# Property tests draw the same examples on every run ("repeatable": CI, the README's command),
# so that a run's verdict is the code's, not the draw's; HYPOTHESIS_PROFILE=explore draws new
# ones each run (with --hypothesis-seed to replay one), which is how new failures are hunted:
# a failure found so becomes a fixed case of its test.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true",
                     help="rewrite tests/golden from the current output (the run still fails)")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens"))


@pytest.fixture
def example_copy(tmp_path: Path):
    """Copy an example folder to tmp so a test can edit its files."""

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(EXAMPLES / name, dst)
        return dst

    return copy


@pytest.fixture(scope="session")
def compiled_example():
    """`compiled_example(name)`: the plan `rackc compile examples/NAME` makes (targets not
    emitted), compiled once per session and shared: plans are frozen, so tests read them
    (`model_copy` makes a changed one)."""
    from tests.targets.fixtures import compiled_plan

    return compiled_plan


# Files whose tests compile whole examples, build bundles or run external validators: the
# quick path `python -m pytest -m "not slow"` leaves them out (each test may also say so itself
# with @pytest.mark.slow).
SLOW_FILES = (
    "conformance/", "validate/", "compile/test_golden_plan.py", "compile/test_golden_fleet.py",
    "targets/test_golden.py", "compile/test_properties.py", "compile/test_incremental.py",
    "compile/test_mixed_fleet.py", "compile/test_examples.py", "compile/test_pipeline.py",
    "compile/test_engine_capabilities.py", "unit/test_signals.py", "targets/test_consistency.py",
    "targets/test_report_layout.py", "targets/test_site.py", "targets/test_netpol.py",
    "unit/test_preflight.py", "unit/test_output_safety.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        where = Path(item.fspath).relative_to(ROOT / "tests").as_posix()
        if where.startswith(SLOW_FILES):
            item.add_marker(pytest.mark.slow)

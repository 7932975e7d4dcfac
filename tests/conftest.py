import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


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

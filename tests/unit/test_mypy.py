"""mypy finds nothing in the schemas, the targets and the plan they read (pyproject.toml
[tool.mypy] names the files and the pydantic plugin)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_mypy_is_clean_on_schemas_targets_and_the_plan():
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

"""`rackc check` loads only what it needs: no solver (OR-Tools and the pandas it pulls in), no
perf model, no emitters (Kubernetes models, matplotlib)."""

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hgx-h200-deepseek-v3"


def test_check_imports_no_solver_perf_model_or_emitter():
    code = ("import sys; from compiler import cli; assert cli.main(['check', sys.argv[1]]) == 0; "
            "heavy = [m for m in ('ortools', 'pandas', 'numpy', 'kubernetes', 'matplotlib', "
            "'targets', 'compiler.solve', 'compiler.perf.predict') if m in sys.modules]; "
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code, str(EXAMPLE / "deployment.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow  # a whole-example compile in a fresh process
def test_compile_imports_neither_pandas_nor_the_kubernetes_validator():
    """OR-Tools' cp_model is imported without pandas (compiler/cpsat.py) and the Kubernetes
    client without kubernetes_validate (targets/_k8s_client.py); both stay importable."""
    code = ("import sys; from compiler import cli; "
            "assert cli.main(['compile', sys.argv[1], '-o', sys.argv[2]]) == 0; "
            "import compiler.solve, targets; "
            "loaded = [m for m in ('pandas', 'kubernetes_validate', 'jsonschema') "
            "if m in sys.modules]; assert not loaded, loaded; "
            "import pandas, kubernetes_validate; assert hasattr(pandas, 'DataFrame'); "
            "from compiler.cpsat import cp_model; m = cp_model.CpModel(); "
            "x = m.new_int_var(0, 3, 'x'); m.maximize(x); s = cp_model.CpSolver(); "
            "assert s.solve(m) == cp_model.OPTIMAL and s.value(x) == 3")
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-c", code, str(EXAMPLE / "deployment.yaml"),
                               f"{out}/o"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr

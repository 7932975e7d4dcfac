"""`rackc check` loads only what it needs: no solver (OR-Tools and the pandas it pulls in), no
perf model, no emitters (Kubernetes models, matplotlib)."""

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hgx-h200-deepseek-v3"


def test_check_imports_no_solver_perf_model_or_emitter():
    code = ("import sys; from compiler import cli; assert cli.main(['check', sys.argv[1]]) == 0; "
            "heavy = [m for m in ('ortools', 'pandas', 'numpy', 'kubernetes', 'matplotlib', "
            "'targets', 'compiler.solve', 'compiler.perf.predict') if m in sys.modules]; "
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code, str(EXAMPLE / "deployment.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

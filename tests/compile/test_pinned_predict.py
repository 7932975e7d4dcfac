"""`rackc predict` of a pinned layout takes the short path (no solver, no emitters) and says
exactly what `compile` puts in the plan."""

import subprocess
import sys
from pathlib import Path

import pytest

from compiler import api
from compiler.pinned import predict_pinned
from tests.builders import write_case

PINS = {"mode": "pinned", "instances": [{"role": "prefill", "shape": "DEP2", "count": 2},
                                        {"role": "decode", "shape": "DEP8", "count": 1}]}


@pytest.mark.parametrize("workload", [{"profile": "chat"}, {"profile": "agentx"}])
def test_short_path_matches_compile(tmp_path: Path, workload: dict):
    path = write_case(tmp_path, system="gb200-nvl72", model="qwen3-30b-a3b",
                      hardware={"trays": 4}, workload=workload, objective=PINS)
    fast = predict_pinned(path)
    full = api.compile(path, only=())
    assert fast is not None
    # the short path has no placed plan to simulate; compile records its short run
    assert full.plan.predicted.simulated is not None and fast[0].simulated is None
    assert fast[0].model_dump(mode="json") == full.plan.predicted.model_dump(
        mode="json", exclude={"simulated"})
    # the same warnings about the layout (W512 is about the bundle, which predict does not emit)
    assert fast[1] == [d for d in full.warnings if d.code != "W512"]


def test_unpinned_or_unplaceable_pins_take_the_full_path(tmp_path: Path):
    free = write_case(tmp_path / "free", system="gb200-nvl72", hardware={"trays": 4})
    assert predict_pinned(free) is None
    many = dict(PINS, instances=[{"role": "decode", "shape": "DEP8", "count": 3},
                                 {"role": "prefill", "shape": "DEP2", "count": 1}])
    over = write_case(tmp_path / "over", system="gb200-nvl72", hardware={"trays": 4},
                      objective=many)
    assert predict_pinned(over) is None


def test_short_path_imports_no_solver_or_emitter(tmp_path: Path):
    path = write_case(tmp_path, system="gb200-nvl72", model="qwen3-30b-a3b",
                      hardware={"trays": 4}, objective=PINS)
    code = ("import sys; from compiler import cli; assert cli.main(['predict', sys.argv[1]]) "
            "== 0; heavy = [m for m in ('ortools', 'kubernetes', 'matplotlib', 'numpy', "
            "'networkx', 'targets', 'compiler.solve', 'compiler.api') if m in sys.modules]; "
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr

"""CUDA-graph kernel floors: the table from raw measurements, and the op model's use of it."""

import pytest

from compiler import catalog
from compiler.perf.floors import floor_table
from compiler.perf.ops import op_model

RAW = {"device": {"gpu": "G", "torch": "t", "cuda": "c", "driver": "d", "measured_on": "day"},
       "measurements": [{"op": "gemm", "dtype": "bf16", "us": 4.0},
                        {"op": "gemm", "dtype": "bf16", "us": 3.5},
                        {"op": "copy", "us": 1.0}]}


def test_floor_is_the_fastest_call_per_op_and_dtype():
    assert floor_table(RAW)["floors"] == {"copy": {"any": 1.0}, "gemm": {"bf16": 3.5}}


def test_floor_replaces_the_fitted_overhead():
    system = catalog.system("hgx-h200")
    cal = catalog.calibration("hgx-h200")
    fitted = op_model(system, cal)
    floored = op_model(system, cal, {"gemm": {"bf16": 10.0}})
    overhead = fitted.curve("gemm", "bf16").overhead_us
    assert floored.gemm("bf16", 1, 4096, 4096) == pytest.approx(
        fitted.gemm("bf16", 1, 4096, 4096) - overhead + 10.0)
    assert floored.copy(1 << 20) == fitted.copy(1 << 20)  # no floor: the curve's overhead


def test_systems_without_floors_borrow_the_h200s_as_assumed():
    own, other = catalog.floors("hgx-h200"), catalog.floors("vera-rubin-nvl72")
    assert other["floors"] == own["floors"] and other["source"].startswith("assumed")

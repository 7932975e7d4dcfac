"""The fitter recovers known curves; `rackc calibrate` is deterministic, refuses bad input with
one diagnostic, and the committed calibration files are what it writes."""

import json
from pathlib import Path

import numpy as np
import pytest

from compiler import catalog
from compiler.perf import aiconfigurator, calibrate, fit, ops
from compiler.perf.ops import Curve

H200 = catalog.system("hgx-h200")
RAW = catalog.calibration_path("hgx-h200", "raw.json")
CONVERTED = tuple(sorted(aiconfigurator.SYSTEMS))
# Systems with no published tables carry a converted system's curves (assumed): its basis.
ASSUMED = {"vera-rubin-nvl72": "gb300-nvl72"}
# Converted systems take the curves the tables lack (copy) from our H200 (benchmarks/README.md)
FILL = {name: None if name == "hgx-h200" else str(catalog.calibration_path("hgx-h200"))
        for name in CONVERTED}

TRUE_GEMM = Curve(e_max=0.72, size_half=0.0, e_mem=0.85, overhead_us=3.5, depth_half=90.0,
                  streams_full=24.0)
TRUE_COPY = Curve(e_max=1.0, size_half=0.0, e_mem=0.88, overhead_us=1.8)
SHAPES = ((2112, 7168), (4096, 7168), (7168, 2048), (32768, 512), (8192, 28672), (57344, 8192))
ROWS = (1, 4, 16, 64, 128, 256, 512, 1024, 4096, 16384)


def synthetic_raw(noise: float = 0.0) -> dict:
    """Raw measurements timed by known curves, with optional deterministic noise."""
    rng = np.random.default_rng(0)
    peak = H200.tflops("bf16") * 1e6
    hbm = H200.gpu.hbm_tbytes_per_s.value * 1e6
    measurements = []
    for n, k in SHAPES:
        for m in ROWS:
            us = TRUE_GEMM.time_us(ops.gemm_work("bf16", m, n, k), peak, hbm)
            measurements.append({"op": "gemm", "dtype": "bf16", "m": m, "n": n, "k": k,
                                 "us": float(us * (1 + noise * rng.standard_normal()))})
    for p in range(20, 34):
        us = TRUE_COPY.time_us(ops.copy_work(1 << p), peak, hbm)
        measurements.append({"op": "copy", "bytes": 1 << p, "us": float(us)})
    return {"schema": fit.RAW_SCHEMA, "device": {"gpu": "NVIDIA H200", "sm_count": 132},
            "measurements": measurements}


def test_fitter_recovers_known_gemm_and_copy_curves():
    results = fit.fit_all(fit.points(synthetic_raw()), H200)
    gemm, copy = results["gemm"]["bf16"], results["copy"][ops.ANY_DTYPE]
    for name in ("e_max", "e_mem", "overhead_us", "depth_half", "streams_full"):
        assert getattr(gemm.curve, name) == pytest.approx(getattr(TRUE_GEMM, name), rel=0.03)
    assert copy.curve.e_mem == pytest.approx(TRUE_COPY.e_mem, rel=1e-3)
    assert copy.curve.overhead_us == pytest.approx(TRUE_COPY.overhead_us, rel=1e-2)
    assert np.max(np.abs(gemm.errors)) < 0.01


def test_fitter_is_robust_to_noise():
    gemm = fit.fit_all(fit.points(synthetic_raw(noise=0.05)), H200)["gemm"]["bf16"]
    assert gemm.curve.e_max == pytest.approx(TRUE_GEMM.e_max, rel=0.05)
    assert gemm.curve.e_mem == pytest.approx(TRUE_GEMM.e_mem, rel=0.05)
    assert gemm.summary()["median_abs_err"] < 0.06


def test_efficiencies_stay_below_one_so_no_fit_beats_the_roofline():
    raw = synthetic_raw()
    for m in raw["measurements"]:  # faster than physics: the fit must still not exceed 1
        m["us"] /= 3.0
    for by_dtype in fit.fit_all(fit.points(raw), H200).values():
        for result in by_dtype.values():
            assert result.curve.e_max <= 1.0 and result.curve.e_mem <= 1.0


def test_unfused_attention_fallbacks_are_excluded():
    base = {"op": "attn_decode", "dtype": "bf16", "batch": 1, "q_heads": 8, "kv_heads": 1,
            "head_dim": 576, "kv_len": 512, "us": 40.0}
    assert not fit.representative({**base, "impl": "sdpa:math gqa-packed"})
    assert fit.representative({**base, "impl": "sdpa:flash_attention gqa-packed"})
    assert fit.representative({"op": "gemm", "impl": "F.linear"})


def write_raw(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(raw))
    return path


def test_calibrate_from_raw_is_deterministic(tmp_path: Path):
    raw = write_raw(tmp_path, synthetic_raw(noise=0.02))
    outputs = []
    for name in ("a.json", "b.json"):
        code, out, err = calibrate.run("hgx-h200", str(tmp_path / name), str(raw))
        assert (code, err) == (0, []) and out[-1].startswith("wrote")
        outputs.append((tmp_path / name).read_bytes())
    assert outputs[0] == outputs[1]
    doc = json.loads(outputs[0])
    assert doc["schema"] == fit.SCHEMA and doc["fit"]["gemm"]["bf16"]["points"] == len(
        SHAPES) * len(ROWS)
    assert list(doc) == sorted(doc)


def assert_same_document(got: object, want: object, where: str = "") -> None:
    """Equal structure and text; numbers equal to 1% (another CPU's float rounding may move a
    fitted parameter's last digits)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for key in want:
            assert_same_document(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_document(g, w, f"{where}[{i}]")
    elif isinstance(want, float | int) and not isinstance(want, bool):
        assert got == pytest.approx(want, rel=1e-2, abs=1e-6), where
    else:
        assert got == want, where


@pytest.mark.parametrize("system", CONVERTED)
def test_committed_calibration_is_the_fit_of_the_committed_conversion(system: str,
                                                                      tmp_path: Path):
    """If this fails after a new conversion, refit with the commands in benchmarks/README.md
    ("Calibration from AIConfigurator")."""
    out = tmp_path / f"{system}.json"
    raw = catalog.calibration_path(system, "aiconfigurator.raw.json")
    assert calibrate.run(system, str(out), str(raw), scale_from=FILL[system])[0] == 0
    assert_same_document(json.loads(out.read_text()), catalog.calibration(system))


def test_h200_conversion_takes_copies_from_our_own_measurements():
    doc = catalog.calibration("hgx-h200")
    own = fit.calibration(json.loads(RAW.read_text()), H200)
    assert doc["curves"]["copy"] == own["curves"]["copy"]
    assert "copy measured on NVIDIA H200" in doc["source"]


@pytest.mark.parametrize(("system", "basis"), sorted(ASSUMED.items()))
def test_committed_assumed_calibrations_carry_their_basis_curves(system: str, basis: str,
                                                                  tmp_path: Path):
    out = tmp_path / f"{system}.json"
    assert calibrate.run(system, str(out), scale_from=str(catalog.calibration_path(basis)))[0] == 0
    assert out.read_text() == catalog.calibration_path(system).read_text()
    doc = json.loads(out.read_text())
    assert doc["source"] == f"assumed: {basis} efficiencies on {system} datasheet peaks"
    assert doc["curves"] == catalog.calibration(basis)["curves"]
    assert doc["licence"] == catalog.calibration(basis)["licence"]


def test_every_catalog_system_has_a_calibration():
    assert set(catalog.system_names()) == set(CONVERTED) | set(ASSUMED)


def test_own_h200_fit_meets_the_kernel_goal_in_sample():
    doc = fit.calibration(json.loads(RAW.read_text()), H200)
    for op, by_dtype in doc["fit"].items():
        for dtype, stats in by_dtype.items():
            assert stats["median_abs_err"] <= 0.10, (op, dtype)


def one_error(result: tuple[int, list[str], list[str]]) -> str:
    code, out, err = result
    assert code == 2 and out == [] and len(err) == 1
    return err[0]


def test_calibrate_refuses_an_unknown_system(tmp_path: Path):
    err = one_error(calibrate.run("hgx-h20", str(tmp_path / "o.json"), str(RAW)))
    assert "E602" in err and "hgx-h200" in err
    assert not (tmp_path / "o.json").exists()


def test_calibrate_refuses_measurements_of_another_gpu(tmp_path: Path):
    err = one_error(calibrate.run("gb200-nvl72", str(tmp_path / "o.json"), str(RAW)))
    assert "device.gpu" in err and "NVIDIA H200" in err


@pytest.mark.parametrize(("text", "got"), [("{", "invalid JSON"),
                                           ('{"schema": "other"}', "'other'")])
def test_calibrate_refuses_unreadable_raw_files(tmp_path: Path, text: str, got: str):
    path = tmp_path / "raw.json"
    path.write_text(text)
    assert got in one_error(calibrate.run("hgx-h200", str(tmp_path / "o.json"), str(path)))


def test_calibrate_without_pytorch_says_so_and_exits_2(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(calibrate.importlib.util, "find_spec", lambda name: None)
    err = one_error(calibrate.run("hgx-h200", str(tmp_path / "o.json")))
    assert "E604" in err and "--from-raw" in err


def test_moe_tables_keep_each_shapes_fastest_call_by_token_count():
    from compiler.perf.calibration_files import validation_errors

    call = {"op": "moe", "dtype": "fp8", "scales": "block", "hidden": 7168, "inter": 256,
            "top_k": 8, "experts": 256, "local_experts": 256, "tp": 8, "ep": 1}
    calls = [{**call, "tokens": 16, "us": 90.0}, {**call, "tokens": 16, "us": 80.0},
             *({**call, "tokens": n, "us": 10.0 * n} for n in (1, 2, 4)),
             {**call, "inter": 512, "tokens": 4, "us": 9.0},
             *({**call, "scales": "", "tokens": n, "us": 1.0} for n in (1, 2, 4, 16))]
    # the inter-512 shape has one count: no table; the per-tensor kernel is a table of its own
    tensor, block = fit.moe_tables(calls)
    assert (block["tokens"], block["us"], block["inter"]) == ([1, 2, 4, 16],
                                                             [10.0, 20.0, 40.0, 80.0], 256)
    assert (tensor["scales"], tensor["us"]) == ("", [1.0] * 4)
    table = block
    raw = {"schema": fit.RAW_SCHEMA, "device": {"gpu": "x"}, "measurements": calls[:1],
           "moe_tables": [{**table, "tokens": table["tokens"][::-1]}]}
    assert any("increasing" in expected for _, expected, _ in validation_errors(raw))

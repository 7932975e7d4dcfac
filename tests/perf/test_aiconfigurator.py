"""AIConfigurator's tables become rackc raw measurements as documented, a fused MoE fits as two
grouped GEMMs, and `rackc calibrate --from-aiconfigurator` fails with one diagnostic without
the tables. The converters take pandas frames (pandas comes with OR-Tools), so these run
without the `calibrate` extra."""

import json
from pathlib import Path

import pandas as pd
import pytest

from compiler import catalog
from compiler.perf import aiconfigurator as aic
from compiler.perf import calibrate, fit, ops
from compiler.perf.ops import Curve

H200 = catalog.system("hgx-h200")
PINNED = "0.12.0"  # pyproject: the calibrate extra pins aiconfigurator-core
TRUE_GROUPED = Curve(e_max=0.6, size_half=0.0, e_mem=0.7, overhead_us=12.0, depth_half=120.0)


def frame(rows: list[dict], **common) -> pd.DataFrame:
    return pd.DataFrame([{**common, **row} for row in rows])


def test_gemm_keeps_the_fastest_kernel_per_shape_and_maps_dtypes():
    df = frame([
        {"gemm_dtype": "fp8", "kernel_source": "Cutlass", "latency": 0.020},
        {"gemm_dtype": "fp8_block", "kernel_source": "DeepGemm", "latency": 0.015},
        {"gemm_dtype": "bfloat16", "kernel_source": "linear", "latency": 0.030},
        {"gemm_dtype": "int8", "kernel_source": "other", "latency": 0.001},
    ], m=16, n=4096, k=7168)
    points = aic.gemm_points(df, "vllm")
    assert [(p["dtype"], p["us"]) for p in points] == [("bf16", 30.0), ("fp8", 15.0)]
    assert points[1]["impl"] == "aiconfigurator vllm: fp8_block DeepGemm"
    assert all(fit.representative(p) for p in points)


def test_moe_points_are_one_ranks_share_of_balanced_routing():
    df = frame([
        {"distribution": "balanced", "moe_tp_size": 2, "moe_ep_size": 4, "latency": 0.1},
        {"distribution": "power_law_1.2", "moe_tp_size": 1, "moe_ep_size": 1, "latency": 0.2},
    ], moe_dtype="bfloat16", kernel_source="triton", num_tokens=64, hidden_size=2048,
        inter_size=768, topk=8, num_experts=128)
    (point,) = aic.moe_points(df, "vllm")
    assert (point["local_experts"], point["inter"], point["tp"], point["ep"]) == (32, 384, 2, 4)
    gate_up, down = fit.moe_work(point)
    assert gate_up.flops == pytest.approx(2 * 32 * (64 * 8 / 128) * 2048 * 768)
    assert down.nbytes > 32 * 384 * 2048 * 2  # every local expert's down weights are read


def test_decode_attends_isl_plus_step_tokens_and_skips_windows():
    df = frame([{"window_size": 0, "step": 1023}, {"window_size": 128, "step": 1023}],
               kernel_source="fa3", kv_cache_dtype="bfloat16", num_heads=32,
               num_key_value_heads=4, head_dim=128, batch_size=8, isl=1, latency=0.02)
    (point,) = aic.decode_points(df, "vllm")
    assert (point["kv_len"], point["batch"], point["us"]) == (1024, 8, 20.0)


def test_mla_takes_the_latent_head_per_tp_rank_and_bf16_caches_only():
    df = frame([{"kv_cache_dtype": "bfloat16"}, {"kv_cache_dtype": "fp8"}],
               kernel_source="flash_attention", num_heads=128, tp_size=8, batch_size=4, isl=1,
               step=4095, latency=0.05)
    (point,) = aic.mla_decode_points(df, "sglang")
    assert (point["q_heads"], point["kv_heads"], point["head_dim"]) == (16, 1, 576)
    assert point["kv_len"] == 4096


def test_thinning_is_a_fixed_sample_in_the_original_order():
    rows = [{"op": "gemm", "m": m, "us": 1.0} for m in range(50)]
    kept = aic._thin(rows, cap=10)
    assert len(kept) == 10 and kept == aic._thin(list(rows), cap=10)
    assert [r["m"] for r in kept] == sorted(r["m"] for r in kept)
    assert len({r["m"] % 2 for r in kept}) == 2  # not every other M


def test_fused_moe_points_fit_the_grouped_gemm_curve_they_were_made_from():
    peak, hbm = H200.tflops("bf16") * 1e6, H200.gpu.hbm_tbytes_per_s.value * 1e6
    measurements = []
    for tokens in (1, 4, 16, 64, 256, 1024, 4096, 16384):
        for hidden, inter, experts, top_k in ((2048, 768, 128, 8), (4096, 14336, 8, 2),
                                              (7168, 2048, 256, 8)):
            q = {"op": "moe", "dtype": "bf16", "tokens": tokens, "hidden": hidden,
                 "inter": inter, "top_k": top_k, "experts": experts, "local_experts": experts}
            us = sum(TRUE_GROUPED.time_us(w, peak, hbm) for w in fit.moe_work(q))
            measurements.append({**q, "us": float(us)})
    raw = {"schema": fit.RAW_SCHEMA, "device": {"gpu": "NVIDIA H200"},
           "measurements": measurements}
    result = fit.fit_all(fit.points(raw), H200)["grouped_gemm"]["bf16"]
    for name in ("e_max", "e_mem", "overhead_us"):
        assert getattr(result.curve, name) == pytest.approx(getattr(TRUE_GROUPED, name),
                                                            rel=0.05)
    assert result.summary()["median_abs_err"] < 0.01


def test_merged_adds_only_the_ops_the_tables_lack():
    published = {"source": {"description": "tables"},
                 "measurements": [{"op": "moe", "us": 1.0}, {"op": "gemm", "us": 1.0}]}
    own = {"device": {"gpu": "NVIDIA H200"},
           "measurements": [{"op": "grouped_gemm", "us": 2.0}, {"op": "copy", "us": 2.0}]}
    out = aic.merged(published, own)
    assert [m["op"] for m in out["measurements"]] == ["moe", "gemm", "copy"]
    assert out["source"]["description"].startswith("tables; copy measured on NVIDIA H200")
    assert published["source"]["description"] == "tables"


def test_newest_version_of_the_first_framework_with_the_table(tmp_path: Path):
    for framework, version in (("sglang", "0.5.14"), ("vllm", "0.9.2"), ("vllm", "0.24.0"),
                               ("vllm", "0.27.0rc1")):
        folder = tmp_path / "gemm" / framework / version
        folder.mkdir(parents=True)
        if version != "0.27.0rc1":
            (folder / "gemm_perf.parquet").write_bytes(b"")
    found = aic.find_table(tmp_path, "gemm", "gemm_perf.parquet")
    assert found[:2] == ("vllm", "0.24.0")


def test_a_chosen_framework_comes_first_and_the_others_fill_in(tmp_path: Path):
    for framework, op_dir in (("vllm", "gemm"), ("sglang", "gemm"), ("vllm", "mla")):
        folder = tmp_path / op_dir / framework / "1.0"
        folder.mkdir(parents=True)
        (folder / "t.parquet").write_bytes(b"")
    assert aic.preference("sglang") == ("sglang", "vllm", "trtllm")
    assert aic.find_table(tmp_path, "gemm", "t.parquet", aic.preference("sglang"))[0] == "sglang"
    assert aic.find_table(tmp_path, "mla", "t.parquet", aic.preference("trtllm"))[0] == "vllm"


def test_every_version_is_a_candidate_newest_first(tmp_path: Path):
    """A newest table with nothing rackc takes (a partial re-collection) gives way to the
    next: raw_document walks these candidates in this order."""
    for framework, version in (("trtllm", "1.3.0rc20"), ("trtllm", "1.3.0rc23"),
                               ("vllm", "0.24.0")):
        folder = tmp_path / "moe" / framework / version
        folder.mkdir(parents=True)
        (folder / "moe_perf.parquet").write_bytes(b"")
    found = aic.find_tables(tmp_path, "moe", "moe_perf.parquet", aic.preference("trtllm"))
    assert [(f, v) for f, v, _ in found] == [("trtllm", "1.3.0rc23"), ("trtllm", "1.3.0rc20"),
                                             ("vllm", "0.24.0")]


def one_error(result: tuple[int, list[str], list[str]]) -> str:
    code, out, err = result
    assert code == 2 and out == [] and len(err) == 1
    return err[0]


def test_calibrate_without_the_tables_says_how_to_get_them(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    def missing() -> Path:
        raise aic.SourceMissing("aiconfigurator-core is not installed")

    monkeypatch.setattr(aic, "data_root", missing)
    err = one_error(calibrate.run("hgx-b200", str(tmp_path / "o.json"),
                                  from_aiconfigurator=True))
    assert "E605" in err and "rackc[calibrate]" in err
    assert list(tmp_path.iterdir()) == []


def test_scale_from_fills_only_the_ops_the_tables_lack():
    document = {"source": "tables", "curves": {"gemm": {"bf16": {"e_max": 0.5}}}}
    basis = {"system": "hgx-h200", "curves": {"gemm": {"bf16": {"e_max": 0.9}},
                                             "copy": {"any": {"e_mem": 0.87}}}}
    out = calibrate.filled(document, basis)
    assert out["curves"] == {"gemm": {"bf16": {"e_max": 0.5}}, "copy": {"any": {"e_mem": 0.87}}}
    assert out["source"] == "tables; copy: assumed, hgx-h200's curves"
    assert calibrate.filled(out, basis) == out


@pytest.mark.parametrize("system", sorted(aic.SYSTEMS))
def test_committed_conversions_carry_source_version_and_licence(system: str):
    doc = catalog.calibration(system)
    assert doc["licence"] == "Apache-2.0" and "NVIDIA" in doc["notice"]
    assert f"aiconfigurator-core {PINNED}" in doc["source"]
    assert {t["framework"] for t in doc["tables"]} >= {"vllm"}
    raw = json.loads(catalog.calibration_path(system, "aiconfigurator.raw.json").read_text())
    assert raw["source"]["version"] == PINNED
    assert {m["op"] for m in raw["measurements"]} >= {"gemm", "moe", "attn_decode",
                                                      "attn_prefill", "nccl"}
    assert ops.op_model(catalog.system(system), doc).curve("grouped_gemm", "bf16")

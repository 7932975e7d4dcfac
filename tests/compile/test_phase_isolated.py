"""A role predicted alone at a pinned operating point (phase-isolated): the step model's own
step at that batch and context, its memory against the one budget, shown by `predict`,
`compile` and the report."""

import json
from html import escape
from pathlib import Path

import pytest
import yaml

from compiler import api
from compiler.cli import main
from compiler.load import load_inputs
from compiler.perf.isolated import phase_alone
from compiler.perf.predict import context, grouped_layouts, groups, workload
from compiler.perf.step import decode_step, prefill_step
from compiler.pinned import predict_pinned
from compiler.resolve import PinnedPoint
from compiler.shapes import parse_shape
from schemas.diagnostics import CompileError
from tests.builders import write_case

EAGLE = {"speculative": {"method": "eagle3", "draft_tokens": 3, "acceptance": 2.5}}


def _case(root: Path, decode: dict | None = None, prefill: dict | None = None,
          serving: dict | None = None) -> Path:
    def entry(role: str, shape: str, count: int, point: dict | None) -> dict:
        return {"role": role, "shape": shape, "count": count,
                **({"operating_point": point} if point else {})}

    objective = {"mode": "pinned", "instances": [entry("prefill", "DEP2", 2, prefill),
                                                 entry("decode", "DEP8", 1, decode)]}
    return write_case(root, hardware={"trays": 4}, workload={"profile": "chat"},
                      objective=objective, serving=serving)


def test_the_isolated_steps_are_the_step_models(tmp_path: Path):
    """Oracle: the step model called directly, on the perf context of each role's group
    (decode: its own GPUs' Engram share; prefill: every prefill GPU's), at the point."""
    path = _case(tmp_path, decode={"batch_per_rank": 48, "context_tokens": 6000},
                 prefill={"batch_per_rank": 3, "context_tokens": 5000, "cached_share": 0.4},
                 serving=EAGLE)
    metrics, _ = predict_pinned(path)
    rows = {r.role: r for r in metrics.isolated}
    inputs = load_inputs(path)
    dep8, dep2 = parse_shape("DEP8"), parse_shape("DEP2")
    step = decode_step(context(inputs, 8, "decode", dep8), dep8, 48, 6000).us
    d = rows["decode"]
    assert d.step_ms == round(step / 1e3, 3) and d.itl_ms == d.step_ms
    assert d.tpot_ms == round(step / 2.5 / 1e3, 3)  # 2.5 tokens emitted per step
    assert d.tokens_per_s_per_user == round(2.5e6 / step, 2)
    # 8 ranks x 48 users, over the 8 GPUs of one instance
    assert d.output_tokens_per_s_per_instance == round(8 * 48 * 2.5e6 / step, 1)
    assert d.output_tokens_per_s_per_gpu == round(48 * 2.5e6 / step, 1)
    cached = int(5000 * 0.4)
    chunk = prefill_step(context(inputs, 4, "prefill", dep2), dep2, 3 * (5000 - cached),
                         5000 - cached, cached)
    p = rows["prefill"]
    assert (p.cached_tokens, p.step_ms) == (cached, round(chunk.us / 1e3, 3))
    assert p.ttft_ms == round((chunk.us + chunk.fill_us) / 1e3, 3)
    assert p.prompt_tokens_per_s_per_gpu == round(3 * 5000 * 1e6 / chunk.us, 1)
    assert p.computed_tokens_per_s_per_gpu == round(3 * (5000 - cached) * 1e6 / chunk.us, 1)


@pytest.fixture(scope="module")
def decode_group(tmp_path_factory):
    """The pinned layout's decode group (its perf context), for sweeps of the point."""
    inputs = load_inputs(_case(tmp_path_factory.mktemp("sweep")))
    layouts = grouped_layouts([("prefill", "DEP2", 64, 16384)] * 2 + [("decode", "DEP8", 64, 0)])
    return inputs, next(g for g in groups(inputs, layouts, workload(inputs))
                        if g.role == "decode")


def test_decode_throughput_per_gpu_rises_with_the_batch(decode_group):
    inputs, g = decode_group
    rates = [phase_alone(inputs, PinnedPoint(1, "decode", "DEP8", b, 8192), g)
             ["output_tokens_per_s_per_gpu"] for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    assert rates == sorted(rates) and len(set(rates)) == len(rates)


def test_tpot_rises_with_the_context(decode_group):
    inputs, g = decode_group
    tpots = [phase_alone(inputs, PinnedPoint(1, "decode", "DEP8", 64, c), g)["tpot_ms"]
             for c in (512, 1024, 2048, 4096, 8192, 16384, 32768)]
    assert tpots == sorted(tpots) and len(set(tpots)) == len(tpots)


def _point_at(tmp_path: Path, batch: int) -> Path:
    return _case(tmp_path / str(batch), decode={"batch_per_rank": batch,
                                                "context_tokens": 32768})


def test_a_batch_whose_kv_does_not_fit_is_refused_naming_the_largest(tmp_path: Path):
    with pytest.raises(CompileError) as info:
        predict_pinned(_point_at(tmp_path, 1024))
    d = info.value.diagnostics[0]
    assert (d.code, d.path, info.value.exit_code) == (
        "E304", "spec.objective.instances[1].operating_point.batch_per_rank", 3)
    most = int(d.expected.split()[2])  # "at most N requests per rank at ..."
    assert 0 < most < 1024 and f"lower batch_per_rank to {most}" in d.hint
    # the named batch is the largest that fits: it predicts, one more is refused
    metrics, _ = predict_pinned(_point_at(tmp_path, most))
    row = next(r for r in metrics.isolated if r.role == "decode")
    assert row.max_batch_per_rank == most and row.kv_gib_per_gpu <= row.kv_cache_gib_per_gpu
    with pytest.raises(CompileError) as info:
        predict_pinned(_point_at(tmp_path, most + 1))
    assert info.value.diagnostics[0].code == "E304"


def test_predict_prints_the_isolated_figures_and_json_carries_them(tmp_path: Path, capsys):
    path = _case(tmp_path, decode={"batch_per_rank": 64, "context_tokens": 8192})
    assert main(["predict", str(path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["isolated"]
    assert [(r["role"], r["shape"], r["batch_per_rank"], r["context_tokens"]) for r in rows] \
        == [("decode", "DEP8", 64, 8192)]
    assert {"step_ms", "tpot_ms", "itl_ms", "tokens_per_s_per_user",
            "output_tokens_per_s_per_gpu", "output_tokens_per_s_per_instance",
            "kv_gib_per_gpu", "kv_cache_gib_per_gpu", "max_batch_per_rank"} <= set(rows[0])
    assert main(["predict", str(path)]) == 0
    text = capsys.readouterr().out
    assert "Phase-isolated: each pinned role alone at its operating point" in text
    assert "decode DEP8 at 64 requests per rank and 8192 tokens of context: step" in text


def test_compile_records_what_predict_says_and_the_report_shows_it(tmp_path: Path):
    path = _case(tmp_path, decode={"batch_per_rank": 32, "context_tokens": 4096},
                 prefill={"batch_per_rank": 2, "context_tokens": 4096})
    fast, _ = predict_pinned(path)
    full = api.compile(path, only=("report",))
    assert full.plan.predicted.isolated == fast.isolated and len(fast.isolated) == 2
    by_role = {i.role: i for i in full.plan.instances}
    assert (by_role["decode"].max_batch, by_role["prefill"].max_batch,
            by_role["prefill"].max_batched_tokens) == (32, 2, 8192)
    plan = yaml.safe_load(full.artifacts["plan.yaml"])
    assert [r["role"] for r in plan["predicted"]["isolated"]] == ["prefill", "decode"]
    report = full.artifacts["report/performance.md"]
    assert "## Phase-isolated" in report and fast.isolated[1].summary() in report
    page = full.artifacts["report/index.html"]
    assert "<h3>Phase-isolated</h3>" in page and escape(fast.isolated[0].summary()) in page


def test_plans_without_a_point_have_no_isolated_block(tmp_path: Path):
    metrics, _ = predict_pinned(_case(tmp_path))
    assert metrics.isolated == [] and "isolated" not in metrics.model_dump()

"""A pinned entry's operating point: the schema's bounds, what it contradicts (each refused at
its field, file:line), and resolve's one record of it (a user decision; the entry's batch
limits where left out)."""

from pathlib import Path

import pytest

from compiler.load import load_inputs
from schemas.diagnostics import CompileError
from tests.builders import write_case

DECODE_POINT = {"batch_per_rank": 64, "context_tokens": 8192}


def _case(tmp_path: Path, prefill: dict | None = None, decode: dict | None = None,
          extra: list[dict] | None = None, serving: dict | None = None) -> Path:
    instances = [{"role": "prefill", "shape": "DEP2", "count": 2, **(prefill or {})},
                 {"role": "decode", "shape": "DEP8", "count": 1, **(decode or {})},
                 *(extra or [])]
    return write_case(tmp_path, hardware={"trays": 6}, workload={"profile": "chat"},
                      objective={"mode": "pinned", "instances": instances}, serving=serving)


def _refused(path: Path) -> list:
    with pytest.raises(CompileError) as info:
        load_inputs(path)
    return info.value.diagnostics


def _line_of(path: Path, text: str, after: int = 0) -> int:
    """The 1-based line of the first occurrence of `text` after line `after`."""
    lines = path.read_text().splitlines()
    return next(k + 1 for k, line in enumerate(lines) if k >= after and text in line)


def test_resolve_records_the_point_as_a_user_decision_and_fills_the_limits(tmp_path: Path):
    path = _case(tmp_path, decode={"operating_point": DECODE_POINT},
                 prefill={"max_batched_tokens": 65536, "operating_point": {
                     "batch_per_rank": 4, "context_tokens": 8192, "cached_share": 0.25}},
                 serving={"speculative": {"method": "eagle3", "draft_tokens": 3,
                                          "acceptance": 2.5}})
    r = load_inputs(path).resolved
    points = {c.value.role: c for c in r.operating_points}
    decode, prefill = points["decode"], points["prefill"]
    assert (decode.path, decode.source) == ("objective.operating_point.decode", "user")
    assert (decode.value.entry, decode.value.shape, decode.value.batch_per_rank,
            decode.value.context_tokens) == (1, "DEP8", 64, 8192)
    assert (prefill.value.cached_tokens, prefill.value.new_tokens) == (2048, 6144)
    pins = {p.role: p for p in r.pins}
    # decode: the batch verifies 1 + 3 tokens per request; prefill keeps the user's budget
    assert (pins["decode"].max_batch, pins["decode"].max_batched_tokens) == (64, 256)
    assert (pins["prefill"].max_batch, pins["prefill"].max_batched_tokens) == (4, 65536)
    decisions = {d.path: d for d in (c.decision() for c in r.choices())}
    assert decisions["objective.operating_point.decode"].value == \
        "DEP8 decode: 64 requests per rank at 8192 tokens of context"


def test_a_cached_share_leaves_at_least_one_token_to_compute(tmp_path: Path):
    path = _case(tmp_path, prefill={"operating_point": {
        "batch_per_rank": 1, "context_tokens": 3, "cached_share": 0.999}})
    point = load_inputs(path).resolved.operating_points[0].value
    assert (point.cached_tokens, point.new_tokens) == (2, 1)


def test_no_point_changes_nothing(tmp_path: Path):
    r = load_inputs(_case(tmp_path)).resolved
    assert r.operating_points == () and all(p.max_batch is None for p in r.pins)


@pytest.mark.parametrize(("point", "field"), [
    ({"batch_per_rank": 0, "context_tokens": 8192}, "batch_per_rank"),
    ({"batch_per_rank": 8, "context_tokens": 8192, "cached_share": 1.0}, "cached_share"),
    ({"batch_per_rank": 8, "context": 8192}, "context"),
])
def test_the_schema_bounds_the_point(tmp_path: Path, point: dict, field: str):
    path = _case(tmp_path, prefill={"operating_point": point})
    found = {(d.code, d.path) for d in _refused(path)}
    prefix = "spec.objective.instances[0].operating_point"
    assert any(p.startswith(prefix) and field in p for _, p in found), found


def test_an_aggregated_entry_takes_no_point(tmp_path: Path):
    objective = {"mode": "pinned", "instances": [
        {"role": "aggregated", "shape": "DEP8", "count": 1, "operating_point": DECODE_POINT}]}
    path = write_case(tmp_path, hardware={"trays": 2}, objective=objective)
    d = _refused(path)[0]
    assert (d.code, d.path, d.line) == ("E105", "spec.objective.instances[0].operating_point",
                                        _line_of(path, "operating_point"))
    assert "interleaves both phases" in d.hint


def test_one_point_per_role(tmp_path: Path):
    path = _case(tmp_path, decode={"operating_point": DECODE_POINT}, extra=[
        {"role": "decode", "shape": "DEP4", "count": 1, "operating_point": dict(DECODE_POINT)}])
    d = _refused(path)[0]
    assert (d.code, d.path) == ("E105", "spec.objective.instances[2].operating_point")
    assert d.got == "a second decode operating point"


def test_the_point_owns_its_shapes_engine_configuration(tmp_path: Path):
    path = _case(tmp_path, decode={"operating_point": DECODE_POINT},
                 extra=[{"role": "decode", "shape": "DEP8", "count": 1}])
    d = _refused(path)[0]
    assert (d.code, d.path) == ("E105", "spec.objective.instances[1].operating_point")
    assert d.got == "also objective.instances[2]"


def test_a_decode_point_has_no_cached_share(tmp_path: Path):
    path = _case(tmp_path, decode={"operating_point": {**DECODE_POINT, "cached_share": 0.5}})
    d = _refused(path)[0]
    assert (d.code, d.path) == ("E105",
                                "spec.objective.instances[1].operating_point.cached_share")
    assert d.line == _line_of(path, "cached_share")


def test_the_context_stays_within_max_model_len(tmp_path: Path):
    path = _case(tmp_path, decode={"operating_point": {"batch_per_rank": 8,
                                                       "context_tokens": 20000}},
                 serving={"max_model_len": 16384})
    d = _refused(path)[0]
    assert (d.code, d.path) == ("E104",
                                "spec.objective.instances[1].operating_point.context_tokens")
    assert d.expected == "at most serving.max_model_len (16384 tokens)"
    assert d.line == _line_of(path, "context_tokens")


@pytest.mark.parametrize(("entry", "expected"), [
    ({"max_batch": 32, "operating_point": DECODE_POINT}, "at most the entry's max_batch (32)"),
    ({"max_batched_tokens": 63, "operating_point": DECODE_POINT},
     "a step within the entry's max_batched_tokens (63)"),
])
def test_the_decode_limits_hold_the_points_step(tmp_path: Path, entry: dict, expected: str):
    d = _refused(_case(tmp_path, decode=entry))[0]
    assert (d.code, d.path, d.expected) == (
        "E104", "spec.objective.instances[1].operating_point.batch_per_rank", expected)


def test_a_prefill_step_holds_its_prompts_uncached_tokens(tmp_path: Path):
    point = {"batch_per_rank": 4, "context_tokens": 8192, "cached_share": 0.5}
    d = _refused(_case(tmp_path, prefill={"max_batched_tokens": 16383,
                                          "operating_point": point}))[0]
    assert d.got == "4 prompts x 4096 uncached tokens = 16384 tokens"
    assert load_inputs(_case(tmp_path / "fits", prefill={
        "max_batched_tokens": 16384, "operating_point": point})).resolved.operating_points
    huge = {"batch_per_rank": 512, "context_tokens": 4096}
    d = _refused(_case(tmp_path / "huge", prefill={"operating_point": huge}))[0]
    assert d.expected == "a step within 1048576 tokens per step (max_batched_tokens' bound)"

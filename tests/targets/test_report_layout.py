"""The report's drawings: no two labels overlap at 1, 16 and 64 racks (the boxes the layout code
computes; tests/targets/test_report_browser.py measures them in Chromium), every GPU of the
plan is drawn with its hover text, and the page is self-contained and deterministic."""

import itertools
import re

import pytest

from compiler.plan import Plan, SloCheck
from targets import _report_memory
from targets._report_curve import curve_svg, nice_ticks
from targets._report_rack import panels, rack_svg
from targets._report_svg import Box, Labels, text_box
from targets.report import emit
from tests.targets.fixtures import EXAMPLE_CASES, compiled_plan

_RACK = re.compile(r"^r(\d+)(-t\d+.*)?$")
_NVL = re.compile(r"^nvl(\d+)$")
_INST = re.compile(r"^(prefill|decode|aggregated)-(\d+)$")
_TEXT = {"why", "value", "path", "node_name", "name", "system", "hf_id", "why_not"}


def _shift(x, k: int, per_role: dict[str, int]):
    """A dumped one-rack plan moved to rack k: rack, NVLink domain and instance ids renamed."""
    if isinstance(x, dict):
        return {_shift(key, k, per_role): v if key in _TEXT else _shift(v, k, per_role)
                for key, v in x.items()}
    if isinstance(x, list):
        return [_shift(v, k, per_role) for v in x]
    if isinstance(x, str):
        if m := _RACK.match(x):
            return f"r{k}{m[2] or ''}"
        if m := _NVL.match(x):
            return f"nvl{k}"
        if m := _INST.match(x):
            return f"{m[1]}-{int(m[2]) + k * per_role[m[1]]:02d}"
    return x


def racks_plan(one: Plan, racks: int) -> Plan:
    """`racks` copies of a one-rack plan, side by side: what a compile of that many identical
    racks places (the solver places identical racks alike)."""
    data = one.model_dump(mode="json")
    per_role = {r: sum(i.role == r for i in one.instances) for r in
                ("prefill", "decode", "aggregated")}
    copies = [_shift(data, k, per_role) for k in range(racks)]
    merged = dict(copies[0])
    [group] = data["hardware"]["groups"]
    trays = [t for c in copies for t in c["hardware"]["groups"][0]["hardware"]["trays"]]
    merged["hardware"] = {"groups": [dict(group, hardware=dict(group["hardware"],
                                                               trays=trays))]}
    merged["instances"] = sorted((i for c in copies for i in c["instances"]),
                                 key=lambda i: i["id"])
    for key in ("memory", "host_memory"):
        merged[key] = {k: v for c in copies for k, v in c[key].items()}
    merged["engram_shards"] = [s for c in copies for s in c["engram_shards"]]
    merged["kv_pool"] = dict(data["kv_pool"], segments=[s for c in copies
                                                        for s in c["kv_pool"]["segments"]])
    return Plan.model_validate(merged)


def _no_overlaps(boxes: list[Box]) -> None:
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            assert not boxes[a].overlaps(boxes[b]), (boxes[a], boxes[b])


@pytest.fixture(scope="module")
def vr64() -> Plan:
    return racks_plan(EXAMPLE_CASES["vr-nvl72-deepseek-v4.1-flash"](), 64)


def _cases(vr64: Plan) -> dict[str, Plan]:
    return {"1 rack": EXAMPLE_CASES["vr-nvl72-deepseek-v4.1-flash"](),
            "16 racks": compiled_plan("vr-nvl72-x16-deepseek-v4.1-flash"),
            "16 HGX nodes": EXAMPLE_CASES["hgx-h200-x16-deepseek-v3"](),
            "64 racks": vr64, "mixed fleet": EXAMPLE_CASES["mixed-gb300-vr-deepseek-v4.1-flash"]()}


@pytest.mark.parametrize("case", ["1 rack", "16 racks", "16 HGX nodes", "64 racks",
                                  "mixed fleet"])
def test_no_label_overlaps_anywhere(case: str, vr64: Plan):
    plan = _cases(vr64)[case]
    for draw in (rack_svg, curve_svg, _report_memory.die_svg, _report_memory.host_svg):
        _, boxes = draw(plan)
        _no_overlaps(boxes)


def test_every_panel_has_its_title_and_every_gpu_its_hover_text(vr64: Plan):
    text, _ = rack_svg(vr64)
    assert len(panels(vr64)) == 64
    titles = re.findall(r"<text[^>]*font-weight=\"bold\"[^>]*>([^<]*)</text>", text)
    assert titles == [t for t, _, _ in panels(vr64)]
    gpus = {g for t in vr64.hardware.trays for g in t.gpus}
    hovered = set(re.findall(r"<g><title>([^:]+):", text))
    assert hovered == gpus and len(gpus) == 64 * 72


def test_a_small_rack_names_its_trays_and_instances():
    plan = EXAMPLE_CASES["vr-nvl72-deepseek-v4.1-flash"]()
    text, _ = rack_svg(plan)
    written = set(re.findall(r"<text[^>]*>([^<]*)</text>", text))
    assert {t.id for t in plan.hardware.trays} <= written
    assert {i.id for i in plan.instances} <= written


def test_labels_refuse_overlap_and_measure_anchors():
    labels = Labels()
    assert labels.place(10, 20, "decode-00", 10)
    assert not labels.place(14, 22, "prefill-01", 10)  # on top of the first
    assert labels.place(10, 40, "prefill-01", 10)  # a row below
    assert text_box(100, 20, "abcd", 10, "end").x == pytest.approx(100 - 4 * 10 * 0.62)
    assert text_box(100, 20, "abcd", 10, "middle").x == pytest.approx(100 - 2 * 10 * 0.62)


@pytest.mark.parametrize("lo,hi", [(0, 1), (0, 463), (0, 343_697), (0, 7.3), (0, 20)])
def test_ticks_cover_the_range_in_round_steps(lo: float, hi: float):
    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 4 <= len(ticks) <= 12
    step = ticks[1] - ticks[0]
    assert all(abs((b - a) - step) < 1e-6 * step for a, b in itertools.pairwise(ticks))


def _with_slo(plan: Plan, *checks: SloCheck) -> Plan:
    return plan.model_copy(update={"predicted": plan.predicted.model_copy(
        update={"slo": list(checks)})})


def test_the_curve_shows_both_percentiles_the_slo_and_the_operating_point():
    plan = _with_slo(EXAMPLE_CASES["hgx-h200-deepseek-v3"](),
                     SloCheck(field="slo.tokens_per_s_per_user_p90", target=20.0,
                              predicted=37.98, met=True),
                     SloCheck(field="slo.ttft_ms_p90", target=2000.0, predicted=2000.0,
                              met=True))
    text, boxes = curve_svg(plan)
    _no_overlaps(boxes)
    assert text.count("<polyline") == 2
    assert "SLO P90 20" in text and "SLO P50" not in text  # TTFT has no line here
    assert "operating point" in text and "(P90)" in text and "(P50)" in text


def test_a_missed_slo_comes_first_in_the_report():
    plan = _with_slo(EXAMPLE_CASES["hgx-h200-deepseek-v3"](),
                     SloCheck(field="slo.tokens_per_s_per_user_p90", target=50.0,
                              predicted=37.98, met=False))
    page = emit(plan)["report/index.html"]
    miss = page.index("SLO missed")
    assert page.index('id="warnings"') < miss < page.index('id="decision"')
    assert "slo.tokens_per_s_per_user_p90 is predicted at 37.98" in page
    assert "| slo.tokens_per_s_per_user_p90 | 50 | 37.98 | missed |" in \
        emit(plan)["report/performance.md"]


def test_the_page_is_self_contained_and_deterministic():
    plan = EXAMPLE_CASES["hgx-h200-deepseek-v3"]()
    first, again = emit(plan), emit(plan)
    assert first == again
    page = first["report/index.html"]
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    for key in ("warnings", "decision", "rack", "memory", "curve", "explain", "breakdown"):
        assert f'<section id="{key}">' in page
    assert page.index('id="warnings"') < page.index('id="decision"')

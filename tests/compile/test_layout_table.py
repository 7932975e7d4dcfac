"""The decision table of whole layouts (plan solver.layouts): the chosen row is the plan's own
prediction, every other row is the one prediction of its layout, the Pareto marks match a
brute-force dominance check, and each re-solve leaves out what it says."""

from dataclasses import replace
from pathlib import Path

import pytest

from compiler import prediction, routes
from compiler.graph import build_graph
from compiler.load import load_fleet
from compiler.precheck import precheck
from compiler.solve.build import build_problem
from compiler.solve.counts import solve_counts
from compiler.solve.layouts import alternatives, shape_sets
from compiler.solve.problem import Kept

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hgx-h200-deepseek-v3"


@pytest.fixture(scope="module")
def compiled(compiled_example):
    return compiled_example(EXAMPLE.name)


@pytest.fixture(scope="module")
def problem():
    inputs = load_fleet(EXAMPLE / "deployment.yaml")[0]
    g = build_graph(inputs)
    p = build_problem(inputs, g, precheck(inputs, g))
    return inputs, p, solve_counts(p)


def _key(row):
    return sorted((g.role, g.shape, g.count) for g in row.instances)


def test_chosen_row_is_the_plans_layout_and_prediction(compiled):
    chosen = [r for r in compiled.solver.layouts if r.chosen]
    assert len(chosen) == 1 and compiled.solver.layouts[0] is chosen[0]
    mine = {}
    for i in compiled.instances:
        mine[i.role, i.shape] = mine.get((i.role, i.shape), 0) + 1
    assert _key(chosen[0]) == sorted((r, s, n) for (r, s), n in mine.items())
    p = compiled.predicted
    assert (chosen[0].ttft_ms_p90, chosen[0].tokens_per_s_per_user_p90, chosen[0].tpot_ms_p50) \
        == (p.ttft_ms_p90, p.tokens_per_s_per_user_p90, p.tpot_ms_p50)
    assert chosen[0].why.startswith("chosen")


def test_rows_are_distinct_layouts_with_both_modes(compiled):
    rows = compiled.solver.layouts
    assert len(rows) >= 2
    assert len({tuple(map(tuple, _key(r))) for r in rows}) == len(rows)
    assert {r.mode for r in rows} == {"disaggregated", "aggregated"}  # layout: any


def test_pareto_marks_match_brute_force(compiled):
    rows = compiled.solver.layouts

    def dominates(a, b):
        ge = (a.goodput >= b.goodput and a.tokens_per_s_per_user_p90
              >= b.tokens_per_s_per_user_p90 and a.ttft_ms_p90 <= b.ttft_ms_p90)
        return ge and (a.goodput, a.tokens_per_s_per_user_p90, -a.ttft_ms_p90) != \
            (b.goodput, b.tokens_per_s_per_user_p90, -b.ttft_ms_p90)

    for r in rows:
        assert r.pareto == (not any(dominates(q, r) for q in rows if q is not r))


def test_other_rows_are_the_one_prediction_of_their_layout(problem):
    inputs, p, counts = problem
    available = sum(len(d.trays) * d.gpus_per_tray for d in p.domains)
    alts = alternatives(p, counts)
    assert alts
    for alt in alts:
        layouts = routes.one_route(inputs, ((c.role, c.shape.name, c.max_batch,
                                             c.max_batched_tokens)
                                            for i, n in sorted(alt.by_candidate.items())
                                            for c in [p.candidates[i]] * n))
        metrics = prediction.predict(inputs, layouts, available, with_curve=False)
        full = prediction.predict(inputs, layouts, available)
        assert metrics.ttft_ms_p90 == full.ttft_ms_p90 and not metrics.curve and full.curve
        assert alt.goodput <= counts.objective + 1e-9  # the chosen layout is the optimum


def test_each_resolve_leaves_out_what_it_names(problem):
    _, p, counts = problem
    sets = shape_sets(p, counts)
    named = {w for w, _ in sets}
    for i in counts.by_candidate:
        c = p.candidates[i]
        assert f"{c.role} {c.shape.name}" in named
    for alt in alternatives(p, counts):
        only = dict(sets)[alt.without]
        assert set(alt.by_candidate) <= only
        assert alt.by_candidate != counts.by_candidate


def test_no_alternatives_when_pinned_or_kept(problem):
    _, p, counts = problem
    assert alternatives(replace(p, mode="pinned"), counts) == []
    kept = Kept("decode-00", "decode", p.candidates[0].shape, ("r0-t00-g0",))
    assert alternatives(replace(p, kept=[kept]), counts) == []

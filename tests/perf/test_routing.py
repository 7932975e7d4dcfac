"""Routing expectations: exact on cases small enough to count by hand."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.perf import routing
from compiler.perf.routing import padded_rows, rank_imbalance


def test_rank_imbalance_counts_the_busiest_rank():
    # two ranks, each Binomial(2, 1/2) (0, 1, 2 with 1/4 1/2 1/4), taken as independent:
    # P(max > 0) = 1 - 1/16, P(max > 1) = 1 - 9/16 -> E[max] 1.375 over a mean of 1
    assert rank_imbalance(2, 2) == pytest.approx(1.375)
    assert rank_imbalance(100, 1) == 1.0


def test_rank_imbalance_fades_with_load():
    assert rank_imbalance(48, 32) > rank_imbalance(4800, 32) > rank_imbalance(480_000, 32) > 1


def test_padded_rows_is_whole_tiles_of_poisson_tokens():
    lam = 0.3  # at most one tile unless X > 64: P(X > 0) tiles
    assert padded_rows(lam, 64) == pytest.approx(64 * (1 - math.exp(-lam)), rel=1e-9)
    assert padded_rows(5.0, 1) == 5.0


@settings(max_examples=30, deadline=None)
@given(t=st.floats(0.01, 8000), tile=st.sampled_from([64, 128]))
def test_padded_rows_bounds(t, tile):
    rows = padded_rows(t, tile)
    assert t <= rows + 1e-6 <= t + tile + 1e-6 or rows <= tile
    assert padded_rows(t * 1.1, tile) >= rows - 1e-6


def test_full_budgets_are_balanced():
    """Ranks that all fill their budget (demand at the cap) wait for nobody; the penalty
    shrinks as the load nears the cap and grows with the ranks."""
    assert routing.busiest_of_capped(4.0, 4, 8) == 1.0
    assert routing.busiest_of_capped(0.0, 4, 8) == 1.0
    assert routing.busiest_of_capped(2.0, 4, 1) == 1.0
    light, heavy = (routing.busiest_of_capped(d, 4, 2) for d in (0.5, 3.8))
    assert light > heavy > 1.0
    assert routing.busiest_of_capped(2.0, 4, 16) > routing.busiest_of_capped(2.0, 4, 2)


def test_a_light_load_is_poisson_busiest():
    """Far below the cap the capped backlog is a plain Poisson count: E[max]/mean of two
    Poisson(0.01) is about 2 (one rank has the lone prompt)."""
    assert routing.busiest_of_capped(0.01, 64, 2) == pytest.approx(2.0, rel=0.02)

"""What random top-k routing does to expert-parallel MoE work, as exact expectations.

* Rank imbalance: each routed copy of a token lands on one of `ranks` expert-parallel ranks
  (uniform routing, experts spread evenly), so a rank's load is Binomial(copies, 1/ranks); the
  step waits for the busiest rank, E[max] over the ranks, with the ranks' loads taken as
  independent (the multinomial's negative correlation vanishes as the ranks grow).
* Tile quantisation: a grouped GEMM computes each expert's rows in M tiles (DeepGEMM: 128-row
  segments in the contiguous layout of prefill, 64- or 128-row blocks in the masked layout of
  decode), so an expert that receives X tokens costs ceil(X / tile) tiles; with X Poisson.
"""

import functools
import math

SPAN_SIGMAS = 12.0  # pmf terms beyond mean +- 12 sigma are below 1e-30


NORMAL_FROM_MEAN = 400.0  # beyond this many copies per rank the binomial is normal to <0.1%


def _binomial_cdf_terms(n: int, p: float) -> tuple[int, list[float]]:
    """(first k, CDF values from there) of Binomial(n, p) over its non-negligible range."""
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    lo = max(0, int(mean - SPAN_SIGMAS * sd) - 1)
    hi = min(n, int(mean + SPAN_SIGMAS * sd) + 2)
    ratio = p / (1 - p)
    pmf = math.exp(math.lgamma(n + 1) - math.lgamma(lo + 1) - math.lgamma(n - lo + 1)
                   + lo * math.log(p) + (n - lo) * math.log1p(-p))
    cdf, total = [], 0.0
    for k in range(lo, hi + 1):
        total += pmf
        cdf.append(min(1.0, total))
        pmf *= (n - k) / (k + 1) * ratio
    return lo, cdf


@functools.lru_cache(maxsize=256)
def _normal_max(ranks: int) -> float:
    """E[max of `ranks` independent standard normals], by the trapezoid rule on
    E[max] = integral of (1[x > 0] - P(max <= x)) dx."""
    dx, total = 4e-3, 0.0
    for i in range(-2000, 2001):
        x = i * dx
        below = (0.5 * math.erfc(-x / math.sqrt(2))) ** ranks
        total += ((1.0 if x > 0 else 0.0) - below) * dx
    return total


@functools.lru_cache(maxsize=4096)
def _rank_imbalance(copies: int, ranks: int) -> float:
    p = 1.0 / ranks
    mean = copies * p
    if mean > NORMAL_FROM_MEAN:
        return 1.0 + math.sqrt(copies * p * (1 - p)) * _normal_max(ranks) / mean
    lo, cdf = _binomial_cdf_terms(copies, p)
    # E[max] = sum_k P(max > k) = lo + sum_{k >= lo} (1 - F(k)^ranks)
    expected_max = lo + sum(1.0 - f ** ranks for f in cdf)
    return max(1.0, expected_max / mean)


def rank_imbalance(copies: float, ranks: int) -> float:
    """Busiest rank's expected share of `copies` routed copies over the mean share."""
    if ranks <= 1 or copies <= 0:
        return 1.0
    return _rank_imbalance(max(1, round(copies)), ranks)


def busiest_of_capped(demand: float, cap: int, ranks: int) -> float:
    """How much longer the busiest of `ranks` data-parallel ranks works in a step than the
    average one, when each rank takes at most `cap` pieces of work per step (prompt chunks
    within its token budget) and holds `demand` pieces per step on average. A rank's backlog
    is taken as Poisson(m), m solved so that E[min(K, cap)] = demand, and it works
    min(K, cap); E[max] over the ranks over the mean. Ranks that all fill their budget
    (demand at the cap) lose nothing; a light load tends to E[max]/mean of Poisson counts."""
    if ranks <= 1 or demand <= 0:
        return 1.0
    cap = max(1, int(cap))
    if demand >= cap:
        return 1.0
    return _busiest_of_capped(round(demand * 1000), cap, ranks)


def _capped_sums(m: float, cap: int, ranks: int) -> tuple[float, float]:
    """(E[min(K, cap)], E[max over ranks of min(K, cap)]) for K ~ Poisson(m)."""
    term = cdf = math.exp(-m)
    mean = busiest = 0.0
    last = min(cap, int(m + SPAN_SIGMAS * math.sqrt(m)) + 12)  # P(K > k) ~ 0 beyond
    for k in range(last):  # E[min(K, c)] = sum_{k < c} P(K > k)
        f = min(1.0, cdf)
        mean += 1.0 - f
        busiest += 1.0 - f ** ranks
        term *= m / (k + 1)
        cdf += term
    return mean, busiest


@functools.lru_cache(maxsize=4096)
def _busiest_of_capped(demand_milli: int, cap: int, ranks: int) -> float:
    demand = demand_milli / 1000
    lo, hi = 0.0, max(4.0 * cap, demand + SPAN_SIGMAS * math.sqrt(cap) + cap)
    if demand > NORMAL_FROM_MEAN:  # many pieces per step: the normal limit, capped
        sd = math.sqrt(demand)
        return min(1.0 + _normal_max(ranks) * sd / demand, cap / demand)
    for _ in range(60):  # E[min(K, cap)] grows with m
        m = (lo + hi) / 2
        lo, hi = (m, hi) if _capped_sums(m, cap, ranks)[0] < demand else (lo, m)
    mean, busiest = _capped_sums((lo + hi) / 2, cap, ranks)
    return max(1.0, busiest / max(mean, 1e-12))


@functools.lru_cache(maxsize=4096)
def _padded_rows(mean_milli: int, tile: int) -> float:
    lam = mean_milli / 1000
    if lam > NORMAL_FROM_MEAN:  # X ~ N(lam, lam): E[ceil(X / tile)] = sum_j P(X > j * tile)
        sd = math.sqrt(lam)
        first = max(0, int((lam - SPAN_SIGMAS * sd) / tile))
        last = int((lam + SPAN_SIGMAS * sd) / tile) + 1
        tiles = first + sum(0.5 * math.erfc((j * tile + 0.5 - lam) / (sd * math.sqrt(2)))
                            for j in range(first, last + 1))
        return tiles * tile
    hi = int(lam + SPAN_SIGMAS * math.sqrt(lam) + tile) + 1
    # E[ceil(X / tile)] over X ~ Poisson(lam), the pmf by its recurrence p(k) = p(k-1) lam / k
    term, tiles = math.exp(-lam), 0.0
    for k in range(1, hi + 1):
        term *= lam / k
        tiles += term * -(-k // tile)
    return tiles * tile


def padded_rows(mean_tokens: float, tile: int) -> float:
    """Expected rows an expert's GEMM computes when it receives Poisson(`mean_tokens`) tokens
    in `tile`-row M tiles (an expert with no token costs nothing)."""
    if tile <= 1 or mean_tokens <= 0:
        return max(0.0, mean_tokens)
    if mean_tokens > 50 * tile:  # the residue is near uniform: half a tile on average
        return mean_tokens + tile / 2
    return _padded_rows(round(mean_tokens * 1000), tile)

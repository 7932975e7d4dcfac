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


def busiest_of_poisson(mean: float, ranks: int) -> float:
    """E[max] over `ranks` independent Poisson(`mean`) counts, over `mean`: how much longer
    the busiest of ranks that synchronise every step works than the average one."""
    if ranks <= 1 or mean <= 0:
        return 1.0
    return _busiest_of_poisson(round(mean * 1000), ranks)


@functools.lru_cache(maxsize=4096)
def _busiest_of_poisson(mean_milli: int, ranks: int) -> float:
    lam = max(mean_milli, 1) / 1000
    if lam > NORMAL_FROM_MEAN:
        return 1.0 + _normal_max(ranks) / math.sqrt(lam)
    hi = int(lam + SPAN_SIGMAS * math.sqrt(lam)) + 12
    term = cdf = math.exp(-lam)
    expected_max = 0.0
    for k in range(hi + 1):  # E[max] = sum_k P(max > k)
        expected_max += 1.0 - min(1.0, cdf) ** ranks
        term *= lam / (k + 1)
        cdf += term
    return max(1.0, expected_max / lam)


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
    log_lam = math.log(lam)
    # E[ceil(X / tile)] over X ~ Poisson(lam)
    tiles = sum(math.exp(k * log_lam - lam - math.lgamma(k + 1)) * math.ceil(k / tile)
                for k in range(1, hi + 1))
    return tiles * tile


def padded_rows(mean_tokens: float, tile: int) -> float:
    """Expected rows an expert's GEMM computes when it receives Poisson(`mean_tokens`) tokens
    in `tile`-row M tiles (an expert with no token costs nothing)."""
    if tile <= 1 or mean_tokens <= 0:
        return max(0.0, mean_tokens)
    if mean_tokens > 50 * tile:  # the residue is near uniform: half a tile on average
        return mean_tokens + tile / 2
    return _padded_rows(round(mean_tokens * 1000), tile)

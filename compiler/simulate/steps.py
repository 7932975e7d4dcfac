"""Step times from the perf model `rackc predict` uses (compiler.perf.step), memoised.

The engine asks for thousands of steps per simulated second; each answer is the perf model's
own at a bucketed operating point (batch and tokens rounded to a geometric grid of 1/8 octave,
at most about 4% off; the decode context interpolated between half-octave points), so the
simulator and the closed form share one model and the simulator stays fast.
"""

import functools
import math

from compiler.perf.step import PerfContext, decode_step, prefill_step
from compiler.shapes import Shape

GRID = 8  # buckets per octave
KV_GRID = 2  # context grid points per octave, interpolated between
ATTENTION_KEYS = ("attention", "indexer", "attn_proj")  # per-rank work under DP attention


def bucket(x: float) -> float:
    """`x` rounded to the geometric grid (exact below 16, where steps are integers)."""
    if x <= 16:
        return float(max(1, round(x)))
    return 2 ** (round(math.log2(x) * GRID) / GRID)


class StepTimes:
    """One instance group's step times (us) under its shape and perf context."""

    def __init__(self, ctx: PerfContext, shape: Shape) -> None:
        self.ctx, self.shape = ctx, shape
        self._decode = functools.lru_cache(maxsize=None)(self._decode_parts)
        self._prefill = functools.lru_cache(maxsize=None)(self._prefill_parts)

    def _decode_parts(self, batch: float, kv_len: float) -> tuple[float, float]:
        st = decode_step(self.ctx, self.shape, batch, kv_len)
        return st.us, sum(st.breakdown.get(k, 0.0) for k in ATTENTION_KEYS)

    def _prefill_parts(self, tokens: float, new: float, cached: float) -> tuple[float, float]:
        st = prefill_step(self.ctx, self.shape, max(1, round(tokens)), new, cached)
        return st.us, st.fill_us

    def decode_us(self, mean_batch: float, max_batch: int, kv_len: float) -> float:
        """A decode step of the instance: its MoE and collectives at the ranks' mean batch,
        the attention of its busiest rank (data-parallel attention ranks meet at every MoE
        layer, so the step lasts as long as the busiest one's attention). Linear in the
        context between grid points (attention reads grow linearly with it)."""
        b = bucket(max(mean_batch, 1.0))
        lo, hi, f = _between(max(kv_len, 1.0))
        us_lo, attn_lo = self._decode(b, lo)
        us_hi, attn_hi = self._decode(b, hi)
        us = us_lo + f * (us_hi - us_lo)
        if max_batch > mean_batch + 0.5:
            top = bucket(max_batch)
            _, a_lo = self._decode(top, lo)
            _, a_hi = self._decode(top, hi)
            us += a_lo + f * (a_hi - a_lo) - (attn_lo + f * (attn_hi - attn_lo))
        return us

    def prefill_us(self, tokens: float, new_per_seq: float, cached_per_seq: float
                   ) -> tuple[float, float]:
        """(step us, pipeline fill us) of a chunk of `tokens` per DP rank (the busiest's)."""
        return self._prefill(bucket(tokens), bucket(max(new_per_seq, 1.0)),
                             bucket(cached_per_seq) if cached_per_seq >= 1 else 0.0)


def _between(x: float) -> tuple[float, float, float]:
    """The grid points of KV_GRID per octave around `x`, and x's share of the way up."""
    e = math.log2(x) * KV_GRID
    lo_e = math.floor(e)
    lo, hi = 2 ** (lo_e / KV_GRID), 2 ** ((lo_e + 1) / KV_GRID)
    return lo, hi, (x - lo) / (hi - lo)

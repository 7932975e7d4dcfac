"""The simulated figures of a plan (`predicted.simulated`) beside the closed-form ones, row by
row: what `rackc predict` prints and the report shows, in one place. Whether a row disagrees
is the compile-time run's own verdict (`Simulated.disagrees`, more than
`runner.DISAGREE_SHARE` apart)."""

import math
from dataclasses import dataclass

from compiler.plan import Predicted
from compiler.simulate.window import WARM_SHARE

TURNOVERS = math.ceil(1 / WARM_SHARE)  # a run this many times what is in flight skips a whole
# turnover as warm-up, so its steady state starts with the decode batches full

# (label, simulated field, its percentile or None, the closed-form field or None)
ROWS = (("TTFT P50 (ms)", "ttft_ms", "p50", "ttft_ms_p50"),
        ("TTFT P90 (ms)", "ttft_ms", "p90", "ttft_ms_p90"),
        ("TTFT P99 (ms)", "ttft_ms", "p99", None),
        ("TPOT P50 (ms)", "tpot_ms", "p50", "tpot_ms_p50"),
        ("TPOT P90 (ms)", "tpot_ms", "p90", None),
        ("ITL P50 (ms)", "itl_ms", "p50", None),
        ("ITL P99 (ms)", "itl_ms", "p99", None),
        ("E2E P50 (ms)", "e2e_ms", "p50", None),
        ("E2E P99 (ms)", "e2e_ms", "p99", None),
        ("tokens/s per user P50", "tokens_per_s_per_user_p50", None,
         "tokens_per_s_per_user_p50"),
        ("tokens/s per user P90", "tokens_per_s_per_user_p90", None,
         "tokens_per_s_per_user_p90"),
        ("requests/s", "requests_per_s", None, "requests_per_s"),
        ("prefix hit rate", "prefix_hit_rate", None, "prefix_hit_rate"))

WHY = ("where they disagree the simulation holds what the closed form averages or bounds away "
       "(queues of whole requests rather than M/M/1 over full chunks, DP ranks stepping in "
       "lockstep, each request decoding on its own rank rather than at the slowest group's "
       "step, KV loads and hand-offs on shared links, a short run's warm-up); "
       "docs/simulate.md says why for each figure")


@dataclass(frozen=True)
class Row:
    label: str
    simulated: float | None
    closed: float | None  # None: the closed form has no such figure
    disagrees: bool


def rows(p: Predicted) -> list[Row]:
    """The side-by-side rows of a prediction with a simulated run (empty without one)."""
    s = p.simulated
    if s is None:
        return []
    sim, closed = s.model_dump(mode="json"), p.model_dump(mode="json")
    return [Row(label, sim[key][q] if q else sim[key],
                closed.get(closed_key) if closed_key else None, closed_key in s.disagrees)
            for label, key, q, closed_key in ROWS]


def start_up(p: Predicted) -> str | None:
    """Why a simulated run's figures still hold its start-up, or None when they do not: a run
    shorter than TURNOVERS times the requests in flight (Little's law: the closed form's
    request rate times the simulated median latency) counts its steady state while the decode
    batches still fill, so its requests/s and TPOT read low. (On the Vera Rubin example, 1,500
    Poisson requests give 737 requests/s and a 1.90 ms TPOT where 30,000 give 1,737 and 2.33;
    the closed form: 1,758.6 and 2.32.)"""
    s = p.simulated
    if s is None or s.e2e_ms.p50 is None:
        return None
    in_flight = p.requests_per_s * s.e2e_ms.p50 / 1e3
    if s.requests >= TURNOVERS * in_flight:
        return None
    # twice the threshold: the short run's own latency is a start-up figure too, lower than
    # the steady state's (VR: 7,000 requests still read 13.5% low on requests/s, 14,000 4.6%)
    need = 1000 * math.ceil(2 * TURNOVERS * in_flight / 1000)
    return (f"the run ({s.requests} requests) is shorter than {TURNOVERS} turnovers of the "
            f"about {round(in_flight)} requests in flight at the closed form's rate, so its "
            f"figures still hold the start-up (decode batches filling: requests/s and TPOT "
            f"read low); `rackc simulate --requests {need}` gives the steady state")

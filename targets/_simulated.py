"""The report's simulated section: `rackc compile`'s short request-by-request run
(plan.prediction.simulated) beside the closed-form figures, and where they disagree."""

from compiler.plan import Plan

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


def simulated_md(plan: Plan) -> list[str]:
    p = plan.prediction
    s = p.simulated if p is not None else None
    if s is None:
        return []
    sim = s.model_dump(mode="json")
    closed = p.model_dump(mode="json")
    lines = ["", "## Simulated beside closed form", "",
             f"{s.requests} requests ({s.workload} arrivals, routing `{s.policy}`, seed "
             f"{s.seed}) replayed request by request by `rackc simulate`, steady state only.", "",
             "| metric | simulated | closed form | disagree (>10%) |", "|---|---|---|---|"]
    for label, key, q, closed_key in ROWS:
        value = sim[key][q] if q else sim[key]
        other = closed.get(closed_key) if closed_key else None
        flag = "yes" if closed_key in s.disagrees else ""
        lines.append(f"| {label} | {_num(value)} | {_num(other)} | {flag} |")
    if s.disagrees:
        lines += ["", "Where they disagree the simulation holds what the closed form averages "
                      "away (queues of whole requests rather than M/M/1 over full chunks, DP "
                      "ranks stepping in lockstep, KV loads and hand-offs on shared links); "
                      "docs/simulate.md says why for each figure."]
    return lines


def _num(x: object) -> str:
    return "" if x is None else f"{x:g}"

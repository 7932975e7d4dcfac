"""Metrics of a simulated run: latency percentiles, goodput at the SLO, hit rate and pool
occupancy over time, per-rank load, queues; text and plots.

Steady state: the requests issued in the middle of the run (from WARM_SHARE to
1 - COOL_SHARE of them in issue order), past the first burst of a closed loop and before the
last requests drain with fewer in flight."""

import math

import numpy as np

from compiler.simulate.engine import Outcome
from compiler.simulate.window import COOL_SHARE, WARM_SHARE
from compiler.simulate.workload import Requests

BINS = 20  # time bins for hit rate and pool occupancy
QUANTILES = (50, 90, 99)


def _pct(x: np.ndarray) -> dict[str, float | None]:
    x = x[np.isfinite(x)]
    if not len(x):
        return {f"p{q}": None for q in QUANTILES}
    return {f"p{q}": round(float(np.percentile(x, q)), 3) for q in QUANTILES}


def _weighted_pct(values: list[float], weights: list[int]) -> dict[str, float | None]:
    if not values:
        return {f"p{q}": None for q in QUANTILES}
    v, w = np.asarray(values), np.asarray(weights, dtype=float)
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    out = {}
    for q in QUANTILES:
        k = int(np.searchsorted(cum, q / 100 * cum[-1]))
        out[f"p{q}"] = round(float(v[order][min(k, len(v) - 1)]) / 1e3, 3)
    return out


def summarise(out: Outcome, w: Requests, slo: dict[str, float], gpus: int) -> dict:
    """The run's metrics as plain data (rounded: byte-identical JSON for a seed)."""
    n = len(w)
    lo, hi = int(n * WARM_SHARE), max(int(n * (1 - COOL_SHARE)), int(n * WARM_SHARE) + 1)
    ok = out.lost == 0
    win = np.zeros(n, dtype=bool)
    win[lo:hi] = True
    win &= ok
    ttft = (out.first_us - out.issued_us) / 1e3
    e2e = (out.done_us - out.issued_us) / 1e3
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(w.osl > 1, (out.done_us - out.first_us) / np.maximum(w.osl - 1, 1)
                        / 1e3, np.nan)
        rate = 1e3 / tpot
    t0, t1 = _span(out, w, e2e, win, lo, hi)
    span_s = (t1 - t0) / 1e6
    in_span = ok & (out.done_us >= t0) & (out.done_us < t1)
    per_s = in_span.sum() / span_s if span_s > 0 else 0.0
    meets = _meets(slo, ttft, rate) & in_span
    out_tokens = float(w.osl[in_span].sum()) / span_s if span_s > 0 else 0.0
    hit = float(out.cached[win].sum() / max(1, w.isl[win].sum()))
    return {
        "requests": n,
        "finished": int(ok.sum()),
        "lost_to_faults": int((out.lost == 1).sum()),
        "too_long_for_kv": int((out.lost == 2).sum()),
        "retried": int((out.retries > 0).sum()),
        "preemptions": out.preemptions,
        "simulated_s": round(out.end_us / 1e6, 3),
        "steady_state": {"requests": int(win.sum()), "from_request": lo, "to_request": hi},
        "ttft_ms": _pct(ttft[win]),
        "tpot_ms": _pct(tpot[win]),
        "itl_ms": _weighted_pct(out.itl_us, out.itl_weight),
        "e2e_ms": _pct(e2e[win]),
        "tokens_per_s_per_user": {"p50": _round(np.nanpercentile(rate[win], 50)),
                                  "p90": _round(np.nanpercentile(rate[win], 10))}
        if np.isfinite(rate[win]).any() else {"p50": None, "p90": None},
        "requests_per_s": round(float(per_s), 3),
        "output_tokens_per_s_per_gpu": round(out_tokens / max(1, gpus), 1),
        "goodput_requests_per_s": round(float(meets.sum() / span_s), 3) if span_s > 0 else 0.0,
        "slo": slo,
        "prefix_hit_rate": round(hit, 4),
        "prefix_hit_rate_over_time": _over_time(out, w, ok),
        "ranks": _ranks(out),
        "queues": _queues(out),
        "pool_occupancy_over_time": _pool(out),
        "kv_peak_share": round(out.peak_kv_share, 4),
        "faults": out.faults,
    }


def _span(out: Outcome, w: Requests, e2e: np.ndarray, win: np.ndarray, lo: int, hi: int
          ) -> tuple[float, float]:
    """When the steady state's completions fall: its issue span (from the `lo`-th to the
    `hi`-th issue in time), shifted by the median latency (what was issued then finishes about
    that much later). A closed loop holds all its clients in flight only until the first of
    them has sent its last request and seen it done: the span ends there at the latest. (In a
    closed loop request k * clients + c is client c's k-th, whose issue time spreads over
    seconds as the clients' latencies add up, so no one request's time bounds the span.)"""
    lag = float(np.nanmedian(e2e[win])) * 1e3 if win.any() else 0.0
    issued = np.sort(out.issued_us)
    t0, t1 = float(issued[lo]) + lag, float(issued[min(hi, len(issued) - 1)]) + lag
    if len(w.client) and (w.client >= 0).all():
        done = np.where(out.lost == 0, out.done_us, np.inf)
        last_done = np.full(int(w.client.max()) + 1, -np.inf)
        np.maximum.at(last_done, w.client, done)
        t1 = min(t1, float(last_done.min()))
    return t0, t1


def _round(x: float) -> float | None:
    return round(float(x), 3) if math.isfinite(x) else None


def _meets(slo: dict[str, float], ttft: np.ndarray, rate: np.ndarray) -> np.ndarray:
    ok = np.isfinite(ttft)
    if "ttft_ms" in slo:
        ok &= ttft <= slo["ttft_ms"]
    if "tokens_per_s_per_user" in slo:
        ok &= ~(rate < slo["tokens_per_s_per_user"])  # one-token answers have no rate
    return ok


def _over_time(out: Outcome, w: Requests, ok: np.ndarray) -> list[dict]:
    t = out.issued_us
    good = ok & np.isfinite(t)
    if not good.any():
        return []
    edges = np.linspace(0.0, float(t[good].max()) + 1.0, BINS + 1)
    which = np.clip(np.searchsorted(edges, t[good], side="right") - 1, 0, BINS - 1)
    cached = np.bincount(which, weights=out.cached[good], minlength=BINS)
    isl = np.bincount(which, weights=w.isl[good], minlength=BINS)
    return [{"t_s": round(float(edges[b]) / 1e6, 3),
             "hit_rate": round(float(cached[b] / isl[b]), 4) if isl[b] else None}
            for b in range(BINS)]


def _ranks(out: Outcome) -> dict:
    by_role: dict[str, list[float]] = {}
    for r in out.ranks:
        by_role.setdefault(r["role"], []).append(r["busy_us"] / out.end_us
                                                 if out.end_us else 0.0)
    samples = out.samples
    idle = {"prefill": 4, "decode": 5}
    res = {}
    for role, u in sorted(by_role.items()):
        key = "prefill" if role in ("prefill", "aggregated") else "decode"
        counts = [s[idle[key]] for s in samples]
        res[role] = {"ranks": len(u), "utilisation_mean": round(float(np.mean(u)), 4),
                     "utilisation_min": round(float(np.min(u)), 4),
                     "utilisation_max": round(float(np.max(u)), 4),
                     "idle_while_another_queues_share": round(
                         float(np.mean(counts)) / len(u), 4) if counts else 0.0}
    res["per_rank"] = [{"instance": r["instance"], "rank": r["rank"],
                        "utilisation": round(r["busy_us"] / out.end_us, 4)
                        if out.end_us else 0.0} for r in out.ranks]
    return res


def _queues(out: Outcome) -> dict:
    if not out.samples:
        return {}
    pre = np.array([s[1] for s in out.samples], dtype=float)
    dec = np.array([s[2] for s in out.samples], dtype=float)
    return {"prefill_mean": round(float(pre.mean()), 2), "prefill_max": int(pre.max()),
            "decode_waiting_mean": round(float(dec.mean()), 2),
            "decode_waiting_max": int(dec.max())}


def _pool(out: Outcome) -> list[dict]:
    s = out.samples
    if not s:
        return []
    step = max(1, len(s) // BINS)
    return [{"t_s": round(x[0] / 1e6, 3), "used_share": round(x[3], 4)} for x in s[::step]]


def compare_table(results: dict[str, dict]) -> list[str]:
    """One row per routing policy: the figures that tell them apart."""
    head = ("policy", "TTFT P50 ms", "TTFT P90 ms", "TPOT P50 ms", "E2E P90 ms", "hit rate",
            "req/s", "goodput req/s")
    rows = [" | ".join(head), " | ".join("---" for _ in head)]
    for name, m in results.items():
        rows.append(" | ".join(str(x) for x in (
            name, m["ttft_ms"]["p50"], m["ttft_ms"]["p90"], m["tpot_ms"]["p50"],
            m["e2e_ms"]["p90"], m["prefix_hit_rate"], m["requests_per_s"],
            m["goodput_requests_per_s"])))
    return rows


def render_text(results: dict[str, dict], closed_form: dict | None) -> str:
    lines = []
    for name, m in results.items():
        lines.append(f"policy {name}: {m['finished']}/{m['requests']} finished, "
                     f"{m['lost_to_faults']} lost to faults, {m['retried']} retried, "
                     f"{m['preemptions']} preemptions, {m['simulated_s']} s simulated")
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            p = m[key]
            lines.append(f"  {key:8s} P50 {p['p50']}  P90 {p['p90']}  P99 {p['p99']}")
        lines.append(f"  requests/s {m['requests_per_s']}, goodput at the SLO "
                     f"{m['goodput_requests_per_s']} requests/s, prefix hit rate "
                     f"{m['prefix_hit_rate']}, KV peak {m['kv_peak_share']}")
        for role, r in m["ranks"].items():
            if role != "per_rank":
                lines.append(f"  {role} ranks {r['ranks']}: utilisation mean "
                             f"{r['utilisation_mean']} (min {r['utilisation_min']}, max "
                             f"{r['utilisation_max']}), idle while another queues "
                             f"{r['idle_while_another_queues_share']}")
        q = m["queues"]
        if q:
            lines.append(f"  queues: prefill mean {q['prefill_mean']} max {q['prefill_max']}, "
                         f"decode waiting mean {q['decode_waiting_mean']} max "
                         f"{q['decode_waiting_max']}")
        for f in m["faults"]:
            lines.append(f"  fault {f['target']} at {f['at_s']} s: {len(f['instances'])} "
                         f"instance(s) down, {f['requests_cut']} requests cut, "
                         f"{f['pool_tokens_lost']} pool tokens lost")
    if len(results) > 1:
        lines += ["", *compare_table(results)]
    if closed_form:
        lines += ["", "closed form (rackc predict): " + ", ".join(
            f"{k} {v}" for k, v in closed_form.items())]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, dict], outcomes: dict[str, tuple[Outcome, Requests]]
         ) -> dict[str, bytes]:
    """PNG files: latency CDFs, hit rate over time, per-rank load (matplotlib, Agg)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def png(fig) -> bytes:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
        plt.close(fig)
        return buf.getvalue()

    files = {}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for name, (out, w) in outcomes.items():
        ok = out.lost == 0
        for ax, (label, x) in zip(axes, (
                ("TTFT ms", (out.first_us - out.issued_us)[ok] / 1e3),
                ("TPOT ms", ((out.done_us - out.first_us) / np.maximum(w.osl - 1, 1))[
                    ok & (w.osl > 1)] / 1e3),
                ("E2E ms", (out.done_us - out.issued_us)[ok] / 1e3)), strict=True):
            x = np.sort(x[np.isfinite(x)])
            ax.plot(x, np.linspace(0, 1, len(x)), label=name)
            ax.set_xlabel(label)
            ax.set_ylabel("share of requests")
    axes[0].legend()
    files["latency_cdf.png"] = png(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, m in results.items():
        pts = [p for p in m["prefix_hit_rate_over_time"] if p["hit_rate"] is not None]
        ax.plot([p["t_s"] for p in pts], [p["hit_rate"] for p in pts], label=name)
    ax.set_xlabel("issue time (s)")
    ax.set_ylabel("prefix hit rate")
    ax.legend()
    files["hit_rate.png"] = png(fig)
    fig, ax = plt.subplots(figsize=(10, 4))
    for name, m in results.items():
        u = [r["utilisation"] for r in m["ranks"]["per_rank"]]
        ax.plot(range(len(u)), u, marker=".", label=name)
    ax.set_xlabel("DP rank (instances in plan order)")
    ax.set_ylabel("busy share")
    ax.legend()
    files["rank_load.png"] = png(fig)
    return files

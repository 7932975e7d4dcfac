"""A layout served by routing groups (compiler/routes.py): each group is predicted on its own,
with its share of the traffic and the share of its hand-offs that cross NVLink domains, and
the groups' figures are put together: rates add, per-GPU figures are the totals over the GPUs,
percentiles are the worst group's (a bound on the layout's), shares are weighted by requests.
A layout of one group predicts exactly as that group alone.
"""

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from compiler.load import Inputs
from compiler.perf.predict import Layout, curve, operating_workload, predict_layout
from compiler.perf.serving import Prediction, Workload

if TYPE_CHECKING:
    from compiler.plan import Predicted


@dataclass(frozen=True)
class RouteLayout:
    """What one routing group serves, `count` identical groups of it."""

    layouts: tuple[Layout, ...]
    cross: float = 0.0  # share of its hand-offs that cross NVLink domains
    count: int = 1

    @property
    def gpus(self) -> int:
        return sum(x.count * x.shape.gpus for x in self.layouts)


def union(routes: list[RouteLayout]) -> list[Layout]:
    """The whole layout: every group's instances, counted together."""
    counts: dict[Layout, int] = {}
    for r in routes:
        for x in r.layouts:
            key = replace(x, count=0)
            counts[key] = counts.get(key, 0) + x.count * r.count
    return sorted((replace(k, count=n) for k, n in counts.items()),
                  key=lambda x: (x.role, x.shape.name, x.max_batch or 0,
                                 x.max_batched_tokens or 0))


def _shares(w: Workload, routes: list[RouteLayout], caps: list[float]) -> list[Workload]:
    """Each group's workload: its share of a closed loop's clients, in proportion to what it
    sustains (the traffic split the site's load balancer makes); unbounded demand stays so."""
    total = sum(c * r.count for c, r in zip(caps, routes, strict=True))
    if not w.closed_loop or total <= 0:
        return [w] * len(routes)
    return [replace(w, concurrency=w.concurrency * c / total) for c in caps]


def predict_routes(inputs: Inputs, routes: list[RouteLayout], caps: list[float],
                   w: Workload, pool_gib: float | None = None) -> Prediction:
    """`caps`: each group's admission cap, requests/s (compiler.prediction.goodputs)."""
    if len(routes) == 1 and routes[0].count == 1:
        r = routes[0]
        return predict_layout(inputs, list(r.layouts), w, caps[0], pool_gib, r.cross)
    whole = union(routes)
    parts = [(predict_layout(inputs, list(r.layouts), wr, cap, pool_gib, r.cross, whole),
              r.count, r.gpus)
             for r, cap, wr in zip(routes, caps, _shares(w, routes, caps), strict=True)]
    return combine(parts)


def combine(parts: list[tuple[Prediction, int, int]]) -> Prediction:
    """The layout's figures from its groups' (prediction, identical groups, GPUs of one)."""
    gpus = sum(n * g for _, n, g in parts) or 1
    rps = sum(p.requests_per_s * n for p, n, _ in parts)

    def per_gpu(key: str) -> float:
        return round(sum(getattr(p, key) * n * g for p, n, g in parts) / gpus, 1)

    def by_requests(key: str) -> float:
        return round(sum(getattr(p, key) * p.requests_per_s * n for p, n, _ in parts)
                     / max(rps, 1e-9), 4)

    largest = max(parts, key=lambda x: x[1] * x[2])[0]
    return Prediction(
        output_tokens_per_s_per_gpu=per_gpu("output_tokens_per_s_per_gpu"),
        total_tokens_per_s_per_gpu=per_gpu("total_tokens_per_s_per_gpu"),
        tokens_per_s_per_user_p50=min(p.tokens_per_s_per_user_p50 for p, _, _ in parts),
        tokens_per_s_per_user_p90=min(p.tokens_per_s_per_user_p90 for p, _, _ in parts),
        ttft_ms_p50=max(p.ttft_ms_p50 for p, _, _ in parts),
        ttft_ms_p90=max(p.ttft_ms_p90 for p, _, _ in parts),
        tpot_ms_p50=max(p.tpot_ms_p50 for p, _, _ in parts),
        prefix_hit_rate=by_requests("prefix_hit_rate"),
        tokens_per_s_per_kw=per_gpu("tokens_per_s_per_kw"),
        requests_per_s=round(rps, 3),
        prefill_utilisation=by_requests("prefill_utilisation"),
        instances=[{**row, "count": row["count"] * n, "gpus": row["gpus"] * n}
                   for p, n, _ in parts for row in p.instances],
        breakdown=largest.breakdown)


def curve_routes(inputs: Inputs, routes: list[RouteLayout],
                 pool_gib: float | None = None) -> list[dict]:
    """The throughput-interactivity curve of the groups together: at each decode batch every
    group reaches, throughput over all GPUs, the slowest group's tokens per user."""
    if len(routes) == 1 and routes[0].count == 1:
        return curve(inputs, list(routes[0].layouts), pool_gib=pool_gib, cross=routes[0].cross)
    whole = union(routes)
    curves = [({c["batch"]: c for c in curve(inputs, list(r.layouts), pool_gib=pool_gib,
                                             cross=r.cross, whole=whole)}, r.count * r.gpus)
              for r in routes]
    total = sum(g for _, g in curves) or 1
    common = sorted(set.intersection(*(set(c) for c, _ in curves)))
    keys = ("output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu")
    return [{"batch": b,
             **{k: min(c[b][k] for c, _ in curves)
                for k in ("tokens_per_s_per_user_p50", "tokens_per_s_per_user_p90")},
             **{k: round(sum(c[b][k] * g for c, g in curves) / total, 1) for k in keys}}
            for b in common]


def operating_point(inputs: Inputs, routes: list[RouteLayout], caps: list[float],
                    pool_gib: float | None = None, with_curve: bool = True) -> "Predicted":
    """The plan's `predicted` block: metrics at the operating point (each group's admission
    capped at its goodput) and, `with_curve`, the throughput-interactivity curve."""
    from compiler.plan import Predicted

    p = predict_routes(inputs, routes, caps, operating_workload(inputs), pool_gib)
    return Predicted(**asdict(p), curve=curve_routes(inputs, routes, pool_gib)
                     if with_curve else [])

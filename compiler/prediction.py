"""The one prediction of a layout, whichever command asks (`compile`, `predict`, `check`).

A layout (instance groups with their batch limits) is predicted at its operating point: demand
as the workload states it (compiler.perf.predict.operating_workload), admission capped at the
goodput its own candidates' arithmetic gives (compiler.perf.capacity.layout_goodput). Nothing
here depends on whether the solver or the user chose the layout, so compile's choice, pinned,
predicts byte-identically. Each stated SLO is checked against the result; a missed one is a
warning (W510) on every command and stays in the plan, as is a stated concurrency the decode
batches cannot hold (W511, with the queue it implies).

What the stated concurrency (`workload.concurrency`) means: the requests a closed loop keeps in
flight, in every mode. Each decode rank's batch is sized within its share of them (no
`--max-num-seqs` beyond what the workload can fill). Unstated, throughput and pinned mode
predict the layout at its goodput (demand unbounded); latency mode takes the profile's.
"""

from compiler.load import Inputs
from compiler.perf.capacity import layout_goodput
from compiler.perf.isolated import phase_alone
from compiler.perf.predict import Layout, groups, pool_tokens, workload
from compiler.perf.routed import RouteLayout, operating_point, union
from compiler.perf.serving import prefix_hit_rate
from compiler.plan import IsolatedPhase, Predicted, SloCheck
from schemas.diagnostics import Diagnostic
from schemas.source import format_path

_PINNED_HINT = ("the pinned layout misses this SLO: lower its max_batch, add instances, let the "
                "solver choose (objective.mode throughput), or relax the SLO")
_HINTS = {"pinned": _PINNED_HINT, "throughput": (
    "the chosen layout meets the SLO per instance but misses it at the operating point "
    "(queueing or the prefix cache): add GPUs or relax the SLO"),
    "latency": "batch-1 sessions cannot reach it on these GPUs: relax the SLO"}

# (field, predicted key, higher is better)
SLOS = (("tokens_per_s_per_user_p50", "tokens_per_s_per_user_p50", True),
        ("tokens_per_s_per_user_p90", "tokens_per_s_per_user_p90", True),
        ("ttft_ms_p50", "ttft_ms_p50", False),
        ("ttft_ms_p90", "ttft_ms_p90", False))


def goodputs(inputs: Inputs, routes: list[RouteLayout], available_gpus: int) -> list[float]:
    """Each routing group's admission cap: what it sustains by the solver's candidate
    arithmetic (its hand-offs across NVLink domains priced on the NICs), with the solver's
    guess of the Engram peer group (half the available GPUs)."""
    w = workload(inputs)
    hit = prefix_hit_rate(w, pool_tokens(inputs, []))
    guess = max(1, available_gpus // 2)
    return [layout_goodput(inputs, list(r.layouts), w, hit, guess, r.cross) for r in routes]


def goodput(inputs: Inputs, routes: list[RouteLayout], available_gpus: int) -> float:
    """The layout's admission cap: its routing groups' added up."""
    caps = goodputs(inputs, routes, available_gpus)
    return round(sum(c * r.count for c, r in zip(caps, routes, strict=True)), 6)


def predict(inputs: Inputs, routes: list[RouteLayout], available_gpus: int,
            pool_gib: float | None = None, with_curve: bool = True) -> Predicted:
    """The plan's `predicted` block, with the SLO checks and the pinned operating points'
    phase-isolated figures (`with_curve` off: without the throughput-interactivity curve, as
    the decision table's rows are). `routes`: the layout's routing groups (compiler.routes)."""
    metrics = operating_point(inputs, routes, goodputs(inputs, routes, available_gpus),
                              pool_gib, with_curve)
    return metrics.model_copy(update={"slo": slo_checks(inputs, metrics),
                                      "isolated": isolated(inputs, union(routes))})


def isolated(inputs: Inputs, layouts: list[Layout]) -> list[IsolatedPhase]:
    """Each pinned operating point's role alone (compiler.perf.isolated), on the perf context
    the layout's group of that role and shape is predicted with."""
    points = [c.value for c in inputs.resolved.operating_points]
    if not points:
        return []
    by_key = {(g.role, g.shape.name): g for g in groups(inputs, layouts, workload(inputs))}
    return [IsolatedPhase(**phase_alone(inputs, p, by_key[(p.role, p.shape)]))
            for p in points if (p.role, p.shape) in by_key]


def slo_checks(inputs: Inputs, metrics: Predicted) -> list[SloCheck]:
    slo = inputs.resolved.slo
    out = []
    for name, key, higher in SLOS:
        target = getattr(slo, name)
        if target is None:
            continue
        value = getattr(metrics, key)
        out.append(SloCheck(field=f"slo.{name}", target=target, predicted=value,
                            met=value >= target if higher else value <= target))
    return out


def decode_slots(layouts: list[Layout]) -> int:
    """Requests the decode (or aggregated) batches hold at once: ranks x max_batch."""
    return sum(x.count * x.shape.dp * (x.max_batch or 0) for x in layouts
               if x.role != "prefill")


def concurrency_warnings(inputs: Inputs, layouts: list[Layout]) -> list[Diagnostic]:
    """W511 when the workload states more requests in flight than the decode batches hold:
    the rest queue (the closed loop keeps them waiting for a slot, which TTFT includes)."""
    stated = inputs.resolved.stated_concurrency
    slots = decode_slots(layouts)
    if not stated or not slots or stated <= slots:
        return []
    src = inputs.sources["deployment"]
    path = ("spec", "workload", "concurrency")
    pos = src.locate(path)
    return [Diagnostic(
        "warning", "W511", src.file, pos.line, pos.column, format_path(path),
        f"at most {slots} requests in flight (the decode batches: ranks x max_batch)",
        f"{stated}: {stated - slots} requests wait for a decode slot at any time",
        "the SLO's batch limit holds fewer than the workload sends: add decode instances, "
        "relax the per-user SLO, or state the concurrency the deployment should serve")]


def slo_warnings(inputs: Inputs, metrics: Predicted | None) -> list[Diagnostic]:
    """W510 for each SLO the prediction misses, at the field that states it."""
    if metrics is None:
        return []
    src = inputs.sources["deployment"]
    out = []
    for check in metrics.slo:
        if check.met:
            continue
        path = ("spec", *check.field.split("."))
        pos = src.locate(path)
        higher = check.field.startswith("slo.tokens")
        out.append(Diagnostic(
            "warning", "W510", src.file, pos.line, pos.column, format_path(path),
            f"{'at least' if higher else 'at most'} {check.target:g}",
            f"{check.predicted:g} predicted for this layout",
            _HINTS[inputs.resolved.objective_mode.value]))
    return out


def warnings(inputs: Inputs, layouts: list[Layout], metrics: Predicted | None
             ) -> list[Diagnostic]:
    """Every command's warnings about a layout's prediction: W511, then W510."""
    return concurrency_warnings(inputs, layouts) + slo_warnings(inputs, metrics)

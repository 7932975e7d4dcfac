"""Why the solver's counts: which role binds the goodput, why one more instance of it would
not pay, and what the other role's spare instances buy (the report shows this).

Goodput is the smaller of prefill and decode supply, so in a disaggregated layout one role
binds it; the GPUs left after that role's instances go to the other role. Those beyond what
the goodput needs are spare: they are compared with the smallest count that keeps the same
goodput, by predicting that smaller layout at the same admission rate.
"""

import math
from dataclasses import replace

from compiler.load import Inputs
from compiler.perf.predict import Layout, operating_workload, predict_layout
from compiler.plan import Instance
from compiler.shapes import parse_shape


def balance(inputs: Inputs, instances: list[Instance], supply: dict[str, float],
            goodput: float, total_gpus: int, plan: list[Layout],
            pool_gib: float | None = None, cross: float = 0.0) -> dict | None:
    """`supply`: requests/s at the SLO of one instance, per (role, shape) name as
    "role:shape"; `goodput` the solver's (requests/s); `cross`: the share of hand-offs that
    cross NVLink domains in the layout's one routing group (compiler.routes). None unless
    P/D disaggregated with one shape per role."""
    by_role: dict[str, set[str]] = {}
    for i in instances:
        by_role.setdefault(i.role, set()).add(i.shape)
    if set(by_role) != {"prefill", "decode"} or any(len(s) != 1 for s in by_role.values()):
        return None
    count = {r: sum(1 for i in instances if i.role == r) for r in by_role}
    shape = {r: parse_shape(next(iter(s))) for r, s in by_role.items()}
    each = {r: supply[f"{r}:{shape[r].name}"] for r in by_role}
    binding = min(by_role, key=lambda r: count[r] * each[r])
    other = "prefill" if binding == "decode" else "decode"
    needed = max(1, math.ceil(goodput / each[other] - 1e-9))
    # one more binding instance: the GPUs left give the other role this many instances
    left = total_gpus - (count[binding] + 1) * shape[binding].gpus
    fit = max(0, left // shape[other].gpus)
    instead = min((count[binding] + 1) * each[binding], fit * each[other])
    out = {
        "binding_role": binding,
        "binding_supply_requests_per_s": round(count[binding] * each[binding], 3),
        "one_more_binding_instance_goodput": round(instead, 3),
        f"{other}_instances_needed": needed,
        f"{other}_instances_spare": count[other] - needed,
    }
    if count[other] > needed:
        fewer = [replace(x, count=needed) if x.role == other else x for x in plan]
        w = operating_workload(inputs)
        chosen = predict_layout(inputs, plan, w, max_requests_per_s=goodput, pool_gib=pool_gib,
                                cross=cross)
        lean = predict_layout(inputs, fewer, w, max_requests_per_s=goodput, pool_gib=pool_gib,
                              cross=cross)
        for key in ("ttft_ms_p50", "ttft_ms_p90", "prefill_utilisation", "prefix_hit_rate"):
            out[f"{key}_with_spare"] = getattr(chosen, key)
            out[f"{key}_without_spare"] = getattr(lean, key)
    return out

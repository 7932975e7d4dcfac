"""A simulation of a plan from start to metrics: the workload, one run per routing policy,
the summary; and the short run `rackc compile` records in the plan."""

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from compiler.load import Inputs
from compiler.perf.predict import operating_workload
from compiler.perf.predict import workload as plan_workload
from compiler.perf.serving import Workload
from compiler.plan import Plan
from compiler.simulate import report
from compiler.simulate.cluster import build_cluster
from compiler.simulate.engine import Outcome, Simulation
from compiler.simulate.faults import parse_faults
from compiler.simulate.workload import TRACE_BLOCK_SIZE, Requests, generate, read_trace

if TYPE_CHECKING:
    from compiler.plan import Simulated

COMPILE_REQUESTS = 1500  # the run compile records: short, so compile stays fast
COMPILE_SEED = 0


@dataclass(frozen=True)
class Options:
    profile: str | None = None  # None: the closed form's: a closed loop at the workload's
    # concurrency where its operating point keeps one (latency mode, or a stated concurrency),
    # else Poisson at the plan's predicted rate (compiler.perf.predict.operating_workload)
    trace: Path | None = None
    trace_name: str = ""
    trace_block_size: int = TRACE_BLOCK_SIZE  # tokens per hash block of the trace's hash_ids
    requests: int = 10_000
    seed: int = 0
    policies: tuple[str, ...] = ()  # empty: the plan's routing policy
    faults: tuple[str, ...] = ()
    rate_per_s: float | None = None


def slo_of(inputs: Inputs) -> dict[str, float]:
    """The per-request SLO goodput counts against: the tightest stated TTFT and per-user
    rate (a P90 target applies to each request, as a P50 one does)."""
    s = inputs.resolved.slo
    out = {}
    ttft = [x for x in (s.ttft_ms_p50, s.ttft_ms_p90) if x is not None]
    rate = [x for x in (s.tokens_per_s_per_user_p50, s.tokens_per_s_per_user_p90)
            if x is not None]
    if ttft:
        out["ttft_ms"] = float(min(ttft))
    if rate:
        out["tokens_per_s_per_user"] = float(max(rate))
    return out


def fleet_workload(fleet: tuple[Inputs, ...]) -> Workload:
    """The workload of a whole fleet: its groups' shares (compiler.load gives each group the
    sessions and clients it serves) added back up; lengths and reuse are every group's."""
    w = plan_workload(fleet[0])
    if len(fleet) == 1:
        return w
    shares = [plan_workload(i) for i in fleet]
    return replace(w, concurrency=sum(x.concurrency for x in shares),
                   sessions=sum(x.sessions for x in shares))


def requests_for(inputs: Inputs, plan: Plan, opts: Options,
                 fleet: tuple[Inputs, ...] = ()) -> Requests:
    max_len = plan.serving.max_model_len
    if opts.trace is not None:
        return read_trace(opts.trace, opts.trace_name, max_len, opts.trace_block_size)
    w = fleet_workload(fleet or (inputs,))
    profile = opts.profile
    if profile is None:
        closed = all(operating_workload(x).closed_loop for x in (fleet or (inputs,)))
        profile = "closed" if closed else "poisson"
    rate = opts.rate_per_s
    if rate is None and plan.predicted is not None:
        rate = plan.predicted.requests_per_s
    return generate(profile, replace(w), opts.requests, opts.seed, rate, max_len)


def simulate(inputs: Inputs, plan: Plan, opts: Options, fleet: tuple[Inputs, ...] = ()
             ) -> tuple[dict[str, dict], dict[str, tuple[Outcome, Requests]]]:
    """Metrics per routing policy (same requests, same seed), and the raw outcomes. A mixed
    fleet's plan takes `fleet` (each group's inputs, `inputs` the first): one router and one
    pool over every group's instances, as the plan deploys them."""
    reqs = requests_for(inputs, plan, opts, fleet)
    faults = parse_faults(list(opts.faults), plan)
    cluster = build_cluster(inputs, plan, fleet_workload(fleet or (inputs,)),
                            fleet if len(fleet) > 1 else ())
    policies = opts.policies or (plan.routing.policy,)
    gpus = sum(len(i.gpus) for i in plan.instances)
    slo = slo_of(inputs)
    results, outcomes = {}, {}
    for p in policies:
        out = Simulation(cluster, reqs, p, opts.seed, faults).run()
        results[p] = report.summarise(out, reqs, slo, gpus)
        outcomes[p] = (out, reqs)
    return results, outcomes


DISAGREE_SHARE = 0.10  # beyond this relative difference the report says they disagree
# (simulated key, closed-form key) pairs compared
COMPARED = (("ttft_ms.p50", "ttft_ms_p50"), ("ttft_ms.p90", "ttft_ms_p90"),
            ("tpot_ms.p50", "tpot_ms_p50"),
            ("tokens_per_s_per_user.p50", "tokens_per_s_per_user_p50"),
            ("tokens_per_s_per_user.p90", "tokens_per_s_per_user_p90"),
            ("requests_per_s", "requests_per_s"), ("prefix_hit_rate", "prefix_hit_rate"))


def _get(m: dict, dotted: str) -> float | None:
    for part in dotted.split("."):
        m = m.get(part) if isinstance(m, dict) else None
    return m


def disagreements(sim: dict, closed: dict) -> list[str]:
    """Closed-form figures the simulation is more than DISAGREE_SHARE away from."""
    out = []
    for s_key, c_key in COMPARED:
        a, b = _get(sim, s_key), closed.get(c_key)
        if a is None or b is None:
            continue
        if abs(a - b) > DISAGREE_SHARE * max(abs(b), 1e-9):
            out.append(c_key)
    return out


def compile_run(inputs: Inputs, plan: Plan) -> "Simulated":
    """The short run `rackc compile` records in `predicted.simulated`."""
    from compiler.plan import Percentiles, Simulated

    opts = Options(requests=COMPILE_REQUESTS, seed=COMPILE_SEED)
    reqs = requests_for(inputs, plan, opts)
    cluster = build_cluster(inputs, plan, plan_workload(inputs))
    out = Simulation(cluster, reqs, plan.routing.policy, opts.seed).run()
    m = report.summarise(out, reqs, slo_of(inputs), sum(len(i.gpus) for i in plan.instances))
    closed = plan.predicted.model_dump(mode="json") if plan.predicted else {}
    workload = "closed" if (reqs.client >= 0).all() else "poisson"
    return Simulated(
        requests=len(reqs), seed=opts.seed, workload=workload, policy=plan.routing.policy,
        ttft_ms=Percentiles(**m["ttft_ms"]), tpot_ms=Percentiles(**m["tpot_ms"]),
        itl_ms=Percentiles(**m["itl_ms"]), e2e_ms=Percentiles(**m["e2e_ms"]),
        tokens_per_s_per_user_p50=m["tokens_per_s_per_user"]["p50"],
        tokens_per_s_per_user_p90=m["tokens_per_s_per_user"]["p90"],
        requests_per_s=m["requests_per_s"], prefix_hit_rate=m["prefix_hit_rate"],
        disagrees=disagreements(m, closed))

"""The simulated run beside the closed form: the rows `rackc predict` and the report share,
the report's section (a warning naming what disagrees), and `rackc predict`'s text and JSON."""

import json

from compiler.cli import main
from compiler.plan import Percentiles, Plan, Simulated
from compiler.simulate.compare import TURNOVERS, rows, start_up
from targets.report import emit
from tests.simulate.test_cli import DEP
from tests.targets.fixtures import EXAMPLE_CASES

CASE = "vr-nvl72-deepseek-v4.1-flash"


def _with_sim(plan: Plan, disagrees: list[str], requests: int = 10**7) -> Plan:
    """The plan with a simulated run whose figures equal the closed form's, but for TPOT."""
    p = plan.predicted
    q = Percentiles(p50=1.0, p90=2.0, p99=3.0)
    sim = Simulated(requests=requests, seed=0, workload="closed", policy="kv",
                    ttft_ms=Percentiles(p50=p.ttft_ms_p50, p90=p.ttft_ms_p90, p99=9e3),
                    tpot_ms=Percentiles(p50=p.tpot_ms_p50 * 2, p90=1.0, p99=1.0), itl_ms=q,
                    e2e_ms=q, tokens_per_s_per_user_p50=p.tokens_per_s_per_user_p50,
                    tokens_per_s_per_user_p90=p.tokens_per_s_per_user_p90,
                    requests_per_s=p.requests_per_s, prefix_hit_rate=p.prefix_hit_rate,
                    disagrees=disagrees)
    return plan.model_copy(update={"predicted": p.model_copy(update={"simulated": sim})})


def test_rows_pair_each_figure_with_the_closed_form_and_flag_the_disagreeing_ones():
    plan = _with_sim(EXAMPLE_CASES[CASE](), ["tpot_ms_p50"])
    table = {r.label: r for r in rows(plan.predicted)}
    tpot = table["TPOT P50 (ms)"]
    assert tpot.closed == plan.predicted.tpot_ms_p50 and tpot.simulated == 2 * tpot.closed
    assert tpot.disagrees and not table["TTFT P50 (ms)"].disagrees
    assert table["TTFT P99 (ms)"].closed is None  # the closed form has no P99
    assert rows(plan.predicted.model_copy(update={"simulated": None})) == []


def test_the_report_shows_the_simulation_and_warns_where_it_disagrees():
    base = EXAMPLE_CASES[CASE]()
    page = emit(_with_sim(base, ["tpot_ms_p50"]))["report/index.html"]
    section = page[page.index('<section id="simulated">'):page.index('<section id="rack">')]
    assert "disagree</b> (more than 10% apart): TPOT P50 (ms);" in section
    assert f'<td class="n">{base.predicted.tpot_ms_p50 * 2:g}</td>' in section
    agreeing = emit(_with_sim(base, []))["report/index.html"]
    assert "agrees with the closed form within 10%" in agreeing
    bare = base.model_copy(update={"predicted": base.predicted.model_copy(
        update={"simulated": None})})
    assert "No simulated run is recorded" in emit(bare)["report/index.html"]


def test_predict_prints_the_simulation_beside_the_closed_form(capsys):
    assert main(["predict", DEP]) == 0
    text = capsys.readouterr().out
    head = text.index("beside the closed form:")
    line = next(ln for ln in text[head:].splitlines() if ln.strip().startswith("TPOT P50"))
    assert len(line.split()) >= 5  # label, simulated, closed (and the flag when apart)
    assert main(["predict", DEP, "--format", "json"]) == 0
    sim = json.loads(capsys.readouterr().out)["simulated"]
    assert {"ttft_ms", "tpot_ms", "disagrees"} <= set(sim)
    flagged = [ln for ln in text[head:].splitlines() if ln.endswith("disagree (>10%)")]
    assert len(flagged) == len(sim["disagrees"])


def test_a_run_shorter_than_its_turnovers_says_its_figures_hold_the_start_up():
    base = EXAMPLE_CASES[CASE]()
    p = _with_sim(base, []).predicted  # e2e P50 1 ms: about requests_per_s / 1000 in flight
    in_flight = p.requests_per_s * 1.0 / 1e3
    long = _with_sim(base, [], requests=int(TURNOVERS * in_flight) + 1)
    short = _with_sim(base, [], requests=int(TURNOVERS * in_flight) - 1)
    assert start_up(long.predicted) is None
    note = start_up(short.predicted)
    assert note and f"about {round(in_flight)} requests in flight" in note
    assert "A short run" in emit(short)["report/index.html"]
    assert "A short run" not in emit(long)["report/index.html"]
    assert "still hold the start-up" in emit(short)["report/performance.md"]
    # the example's own compile-time run (1,500 requests at its planned rate) is one
    assert start_up(base.predicted) is not None


def test_the_run_beside_the_closed_form_loads_the_plan_as_the_closed_form_does(tmp_path):
    """A pinned layout with no stated concurrency: the closed form admits unbounded demand at
    its goodput, so the simulation sends Poisson arrivals at that rate (not the profile's 64
    clients, which left the batch half the closed form's and TPOT 37% short); a stated
    concurrency is a closed loop of that many clients in both."""
    from compiler.load import load_inputs
    from compiler.simulate.runner import Options, requests_for
    from tests.builders import write_case

    pins = {"mode": "pinned", "instances": [{"role": "aggregated", "shape": "TP1", "count": 1}]}
    for stated, closed in ((None, False), (48, True)):
        work = {"profile": "fixed", **({"concurrency": stated} if stated else {})}
        path = write_case(tmp_path / str(stated), system="hgx-h200", model="qwen3-32b",
                          kind="Cluster", hardware={"nodes": 1}, objective=pins, workload=work)
        inputs = load_inputs(path)
        plan = Plan.model_construct(serving=EXAMPLE_CASES[CASE]().serving, predicted=None)
        reqs = requests_for(inputs, plan, Options(requests=200, rate_per_s=5.0))
        assert bool((reqs.client >= 0).all()) is closed
        if closed:
            assert int(reqs.client.max()) + 1 == stated

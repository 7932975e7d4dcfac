"""The simulated requests/s of a closed loop is the rate Little's law gives its steady state
(clients / mean latency), whatever the order requests were issued in: request k * clients + c
is client c's k-th, whose issue time spreads over seconds as the clients' latencies add up
(output lengths spread as an exponential), so the window of the steady state is taken from
the issue times in time order, not from two requests' own times."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from compiler import api
from compiler.load import load_inputs
from compiler.perf.predict import workload
from compiler.simulate import report
from compiler.simulate.cluster import build_cluster
from compiler.simulate.engine import Simulation
from compiler.simulate.window import COOL_SHARE, WARM_SHARE
from compiler.simulate.workload import generate

ROOT = Path(__file__).resolve().parents[2]
CASE = "vr-nvl72-deepseek-v4.1-flash"


@pytest.mark.parametrize("clients,requests", [(512, 6144), (1024, 20000)])
def test_a_closed_loops_rate_is_littles_law_of_its_steady_state(clients: int, requests: int):
    """(1,024 clients and 20,000 requests: 838 requests/s where Little's law gives 985, before
    the window was taken in time order and ended where the first client runs dry.)"""
    inputs = load_inputs(ROOT / "examples" / CASE / "deployment.yaml")
    plan = api.read_plan(ROOT / "tests" / "golden" / CASE / "plan" / "plan.yaml")
    w = replace(workload(inputs), concurrency=clients)
    assert w.osl_cv >= 0.5  # latencies spread: clients drift apart
    reqs = generate("closed", w, requests, 0)
    out = Simulation(build_cluster(inputs, plan, w), reqs, plan.routing.policy, 0).run()
    m = report.summarise(out, reqs, {}, 72)
    n = len(reqs)
    steady = slice(int(n * WARM_SHARE), int(n * (1 - COOL_SHARE)))
    mean_e2e_s = float(np.mean((out.done_us - out.issued_us)[steady])) / 1e6
    assert m["requests_per_s"] == pytest.approx(clients / mean_e2e_s, rel=0.05)

"""How fast `rackc simulate` replays requests on the Vera Rubin example plan (goal: 100K
requests in <= 10 s, 1M in <= 60 s on the 2-core dev machine).

    python3 benchmarks/simulate_speed.py [--requests 100000,1000000] [--profile poisson]

Times the event loop alone (the workload made and the plan read beforehand), CPU and wall,
and prints the run's headline figures so a faster loop can be seen to give the same answer.
"""

import argparse
import os
import resource
import sys
import time
from pathlib import Path

from compiler import api
from compiler.load import load_inputs
from compiler.perf.predict import workload
from compiler.simulate.cluster import build_cluster
from compiler.simulate.engine import Simulation
from compiler.simulate.runner import Options, requests_for

ROOT = Path(__file__).resolve().parents[1]
GOALS_S = {100_000: 10.0, 1_000_000: 60.0}  # CPU seconds (wall on a quiet machine)
CASE = "vr-nvl72-deepseek-v4.1-flash"


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", default="100000,1000000")
    ap.add_argument("--profile", default=None)
    args = ap.parse_args()
    inputs = load_inputs(ROOT / "examples" / CASE / "deployment.yaml")
    plan = api.read_plan(ROOT / "tests" / "golden" / CASE / "plan" / "plan.yaml")
    cluster = build_cluster(inputs, plan, workload(inputs))
    print(f"load average {os.getloadavg()[0]:.1f}")
    missed = False
    for n in (int(x) for x in args.requests.split(",")):
        reqs = requests_for(inputs, plan, Options(profile=args.profile, requests=n))
        c0, w0 = cpu_s(), time.perf_counter()
        out = Simulation(cluster, reqs, plan.routing.policy, 0).run()
        cpu, wall = cpu_s() - c0, time.perf_counter() - w0
        done = (out.lost == 0).sum()
        print(f"{n:>9} requests: {cpu:6.2f} s CPU, {wall:6.2f} s wall, "
              f"{out.end_us / 1e6:8.1f} s simulated, {done} finished, "
              f"{len(out.itl_us)} engine steps")
        goal = GOALS_S.get(n)
        if goal is not None and cpu > goal:
            print(f"  missed: goal {goal:g} s")
            missed = True
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()

"""CPU time of the report target (index.html, curve.svg, performance.md/json) on an example's
plan: its first emit in a fresh process (what a compile pays) and the best of several; CPU
time, so that other processes on the machine do not count.
Usage: python benchmarks/report_time.py [--example DIR] [--runs N]
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_CPU_S = 0.25  # a sixth of the 1.5 s compile goal (benchmarks/README.md), at 16 racks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="examples/vr-nvl72-deepseek-v4.1-flash")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from compiler import api

    plan = api.compile(ROOT / args.example / "deployment.yaml", only=()).plan
    from targets.report import emit

    runs = []
    for _ in range(args.runs):
        t = time.process_time()
        out = emit(plan)
        runs.append(time.process_time() - t)
    first = runs[0]
    size = len(out["report/index.html"].encode())
    print(f"report of {args.example}: first emit {first:.3f} CPU s, best "
          f"{min(runs):.3f} CPU s over {args.runs}; index.html {size / 1024:.0f} KiB; "
          f"goal {GOAL_CPU_S} CPU s")
    return 0 if first <= GOAL_CPU_S else 1


if __name__ == "__main__":
    sys.exit(main())

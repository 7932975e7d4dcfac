"""Whole-process `rackc compile` time on the Vera Rubin example, and the solver's share.

Runs the installed CLI in fresh processes (imports included, as a user sees it), takes the
median of several runs, and reads the per-phase split from an in-process compile.
Usage: python benchmarks/compile_time.py [--runs N] [--example DIR]
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 1.5


def whole_process(deployment: Path, runs: int) -> list[float]:
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "compiler.cli", "compile", str(deployment),
                            "-o", str(Path(tmp) / f"out{k}")], check=True,
                           stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
    return times


def phases(deployment: Path) -> dict[str, float]:
    from compiler import api

    return api.compile(deployment).seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--example", default="examples/vr-nvl72-deepseek-v4.1-flash")
    args = parser.parse_args()
    deployment = ROOT / args.example / "deployment.yaml"
    times = whole_process(deployment, args.runs)
    median = statistics.median(times)
    split = phases(deployment)
    solver = split["solved"]
    print(f"rackc compile {args.example}: median {median:.3f} s over {args.runs} runs "
          f"(min {min(times):.3f}, max {max(times):.3f}); goal {GOAL_S} s")
    print("in-process phases (s): " + ", ".join(f"{k} {v:.3f}" for k, v in split.items()))
    print(f"solver share of the whole process: {solver / median:.1%}")
    return 0 if median <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())

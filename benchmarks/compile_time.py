"""Whole-process `rackc compile` and `rackc check` time on the Vera Rubin example, CPU time
beside wall time, and the solver's share.

Runs the installed CLI in fresh processes (imports included, as a user sees it), takes the
median of several runs, and reads the per-phase split from an in-process compile. CPU time is
the children's user + system time (`resource.getrusage`, the emitter process that `compile`
forks included): on a shared or busy machine wall time stretches with the load while CPU time
does not, so the goals are judged on CPU time and the wall time is printed beside it.
Usage: python benchmarks/compile_time.py [--runs N] [--example DIR]
"""

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 1.5  # compile, CPU seconds of the parent and its emitter together


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def whole_process(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds per fresh `rackc ARGV` process; `{k}` in ARGV is the run number."""
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(runs):
            args = [a.format(k=k, tmp=tmp) for a in argv]
            cpu, start = _cpu(), time.perf_counter()
            subprocess.run([sys.executable, "-m", "compiler.cli", *args], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            walls.append(time.perf_counter() - start)
            cpus.append(_cpu() - cpu)
    return walls, cpus


def phases(deployment: Path) -> dict[str, float]:
    from compiler import api

    return api.compile(deployment).seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--example", default="examples/vr-nvl72-deepseek-v4.1-flash")
    args = parser.parse_args()
    deployment = ROOT / args.example / "deployment.yaml"
    missed = []
    for name, argv, goal in (
            ("compile", ["compile", str(deployment), "-o", "{tmp}/out{k}"], GOAL_S),
            ("check", ["check", str(deployment)], None)):
        walls, cpus = whole_process(argv, args.runs)
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        print(f"rackc {name} {args.example}: median CPU {cpu:.3f} s, wall {wall:.3f} s over "
              f"{args.runs} runs (wall min {min(walls):.3f}, max {max(walls):.3f})"
              + (f"; goal {goal} s CPU" if goal else "; measured, no goal"))
        if goal and cpu > goal:
            missed.append(name)
        if name == "compile":
            split = phases(deployment)
            print("in-process phases (s, wall): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in split.items()))
            print(f"solver share of the whole process: {split['solved'] / wall:.1%}")
    print("goals met" if not missed else "missed: " + ", ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

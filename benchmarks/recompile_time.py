"""Whole-process `rackc compile --from` against a fresh compile of the same deployment, CPU time
(user + system of the process and the emitter it forks, os.wait4) and wall time, median of
`--runs`.

Per example: a fresh compile into OUT, then `--from OUT/plan.yaml` with nothing failed, against
that fresh compile, and with one GPU failed (`--unavailable`), against a fresh compile with the
same GPU failed: each recompile against a fresh compile of the same inputs. `--fleet vr64`
(a case of benchmarks/compile_scaling.py) does the same for the example scaled to a fleet,
failing that case's first fault GPU. Usage:
  python benchmarks/recompile_time.py [--examples vr-nvl72-deepseek-v4.1-flash,...] [--runs 3]
  python benchmarks/recompile_time.py --fleet vr64 --runs 1
Exits 1 when a recompile's median CPU time is not below its fresh compile's (issue 20: `--from`
took 1.3-1.6x a fresh compile).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import compile_scaling  # noqa: E402

# example -> a GPU to fail (None: every GPU is needed, as on the two-node HGX example)
EXAMPLES = {"vr-nvl72-deepseek-v4.1-flash": "r0-t07-g2", "hgx-h200-deepseek-v3": None}


def run(*argv: str) -> tuple[float, float]:
    """(CPU s, wall s) of one `rackc` process; raises when it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "compiler.cli", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"rackc {' '.join(argv)} failed: {err.decode()[-400:]}")
    return usage.ru_utime + usage.ru_stime, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", default=",".join(EXAMPLES))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fleet", choices=sorted(compile_scaling.FAULTS),
                        help="instead of the examples, this fleet case of compile_scaling.py")
    args = parser.parse_args()
    slower = []
    with tempfile.TemporaryDirectory() as tmp:
        faults = dict(EXAMPLES)
        if args.fleet:
            faults = {args.fleet: compile_scaling.FAULTS[args.fleet][0]}
        for example in faults if args.fleet else args.examples.split(","):
            out = Path(tmp) / example
            dep = str(compile_scaling.write_case(out / "in", example) if args.fleet
                      else ROOT / "examples" / example / "deployment.yaml")
            cases = {"fresh": ["compile", dep, "-o", str(out / "fresh")]}
            run(*cases["fresh"])  # the plan the recompiles start from
            base = ["--from", str(out / "fresh" / "plan.yaml")]
            cases["--from"] = ["compile", dep, "-o", str(out / "kept"), *base]
            # a recompile is weighed against a fresh compile of the same inputs: with a GPU
            # down, the fresh compile of the rack without it (the degraded layout has more
            # instances and shapes to predict than the healthy one)
            against = {"--from": "fresh"}
            if faults.get(example):
                down = ["--unavailable", faults[example]]
                cases["fresh --unavailable"] = ["compile", dep, "-o", str(out / "down"), *down]
                cases["--from --unavailable"] = ["compile", dep, "-o", str(out / "fault"),
                                                 *base, *down]
                against["--from --unavailable"] = "fresh --unavailable"
            times = {name: [run(*argv) for _ in range(args.runs)] for name, argv in cases.items()}
            cpu = {name: statistics.median(c for c, _ in runs) for name, runs in times.items()}
            for name, runs in times.items():
                wall = statistics.median(w for _, w in runs)
                line = f"{example:32s} {name:22s} CPU {cpu[name]:6.2f} s  wall {wall:6.2f} s"
                if name in against:
                    line += f"  {cpu[name] / cpu[against[name]]:5.2f}x {against[name]}"
                    if cpu[name] >= cpu[against[name]]:
                        slower.append(f"{example} {name}")
                print(line)
    print("every recompile cheaper than a fresh compile" if not slower
          else "not cheaper: " + "; ".join(slower))
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())

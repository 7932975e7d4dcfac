"""Whole-process `rackc predict` time of a pinned layout (the Vera Rubin example pinned to one
DEP32 decode and 20 DEP2 prefill instances), wall and CPU, median of several fresh processes.
By default without the Mooncake DRAM pool (the short path, compiler/pinned.py); `--pool` keeps
the example's pool, whose per-tray segments depend on the placement, so predict compiles.

The 2-core machines these run on are shared, so wall time swings with the load; CPU time
(user + sys of the child) is what the process itself costs.
Usage: python benchmarks/predict_time.py [--runs N]
"""

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "vr-nvl72-deepseek-v4.1-flash"
GOAL_S = 0.5
PINS = [{"role": "decode", "shape": "DEP32", "count": 1},
        {"role": "prefill", "shape": "DEP2", "count": 20}]


def pinned_example(root: Path, pool: bool = False) -> Path:
    for f in EXAMPLE.glob("*.yaml"):
        shutil.copy(f, root / f.name)
    dep = yaml.safe_load((root / "deployment.yaml").read_text())
    dep["spec"]["objective"] = {"mode": "pinned", "instances": PINS}
    if not pool:
        dep["spec"]["serving"].pop("kv_pool", None)
    (root / "deployment.yaml").write_text(yaml.safe_dump(dep, sort_keys=False))
    return root / "deployment.yaml"


def run_once(deployment: Path) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "compiler.cli", "predict", str(deployment)],
                   check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--pool", action="store_true", help="keep the DRAM pool (full compile)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        deployment = pinned_example(Path(tmp), args.pool)
        runs = [run_once(deployment) for _ in range(args.runs)]
    wall = statistics.median(w for w, _ in runs)
    cpu = statistics.median(c for _, c in runs)
    print(f"rackc predict (pinned Vera Rubin example{', DRAM pool' if args.pool else ''}): "
          f"median wall {wall:.3f} s "
          f"(min {min(w for w, _ in runs):.3f}), median CPU {cpu:.3f} s over {args.runs} runs;"
          f" goal {GOAL_S} s")
    return 0 if wall <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())

"""Bounded time and memory at the largest legal inputs: whole-process `rackc compile` and
`rackc check` of mixed fleets and of the largest one-system cluster, CPU and wall time and
peak resident memory (os.wait4: the process and the emitter it forks).

Cases (the example mixed fleet's deployment, DeepSeek-V4.1-Flash, workload 512 sessions per
rack):
  mixed64x1     64 groups of 1 NVL72 rack, GB300 and Vera Rubin in turn
  distinct64x1  64 groups of 1 rack, each with another GPU down, so no two groups are alike
  vr64          one Vera Rubin cluster of 64 racks (the largest one-system cluster)
  hgx64x9       64 groups of 9 HGX H200 nodes (576 nodes, the most a fleet holds), the HGX
                example's deployment (DeepSeek-V3, chat, 128 sessions per node; prefill/decode
                and aggregated layouts both searched)
  over64x64     64 groups of 64 racks: beyond the 4608 GPUs a cluster may hold (E212), refused
                by both commands with a diagnostic (exit 2)
Usage: python benchmarks/bounded.py [--cases mixed64x1,...] [--out DIR]
Exits 1 when a bound (BOUNDS, also in docs/constraints.md) is exceeded or a case ends other
than it should.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MIXED = ROOT / "examples" / "mixed-gb300-vr-deepseek-v4.1-flash" / "deployment.yaml"
HGX = ROOT / "examples" / "hgx-h200-deepseek-v3" / "deployment.yaml"
SYSTEMS = ("gb300-nvl72", "vera-rubin-nvl72")
SESSIONS_PER_RACK, SESSIONS_PER_NODE = 512, 128
# (compile CPU s, check CPU s, peak MiB): every legal input stays under them
BOUNDS = {"compile_cpu_s": 120.0, "check_cpu_s": 10.0, "peak_mib": 1024.0}
CASES = {  # name -> (groups, racks per group, a GPU down per group, exit expected)
    "mixed64x1": (64, 1, False, 0),
    "distinct64x1": (64, 1, True, 0),
    "vr64": (None, 64, False, 0),
    "over64x64": (64, 64, False, 2),
    "hgx64x9": (64, 9, False, 0),  # nodes, not racks
}


def write_case(folder: Path, name: str) -> Path:
    groups, racks, down, _ = CASES[name]
    folder.mkdir(parents=True)
    hgx = name.startswith("hgx")
    if groups is None:
        spec = {"system": "vera-rubin-nvl72", "racks": racks}
    elif hgx:
        spec = {"groups": [{"name": f"g{i:02d}", "system": "hgx-h200", "nodes": racks,
                            "node_name_template": "{name}-n{tray:02d}"} for i in range(groups)]}
    else:
        spec = {"groups": [_group(i, racks, down) for i in range(groups)]}
    cluster = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Cluster",
               "metadata": {"name": "fleet"}, "spec": spec}
    dep = yaml.safe_load((HGX if hgx else MIXED).read_text())
    dep["spec"]["rack"] = "cluster.yaml"
    total = (groups or 1) * racks * (SESSIONS_PER_NODE if hgx else SESSIONS_PER_RACK)
    dep["spec"]["workload"].update(sessions=min(total, 1 << 20), concurrency=min(total, 1 << 20))
    (folder / "cluster.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False))
    (folder / "deployment.yaml").write_text(yaml.safe_dump(dep, sort_keys=False))
    return folder / "deployment.yaml"


def _group(i: int, racks: int, down: bool) -> dict:
    group = {"name": f"g{i:02d}", "system": SYSTEMS[i % 2], "racks": racks,
             "node_name_template": "{name}-r{rack}-t{tray:02d}"}
    if down:  # plan ids: group i's rack is r<i>; another tray and GPU in each group
        group["unavailable"] = {"gpus": [f"r{i * racks}-t{i % 18:02d}-g{i // 18 % 4}"]}
    return group


def run(*argv: str) -> dict:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "compiler.cli", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    return {"exit": os.waitstatus_to_exitcode(status), "wall_s": time.perf_counter() - start,
            "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss / 1024,
            "stderr": stderr.decode(errors="replace")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", help="keep the inputs and outputs here")
    args = parser.parse_args()
    missed = []
    print("bounds: " + ", ".join(f"{k} <= {v:g}" for k, v in BOUNDS.items()))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.out) if args.out else Path(tmp)
        for name in args.cases.split(","):
            dep = write_case(base / name / "in", name)
            expect = CASES[name][3]
            for command, extra in (("check", ()), ("compile", ("-o", str(base / name / "out")))):
                r = run(command, str(dep), *extra)
                print(f"{name:13s} {command:8s} exit {r['exit']}  CPU {r['cpu_s']:7.2f} s  "
                      f"wall {r['wall_s']:7.2f} s  peak {r['peak_mib']:6.0f} MiB")
                if r["exit"] != expect:
                    missed.append(f"{name} {command}: exit {r['exit']}, not {expect}")
                    print("  " + r["stderr"][-600:].replace("\n", "\n  "))
                if r["cpu_s"] > BOUNDS[f"{command}_cpu_s"]:
                    missed.append(f"{name} {command}: {r['cpu_s']:.1f} CPU s")
                if r["peak_mib"] > BOUNDS["peak_mib"]:
                    missed.append(f"{name} {command}: {r['peak_mib']:.0f} MiB")
    print("bounds held" if not missed else "missed: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

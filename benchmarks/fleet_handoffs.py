"""Where a fleet's KV hand-offs go: per NVLink domain, the prefill supply and decode demand
(requests/s), the share of hand-offs that cross a domain under the plan's routing, the NIC load
that puts on each domain's prefill GPUs, and the goodput per rack (or HGX node) against the
fleet size.

The cases are benchmarks/compile_scaling.py's (the examples' deployments on 1 to 64 Vera Rubin
racks, 2 to 128 HGX H200 nodes), compiled by the installed CLI. Each router (one per routing
group of `plan.yaml` `routing.groups`, or one for the whole plan) picks a prefill and a decode
instance independently, each in proportion to its supply, so a hand-off stays in its domain
with probability sum_d p_d q_d (p_d, q_d: the domain's share of the group's prefill and decode
supply); an ideal rack-affine router would keep sum_d min(p_d, q_d).
Usage: python benchmarks/fleet_handoffs.py [--cases vr1,vr16,hgx2,...] [--out DIR]
"""

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.compile_scaling import run, write_case  # noqa: E402
from compiler import arch, catalog  # noqa: E402
from compiler.perf.comm import RDMA_EFF  # noqa: E402


def kv_bytes(plan: dict, isl: float) -> float:
    """One request's hand-off: its prompt's KV (as compiler.perf.serving prices it)."""
    model = catalog.model(plan["model"]["name"]).spec
    return isl * arch.kv_bytes_per_token(model, plan["serving"]["kv_cache_dtype"]) \
        + arch.state_bytes_per_request(model)


def routes(plan: dict) -> dict[str, str]:
    """NVLink domain -> routing group (one group for all where the plan records none)."""
    groups = plan["routing"].get("groups") or []
    return {d: g["name"] for g in groups for d in g["domains"]}


def per_domain(plan: dict) -> dict[str, dict[str, list[float]]]:
    """Per routing group, per NVLink domain: [prefill supply, decode supply, prefill GPUs] (an
    instance over several domains, HGX's DEP16, splits evenly over its trays' domains)."""
    system = plan["hardware"]["groups"][0]["hardware"]
    domain_of = {t["id"]: t["nvlink_domain"] for t in system["trays"]}
    supply = {(c["role"], c["shape"]): c["requests_per_s"]
              for c in plan["solver"]["considered"]}
    route = routes(plan)
    table: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    for i in plan["instances"]:
        doms = [domain_of[t] for t in i["trays"]]
        each = supply[(i["role"], i["shape"])] / len(doms)
        for d in doms:
            row = table[route.get(d, "all")][d]
            row[0 if i["role"] == "prefill" else 1] += each
            if i["role"] == "prefill":
                row[2] += len(i["gpus"]) / len(doms)
    return table


def crossing(table: dict[str, dict[str, list[float]]], per_request: float, nic: float
             ) -> tuple[float, float, float]:
    """(share of hand-offs across domains, the least a rack-affine router would leave, the
    busiest domain's prefill NIC load), each group serving the smaller of its supplies."""
    cross = ideal = worst = served_all = 0.0
    for doms in table.values():
        ptot = sum(x[0] for x in doms.values()) or 1.0
        dtot = sum(x[1] for x in doms.values()) or 1.0
        served = min(ptot, dtot)
        served_all += served
        cross += served * (1 - sum(x[0] / ptot * x[1] / dtot for x in doms.values()))
        ideal += served * (1 - sum(min(x[0] / ptot, x[1] / dtot) for x in doms.values()))
        for p, q, gpus in doms.values():
            if gpus:
                out = served * p / ptot * (1 - q / dtot) * per_request
                worst = max(worst, out / (gpus * nic))
    served_all = served_all or 1.0
    return cross / served_all, ideal / served_all, worst


def report(name: str, r: dict, isl: float) -> None:
    plan = r["plan"]
    system = plan["hardware"]["groups"][0]["hardware"]
    table = per_domain(plan)
    nic = catalog.system(system["system"]).tray.nic_gbps_per_gpu.value / 8 * 1e9 * RDMA_EFF
    cross, ideal, worst = crossing(table, kv_bytes(plan, isl), nic)
    units = len({t["nvlink_domain"] for t in system["trays"]})
    print(f"{name:7s} {units:3d} domains  goodput {r['goodput']:10.1f} req/s  "
          f"per domain {r['goodput'] / units:8.1f}  routing groups {len(table):3d}  "
          f"cross-domain hand-offs {cross:6.1%} (rack-affine at best {ideal:6.1%})  "
          f"worst prefill NIC load {worst:6.1%}  TTFT p90 {plan['predicted']['ttft_ms_p90']} ms")
    if units <= 16:
        for group, doms in sorted(table.items()):
            for d, (p, q, _) in sorted(doms.items(), key=lambda kv: int(kv[0][3:])):
                print(f"    {group:8s} {d:6s} prefill supply {p:9.1f}  decode supply {q:9.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="vr1,vr4,vr16,vr64,hgx2,hgx16,hgx128")
    parser.add_argument("--out", help="keep the compiled folders here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.out) if args.out else Path(tmp)
        for name in args.cases.split(","):
            r = run(write_case(base / name / "in", name), base / name / "out")
            if r["exit"]:
                print(f"{name}: exit {r['exit']}: {r['error']}")
                continue
            isl = next(d["value"] for d in r["plan"]["decisions"]
                       if d["path"].endswith("workload.isl"))
            report(name, r, float(isl))
    return 0


if __name__ == "__main__":
    sys.exit(main())

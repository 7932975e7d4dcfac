"""Prediction error of the perf model: (a) kernel level against our own H200 measurements held
out of the fit (benchmarks/accuracy_ops.py), (b) end to end against the calibration points of
REFERENCE-DATA.md C1 (e2e_cases.yaml). Nothing end to end is fitted: every point is predicted
from the kernel curves and the serving mechanisms (benchmarks/README.md says which).

Usage: python benchmarks/accuracy.py    (exit 1 when a goal is missed)
Goals: kernel median |error| <= 10%; end to end every point within +-20%.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy_ops
import e2e

E2E_GOAL = 0.20


def end_to_end() -> bool:
    rows = e2e.errors()
    print("\n(b) end to end, REFERENCE-DATA.md C1")
    print(f"{'case':16s} {'metric':34s} {'predicted':>11s} {'measured':>10s} {'error':>8s}")
    for case, metric, got, measured, err in rows:
        print(f"{case:16s} {metric:34s} {got:11.1f} {measured:10.1f} {err:+8.1%}")
    checks = [abs(r[4]) for r in rows]
    within = sum(1 for e in checks if e <= E2E_GOAL)
    print(f"points within +-{E2E_GOAL:.0%}: {within}/{len(checks)}; "
          f"median |error| {e2e.median(checks):.1%}")
    return within == len(checks)


def main() -> int:
    print("(a) kernel level, H200, held out by shape group")
    kernel_ok = accuracy_ops.main([]) == 0
    e2e_ok = end_to_end()
    return 0 if kernel_ok and e2e_ok else 1


if __name__ == "__main__":
    sys.exit(main())

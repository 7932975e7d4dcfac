"""Per-kernel floors under CUDA graphs: what the smallest call of each op costs when engines
replay a captured graph (no Python, no launch queue), per op and dtype.

The floor of an op is the fastest of its measurements at tiny shapes (compiler/perf/measure.py
`--grid floors`: GEMM M 1-128, 1-4 tokens per expert, decode attention at batch 1-4 over
16-1,024 tokens, copies of 1 KiB-1 MiB, and the elementwise kernels around a layer's GEMMs:
RMSNorm, residual add + RMSNorm, SiLU x mul, router top-k + softmax, the faster of PyTorch's
kernels and their `torch.compile` fusion). The op model charges it as the op's fixed cost in
place of the curve's fitted `overhead_us`, for every engine shape (ops.py).

    python -m compiler.perf.floors RAW.floors.raw.json -o SYSTEM.floors.json
"""

import argparse
import json
import sys
from pathlib import Path

SCHEMA = "rackc.floors/v1"
ANY_DTYPE = "any"


def floor_table(raw: dict) -> dict:
    """The floors file for a raw floors measurement (sorted keys: byte-identical reruns)."""
    floors: dict[str, dict[str, float]] = {}
    for m in raw["measurements"]:
        by_dtype = floors.setdefault(m["op"], {})
        dtype = m.get("dtype", ANY_DTYPE)
        by_dtype[dtype] = min(by_dtype.get(dtype, float("inf")), float(m["us"]))
    d = raw["device"]
    return {"schema": SCHEMA,
            "source": f"fastest call per op of `measure.py --grid floors` under CUDA graphs on "
                      f"{d['gpu']} (torch {d['torch']}, CUDA {d['cuda']}, driver "
                      f"{d['driver']}) on {d['measured_on']}",
            "floors": {op: {dt: round(us, 3) for dt, us in sorted(v.items())}
                       for op, v in sorted(floors.items())}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    table = floor_table(json.loads(args.raw.read_text()))
    args.output.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

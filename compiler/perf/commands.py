"""The perf model's subcommands: `rackc perf ops` and `rackc calibrate`.

`add_perf_commands(subparsers)` adds them to rackc's argparse subparsers; each sets
`run=fn` with `fn(args) -> int` (the exit code), as compiler/cli.py's other commands do.
stdout carries results, stderr diagnostics; 0 OK, 2 bad input. The commands' modules (the
fitter, numpy) are imported when a command runs, not when rackc builds its parser.
"""

import argparse
import io
import json
import sys

OPS = ("gemm", "grouped_gemm", "attn_decode", "attn_prefill", "indexer", "copy")
CALIBRATE_HELP = "Write the calibration file the catalog loads for a system."


def cmd_perf_ops(args: argparse.Namespace) -> int:
    """Answer JSON Lines queries from stdin, one line out per good line in."""
    from compiler import catalog
    from compiler.perf import calibrate, query
    from compiler.perf.ops import op_model

    try:
        system = calibrate.resolve_system(args.system)
    except calibrate.CalibrationError as exc:
        sys.stderr.write(exc.diagnostic.render() + "\n")
        return 2
    model = op_model(system, catalog.calibration(system.name),
                     catalog.floors(system.name)["floors"])
    # Undecodable bytes become U+FFFD, so such a line is reported as bad JSON, not a crash.
    stdin = (io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
             if hasattr(sys.stdin, "buffer") else sys.stdin)
    bad = 0
    for result in query.run_queries(model, query.capped_lines(stdin)):
        if isinstance(result, dict):
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()  # answer each query as it comes, for interactive pipes
        else:
            bad += 1
            sys.stderr.write(query.render(result) + "\n")
    return 2 if bad else 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from compiler.perf import calibrate

    code, out, err = calibrate.run(args.system, args.output, args.from_raw, args.scale_from,
                                   args.from_aiconfigurator, args.framework)
    for line in out:
        sys.stdout.write(line + "\n")
    for line in err:
        sys.stderr.write(line + "\n")
    return code


def add_perf_commands(sub: argparse._SubParsersAction) -> None:
    """Add `perf ops` and `calibrate` to rackc's subcommands."""
    perf = sub.add_parser("perf", help="query the performance model")
    perf_sub = perf.add_subparsers(dest="perf_command", required=True, metavar="PERF_COMMAND")
    ops = perf_sub.add_parser(
        "ops", help="predict operator times: JSON Lines queries on stdin, answers on stdout",
        description="Each stdin line is a query such as "
                    '{"op":"gemm","dtype":"bf16","m":128,"n":4096,"k":7168}; each answer is '
                    'the query plus "us" (predicted microseconds). Ops: '
                    + ", ".join(OPS) + ".")
    ops.add_argument("--system", required=True, help="catalog system, e.g. hgx-h200")
    ops.set_defaults(run=cmd_perf_ops)

    cal = sub.add_parser(
        "calibrate", help="measure and fit operator efficiency curves; write a calibration file",
        description=CALIBRATE_HELP)
    cal.add_argument("--system", required=True, help="catalog system the file is for")
    cal.add_argument("-o", "--output", required=True, help="calibration JSON to write")
    cal.add_argument("--from-raw", metavar="RAW.json",
                     help="fit these raw measurements instead of measuring here (with "
                          "--from-aiconfigurator: for the ops its tables lack)")
    cal.add_argument("--from-aiconfigurator", action="store_true",
                     help="convert NVIDIA AIConfigurator's measured kernel tables for the "
                          "system (needs rackc[calibrate]) and fit them")
    cal.add_argument("--framework", choices=("vllm", "sglang", "trtllm"), default="vllm",
                     help="with --from-aiconfigurator: whose tables come first (another "
                          "framework's only where it has none); the non-vLLM files are what "
                          "`rackc predict --kernels` reads")
    cal.add_argument("--scale-from", metavar="CAL.json",
                     help="no measurements: carry this calibration's efficiencies onto the "
                          "system's datasheet peaks (assumed); with measurements or tables, "
                          "only for the ops they lack")
    cal.set_defaults(run=cmd_calibrate)

"""The `rackc` command line: parse arguments, call compiler.api, print. Only this module does I/O
on the user's behalf (through compiler.files and compiler.output_dir). `compiler.api` is
imported inside each command so that `compile` can fork its target emitter before the heavy
imports. One module past 500 lines on purpose: it is the one place that talks to the user
(each command's arguments, exit codes and printing), so a reader sees every command's
interface together.
"""

import argparse
import json
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from compiler import files, interrupts, output_dir
from compiler.load import display_name
from compiler.perf.commands import add_perf_commands
from compiler.validate.cli import add_validate_command
from schemas import KINDS
from schemas.diagnostics import CompileError, Diagnostic, did_you_mean, rendered
from schemas.export import schema_text

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


def _print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def _report(diagnostics: tuple[Diagnostic, ...] | list[Diagnostic]) -> None:
    sys.stderr.write(rendered(diagnostics))


def cmd_check(args: argparse.Namespace) -> int:
    from compiler import api

    try:
        result = api.check(Path(args.deployment))
    except CompileError as exc:
        if args.format == "json":
            _print_json(api.failed_check(exc))
        _report(exc.diagnostics)
        return exc.exit_code
    warnings = _pinned_warnings(Path(args.deployment))
    _report(warnings)
    if args.format == "json":
        result["diagnostics"] += [d.to_dict() for d in warnings]
        _print_json(result)
        return 0
    print(f"ok: {result['system']}, {result['racks']} rack(s), {result['trays']} trays, "
          f"{result['gpus_available']}/{result['gpus']} GPUs available, "
          f"{result['memory_domains']} memory domains, {result['nvlink_domains']} NVLink domain(s)")
    state = result["state_bytes_per_request"]
    print(f"model {result['model']}: {result['weights_gib']} GiB of weights, "
          f"{result['kv_bytes_per_token']} KV bytes per token"
          + (f", {state / 2 ** 20:.1f} MiB of linear-attention state per request" if state
             else ""))
    groups = list(dict.fromkeys(s.get("group") for s in result["shapes"])) or [None]
    for group in groups:  # a mixed fleet: each group's shapes
        for role in ("prefill", "decode"):
            shapes = [s for s in result["shapes"] if s["role"] == role and s.get("group") == group]
            fit = ", ".join(f"{s['shape']} ({s['weights_gib_per_gpu']} GiB)" for s in shapes
                            if s["fits"])
            print(f"{f'{group}: ' if group else ''}{role} shapes that fit: {fit or 'none'}")
    return 0


def _pinned_warnings(path: Path) -> list[Diagnostic]:
    """`check` of a pinned layout: the SLOs its prediction misses (W510), as `predict` and
    `compile` report them; a layout the solver chooses is checked by `compile`, and so is
    every mixed fleet's (pinned counts are refused there, E211)."""
    from compiler.load import load_fleet
    from compiler.pinned import predict_loaded

    fleet = load_fleet(path, "vllm")
    pinned = predict_loaded(fleet[0]) if len(fleet) == 1 else None
    return pinned[1] if pinned else []


def cmd_schema(args: argparse.Namespace) -> int:
    if args.kind is None:
        print("\n".join(KINDS))
        return 0
    kind = next((k for k in KINDS if k.lower() == args.kind.lower()), None)
    if kind is None:
        _report([Diagnostic("error", "E011", "<argument>", 0, 0, "KIND", " or ".join(KINDS),
                            repr(args.kind), "run `rackc schema` to list the kinds")])
        return 2
    sys.stdout.write(schema_text(kind))
    return 0


def cmd_import_hf(args: argparse.Namespace) -> int:
    from compiler.hf_import import import_hf

    path = Path(args.config)
    try:
        text = import_hf(path, display_name(path), args.name, args.hf_id)
    except CompileError as exc:
        _report(exc.diagnostics)
        return exc.exit_code
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        try:
            files.write_text_atomic(Path(args.output), text, keep=(path,))
        except CompileError as exc:
            _report(exc.diagnostics)
            return exc.exit_code
    return 0


def _with_progress(label: str, work: Callable[[], object]) -> object:
    """Run `work`; if it takes more than a second, show a progress line on stderr meanwhile
    (rich is imported only then: most compiles finish sooner)."""
    done = threading.Event()
    shown: list = []

    def show() -> None:
        if not done.wait(1.0):
            from rich.console import Console

            shown.append(Console(stderr=True).status(f"rackc: {label}..."))
            shown[0].start()

    watcher = threading.Thread(target=show, daemon=True)
    watcher.start()
    try:
        return work()
    finally:
        done.set()
        watcher.join()
        for status in shown:
            status.stop()


def _targets_asked(text: str | None) -> tuple[str, ...] | None:
    """`--targets a,b`: known target names, or CompileError with did-you-mean."""
    if text is None:
        return None
    from compiler.targets_registry import target_names

    known = target_names()
    asked = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in asked if t not in known]
    if bad or not asked:
        word = bad[0] if bad else text
        raise CompileError([Diagnostic("error", "E012", "<argument>", 0, 0, "--targets",
                                       "comma-separated target names", repr(word),
                                       did_you_mean(word, known))])
    return asked


def cmd_compile(args: argparse.Namespace) -> int:
    from compiler.emit_worker import EmitWorker

    try:
        only = _targets_asked(args.targets)
        read = (Path(args.deployment), *([Path(args.base)] if args.base else []))
        output_dir.check_location(Path(args.output), read)
        if not args.check:
            output_dir.owned_files(Path(args.output))  # refuse before the work
    except CompileError as exc:
        _report(exc.diagnostics)
        return exc.exit_code
    emitter = EmitWorker()  # forked before the solver's imports, so the two overlap
    try:
        from compiler import api

        base = api.read_plan(Path(args.base)) if args.base else None
        if args.restore and base is None:
            raise CompileError([Diagnostic("error", "E205", "<argument>", 0, 0, "--restore",
                                           "--from OLD/plan.yaml with it", "no --from",
                                           "name the running plan whose GPUs come back")])
        result = _with_progress("compiling", lambda: api.compile(
            Path(args.deployment), only, emitter, base, args.unavailable, args.restore))
        if args.check:
            return _check_output(Path(args.output), result.artifacts, only is not None)
        output_dir.write_output(Path(args.output), result.artifacts,
                                (*result.input_files, *read), keep_targets=only is not None)
    except CompileError as exc:
        _report(exc.diagnostics)
        return exc.exit_code
    finally:
        emitter.close()
    _report(result.warnings)
    _print_compiled(args, result, base, only)
    return 0


def _print_compiled(args: argparse.Namespace, result, base, only: tuple[str, ...] | None
                    ) -> None:
    """What a compile says once OUT is written: the survivors' cost (`--from`), the site
    notices of the targets written, then the layout and its prediction (or JSON)."""
    from compiler import incremental

    plan = result.plan
    if base is not None:
        for line in incremental.survivor_cost(plan, result.fresh_goodput):
            sys.stderr.write(line + "\n")
    for notice in plan.notices:
        if only is None or notice.target in only:
            sys.stderr.write(notice.render() + "\n")
    if args.format == "json":
        _print_json({"out": args.output, "files": sorted(result.artifacts),
                     "solver": plan.solver.model_dump(),
                     "predicted": plan.predicted.model_dump(mode="json", exclude={"curve"})})
        return
    print(f"compiled {plan.serving.name}: {len(plan.instances)} instances on "
          f"{sum(len(i.gpus) for i in plan.instances)} GPUs, solver {plan.solver.status}, "
          f"goodput {plan.goodput:g} requests/s")  # as the report's headline says it
    if base is not None:
        print("\n".join(incremental.changes(base, plan)
                        + incremental.metrics(base, plan, result.fresh_goodput)))
    else:
        for i in plan.instances:
            print(f"  {i.id:12s} {i.shape:8s} {','.join(i.trays)}")
    p = plan.predicted
    print(f"predicted: {p.tokens_per_s_per_user_p90:g} tokens/s per user (P90), "
          f"TTFT P90 {p.ttft_ms_p90:g} ms, {p.total_tokens_per_s_per_gpu:g} tokens/s per "
          f"GPU; wrote {len(result.artifacts)} files to {args.output}")
    _print_isolated(p)


def _check_output(out: Path, artifacts: dict[str, str | bytes], subset: bool) -> int:
    """`compile --check`: exit 0 when OUT is what the inputs compile to, else 1 and the list."""
    if not out.exists():
        print(f"{out}: does not exist")
        return 1
    lines = output_dir.differences(out, artifacts, subset)
    print("\n".join(lines) if lines else f"{out}: up to date")
    return 1 if lines else 0


def cmd_predict(args: argparse.Namespace) -> int:
    try:
        pinned, systems = (None, []) if args.plot else _predict_pinned(Path(args.deployment),
                                                                         args.kernels)
        if pinned is None:
            from compiler import api

            result = _with_progress("predicting", lambda: api.compile(
                Path(args.deployment), ("report",) if args.plot else (),
                kernels=args.kernels))
            if args.plot:
                files.write_text_atomic(Path(args.plot), result.artifacts["report/curve.svg"],
                                         "--plot", result.input_files)
            pinned = result.plan.predicted, result.warnings
            systems = [h.system for h in result.plan.fleet]
    except CompileError as exc:
        _report(exc.diagnostics)
        return exc.exit_code
    _report(pinned[1])
    p = {**pinned[0].model_dump(mode="json"), "kernels": _kernels_used(systems, args.kernels)}
    if args.format == "json":
        _print_json(p)
        return 0
    for key, value in p.items():
        if key not in ("instances", "breakdown", "curve", "balance", "kernels", "slo",
                       "simulated", "isolated"):
            print(f"{key}: {value}")
    for row in p["instances"]:
        print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    k = p["kernels"]
    what_if = "" if k["deployed"] else " (a what-if: the bundle runs vllm)"
    for c in k["calibration"]:
        print(f"kernels: {k['engine']}{what_if}, {c['system']}: {c['file']}, {c['source']}")
    _print_isolated(pinned[0])
    if pinned[0].simulated is not None:
        _print_simulated(pinned[0])
    return 0


def _print_isolated(predicted) -> None:
    """The pinned operating points' phase-isolated figures, said to be such."""
    if predicted.isolated:
        print(f"{predicted.isolated[0].HEADING}:")
        for row in predicted.isolated:
            print(f"  {row.summary()}")


def _print_simulated(predicted) -> None:
    """The compile-time simulated run beside the closed form, a row per figure."""
    from compiler.simulate.compare import WHY, rows, start_up

    sim = predicted.simulated
    print(f"simulated ({sim.requests} requests, {sim.workload}, routing {sim.policy}, "
          f"seed {sim.seed}) beside the closed form:")
    table = rows(predicted)
    width = max(len(r.label) for r in table)
    print(f"  {'':<{width}}  {'simulated':>10}  {'closed':>10}")
    for r in table:
        closed = "" if r.closed is None else f"{r.closed:g}"
        value = "" if r.simulated is None else f"{r.simulated:g}"
        flag = "  disagree (>10%)" if r.disagrees else ""
        print(f"  {r.label:<{width}}  {value:>10}  {closed:>10}{flag}".rstrip())
    if sim.disagrees:
        print(f"  {WHY}")
    short = start_up(predicted)
    if short:
        print(f"  {short}")


def _predict_pinned(path: Path, kernels: str) -> tuple:
    """A pinned layout is predicted without the solver or the emitters (compiler/pinned.py):
    ((the prediction, its warnings) or None, the systems it is of)."""
    from compiler.load import load_inputs
    from compiler.pinned import predict_loaded

    inputs = load_inputs(path, kernels)
    return predict_loaded(inputs), [inputs.system.name]


def _kernels_used(systems: list[str], kernels: str) -> dict:
    """Whose measured kernels a prediction used: the calibration file of each system and
    what its curves were fitted to."""
    from compiler import catalog

    return {"engine": kernels, "deployed": kernels == catalog.DEPLOYED_KERNELS,
            "calibration": [{"system": s, "file": catalog.kernels_path(s, kernels).name,
                             "source": (catalog.calibration(s, kernels) or {}).get(
                                 "source", "none: datasheet peaks (assumed)")}
                            for s in dict.fromkeys(systems)]}


def cmd_explain(args: argparse.Namespace) -> int:
    from compiler import api

    try:
        plan = api.read_plan(Path(args.plan))
    except CompileError as exc:
        _report(exc.diagnostics)
        return exc.exit_code
    prefix = args.path or ""
    rows = [d for d in plan.decisions if _explains(d.path, prefix)]
    if not rows:
        _report([Diagnostic("error", "E702", display_name(Path(args.plan)), 0, 0, prefix,
                            "a decision path", repr(prefix),
                            "run `rackc explain PLAN` to list every decision")])
        return 2
    for d in rows:
        print(f"{d.path} = {d.value}  [{d.source}]  {d.why}")
    return 0


def _explains(path: str, prefix: str) -> bool:
    """A decision at or below `prefix`; a mixed fleet's group setting
    (`groups.<group>.<path>`, compiler.fleet) also by its path within the group."""
    head, _, rest = path.partition(".")
    within = rest.partition(".")[2] if head == "groups" else None
    return path.startswith(prefix) or (within is not None and within.startswith(prefix))


def cmd_diff(args: argparse.Namespace) -> int:
    from compiler import api

    try:
        a, b = api.read_plan(Path(args.a)), api.read_plan(Path(args.b))
    except CompileError as exc:
        _report(exc.diagnostics)
        return exc.exit_code
    lines = api.diff_plans(a, b)
    print("\n".join(lines) if lines else "no differences")
    return 1 if lines else 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from compiler import api
    from compiler.simulate import report
    from compiler.simulate.runner import Options

    trace = Path(args.trace) if args.trace else None
    opts = Options(profile=args.workload, trace=trace,
                   trace_name=display_name(trace) if trace else "",
                   **({"trace_block_size": args.trace_block_size}
                      if args.trace_block_size else {}),
                   requests=args.requests, seed=args.seed,
                   policies=tuple(p for p in (args.policy or "").split(",") if p),
                   faults=tuple(f for spec in args.fail or [] for f in spec.split(",") if f),
                   rate_per_s=args.rate)
    try:
        if trace is not None and not trace.is_file():
            raise CompileError([Diagnostic("error", "E752", display_name(trace), 0, 0,
                                           "--trace", "a JSON Lines file", "no such file",
                                           "pass the path of a trace file")])
        out = _with_progress("simulating", lambda: api.simulate(
            Path(args.plan), Path(args.deployment), opts))
        if args.plot:
            plots = report.plot(out["results"], out["outcomes"])
            folder = Path(args.plot)
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in plots.items():
                files.write_bytes_atomic(folder / name, data, "--plot")
    except CompileError as exc:
        _report(exc.diagnostics)
        return exc.exit_code
    except OSError as exc:
        _report(files.os_error("--plot", args.plot, exc).diagnostics)
        return 2
    if args.format == "json":
        _print_json({"seed": args.seed, "policies": out["results"],
                     "closed_form": out["closed_form"]})
        return 0
    sys.stdout.write(report.render_text(out["results"], out["closed_form"]))
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= value <= 10_000_000:
        raise argparse.ArgumentTypeError(f"expected 1 to 10000000, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rackc", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_input_commands(sub)
    _add_compile_command(sub)
    _add_plan_commands(sub)
    _add_simulate_command(sub)
    add_perf_commands(sub)
    add_validate_command(sub)
    return parser


def _add_input_commands(sub) -> None:
    check = sub.add_parser("check", help="validate inputs and show which engine shapes fit")
    check.add_argument("deployment")
    check.add_argument("--format", choices=("text", "json"), default="text")
    check.set_defaults(run=cmd_check)

    schema = sub.add_parser("schema", help="print the JSON Schema of an input kind")
    schema.add_argument("kind", nargs="?")
    schema.set_defaults(run=cmd_schema)

    imp = sub.add_parser("import-hf", help="turn a Hugging Face config.json into a Model file")
    imp.add_argument("config")
    imp.add_argument("-o", "--output")
    imp.add_argument("--name", help="metadata.name of the model (default: from the config)")
    imp.add_argument("--hf-id", help="the Hugging Face repository vLLM downloads the weights "
                                     "from, OWNER/NAME (default: the config's _name_or_path; "
                                     "required when that is absent or a local folder)")
    imp.set_defaults(run=cmd_import_hf)


def _add_compile_command(sub) -> None:
    comp = sub.add_parser("compile", help="solve, place, predict and emit every target")
    comp.add_argument("deployment")
    comp.add_argument("-o", "--output", required=True,
                      help="output folder: created, filled when empty, or replaced when rackc "
                           "wrote it (nothing else is ever replaced)")
    comp.add_argument("--targets", help="comma-separated subset of targets to emit (the other "
                                        "targets' files in OUT are kept)")
    comp.add_argument("--check", action="store_true",
                      help="write nothing; exit 1 when OUT differs from what the inputs give")
    comp.add_argument("--format", choices=("text", "json"), default="text")
    comp.add_argument("--from", dest="base", metavar="OLD/plan.yaml",
                      help="the running plan: instances whose GPUs all stay available keep "
                           "their ids and GPUs; print what stops, starts and moves")
    comp.add_argument("--unavailable", metavar="ID[,ID...]",
                      help="failed GPUs (r0-t07-g2), trays (r0-t07) or racks (r3)")
    comp.add_argument("--restore", metavar="ID[,ID...]",
                      help="with --from: GPUs, trays or racks the old plan had down that are "
                           "repaired (running instances stay where they are)")
    comp.set_defaults(run=cmd_compile)


def _add_plan_commands(sub) -> None:
    """Commands that read a deployment's prediction or a written plan."""
    pred = sub.add_parser("predict", help="predicted serving metrics of the deployment")
    pred.add_argument("deployment")
    pred.add_argument("--format", choices=("text", "json"), default="text")
    pred.add_argument("--plot", help="write the throughput-interactivity curve (SVG)")
    pred.add_argument("--kernels", choices=("vllm", "sglang", "trtllm"), default="vllm",
                      help="predict with this engine's measured kernels (a what-if for "
                           "results measured on SGLang or TRT-LLM; the bundle runs vLLM)")
    pred.set_defaults(run=cmd_predict)

    exp = sub.add_parser("explain", help="why a decision in a plan was made")
    exp.add_argument("plan")
    exp.add_argument("path", nargs="?")
    exp.set_defaults(run=cmd_explain)

    diff = sub.add_parser("diff", help="what moved between two plans (exit 1 when they differ)")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.set_defaults(run=cmd_diff)


def _add_simulate_command(sub) -> None:
    sim = sub.add_parser("simulate", help="replay a workload request by request against a "
                                          "compiled plan")
    sim.add_argument("plan", help="OUT/plan.yaml")
    sim.add_argument("--deployment", required=True,
                     help="the deployment the plan was compiled from (its model, system and "
                          "workload; the plan's inputs digest must match)")
    src = sim.add_mutually_exclusive_group()
    src.add_argument("--workload", choices=("closed", "poisson", "bursty", "agentic"),
                     help="generator (default: closed loop at the workload's concurrency, or "
                          "Poisson at the plan's predicted rate in throughput mode)")
    src.add_argument("--trace", metavar="FILE.jsonl", help="requests from a JSON Lines trace")
    sim.add_argument("--trace-block-size", type=_positive_int, metavar="TOKENS",
                     help="tokens per block of a trace's hash_ids (default: 512, Mooncake's)")
    sim.add_argument("--requests", type=_positive_int, default=10_000)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--rate", type=_positive_float,
                     help="requests/s of the open-loop profiles (default: the plan's)")
    sim.add_argument("--policy", help="routing policies to compare, comma-separated "
                                      "(kv, round-robin, random, session, least-uncached)")
    sim.add_argument("--fail", action="append", metavar="ID@T",
                     help="a GPU, tray or rack fails T seconds in (repeatable)")
    sim.add_argument("--format", choices=("text", "json"), default="text")
    sim.add_argument("--plot", metavar="DIR", help="write latency CDFs, hit rate over time "
                                                   "and per-rank load (PNG) into DIR")
    sim.set_defaults(run=cmd_simulate)


def main(argv: list[str] | None = None) -> int:
    interrupts.install()  # ^C and SIGTERM unwind: staging is removed, OUT is untouched
    try:
        args = build_parser().parse_args(argv)
        run: Callable[[argparse.Namespace], int] = args.run
        return run(args)
    except BrokenPipeError:  # stdout closed early (`| head`): nothing left to say
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as exc:
        sys.stderr.write("rackc: interrupted; nothing was written\n")
        return exc.exit_code if isinstance(exc, interrupts.Interrupted) else EXIT_INTERRUPTED
    except Exception:  # a bug, not bad input: show where, and say so
        signum = interrupts.received()
        if signum is not None:  # the interrupt, turned into another error by an extension
            sys.stderr.write("rackc: interrupted; nothing was written\n")
            return 128 + signum
        traceback.print_exc()
        sys.stderr.write("rackc: internal error (a bug in rackc, not in your input); "
                         "please report it with the traceback above\n")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())

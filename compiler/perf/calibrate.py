"""`rackc calibrate`: write the calibration file the catalog loads for a system.

Four sources, one output shape (compiler/perf/fit.py `calibration`):
* measure here: needs PyTorch and a CUDA GPU; compiler/perf/measure.py writes the raw
  measurements next to the output (`<name>.raw.json`), then they are fitted;
* `--from-raw RAW.json`: fit measurements taken elsewhere (measure.py needs only PyTorch and
  the standard library, so it runs on a bare GPU machine; fitting needs numpy and the catalog);
* `--from-aiconfigurator`: convert NVIDIA AIConfigurator's published kernel tables for this
  system (compiler/perf/aiconfigurator.py; needs the `rackc[calibrate]` extra), write them
  next to the output (`<name>.aiconfigurator.raw.json`, refittable with --from-raw), then fit;
  with `--from-raw` too, ops the tables lack are fitted from those measurements;
* `--scale-from CAL.json`: no GPU of this system at hand: carry another system's fitted
  efficiencies onto this system's datasheet peaks, marked `assumed`; beside measurements or
  tables, only for the ops they lack (e.g. copies, which AIConfigurator does not table).
The same inputs give a byte-identical file (sorted keys, rounded parameters).
"""

import importlib.util
import json
from pathlib import Path

from compiler import catalog
from compiler.catalog.system import System
from compiler.files import check_target, write_text_atomic
from compiler.perf import fit
from compiler.perf.calibration_files import calibration_errors, validation_errors
from schemas.diagnostics import CompileError, Diagnostic, did_you_mean
from schemas.reading import FileProblem, read_regular

CODE_SYSTEM = "E602"  # unknown system
CODE_INPUT = "E603"  # unreadable or mismatched calibration input
CODE_NO_GPU = "E604"  # measuring needs PyTorch and a CUDA GPU
CODE_NO_TABLES = "E605"  # AIConfigurator's tables are not installed or lack this system
AIC_RAW_SUFFIX = ".aiconfigurator.raw.json"
RAW_SUFFIX = ".raw.json"
MAX_INPUT_BYTES = 64 << 20  # raw files are 0.2-1.4 MB; a calibration file is a few KB


class CalibrationError(Exception):
    """An expected failure, told as one diagnostic; the command exits 2 without a traceback."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.render())
        self.diagnostic = diagnostic


def _error(code: str, where: str, path: str, expected: str, got: str,
           hint: str = "") -> CalibrationError:
    return CalibrationError(Diagnostic("error", code, where, 0, 0, path, expected, got, hint))


def resolve_system(name: str) -> System:
    """The catalog system called `name`, or a diagnostic naming the known ones."""
    names = catalog.system_names()
    if name not in names:
        raise _error(CODE_SYSTEM, "<argument>", "--system", "a catalog system", repr(name),
              did_you_mean(name, names))
    return catalog.system(name)


def read_json(path: Path, what: str) -> dict:
    """A JSON object from a regular file of at most MAX_INPUT_BYTES (never a FIFO or a
    device), or a diagnostic."""
    try:
        data = json.loads(read_regular(path, MAX_INPUT_BYTES).decode("utf-8"))
    except FileProblem as problem:
        raise _error(CODE_INPUT, str(path), "", f"{problem.expected} ({what})", problem.got,
                     problem.hint) from None
    except UnicodeDecodeError as exc:
        raise _error(CODE_INPUT, str(path), "", f"a {what} in UTF-8",
                     f"undecodable byte at offset {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise _error(CODE_INPUT, f"{path}:{exc.lineno}:{exc.colno}", "", f"a {what} in JSON",
                     f"invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise _error(CODE_INPUT, str(path), "", f"a {what} in JSON", "nesting too deep",
                     "rackc's JSON files nest a few levels") from None
    if not isinstance(data, dict):
        raise _error(CODE_INPUT, str(path), "", f"a {what}: a JSON object",
                     f"a JSON {type(data).__name__}")
    return data


def check_raw(raw: dict, path: Path, system: System) -> None:
    """Raw measurements must follow the raw schema (compiler/perf/raw.py) and come from this
    system's GPU."""
    problems = validation_errors(raw)
    if problems:
        field, expected, got = problems[0]
        more = f"; {len(problems) - 1} more problem(s) after this one" if len(problems) > 1 else ""
        raise _error(CODE_INPUT, str(path), field, expected, got,
                     f"a raw file as compiler/perf/measure.py writes it{more}")
    gpu = raw["device"]["gpu"]
    if system.gpu.name.lower() not in gpu.lower():
        raise _error(CODE_INPUT, str(path), "device.gpu", f"a {system.gpu.name} ({system.name})",
              repr(gpu), "fit measurements with the --system they were taken on")
    if not any(m["op"] in fit.WORK for m in raw["measurements"]):
        raise _error(CODE_INPUT, str(path), "measurements", "a measurement of an op rackc fits "
                     f"({', '.join(fit.WORK)})", "none",
                     "measure with compiler/perf/measure.py")


def measure_here(raw_path: Path) -> Path:
    """Run compiler/perf/measure.py on this machine's GPU, writing `raw_path`."""
    if importlib.util.find_spec("torch") is None:
        raise _error(CODE_NO_GPU, "<machine>", "", "PyTorch with CUDA to measure on",
              "no PyTorch installed",
              "run on a CUDA machine with PyTorch, or fit measurements with --from-raw RAW.json")
    import torch  # only here: the rest of rackc runs without PyTorch

    if not torch.cuda.is_available():
        raise _error(CODE_NO_GPU, "<machine>", "", "a CUDA GPU to measure on", "no CUDA device",
              "run on a CUDA machine, or fit measurements with --from-raw RAW.json")
    from compiler.perf import measure  # imports torch

    measure.main(["-o", str(raw_path)])
    return raw_path


def assumed(system: System, basis: dict) -> dict:
    """Another system's fitted curves on this system's datasheet peaks (`assumed`); a basis
    converted from published tables passes its licence and notice on."""
    document = {
        "schema": fit.SCHEMA,
        "system": system.name,
        "source": f"assumed: {basis['system']} efficiencies on {system.name} datasheet peaks",
        "basis": basis["system"],
        "notes": list(basis.get("notes", [])),
        "curves": fit.with_fp4(basis["curves"]),
    }
    document.update({key: basis[key] for key in ("licence", "notice") if key in basis})
    return document


def read_basis(path: str) -> dict:
    basis = read_json(Path(path), "calibration file")
    problems = calibration_errors(basis)
    if problems:
        field, expected, got = problems[0]
        raise _error(CODE_INPUT, path, field, expected, got,
                     "pass a calibration file rackc calibrate wrote")
    return basis


def filled(document: dict, basis: dict) -> dict:
    """`document` with the ops it has no curves for carried from `basis` (assumed, said in
    its source)."""
    missing = sorted(set(basis["curves"]) - set(document["curves"]))
    if not missing:
        return document
    curves = {**document["curves"], **{op: basis["curves"][op] for op in missing}}
    source = (f"{document['source']}; {', '.join(missing)}: assumed, {basis['system']}'s "
              "curves")
    return {**document, "curves": curves, "source": source}


def published_raw(system: System, from_raw: str | None, output: Path,
                  inputs: tuple[str, ...] = (), framework: str = "vllm") -> dict:
    """AIConfigurator's tables for `system` as raw measurements, `framework`'s first (merged
    with `from_raw`'s for the ops they lack), also written next to `output`."""
    from compiler.perf import aiconfigurator  # its tables need the calibrate extra

    try:
        raw = aiconfigurator.raw_document(system.name, framework)
    except (ImportError, aiconfigurator.SourceMissing) as exc:
        raise _error(CODE_NO_TABLES, "<machine>", "--from-aiconfigurator",
                     f"AIConfigurator's kernel tables for {system.name}", str(exc),
                     "pip install 'rackc[calibrate]'") from None
    if from_raw:
        own = read_json(Path(from_raw), "raw calibration file")
        check_raw(own, Path(from_raw), system)
        raw = aiconfigurator.merged(raw, own)
    write_text_atomic(beside(output, AIC_RAW_SUFFIX), raw_text(raw), keep=inputs)
    return raw


def raw_text(raw: dict) -> str:
    """A raw document as measure.py renders it: one measurement a line, so re-conversions
    diff cleanly."""
    head = json.dumps({key: value for key, value in raw.items()
                       if key not in ("measurements", "moe_tables")}, indent=1, sort_keys=True)
    rows = ",\n".join(f"  {json.dumps(m)}" for m in raw["measurements"])
    tables = f",\n{fit.table_lines(raw['moe_tables'], ' ')}" if raw.get("moe_tables") else ""
    return f'{head[:-2]},\n "measurements": [\n{rows}\n]{tables}}}\n'


def beside(output: Path, suffix: str) -> Path:
    """The file written next to `output` (`cal.json` -> `cal.raw.json`)."""
    return output.with_name(output.name.removesuffix(".json") + suffix)


def calibration_for(args_system: str, from_raw: str | None, scale_from: str | None,
                    output: Path, from_aiconfigurator: bool = False,
                    framework: str = "vllm") -> dict:
    system = resolve_system(args_system)
    inputs = tuple(p for p in (from_raw, scale_from) if p)
    basis = read_basis(scale_from) if scale_from else None
    if from_aiconfigurator:
        check_target(beside(output, AIC_RAW_SUFFIX), keep=inputs)
        raw = published_raw(system, from_raw, output, inputs, framework)
    elif from_raw or not basis:
        if not from_raw:
            check_target(beside(output, RAW_SUFFIX), keep=inputs)
        raw_path = Path(from_raw) if from_raw else measure_here(beside(output, RAW_SUFFIX))
        raw = read_json(raw_path, "raw calibration file")
        check_raw(raw, raw_path, system)
    else:
        return assumed(system, basis)
    try:
        document = fit.calibration(raw, system)
    except fit.FitProblem as exc:
        raise _error(CODE_INPUT, str(from_raw or "<measurements>"), exc.field, exc.expected,
                     exc.got, exc.hint) from None
    return filled(document, basis) if basis else document


def summary_lines(document: dict) -> list[str]:
    """The fit's per-(op, dtype) in-sample errors, or the assumption made."""
    if "fit" not in document:
        return [f"{document['system']}: {document['source']}"]
    lines = [f"{'op':<14}{'dtype':<7}{'points':>7}{'excluded':>9}{'median':>8}{'p90':>8}"]
    for op, by_dtype in document["fit"].items():
        for dtype, s in by_dtype.items():
            lines.append(f"{op:<14}{dtype:<7}{s['points']:>7}{s['excluded']:>9}"
                         f"{s['median_abs_err']:>8.1%}{s['p90_abs_err']:>8.1%}")
    return lines


def run(system: str, output: str, from_raw: str | None = None, scale_from: str | None = None,
        from_aiconfigurator: bool = False,
        framework: str = "vllm") -> tuple[int, list[str], list[str]]:
    """(exit code, stdout lines, stderr lines) of one calibration."""
    inputs = tuple(p for p in (from_raw, scale_from) if p)
    try:
        check_target(Path(output), keep=inputs)  # before the work: never over an input
        document = calibration_for(system, from_raw, scale_from, Path(output),
                                   from_aiconfigurator, framework)
        write_text_atomic(Path(output), fit.dumps(document), keep=inputs)
    except CalibrationError as exc:
        return 2, [], [exc.diagnostic.render()]
    except CompileError as exc:
        return 2, [], [d.render() for d in exc.diagnostics]
    return 0, [*summary_lines(document), f"wrote {output}"], []

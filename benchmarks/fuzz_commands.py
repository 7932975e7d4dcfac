"""Fuzzer of the commands and their non-YAML inputs (benchmarks/fuzz.py covers the Rack, Model
and Deployment files): hand-edited plans, damaged calibration files, tampered bundles, outputs
named over inputs, signals and concurrent runs. Every case must end in a result or a
diagnostic, never a traceback (exit 70, an uncaught exception, "Traceback" on stderr), a hang
(`--timeout`), a partial output, data loss (an input changed) or litter (anything left in the
case's folder that the command did not promise to write).

Families, each with its own oracle:
* plan: a golden plan.yaml mutated in its structure (ids, GPUs, shapes, extreme values,
  deleted keys) or its text, read by `explain` and `diff`; every `--compile-every`-th case also
  `compile --from` it (exit 0 must leave a complete OUT, any other exit none).
* calibrate: a small raw file (from compiler/catalog/calibration/hgx-h200.raw.json) mutated,
  fitted by `calibrate --from-raw`; or an output named over an input (the raw file, a hard link
  to it, the `--scale-from` basis), a folder, a FIFO, a link; a replaced output keeps its mode.
* validate: a compiled bundle with files deleted, edited, added, replaced by links or FIFOs,
  made unreadable; exit 0 only when OUT is exactly what rackc wrote.
* signal: `rackc compile` into a rackc-written OUT, sent SIGINT or SIGTERM at a random moment:
  exit 130/143 with OUT as it was, or 0 with OUT new; nothing beside OUT.
* concurrent: two compiles into one OUT at once: both exit 0 and OUT is one complete output.

In-process cases run the CLI's own `main` in `--workers` processes; signal and concurrent
cases run `python -m compiler` in subprocesses. Stops after `--cases` or `--budget` seconds.

Usage: python benchmarks/fuzz_commands.py [--cases 10000] [--seed 0] [--workers 2]
           [--budget SECONDS] [--timeout 120] [--compile-every 400] [--only signal,...]
Exit 1 when any case failed its oracle; the failures are listed with their case number.
"""

import argparse
import contextlib
import copy
import hashlib
import io
import json
import multiprocessing
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXAMPLE = ROOT / "examples" / "hgx-h200-deepseek-v3"
GOLDEN_PLAN = ROOT / "tests" / "golden" / "hgx-h200-deepseek-v3" / "plan" / "plan.yaml"
RAW = ROOT / "compiler" / "catalog" / "calibration" / "hgx-h200.raw.json"
BASIS = ROOT / "compiler" / "catalog" / "calibration" / "hgx-h200.json"
MANIFEST = ".rackc-manifest.json"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
EXTREMES = [0, -1, 1, 2**31, 2**63, 10**30, 1e308, float("inf"), float("nan"), -0.0, True,
            None, "", "x" * 300, "\u202e", "decode-00", "prefill-00", "r0-t00-g0", "r9-t99-g9",
            "DEP8", "TP8", "DEP999", [], {}, [1, 2], {"a": 1}, "bf16", "int4", "64"]
# The workers run numpy (calibrate's fit) in-process and fork rackc processes: one BLAS
# thread each, so two workers do not oversubscribe two cores or hold threads across cases.
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
FAMILIES = (("plan", 45), ("calibrate", 45), ("validate", 8), ("signal", 1), ("concurrent", 1))


class Hang(Exception):
    pass


def _alarm(_signum, _frame):
    raise Hang


# --- running ---------------------------------------------------------------------------------

def run_cli(argv: list[str], timeout: float) -> tuple[int | str, str]:
    """(exit code, or 'hang'/'traceback', stderr) of the CLI's main, in this process."""
    from compiler import cli

    err, out = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = cli.main(argv)
    except Hang:
        return "hang", err.getvalue()
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:  # exactly what the fuzzer looks for
        return "traceback", f"{err.getvalue()}\n{type(exc).__name__}: {exc}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        for signum in (signal.SIGINT, signal.SIGTERM):  # main installed rackc's handlers
            signal.signal(signum, signal.SIG_DFL)
    text = err.getvalue()
    if code == 70 or "Traceback" in text:
        return "traceback", text
    return code, text


def run_rackc(argv: list[str], cwd: Path, timeout: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "compiler", *argv], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def tree(folder: Path) -> dict[str, str]:
    """Every entry below `folder`: file -> sha256, anything else -> its kind (and mode)."""
    out = {}
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and os.access(path, os.R_OK):
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() + oct(st.st_mode)
            else:
                out[rel] = oct(st.st_mode)
    return out


def complete(out: Path) -> bool:
    """OUT holds exactly what its manifest lists."""
    try:
        listed = json.loads((out / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return False
    have = {k: v[:64] for k, v in tree(out).items() if len(v) > 64}
    have.pop(MANIFEST, None)
    return have == listed


# --- mutations -------------------------------------------------------------------------------

def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _at(doc: object, path: tuple) -> object:
    for p in path:
        doc = doc[p]
    return doc


def mutate_tree(rng: random.Random, doc: dict, prefer: str | None = None) -> str:
    paths = _paths(doc)
    if prefer and rng.random() < 0.6:
        paths = [p for p in paths if p[0] == prefer] or paths
    path = rng.choice(paths)
    parent, key = _at(doc, path[:-1]), path[-1]
    kind = rng.choice(("set", "set", "delete", "duplicate", "swap"))
    if kind == "delete":
        del parent[key]
    elif kind == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(parent[key]))
    elif kind == "swap" and isinstance(parent, list) and len(parent) > 1:
        other = rng.randrange(len(parent))
        parent[key], parent[other] = parent[other], parent[key]
    else:
        parent[key] = copy.deepcopy(rng.choice(EXTREMES))
    return f"{kind} {'.'.join(map(str, path))}"


def mutate_text(rng: random.Random, text: str) -> tuple[str, str]:
    lines = text.splitlines(keepends=True)
    kind = rng.choice(("truncate", "flip", "drop-line", "dup-line", "junk"))
    if kind == "truncate":
        return text[:rng.randrange(len(text))], kind
    if kind == "flip":
        i = rng.randrange(len(text))
        return text[:i] + chr(rng.randrange(32, 0x2FF)) + text[i + 1:], kind
    i = rng.randrange(len(lines))
    if kind == "drop-line":
        del lines[i]
    elif kind == "dup-line":
        lines.insert(i, lines[i])
    else:
        lines.insert(i, rng.choice(("- id: decode-00\n", "  gpus: [r0-t00-g0]\n", "{\n",
                                    "  shape: TP8\n", '"x": 1,\n', "]]\n", "\t\n")))
    return "".join(lines), kind


# --- families --------------------------------------------------------------------------------

def case_plan(rng: random.Random, work: Path, ctx: dict, index: int) -> tuple[str, str]:
    text = ctx["plan_text"]
    if rng.random() < 0.7:
        doc = yaml.load(text, Loader=LOADER)
        what = "; ".join(mutate_tree(rng, doc, "instances") for _ in range(rng.randint(1, 3)))
        text = yaml.dump(doc, Dumper=DUMPER, sort_keys=False)
    else:
        text, what = mutate_text(rng, text)
    plan = work / "plan.yaml"
    plan.write_text(text, encoding="utf-8", errors="surrogatepass")
    before = tree(work)
    for argv in (["explain", str(plan)], ["diff", str(plan), str(GOLDEN_PLAN)]):
        code, err = run_cli(argv, ctx["timeout"])
        if code not in (0, 1, 2):
            return f"{code}", f"{what}: {argv[0]}: {err[-300:]}"
    if tree(work) != before:
        return "data loss", what
    if index % ctx["compile_every"] == 0:
        out = work / "out"
        proc = run_rackc(["compile", str(EXAMPLE / "deployment.yaml"), "-o", str(out),
                          "--from", str(plan)], work, ctx["timeout"])
        try:
            _, err = proc.communicate(timeout=ctx["timeout"] * 3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return "hang", f"{what}: compile --from"
        code = "traceback" if "Traceback" in err or proc.returncode == 70 else proc.returncode
        if code not in (0, 2, 3):
            return f"{code}", f"{what}: compile --from: {err[-300:]}"
        if (code == 0) != out.exists() or (code == 0 and not complete(out)):
            return "partial output", what
        left = set(os.listdir(work)) - {"plan.yaml", "out"}
        if left:
            return "litter", f"{what}: {sorted(left)}"
    return "ok", what


def _small_raw(rng: random.Random, raw: dict) -> dict:
    ms = raw["measurements"]
    gemm = [m for m in ms if m["op"] == "gemm" and m.get("dtype") == "bf16"]
    copies = [m for m in ms if m["op"] == "copy"]
    return copy.deepcopy({**raw, "measurements": rng.sample(gemm, 12) + rng.sample(copies, 4)})


def case_calibrate(rng: random.Random, work: Path, ctx: dict, index: int) -> tuple[str, str]:
    raw_doc = _small_raw(rng, ctx["raw"])
    raw, out = work / "raw.json", work / "cal.json"
    scale = None
    kind = rng.choice(("damage", "damage", "damage", "over-raw", "hard-link", "over-basis",
                       "folder", "fifo", "link", "mode"))
    if kind == "damage":
        if rng.random() < 0.8:
            what = "; ".join(mutate_tree(rng, raw_doc, "measurements")
                             for _ in range(rng.randint(1, 3)))
            text = json.dumps(raw_doc, allow_nan=True)
        else:
            text, what = mutate_text(rng, json.dumps(raw_doc, indent=1))
        raw.write_text(text, encoding="utf-8", errors="surrogatepass")
    else:
        what = kind
        raw.write_text(json.dumps(raw_doc))
    if kind == "over-raw":
        out = raw
    elif kind == "hard-link":
        os.link(raw, work / "same.json")
        out = work / "same.json"
    elif kind == "over-basis":
        scale = work / "basis.json"
        shutil.copy(BASIS, scale)
        out = scale
    elif kind == "folder":
        out.mkdir()
    elif kind == "fifo":
        os.mkfifo(out)
    elif kind == "link":
        out.symlink_to(raw)
    elif kind == "mode":
        out.write_text("{}")
        out.chmod(0o600)
    inputs = {p: p.read_bytes() for p in (raw, scale) if p}
    had = tree(work)
    argv = ["calibrate", "--system", "hgx-h200", "--from-raw", str(raw), "-o", str(out)]
    if scale:
        argv += ["--scale-from", str(scale)]
    code, err = run_cli(argv, ctx["timeout"])
    if code not in (0, 2):
        return f"{code}", f"{what}: {err[-300:]}"
    if any(p.read_bytes() != data for p, data in inputs.items()):
        return "data loss", what
    now = tree(work)
    if code == 0:
        if set(now) != set(had) | {out.name}:
            return "litter", f"{what}: {sorted(set(now) ^ set(had))}"
        try:
            json.loads(out.read_text())["curves"]
        except (ValueError, KeyError):
            return "partial output", what
        if kind == "mode" and stat.S_IMODE(out.stat().st_mode) != 0o600:
            return "mode changed", what
    elif now != had:
        return "partial output" if out.name in now else "litter", f"{what}: {err[-200:]}"
    return "ok", what


def case_validate(rng: random.Random, work: Path, ctx: dict, index: int) -> tuple[str, str]:
    out = work / "out"
    shutil.copytree(ctx["bundle"], out, symlinks=True)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    target = rng.choice([out / "k8s" / "kustomization.yaml", out / MANIFEST, *files])
    kind = rng.choice(("delete", "edit", "add", "empty-dir", "symlink", "fifo", "unreadable",
                       "none"))
    if kind == "delete":
        target.unlink()
    elif kind == "edit":
        data = target.read_bytes()
        i = rng.randrange(max(len(data), 1))
        target.write_bytes(data[:i] + bytes([rng.randrange(256)]) + data[i + 1:])
    elif kind == "add":
        (target.parent / "extra.yaml").write_text("kind: ConfigMap\n")
    elif kind == "empty-dir":
        (target.parent / "notes").mkdir()
    elif kind == "symlink":
        target.unlink()
        target.symlink_to(rng.choice([files[0], Path("/etc/hostname"), work / "nowhere"]))
    elif kind == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif kind == "unreadable":
        target.chmod(0)
    what = f"{kind} {target.relative_to(out)}"
    before = tree(work)
    code, err = run_cli(["validate", str(out), "--format", "json"], ctx["timeout"])
    target.chmod(0o644) if kind == "unreadable" and target.exists() else None
    if code not in (0, 1, 2):
        return f"{code}", f"{what}: {err[-300:]}"
    untouched = kind == "none" or (kind == "edit" and _same_bytes(ctx["bundle"], out, target)) or (
        kind == "unreadable" and os.geteuid() == 0)  # root reads a mode-0 file all the same
    if code == 0 and not untouched:
        return "false pass", what
    if tree(work) != before and kind != "unreadable":
        return "data loss", what
    return "ok", what


def _old_out(out: Path) -> None:
    from compiler import output_dir

    output_dir.write_output(out, {"plan.yaml": "old: 1\n"})


def case_signal(rng: random.Random, work: Path, ctx: dict, index: int) -> tuple[str, str]:
    out = work / "out"
    _old_out(out)
    before = tree(out)
    sig = rng.choice((signal.SIGINT, signal.SIGTERM))
    delay = rng.uniform(0, ctx["compile_seconds"] * 1.1)
    proc = run_rackc(["compile", str(EXAMPLE / "deployment.yaml"), "-o", str(out)], work,
                     ctx["timeout"])
    time.sleep(delay)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=ctx["timeout"])
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return "hang", f"{sig.name} at {delay:.2f}s"
    what = f"{sig.name} at {delay:.2f}s -> {proc.returncode}"
    if "Traceback" in err:
        return "traceback", f"{what}: {err[-300:]}"
    if proc.returncode in (128 + sig, -sig) and tree(out) != before:
        return "partial output", what
    if proc.returncode == 0 and not complete(out):
        return "partial output", what
    if proc.returncode not in (0, 128 + sig, -sig):
        return f"{proc.returncode}", f"{what}: {err[-300:]}"
    if os.listdir(work) != ["out"]:
        return "litter", f"{what}: {os.listdir(work)}"
    # -sig: the signal came while the interpreter itself was starting, before rackc ran
    return "ok", what


def case_concurrent(rng: random.Random, work: Path, ctx: dict, index: int) -> tuple[str, str]:
    out = work / "out"
    procs = [run_rackc(["compile", str(EXAMPLE / "deployment.yaml"), "-o", str(out)], work,
                       ctx["timeout"]) for _ in range(2)]
    codes, errs = [], []
    for p in procs:
        try:
            _, err = p.communicate(timeout=ctx["timeout"] * 2)
        except subprocess.TimeoutExpired:
            p.kill()
            return "hang", "two compiles"
        codes.append(p.returncode)
        errs.append(err)
    if any("Traceback" in e for e in errs):
        return "traceback", errs[0][-300:] + errs[1][-300:]
    if codes != [0, 0] or not complete(out):
        return "partial output", f"exits {codes}"
    if os.listdir(work) != ["out"]:
        return "litter", str(os.listdir(work))
    return "ok", "two compiles into one OUT"


CASES = {"plan": case_plan, "calibrate": case_calibrate, "validate": case_validate,
         "signal": case_signal, "concurrent": case_concurrent}


def family_of(seed: int, index: int) -> str:
    rng = random.Random(f"{seed}:{index}:family")
    return rng.choices([f for f, _ in FAMILIES], [w for _, w in FAMILIES])[0]


CTX: dict = {}  # set before the workers fork, which inherit it


def one(job: tuple[int, int]) -> tuple[int, str, str, str, float]:
    seed, index = job
    ctx = CTX
    family = family_of(seed, index)
    rng = random.Random(f"{seed}:{index}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rackc-fuzz-") as tmp:
        work = Path(tmp) / "case"
        work.mkdir()
        try:
            outcome, what = CASES[family](rng, work, ctx, index)
        except Exception as exc:  # a fuzzer defect, reported as such
            outcome, what = "fuzzer error", f"{type(exc).__name__}: {exc}"
        for p in work.rglob("*"):  # let the cleanup remove what a case made unreadable
            with contextlib.suppress(OSError):
                if not p.is_symlink():
                    p.chmod(0o755)
    return index, family, outcome, what, time.monotonic() - start


# --- setup -----------------------------------------------------------------------------------

def _same_bytes(bundle: Path, out: Path, target: Path) -> bool:
    """An edit that wrote back the byte it replaced."""
    return (bundle / target.relative_to(out)).read_bytes() == target.read_bytes()


def setup(scratch: Path, timeout: float) -> dict:
    """The compiled bundle the validate cases tamper with, and one compile's wall time (the
    window the signal cases aim into)."""
    bundle = scratch / "bundle"
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "compiler", "compile", str(EXAMPLE / "deployment.yaml"),
                    "-o", str(bundle)], cwd=ROOT, check=True, capture_output=True,
                   timeout=timeout * 3, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return {"bundle": bundle, "compile_seconds": time.monotonic() - start,
            "plan_text": GOLDEN_PLAN.read_text(), "raw": json.loads(RAW.read_text())}


def main() -> int:
    global FAMILIES
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budget", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a case hangs")
    ap.add_argument("--compile-every", type=int, default=400)
    ap.add_argument("--only", default="", help="comma-separated families to draw from "
                    f"(default all: {', '.join(f for f, _ in FAMILIES)})")
    args = ap.parse_args()
    if args.only:  # before the workers fork: family_of reads it there
        wanted = set(args.only.split(","))
        if not wanted <= {f for f, _ in FAMILIES}:
            ap.error(f"--only: unknown families {sorted(wanted - {f for f, _ in FAMILIES})}")
        FAMILIES = tuple((f, w) for f, w in FAMILIES if f in wanted)
    for var in THREAD_VARS:  # before a worker imports numpy: no BLAS thread pool per worker
        os.environ.setdefault(var, "1")
    with tempfile.TemporaryDirectory(prefix="rackc-fuzz-setup-") as scratch:
        ctx = CTX
        ctx.update(setup(Path(scratch), args.timeout))
        ctx.update(timeout=args.timeout, compile_every=args.compile_every)
        start = time.monotonic()
        outcomes: Counter = Counter()
        busy: Counter = Counter()
        failures: list[tuple] = []
        done = 0
        # forked once, before the pool starts its threads, and never replaced: a worker forked
        # later from the threaded parent can inherit a held lock and wait for ever
        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            jobs = ((args.seed, i) for i in range(args.cases))
            results = pool.imap_unordered(one, jobs)
            while True:
                try:
                    index, family, outcome, what, secs = results.next(args.timeout * 4)
                except StopIteration:
                    break
                except multiprocessing.TimeoutError:  # a case hung outside its own timeouts
                    failures.append((-1, "?", "hang", "no result from a worker"))
                    print("FAIL: no result from a worker", flush=True)
                    break
                done += 1
                busy[family] += secs
                outcomes[family, outcome] += 1
                if outcome != "ok":
                    failures.append((index, family, outcome, what))
                    print(f"FAIL case {index} ({family}): {outcome}: {what}", flush=True)
                if done % 100 == 0:
                    print(f"{done} cases, {time.monotonic() - start:.0f} s, "
                          f"{len(failures)} failed", flush=True)
                if args.budget and time.monotonic() - start > args.budget:
                    pool.terminate()
                    break
        seconds = time.monotonic() - start
    print(f"{done} cases in {seconds:.0f} s ({args.workers} workers, seed {args.seed})")
    for family, _ in FAMILIES:
        row = {o: n for (f, o), n in outcomes.items() if f == family}
        print(f"  {family:11s} {sum(row.values()):6d} cases {busy[family]:7.0f} s  " + ", ".join(
            f"{o} {n}" for o, n in sorted(row.items())))
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

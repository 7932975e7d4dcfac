"""Structure-aware fuzzer: mutated inputs get a diagnostic or a result, never a traceback, a hang
or a half-written output.

Each case copies one of the examples (its Deployment and Rack/Cluster, and in a third of the
cases the catalog Model it names, written beside them as model.yaml) and applies one to three
mutations: to the parsed documents (extreme and non-finite numbers, wrong types, deleted,
unknown and misspelt keys, odd `rack:`/`model:` paths: devices, FIFOs, folders, symlink loops,
NUL bytes, overlong names, lone surrogates) or to their text (tags, merge keys, anchors and
aliases, complex keys, deep nesting, huge files, long lines, unicode, undecodable bytes,
5000-digit numbers, duplicated, swapped and re-indented lines, truncation, byte flips).

`rackc check --format json|text` runs in-process in worker processes (the CLI's own `main`,
with strict UTF-8 stdout); a case that overruns `--timeout` is a hang (its worker is killed and
replaced). Every `--compile-every`-th case, and every fifth of that among the cases whose check
passed, also runs `rackc compile -o OUT` in a subprocess: exit 0 must leave OUT/plan.yaml and
its manifest, any other exit must leave no OUT (a partial output otherwise).

Usage: python benchmarks/fuzz.py [--cases 10000] [--seed 0] [--workers 2] [--compile-every 100]
       python benchmarks/fuzz.py --show K [--seed 0]   (write case K to ./fuzz-case-K, run it)
Exit 1 when any case gave a traceback (exit 70 or an uncaught exception), a hang, a bad exit
(not 0/2/3, or output that is not what the format promises) or a partial output.
"""

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.connection import Connection, wait
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from compiler.output_dir import MANIFEST  # noqa: E402  (the file compile -o writes last)

EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if (p / "deployment.yaml").exists())
CHECK_EXITS = (0, 2, 3)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# --- values ----------------------------------------------------------------------------------

EXTREMES = [0, -1, 1, 2, 7, 2**31, -(2**63), 2**63, 2**64 + 1, 10**20, 10**300, 1e308, -1e308,
            float("inf"), float("-inf"), float("nan"), 1e-300, 5e-324, 0.5, -0.0, 1.0000001,
            True, False, None, "", " ", "0", "1e400", "x" * 300, "名前", "\u202e\u200bx",
            "\ud800", "a\0b", "\x1b[31m", [], {}, [1, 2], {"a": 1}, [[[[]]]], "DEP999",
            "TP0EP0", "TP8EP4", "DEP0", "r999-t99-g99", "r0-t00-g0", "{name.__class__}",
            "{rack:999999999}", "{tray:>1000000000}", "{0}", "{", "UPPER", "-x-", "a" * 64,
            "v" * 254, 64, 16, 48, 3.51, 131072, 4608, 577, 65]
TEXT_SCALARS = ["9" * 5000, "-" + "9" * 4400, "0x" + "f" * 5000, "0b" + "1" * 20000,
                "0o" + "7" * 5000, "1" + "0" * 400 + ".5", "2024-13-45", "2024-02-30",
                "2001-12-14t21:59:43.10-99:00", "=", "~", ".NaN", "-.inf", "+.inf", "1_000",
                "190:20:30", "1e99999", "0x_", "!", "&", "*", "|", ">", "'", '"\\ud800"',
                '"\\x00"', '"\\U0010FFFF"', '"\\uDFFF"', "<<", "? x", "[a, b]: c", "@x", "`x`",
                "%x", "{a: [b, {c: d}]}", "null", "Yes", "off", "0777", "1e-400"]
TAGS = ["!foo", "!!python/object/apply:os.system", "!!python/name:os.system", "!!binary",
        "!!int", "!!timestamp", "!!float", "!!str", "!", "!!set", "!!omap", "!!null", "!!map",
        "!<tag:yaml.org,2002:str>", "!!merge", "!!value", "!!bool", "!e!x"]
ODD_PATHS = ["", ".", "..", "/", "/dev/zero", "/dev/null", "/dev/stdin", "/dev/tty",
             "/dev/urandom", "/proc/self/fd/0", "/proc/self/environ", "/proc/self/mem",
             "/etc/passwd", "/etc", "fifo.yaml", "loop.yaml", "dir.yaml", "zero-link.yaml",
             "big.yaml", "a\0b.yaml", "x" * 300 + ".yaml", "a/" * 2100 + "r.yaml",
             "\ud800.yaml", "\udcff.yaml", "rack.yaml/", "./rack.yaml", "../" * 50 + "etc/passwd",
             "deployment.yaml", "~/rack.yaml", "model.yaml", "rack.yaml", "cluster.yaml",
             "C:\\rack.yaml", "rack.yml", "nope.yaml", "%2e%2e/rack.yaml", "rack.yaml\n",
             " rack.yaml", "rack.yaml#x", "file:///etc/passwd", "-", "*", "?.yaml"]

# --- mutations on the parsed documents --------------------------------------------------------


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _parent(doc: object, path: tuple) -> tuple[object, object]:
    node = doc
    for part in path[:-1]:
        node = node[part]
    return node, path[-1]


def set_extreme(rng: random.Random, doc: dict, ctx: dict) -> str:
    path = rng.choice([p for p in _paths(doc) if p])
    parent, key = _parent(doc, path)
    parent[key] = rng.choice(EXTREMES)
    return "extreme value"


def wrong_type(rng: random.Random, doc: dict, ctx: dict) -> str:
    path = rng.choice([p for p in _paths(doc) if p])
    parent, key = _parent(doc, path)
    value = parent[key]
    parent[key] = rng.choice([str(value), [value], {"value": value}, None,
                              bool(value) if not isinstance(value, list | dict) else 1])
    return "wrong type"


def delete_key(rng: random.Random, doc: dict, ctx: dict) -> str:
    paths = [p for p in _paths(doc) if p and isinstance(_parent(doc, p)[0], dict)]
    parent, key = _parent(doc, rng.choice(paths))
    del parent[key]
    return "deleted key"


def add_key(rng: random.Random, doc: dict, ctx: dict) -> str:
    dicts = [p for p in _paths(doc) if isinstance(_follow(doc, p), dict)]
    target = _follow(doc, rng.choice(dicts))
    known = list(target) or ["x"]
    name = rng.choice([rng.choice(known) + "s", rng.choice(known)[:-1] or "y", "colour",
                       "\u00e9t\u00e9", "", "x" * 200, "1", "null", "<<"])
    target[name] = rng.choice(EXTREMES)
    return "unknown key"


def _follow(doc: object, path: tuple) -> object:
    for part in path:
        doc = doc[part]
    return doc


def odd_reference(rng: random.Random, doc: dict, ctx: dict) -> str:
    if doc.get("kind") != "Deployment" or not isinstance(doc.get("spec"), dict):
        return set_extreme(rng, doc, ctx)
    field = rng.choice(["rack", "model"])
    value = rng.choice(ODD_PATHS + ctx["abs_paths"])
    if field == "model" and rng.random() < 0.5 and not value.endswith((".yaml", ".yml")):
        value += ".yaml"
    doc["spec"][field] = value
    ctx["specials"] = True
    return "odd path"


def odd_objective(rng: random.Random, doc: dict, ctx: dict) -> str:
    if doc.get("kind") != "Deployment" or not isinstance(doc.get("spec"), dict):
        return set_extreme(rng, doc, ctx)
    shapes = ["DEP2", "DEP4", "DEP8", "DEP16", "DEP32", "DEP64", "DEP72", "DEP3", "TP1", "TP8",
              "TP16", "TP8EP8", "TP4EP4", "TP8EP4", "DEP999", "TP0", "DEP1"]
    roles = ["prefill", "decode", "aggregated"]
    if rng.random() < 0.5:
        doc["spec"]["objective"] = {"mode": "pinned", "instances": [
            {"role": rng.choice(roles), "shape": rng.choice(shapes),
             "count": rng.choice([1, 2, 3, 17, 4608, 4609])}
            for _ in range(rng.randint(1, 4))]}
    else:
        doc["spec"]["objective"] = {"mode": rng.choice(["throughput", "latency"]), "shapes": {
            role: rng.sample(shapes, rng.randint(0, 3)) for role in ("prefill", "decode")
            if rng.random() < 0.7}}
    return "odd objective"


CHOICES = [["fixed", "chat", "agentx"], ["throughput", "latency", "pinned"],
           ["dspark", "mtp", "eagle3"], ["fp8", "bf16", "fp4"], ["hbm", "dram"],
           ["kv", "round-robin", "random"], ["mla", "gqa", "mha"], ["prefill", "decode"],
           ["vera-rubin-nvl72", "gb300-nvl72", "gb200-nvl72", "hgx-h200", "hgx-b200",
            "hgx-b300", "hgx-h100"],
           ["deepseek-v3", "deepseek-v4.1-flash", "qwen3-30b-a3b", "llama-3.1-70b",
            "gpt-oss-120b", "kimi-k2", "glm-4.5"]]


def plausible(rng: random.Random, doc: dict, ctx: dict) -> str:
    """A valid-looking change, so that cases reach the graph, precheck and solver: a number
    scaled or set to a small count, a choice swapped for another of its kind, a flag flipped,
    an optional block added."""
    leaves = [p for p in _paths(doc) if p and not isinstance(_follow(doc, p), dict | list)]
    if not leaves:
        return add_key(rng, doc, ctx)
    parent, key = _parent(doc, rng.choice(leaves))
    value = parent[key]
    if isinstance(value, bool):
        parent[key] = not value
    elif isinstance(value, int):
        parent[key] = rng.choice([1, 2, 3, 4, 8, max(1, value // 2), value * 2, value * 10,
                                  value + 1, max(0, value - 1)])
    elif isinstance(value, float):
        parent[key] = rng.choice([value * 0.1, value * 0.5, value * 2, value * 10, 1.0, 0.01])
    else:
        kinds = [c for c in CHOICES if value in c]
        if kinds:
            parent[key] = rng.choice(kinds[0])
        elif doc.get("kind") == "Deployment" and isinstance(doc.get("spec"), dict):
            block = rng.choice([("slo", {"ttft_ms_p90": rng.choice([50.0, 500.0, 5000.0])}),
                                ("workload", {"profile": "chat", "isl": rng.choice([1, 128, 8192]),
                                              "osl": rng.choice([1, 64, 2048]),
                                              "concurrency": rng.choice([1, 64, 4096])}),
                                ("serving", {"kv_pool": {"dram": True, "hbm": True},
                                             "block_size": rng.choice([16, 64, 256])})])
            doc["spec"][block[0]] = block[1]
        else:
            parent[key] = str(value)[::-1]
    return "plausible change"


DOC_MUTATIONS = [set_extreme, set_extreme, wrong_type, delete_key, add_key, odd_reference,
                 odd_reference, odd_objective, plausible, plausible, plausible, plausible]

# --- mutations on the text --------------------------------------------------------------------

_VALUE_LINE = re.compile(r"^(\s*(?:- )?[A-Za-z_0-9]+:)[ ]+(\S.*)$")


def _value_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if _VALUE_LINE.match(line)]


def insert_tag(rng: random.Random, lines: list[str], ctx: dict) -> str:
    spots = _value_lines(lines)
    if spots:
        i = rng.choice(spots)
        m = _VALUE_LINE.match(lines[i])
        lines[i] = f"{m[1]} {rng.choice(TAGS)} {m[2]}"
    else:
        lines.insert(0, f"{rng.choice(TAGS)} x")
    return "tag"


def merge_key(rng: random.Random, lines: list[str], ctx: dict) -> str:
    i = rng.randrange(len(lines) + 1)
    indent = re.match(r"\s*", lines[i] if i < len(lines) else "")[0]
    lines.insert(i, indent + rng.choice(["<<: {trays: 2}", "<<: *a", "<<: [{a: 1}]", "<<: x"]))
    if rng.random() < 0.5:
        lines.insert(0, "base: &a {trays: 3}")
    return "merge key"


def alias(rng: random.Random, lines: list[str], ctx: dict) -> str:
    spots = _value_lines(lines)
    if len(spots) < 2:
        return insert_tag(rng, lines, ctx)
    a, b = rng.sample(spots, 2)
    m = _VALUE_LINE.match(lines[a])
    lines[a] = f"{m[1]} &anchor {m[2]}"
    m = _VALUE_LINE.match(lines[b])
    lines[b] = f"{m[1]} {rng.choice(['*anchor', '*missing', '&anchor x'])}"
    return "anchor/alias"


def deep_nesting(rng: random.Random, lines: list[str], ctx: dict) -> str:
    depth = rng.choice([20, 31, 33, 100, 1000, 20000])
    spots = _value_lines(lines)
    i = rng.choice(spots) if spots else 0
    m = _VALUE_LINE.match(lines[i]) if spots else None
    head = m[1] if m else "x:"
    if rng.random() < 0.6:
        open_, close = rng.choice([("[", "]"), ("{a: ", "}"), ("- ", "")])
        if open_ == "- ":
            value = "\n" + "\n".join("  " * (k + 1) + "-" for k in range(min(depth, 2000)))
        else:
            value = " " + open_ * depth + "1" + close * depth
    else:
        value = "".join(f"\n{'  ' * (k + 1)}k{k}:" for k in range(min(depth, 2000))) + " 1"
    lines[i] = head + value
    return "deep nesting"


def huge(rng: random.Random, lines: list[str], ctx: dict) -> str:
    size = rng.choice([64 * 1024 - 200, 64 * 1024 + 1, 1 << 20, 3 << 20])
    how = rng.random()
    if how < 0.4:
        lines.extend(["# padding " + "p" * 70] * (size // 80))
    elif how < 0.7:
        spots = _value_lines(lines)
        i = rng.choice(spots) if spots else 0
        m = _VALUE_LINE.match(lines[i]) if spots else None
        lines[i] = (m[1] if m else "x:") + " " + "y" * size
    else:
        lines.extend([f"extra{k}: {k}" for k in range(size // 12)])
    return "huge file"


def unicode_text(rng: random.Random, lines: list[str], ctx: dict) -> str:
    bit = rng.choice(["\ufeff", "\u200b", "\u202e", "\U0001f680", "\x85", "\u2028", "\t",
                      "\r", "\x00", "\x1b", "\ud7ff", "\ufffe", "é", "ﬁ", "\u0301"])
    i = rng.randrange(len(lines))
    j = rng.randrange(len(lines[i]) + 1)
    lines[i] = lines[i][:j] + bit + lines[i][j:]
    return "unicode"


def scalar_text(rng: random.Random, lines: list[str], ctx: dict) -> str:
    spots = _value_lines(lines)
    if not spots:
        return unicode_text(rng, lines, ctx)
    i = rng.choice(spots)
    m = _VALUE_LINE.match(lines[i])
    lines[i] = f"{m[1]} {rng.choice(TEXT_SCALARS)}"
    return "odd scalar text"


def complex_key(rng: random.Random, lines: list[str], ctx: dict) -> str:
    i = rng.randrange(len(lines) + 1)
    indent = re.match(r"\s*", lines[i] if i < len(lines) else "")[0]
    lines[i:i] = rng.choice([[f"{indent}? [a, b]", f"{indent}: 1"], [f"{indent}? {{a: 1}}",
                             f"{indent}: 2"], [f"{indent}[x]: 1"], [f"{indent}{{y: 1}}: 2"]])
    return "complex key"


def structure_text(rng: random.Random, lines: list[str], ctx: dict) -> str:
    how = rng.choice(["duplicate", "swap", "indent", "dedent", "truncate", "multidoc", "delete",
                      "crlf", "flip"])
    i = rng.randrange(len(lines))
    if how == "duplicate":
        lines.insert(i, lines[i])
    elif how == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif how == "indent":
        lines[i] = "  " + lines[i]
    elif how == "dedent":
        lines[i] = lines[i].lstrip()
    elif how == "truncate":
        del lines[i:]
        if lines:
            lines[-1] = lines[-1][:rng.randrange(len(lines[-1]) + 1)]
    elif how == "multidoc":
        lines.insert(i, rng.choice(["---", "...", "--- !foo", "%YAML 1.1", "%TAG !e! tag:x,1:"]))
    elif how == "delete":
        del lines[i]
    elif how == "crlf":
        lines[:] = [line + "\r" for line in lines]
    else:
        line = lines[i]
        if line:
            j = rng.randrange(len(line))
            lines[i] = line[:j] + chr(rng.randrange(32, 127)) + line[j + 1:]
    return f"text {how}"


TEXT_MUTATIONS = [insert_tag, insert_tag, merge_key, alias, deep_nesting, huge, unicode_text,
                  scalar_text, scalar_text, complex_key, structure_text, structure_text]

# --- cases ------------------------------------------------------------------------------------


def _dump(doc: object, rng: random.Random) -> str:
    return yaml.dump(doc, Dumper=_DUMPER, sort_keys=False, allow_unicode=rng.random() < 0.5,
                          default_flow_style=rng.choice([False, None]), width=100)


def _parsed(text: str) -> dict | None:
    """The document, when an earlier mutation left it a mapping PyYAML can still load."""
    if len(text) > 100_000:
        return None
    try:
        doc = yaml.load(text, Loader=_LOADER)
    except Exception:  # any failure: mutate the text instead
        return None
    return doc if isinstance(doc, dict) and doc else None


def make_case(seed: int, index: int) -> tuple[dict[str, bytes], list[str], bool]:
    """The files of case `index` (name -> bytes), the mutations applied, and whether odd
    reference targets (FIFO, loop, device link, folder, big file) must exist beside them."""
    rng = random.Random(f"{seed}:{index}")
    example = rng.choice(EXAMPLES)
    texts = {p.name: p.read_text() for p in example.glob("*.yaml")}
    dep = yaml.safe_load(texts["deployment.yaml"])
    if rng.random() < 1 / 3:
        from compiler import catalog

        texts["model.yaml"] = catalog.model_text(dep["spec"]["model"])
        dep["spec"]["model"] = "model.yaml"
        texts["deployment.yaml"] = _dump(dep, rng)
    ctx = {"specials": False, "abs_paths": [str(p) for p in EXAMPLES[0].glob("*.yaml")]}
    applied = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        name = rng.choice(sorted(texts))
        doc = _parsed(texts[name]) if rng.random() < 0.5 else None
        if doc:
            applied.append(rng.choice(DOC_MUTATIONS)(rng, doc, ctx))
            with contextlib.suppress(ValueError):  # an int PyYAML will not print: skip it
                texts[name] = _dump(doc, rng)
        else:
            lines = texts[name].split("\n")
            applied.append(rng.choice(TEXT_MUTATIONS)(rng, lines, ctx))
            texts[name] = "\n".join(lines)
    files = {n: t.encode("utf-8", "surrogatepass") for n, t in texts.items()}
    if rng.random() < 0.02:  # undecodable bytes
        name = rng.choice(sorted(files))
        files[name] = files[name][:10] + b"\xff\xfe\xc3" + files[name][10:]
        applied.append("undecodable bytes")
    return files, applied, ctx["specials"]


def write_case(folder: Path, files: dict[str, bytes], specials: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    if specials:
        os.mkfifo(folder / "fifo.yaml")
        os.symlink("loop.yaml", folder / "loop.yaml")
        os.symlink("/dev/zero", folder / "zero-link.yaml")
        (folder / "dir.yaml").mkdir()
        (folder / "big.yaml").write_bytes(b"# " + b"b" * (1 << 20))


# --- running ----------------------------------------------------------------------------------

def _where(stderr: str) -> str:
    """The innermost frame of a traceback in rackc's own code, and the exception."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', stderr)
    ours = [f for f in frames if "/compiler/" in f[0] or "/schemas/" in f[0]
            or "/targets/" in f[0]] or frames
    last = stderr.strip().splitlines()
    error = next((line for line in reversed(last) if re.match(r"^[A-Za-z_.]+(Error|Exception|"
                                                              r"Interrupt|Exit)", line)), "?")
    if not ours:
        return error.split(":")[0]
    file, line, func = ours[-1]
    return f"{Path(file).relative_to(ROOT) if file.startswith(str(ROOT)) else file}:{line} " \
           f"({func}) {error.split(':')[0]}"


def run_check(fmt: str) -> dict:
    """`rackc check deployment.yaml` through the CLI's main, in this process."""
    from compiler import api, cli

    out, err = io.BytesIO(), io.BytesIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", errors="strict", write_through=True)
    stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace",
                              write_through=True)
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = cli.main(["check", "deployment.yaml", "--format", fmt])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # what main let through is a traceback too
            import traceback

            traceback.print_exception(exc)
            code = 70
        stdout.flush()
        stderr.flush()
    text_err = err.getvalue().decode("utf-8", "replace")
    result = {"exit": code, "codes": sorted(set(re.findall(r"error\[(E\d+)\]", text_err)))}
    if code == 70 or "Traceback (most recent call last)" in text_err:
        result.update(outcome="traceback", where=_where(text_err))
    elif code not in CHECK_EXITS:
        result.update(outcome="bad exit", where=f"exit {code}")
    elif code != 0 and not result["codes"]:
        result.update(outcome="bad exit", where=f"exit {code} without a diagnostic")
    elif fmt == "json" and not _json_ok(out.getvalue(), api.CHECK_KEYS):
        result.update(outcome="bad exit", where="stdout is not the check JSON")
    else:
        result["outcome"] = "ok" if code == 0 else "diagnosed"
    return result


def _json_ok(raw: bytes, keys: tuple[str, ...]) -> bool:
    try:
        data = json.loads(raw)
    except ValueError:
        return False
    return isinstance(data, dict) and set(data) == set(keys)


def run_compile(folder: Path, timeout: float) -> dict:
    """`rackc compile deployment.yaml -o out` in a fresh process."""
    try:
        proc = subprocess.run([sys.executable, "-m", "compiler.cli", "compile",
                               "deployment.yaml", "-o", "out"], cwd=folder, capture_output=True,
                              text=True, errors="replace", timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"outcome": "hang", "where": "compile timeout"}
    out = folder / "out"
    if proc.returncode == 70 or "Traceback (most recent call last)" in proc.stderr:
        return {"outcome": "traceback", "where": "compile: " + _where(proc.stderr)}
    if proc.returncode == 0:
        whole = (out / "plan.yaml").is_file() and (out / MANIFEST).is_file()
        return {"outcome": "compiled"} if whole else \
            {"outcome": "partial output", "where": "exit 0 without plan.yaml and manifest"}
    if proc.returncode not in CHECK_EXITS:
        return {"outcome": "bad exit", "where": f"compile exit {proc.returncode}"}
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".out")
                 and not p.name.endswith("rackc-lock")]  # staging folders beside OUT
    if os.path.lexists(out) or leftovers:
        return {"outcome": "partial output", "where": f"compile exit {proc.returncode} left out/"}
    return {"outcome": "diagnosed"}


def _compiles(index: int, every: int, checked_ok: bool) -> bool:
    """Every `every`-th case, and every (`every` / 5)-th case whose check passed (those reach
    the solver and the targets)."""
    return bool(every) and (index % every == 0
                            or (checked_ok and index % max(1, every // 5) == 0))


def run_case(seed: int, index: int, compile_every: int, timeout: float, root: Path) -> dict:
    files, applied, specials = make_case(seed, index)
    folder = root / f"case-{index}"
    write_case(folder, files, specials)
    start = time.perf_counter()
    here = os.getcwd()
    os.chdir(folder)
    try:
        result = run_check("json" if index % 2 else "text")
    finally:
        os.chdir(here)
    result.update(index=index, mutations=applied, seconds=time.perf_counter() - start)
    if _compiles(index, compile_every, result["outcome"] == "ok"):
        result["compile"] = run_compile(folder, timeout * 6)
    shutil.rmtree(folder, ignore_errors=True)
    return result


def _worker(conn: Connection, seed: int, compile_every: int, timeout: float,
            tmp: Path) -> None:
    from compiler import api, cli  # noqa: F401  (imported once, before the first case)

    root = Path(tempfile.mkdtemp(dir=tmp))  # the parent removes `tmp`, even after a kill
    while True:
        index = conn.recv()
        if index is None:
            return
        conn.send(run_case(seed, index, compile_every, timeout, root))


class Worker:
    def __init__(self, ctx: multiprocessing.context.BaseContext, args: tuple):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, *args), daemon=True)
        self.proc.start()
        child.close()
        self.index: int | None = None
        self.deadline = 0.0

    def give(self, index: int, limit: float) -> None:
        self.index, self.deadline = index, time.monotonic() + limit
        self.conn.send(index)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()


def fuzz(cases: int, seed: int, workers: int, compile_every: int, timeout: float) -> list[dict]:
    ctx = multiprocessing.get_context("fork")
    tmp = Path(tempfile.mkdtemp(prefix="rackc-fuzz-"))
    try:
        return _run(ctx, (seed, compile_every, timeout, tmp), cases, workers)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(ctx: multiprocessing.context.BaseContext, args: tuple, cases: int,
         workers: int) -> list[dict]:
    compile_every, timeout = args[1], args[2]
    pool = [Worker(ctx, args) for _ in range(workers)]
    todo, results = list(range(cases)), []
    while todo or any(w.index is not None for w in pool):
        for w in pool:
            if w.index is None and todo:
                index = todo.pop(0)
                w.give(index, timeout * (8 if _compiles(index, compile_every, True) else 1)
                       + 30 * (index < workers))
        ready = wait([w.conn for w in pool if w.index is not None], timeout=0.5)
        for w in list(pool):
            if w.index is None:
                continue
            if w.conn in ready:
                if len(results) % 1000 == 999:
                    print(f"fuzz: {len(results) + 1}/{cases} cases", file=sys.stderr)
                try:
                    results.append(w.conn.recv())
                except EOFError:  # the worker died: a crash of the interpreter itself
                    results.append({"index": w.index, "outcome": "traceback",
                                    "where": f"worker died (exit {w.proc.exitcode})"})
                    pool[pool.index(w)] = Worker(ctx, args)
                    continue
                w.index = None
            elif time.monotonic() > w.deadline:
                results.append({"index": w.index, "outcome": "hang",
                                "where": f"over {timeout:g} s"})
                w.kill()
                pool[pool.index(w)] = Worker(ctx, args)
    for w in pool:
        w.conn.send(None)
        w.proc.join(5)
    return sorted(results, key=lambda r: r["index"])


def summary(results: list[dict], seconds: float) -> dict:
    outcomes = Counter(r["outcome"] for r in results)
    compiles = Counter(r["compile"]["outcome"] for r in results if "compile" in r)
    bad = [r for r in results if r["outcome"] in ("traceback", "hang", "bad exit")]
    bad += [{**r, **r["compile"]} for r in results if "compile" in r
            and r["compile"]["outcome"] in ("traceback", "hang", "bad exit", "partial output")]
    places = Counter(r["where"] for r in bad)
    first = {}
    for r in bad:
        first.setdefault(r["where"], r["index"])
    return {
        "cases": len(results),
        "checked_ok": outcomes["ok"],
        "diagnosed": outcomes["diagnosed"],
        "tracebacks": outcomes["traceback"] + compiles["traceback"],
        "hangs": outcomes["hang"] + compiles["hang"],
        "bad_exits": outcomes["bad exit"] + compiles["bad exit"],
        "compile_runs": sum(compiles.values()),
        "compiled": compiles["compiled"],
        "compile_diagnosed": compiles["diagnosed"],
        "partial_outputs": compiles["partial output"],
        "seconds": round(seconds, 1),
        "cpu_seconds": round(sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2]), 1),
        "slowest_check_s": round(max((r.get("seconds", 0) for r in results), default=0), 3),
        "codes": dict(Counter(c for r in results for c in r.get("codes", ())).most_common()),
        "mutations": dict(Counter(m for r in results for m in r.get("mutations", ()))
                          .most_common()),
        "failures": [{"where": w, "count": n, "first_case": first[w]}
                     for w, n in places.most_common()],
    }


def show(seed: int, index: int) -> int:
    files, applied, specials = make_case(seed, index)
    folder = Path(f"fuzz-case-{index}").resolve()
    shutil.rmtree(folder, ignore_errors=True)
    write_case(folder, files, specials)
    print(f"case {index}: {', '.join(applied)} -> {folder}")
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "check", "deployment.yaml"],
                          cwd=folder, check=False, timeout=60)
    return proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--compile-every", type=int, default=100,
                        help="also run `rackc compile -o` on every Nth case (0: never)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per check")
    parser.add_argument("--show", type=int, metavar="K", help="write case K here and run it")
    parser.add_argument("--json", metavar="FILE", help="also write every case's result")
    args = parser.parse_args()
    if args.show is not None:
        return show(args.seed, args.show)
    from compiler import api, cli  # noqa: F401  (the workers fork with them imported)

    start = time.perf_counter()
    results = fuzz(args.cases, args.seed, args.workers, args.compile_every, args.timeout)
    report = summary(results, time.perf_counter() - start)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(json.dumps(report, indent=2))
    return 1 if report["tracebacks"] or report["hangs"] or report["bad_exits"] or \
        report["partial_outputs"] else 0


if __name__ == "__main__":
    sys.exit(main())

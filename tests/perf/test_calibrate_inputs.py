"""`rackc calibrate` with damaged or hostile inputs: one diagnostic and exit 2, never a traceback;
never a write over one of its own inputs; a replaced file keeps its mode."""

import copy
import json
import os
import stat
from pathlib import Path

import pytest

from compiler.perf import calibrate
from tests.perf.test_fit import RAW, one_error, synthetic_raw, write_raw

GOOD = synthetic_raw()
GEMM = next(i for i, m in enumerate(GOOD["measurements"]) if m["op"] == "gemm")
COPY = next(i for i, m in enumerate(GOOD["measurements"]) if m["op"] == "copy")


def damaged(path: tuple, value: object, delete: bool = False) -> dict:
    raw = copy.deepcopy(GOOD)
    target = raw
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


M = "measurements"
DAMAGE = [  # (raw, field path named by the diagnostic)
    (damaged((M, GEMM, "m"), "64"), f"{M}[{GEMM}].m"),
    (damaged((M, GEMM, "m"), 0), f"{M}[{GEMM}].m"),
    (damaged((M, GEMM, "m"), True), f"{M}[{GEMM}].m"),
    (damaged((M, GEMM, "k"), 10 ** 30), f"{M}[{GEMM}].k"),
    (damaged((M, GEMM, "n"), None, delete=True), f"{M}[{GEMM}].n"),
    (damaged((M, GEMM, "dtype"), "int4"), f"{M}[{GEMM}].dtype"),
    (damaged((M, GEMM, "us"), -1.0), f"{M}[{GEMM}].us"),
    (damaged((M, GEMM, "us"), float("nan")), f"{M}[{GEMM}].us"),
    (damaged((M, GEMM, "us"), "fast"), f"{M}[{GEMM}].us"),
    (damaged((M, COPY, "bytes"), [1]), f"{M}[{COPY}].bytes"),
    (damaged((M, GEMM), "gemm"), f"{M}[{GEMM}]"),
    (damaged((M, GEMM, "op"), 7), f"{M}[{GEMM}].op"),
    (damaged((M,), []), M),
    (damaged((M,), {"a": 1}), M),
    (damaged(("device",), "H200"), "device"),
    (damaged(("device", "gpu"), None, delete=True), "device.gpu"),
    (damaged(("schema",), None, delete=True), "schema"),
    (damaged((M, GEMM), {"op": "attn_decode", "dtype": "bf16", "batch": 1, "q_heads": 7,
                         "kv_heads": 2, "head_dim": 64, "kv_len": 8, "us": 3.0}), f"{M}[{GEMM}]"),
    (damaged((M, GEMM), {"op": "moe", "dtype": "bf16", "tokens": 8, "experts": 4,
                         "local_experts": 8, "top_k": 2, "hidden": 64, "inter": 64,
                         "us": 3.0}), f"{M}[{GEMM}]"),
]


@pytest.mark.parametrize(("raw", "field"), DAMAGE, ids=[f for _, f in DAMAGE])
def test_a_damaged_raw_file_is_one_diagnostic_naming_the_field(tmp_path: Path, raw: dict,
                                                              field: str):
    err = one_error(calibrate.run("hgx-h200", str(tmp_path / "o.json"), str(write_raw(
        tmp_path, raw))))
    assert "E603" in err and field in err
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize(("text", "got"), [
    ("[" * 100_000, "nesting too deep"), ("[1, 2]", "a JSON list"), (b"\xff\xfe", "UTF-8"),
    ('{"schema": 1e400}', "schema")])
def test_raw_files_that_are_not_json_objects(tmp_path: Path, text: str | bytes, got: str):
    path = tmp_path / "raw.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert got in one_error(calibrate.run("hgx-h200", str(tmp_path / "o.json"), str(path)))


def test_a_fifo_as_raw_file_is_refused_without_waiting(tmp_path: Path):
    fifo = tmp_path / "raw.json"
    os.mkfifo(fifo)
    assert "FIFO" in one_error(calibrate.run("hgx-h200", str(tmp_path / "o.json"), str(fifo)))


def test_attention_only_through_unfused_fallbacks_is_a_diagnostic(tmp_path: Path):
    raw = copy.deepcopy(GOOD)
    raw[M].append({"op": "attn_decode", "dtype": "bf16", "batch": 1, "q_heads": 8,
                   "kv_heads": 1, "head_dim": 576, "kv_len": 1024, "us": 30.0,
                   "impl": "math"})
    err = one_error(calibrate.run("hgx-h200", str(tmp_path / "o.json"), str(write_raw(
        tmp_path, raw))))
    assert "unfused" in err


def test_prefill_without_decode_to_borrow_from_is_a_diagnostic(tmp_path: Path):
    raw = copy.deepcopy(GOOD)
    raw[M].append({"op": "attn_prefill", "dtype": "bf16", "seq_len": 1024, "q_heads": 8,
                   "kv_heads": 8, "head_dim": 128, "causal": True, "us": 30.0,
                   "impl": "flash_attention"})
    err = one_error(calibrate.run("hgx-h200", str(tmp_path / "o.json"), str(write_raw(
        tmp_path, raw))))
    assert "attn_decode measurements" in err


def test_calibrate_never_writes_over_its_raw_input(tmp_path: Path):
    raw = write_raw(tmp_path, GOOD)
    before = raw.read_bytes()
    err = one_error(calibrate.run("hgx-h200", str(raw), str(raw)))
    assert "E801" in err and "input" in err
    os.link(raw, tmp_path / "hard.json")  # the same file under another name
    assert "E801" in one_error(calibrate.run("hgx-h200", str(tmp_path / "hard.json"), str(raw)))
    assert raw.read_bytes() == before


def test_scale_from_never_writes_over_its_basis(tmp_path: Path):
    basis = tmp_path / "cal.json"
    assert calibrate.run("hgx-h200", str(basis), str(RAW))[0] == 0
    before = basis.read_bytes()
    assert "E801" in one_error(calibrate.run("hgx-b200", str(basis), None, str(basis)))
    assert basis.read_bytes() == before


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: d["curves"]["gemm"]["bf16"].update(e_max=1.5), "curves.gemm.bf16"),
    (lambda d: d["curves"]["gemm"]["bf16"].update(e_max="x"), "curves.gemm.bf16.e_max"),
    (lambda d: d["curves"].update(warp={}), "curves"),
    (lambda d: d.update(curves=[]), "curves"),
    (lambda d: d.pop("system"), "system")])
def test_a_damaged_basis_is_one_diagnostic(tmp_path: Path, edit, field: str):
    basis = tmp_path / "cal.json"
    assert calibrate.run("hgx-h200", str(basis), str(RAW))[0] == 0
    doc = json.loads(basis.read_text())
    edit(doc)
    basis.write_text(json.dumps(doc))
    err = one_error(calibrate.run("hgx-b200", str(tmp_path / "o.json"), None, str(basis)))
    assert "E603" in err and field in err


def test_a_replaced_output_keeps_its_mode(tmp_path: Path):
    out = tmp_path / "o.json"
    out.write_text("{}")
    out.chmod(0o600)
    assert calibrate.run("hgx-h200", str(out), str(write_raw(tmp_path, GOOD)))[0] == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and json.loads(out.read_text())["curves"]

"""`rackc perf ops`: JSON Lines in, the query plus `us` out; a bad line gets one error line
naming its line number, field, expectation and value, and the exit code is 2 at the end."""

import argparse
import io
import json
import subprocess
import sys

import pytest

from compiler import catalog
from compiler.perf import commands, query
from compiler.perf.ops import op_model

MODEL = op_model(catalog.system("hgx-h200"), catalog.calibration("hgx-h200"),
                 catalog.floors("hgx-h200")["floors"])

GOOD = [
    {"op": "gemm", "dtype": "bf16", "m": 128, "n": 4096, "k": 7168},
    {"op": "gemm", "dtype": "fp4", "m": 1, "n": 4096, "k": 7168},
    {"op": "grouped_gemm", "dtype": "fp8", "experts": 32, "tokens_per_expert": 16, "k": 7168,
     "n": 4096},
    {"op": "attn_decode", "dtype": "bf16", "batch": 64, "q_heads": 64, "kv_heads": 8,
     "head_dim": 128, "kv_len": 8192},
    {"op": "attn_prefill", "dtype": "bf16", "seq_len": 4096, "q_heads": 64, "kv_heads": 8,
     "head_dim": 128, "causal": True},
    {"op": "copy", "bytes": 1 << 30},
    {"op": "attn_decode", "dtype": "fp8", "batch": 8, "q_heads": 128, "kv_heads": 1,
     "head_dim": 576, "kv_len": 65536, "v_head_dim": 512, "topk": 2048, "q_len": 2},
    {"op": "indexer", "dtype": "fp8", "batch": 8, "q_len": 2, "heads": 64, "head_dim": 128,
     "kv_len": 65536},
    {"op": "grouped_gemm", "dtype": "fp4", "experts": 48, "tokens_per_expert": 0.5, "k": 4096,
     "n": 4608, "skew": 1.3, "placement": "local"},
]


def answers(lines: list[str]) -> list[dict | list]:
    return list(query.run_queries(MODEL, lines))


def test_good_queries_come_back_with_their_fields_in_order_plus_us():
    out = answers([json.dumps(q) for q in GOOD])
    for q, a in zip(GOOD, out, strict=True):
        assert isinstance(a, dict)
        assert list(a) == [*q, "us"] and {k: a[k] for k in q} == q
        assert a["us"] > 0 and a["us"] == round(a["us"], 3)


def test_answers_equal_the_op_model():
    (a,) = answers([json.dumps(GOOD[0])])
    assert a["us"] == round(MODEL.gemm("bf16", 128, 4096, 7168), 3)


def error_line(q: object, line: int = 1) -> str:
    (result,) = answers(["", json.dumps(q)] if line == 2 else [json.dumps(q)])
    assert isinstance(result, list), result
    return query.render(result)


GEMM = GOOD[0]


@pytest.mark.parametrize(("bad", "field", "expected", "got"), [
    ({**GEMM, "op": "gem"}, "op", "gemm | grouped_gemm", '"gem" (did you mean `gemm`?)'),
    ({k: v for k, v in GEMM.items() if k != "op"}, "op", "gemm", "nothing (missing field)"),
    ({k: v for k, v in GEMM.items() if k != "k"}, "k", "positive integer",
     "nothing (missing field)"),
    ({**GEMM, "m": -4}, "m", "positive integer", "-4"),
    ({**GEMM, "m": 0}, "m", "positive integer", "0"),
    ({**GEMM, "m": 2.5}, "m", "positive integer", "2.5"),
    ({**GEMM, "m": "128"}, "m", "positive integer", '"128"'),
    ({**GEMM, "m": True}, "m", "positive integer", "true"),
    ({**GEMM, "dtype": "fp16"}, "dtype", '"bf16" | "fp8" | "fp4"', '"fp16"'),
    ({**GEMM, "batch": 4}, "batch", "a field of this op", "an extra field"),
    ({**GOOD[4], "causal": 1}, "causal", "true or false", "1"),
    ({**GOOD[3], "kv_heads": 6}, "kv_heads", "a divisor of q_heads (64)", "6"),
    ({**GOOD[5], "placement": "far"}, "placement", '"local" | "interleaved" | "remote"',
     '"far"'),
    ({**GOOD[2], "tokens_per_expert": -1.0}, "tokens_per_expert", "positive number", "-1.0"),
    ({**GEMM, "n": 10**400}, "n", "positive integer (at most 2^53)", "1" + "0" * 400),
    ({**GOOD[2], "skew": 0.5}, "skew", "number >= 1", "0.5"),
    ({**GOOD[5], "bytes": float("nan")}, "bytes", "positive integer", "NaN"),
])
def test_bad_queries_name_field_expectation_and_value(bad: dict, field: str, expected: str,
                                                      got: str):
    line = error_line(bad)
    assert line.startswith("error[E601] <stdin>:1 ")
    assert f"{field}: expected {expected}" in line and f"got {got}" in line
    assert "\n" not in line


@pytest.mark.parametrize(("text", "got"), [("{oops", "invalid JSON"), ("[1, 2]", "list"),
                                           ("42", "int")])
def test_lines_that_are_not_objects_are_reported(text: str, got: str):
    (result,) = answers([text])
    assert "expected a JSON object" in query.render(result) and got in query.render(result)


def test_bad_lines_do_not_stop_the_rest_and_blank_lines_are_skipped():
    lines = [json.dumps(GOOD[0]), "", "nonsense", json.dumps({**GEMM, "m": -1}),
             json.dumps(GOOD[5])]
    out = answers(lines)
    assert [type(r).__name__ for r in out] == ["dict", "list", "list", "dict"]
    assert query.render(out[1]).startswith("error[E601] <stdin>:3 ")
    assert query.render(out[2]).startswith("error[E601] <stdin>:4 m:")


def test_several_problems_of_one_line_share_one_error_line():
    line = error_line({"op": "gemm", "dtype": "bf16", "m": -1})
    assert line.count("expected") == 3 and "\n" not in line


def run_command(argv: list[str], stdin: str, monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="rackc")
    commands.add_perf_commands(parser.add_subparsers(dest="command", required=True))
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    args = parser.parse_args(argv)
    code = args.run(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_perf_ops_command_answers_and_exits_2_after_a_bad_line(monkeypatch, capsys):
    stdin = "\n".join([json.dumps(GOOD[0]), json.dumps({"op": "nope"}), json.dumps(GOOD[5])])
    code, out, err = run_command(["perf", "ops", "--system", "hgx-h200"], stdin, monkeypatch,
                                 capsys)
    assert code == 2
    assert [json.loads(line)["op"] for line in out.splitlines()] == ["gemm", "copy"]
    assert err.splitlines() == [query.render(query.validate(2, {"op": "nope"}))]


def test_perf_ops_command_exits_0_when_all_lines_are_good(monkeypatch, capsys):
    stdin = "\n".join(json.dumps(q) for q in GOOD) + "\n"
    code, out, err = run_command(["perf", "ops", "--system", "vera-rubin-nvl72"], stdin,
                                 monkeypatch, capsys)
    assert (code, err) == (0, "") and len(out.splitlines()) == len(GOOD)


def test_perf_ops_command_refuses_an_unknown_system(monkeypatch, capsys):
    code, out, err = run_command(["perf", "ops", "--system", "h200"], "", monkeypatch, capsys)
    assert code == 2 and out == "" and "E602" in err and "--system" in err


def test_rackc_perf_ops_as_a_process():
    stdin = json.dumps(GOOD[0]) + "\n" + json.dumps({**GEMM, "m": -1}) + "\n"
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "perf", "ops", "--system",
                           "hgx-h200"], input=stdin, capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["us"] == round(MODEL.gemm("bf16", 128, 4096, 7168), 3)
    assert proc.stderr.startswith("error[E601] <stdin>:2 m: expected positive integer")
    assert "got -1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_perf_ops_help_names_every_op():
    """`rackc perf ops --help` lists the ops without importing the query module."""
    from compiler.perf import commands, query
    assert tuple(query.FORMS) == commands.OPS

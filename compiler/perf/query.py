"""`rackc perf ops`: operator-cost queries as JSON Lines, validated, answered by the op model.

Each input line is one query object; each answer is the query's own fields, in their order,
plus `us` (predicted microseconds, 3 decimals). A bad line gets one diagnostic line naming its
line number, field, what was expected and what came, and the next line is read; the exit code
is 2 when any line was bad.
"""

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TextIO

from compiler.perf.ops import DTYPES, PLACEMENTS, OpModel
from schemas.diagnostics import Diagnostic, did_you_mean

SOURCE = "<stdin>"
MAX_LINE = 64 * 1024  # characters; a query is about a hundred
CODE = "E601"  # a perf ops query rackc cannot answer


@dataclass(frozen=True)
class Kind:
    """What one query field must hold."""

    expected: str
    check: Callable[[object], bool]


LARGEST = 2**53  # beyond this, sizes lose integer precision in float arithmetic


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) <= LARGEST


def _is_number(v: object) -> bool:
    """A finite JSON number (NaN, infinities and huge values are refused)."""
    return _is_int(v) or (isinstance(v, float) and abs(v) <= LARGEST)


SIZE = Kind("positive integer (at most 2^53)", lambda v: _is_int(v) and v > 0)
COUNT = Kind("non-negative integer (at most 2^53)", lambda v: _is_int(v) and v >= 0)
AMOUNT = Kind("positive number (at most 2^53)", lambda v: _is_number(v) and v > 0)
SKEW = Kind("number >= 1 (at most 2^53)", lambda v: _is_number(v) and v >= 1)
FLAG = Kind("true or false", lambda v: isinstance(v, bool))
DTYPE = Kind(" | ".join(f'"{d}"' for d in DTYPES), lambda v: v in DTYPES)
PLACEMENT = Kind(" | ".join(f'"{p}"' for p in PLACEMENTS), lambda v: v in PLACEMENTS)


@dataclass(frozen=True)
class Form:
    """One op's query form: required and optional fields, and how to answer it."""

    required: dict[str, Kind]
    optional: dict[str, Kind]
    answer: Callable[[OpModel, dict], float]


FORMS: dict[str, Form] = {
    "gemm": Form(
        {"dtype": DTYPE, "m": SIZE, "n": SIZE, "k": SIZE},
        {"placement": PLACEMENT},
        lambda om, q: om.gemm(q["dtype"], q["m"], q["n"], q["k"],
                              placement=q.get("placement", "interleaved"))),
    "grouped_gemm": Form(
        {"dtype": DTYPE, "experts": SIZE, "tokens_per_expert": AMOUNT, "k": SIZE, "n": SIZE},
        {"skew": SKEW, "placement": PLACEMENT},
        lambda om, q: om.grouped_gemm(q["dtype"], q["experts"], q["tokens_per_expert"], q["k"],
                                      q["n"], skew=q.get("skew", 1.0),
                                      placement=q.get("placement", "interleaved"))),
    "attn_decode": Form(
        {"dtype": DTYPE, "batch": SIZE, "q_heads": SIZE, "kv_heads": SIZE, "head_dim": SIZE,
         "kv_len": SIZE},
        {"q_len": SIZE, "v_head_dim": SIZE, "topk": SIZE, "placement": PLACEMENT},
        lambda om, q: om.attn_decode(q["dtype"], q["batch"], q["q_heads"], q["kv_heads"],
                                     q["head_dim"], q["kv_len"], q_len=q.get("q_len", 1),
                                     v_head_dim=q.get("v_head_dim"), topk=q.get("topk"),
                                     placement=q.get("placement", "interleaved"))),
    "attn_prefill": Form(
        {"dtype": DTYPE, "seq_len": SIZE, "q_heads": SIZE, "kv_heads": SIZE, "head_dim": SIZE,
         "causal": FLAG},
        {"kv_len": COUNT, "v_head_dim": SIZE},
        lambda om, q: om.attn_prefill(q["dtype"], q["seq_len"], q["q_heads"], q["kv_heads"],
                                      q["head_dim"], causal=q["causal"],
                                      kv_len=q.get("kv_len", 0),
                                      v_head_dim=q.get("v_head_dim"))),
    "indexer": Form(
        {"dtype": DTYPE, "batch": SIZE, "q_len": SIZE, "heads": SIZE, "head_dim": SIZE,
         "kv_len": SIZE},
        {"placement": PLACEMENT},
        lambda om, q: om.indexer(q["dtype"], q["batch"], q["q_len"], q["heads"], q["head_dim"],
                                 q["kv_len"], placement=q.get("placement", "interleaved"))),
    "copy": Form(
        {"bytes": SIZE},
        {"placement": PLACEMENT},
        lambda om, q: om.copy(q["bytes"], placement=q.get("placement", "interleaved"))),
}


def _error(line: int, path: str, expected: str, got: str, hint: str = "") -> Diagnostic:
    return Diagnostic("error", CODE, SOURCE, line, 0, path, expected, got, hint)


def _shown(value: object) -> str:
    return json.dumps(value)


def _field_errors(line: int, q: dict, form: Form) -> list[Diagnostic]:
    known = {"op", *form.required, *form.optional}
    errors = [_error(line, key, "a field of this op", "an extra field",
                     did_you_mean(key, sorted(known - {"op"})))
              for key in q if key not in known]
    for key, kind in form.required.items():
        if key not in q:
            errors.append(_error(line, key, kind.expected, "nothing (missing field)"))
    for key, kind in {**form.required, **form.optional}.items():
        if key in q and not kind.check(q[key]):
            errors.append(_error(line, key, kind.expected, _shown(q[key])))
    return errors


def _shape_errors(line: int, q: dict) -> list[Diagnostic]:
    """Cross-field rules: grouped-query attention shares each KV head by whole query heads."""
    heads, kv_heads = q.get("q_heads"), q.get("kv_heads")
    if _is_int(heads) and _is_int(kv_heads) and kv_heads > 0 and heads % kv_heads:
        return [_error(line, "kv_heads", f"a divisor of q_heads ({heads})", _shown(kv_heads))]
    return []


def validate(line: int, q: object) -> list[Diagnostic]:
    """Every problem of one parsed query line; empty when the query can be answered."""
    if not isinstance(q, dict):
        return [_error(line, "", "a JSON object", type(q).__name__)]
    op = q.get("op")
    if not isinstance(op, str) or op not in FORMS:
        got = "nothing (missing field)" if "op" not in q else _shown(op)
        hint = did_you_mean(op, FORMS) if isinstance(op, str) else ""
        return [_error(line, "op", " | ".join(FORMS), got, hint)]
    errors = _field_errors(line, q, FORMS[op])
    return errors or _shape_errors(line, q)


def answer(model: OpModel, q: dict) -> dict:
    """The query's fields, in their order, plus the predicted microseconds."""
    return {**q, "us": round(FORMS[q["op"]].answer(model, q), 3)}


def parse(line: int, text: str) -> tuple[object, list[Diagnostic]]:
    if len(text.rstrip("\r\n")) > MAX_LINE:
        return None, [_error(line, "", f"a line of at most {MAX_LINE} characters",
                             f"more than {MAX_LINE}", "one query per line")]
    try:
        return json.loads(text), []
    except json.JSONDecodeError as exc:
        return None, [_error(line, "", "a JSON object", f"invalid JSON ({exc.msg})")]
    except RecursionError:
        return None, [_error(line, "", "a JSON object", "nesting too deep to parse")]
    except ValueError as exc:  # an integer beyond Python's digit limit
        return None, [_error(line, "", "a JSON object", f"invalid JSON ({exc})"[:120])]


def render(errors: list[Diagnostic]) -> str:
    """One line for all problems of one query line: the first in full, the rest by field."""
    parts = [f"{d.path or '(line)'}: expected {d.expected}, got {d.got}"
             + (f" ({d.hint})" if d.hint else "") for d in errors]
    first = errors[0]
    return f"{first.severity}[{first.code}] {first.file}:{first.line} " + "; ".join(parts)


def capped_lines(stream: TextIO) -> Iterator[str]:
    """The lines of `stream`, holding at most MAX_LINE + 1 characters of any: an over-long
    line comes as its first MAX_LINE + 1 characters (which `parse` refuses), the rest skipped."""
    while line := stream.readline(MAX_LINE + 1):
        rest = line
        while len(rest) > MAX_LINE and not rest.endswith("\n"):
            rest = stream.readline(MAX_LINE + 1)
        yield line


def run_queries(model: OpModel, lines: Iterable[str]) -> Iterator[dict | list[Diagnostic]]:
    """One answer or one list of diagnostics per non-blank line, in input order."""
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        q, errors = parse(number, text)
        errors = errors or validate(number, q)
        yield errors or answer(model, q)

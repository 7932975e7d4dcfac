"""The CEL rules (`x-kubernetes-validations`) of a CRD schema, evaluated as the API server does
on create: at each schema node the object has, with `self` bound to the value there, after the
schema's defaults are applied. Transition rules (those naming `oldSelf`) are skipped unless the
rule sets `optionalOldSelf`, where `oldSelf` has no value, as on create.

cel-python implements the CEL language; the Kubernetes library functions the upstream CRDs use
(`lowerAscii`, `split`, `quantity`, optionals' `hasValue`, ...) are added here. A rule that names
a function missing here is reported as not evaluated, never as passed.
"""

import copy
import functools
import re
from collections.abc import Iterator
from typing import Any

import celpy
from celpy import celtypes

from compiler.validate import quantity


@functools.total_ordering
class Quantity:
    """A quantity as Kubernetes' CEL library has it: compared exactly."""

    def __init__(self, text: object) -> None:
        self.value = quantity.parse(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: "Quantity") -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _bool(value: bool) -> celtypes.BoolType:
    return celtypes.BoolType(value)


def _strings(values: list[str]) -> celtypes.ListType:
    return celtypes.ListType([celtypes.StringType(v) for v in values])


FUNCTIONS = {
    # Kubernetes' strings library (k8s.io/apiserver/pkg/cel/library, cel-go ext.Strings)
    "lowerAscii": lambda s: celtypes.StringType(str(s).lower()),
    "upperAscii": lambda s: celtypes.StringType(str(s).upper()),
    "split": lambda s, sep, *n: _strings(str(s).split(str(sep)) if not n else
                                         str(s).split(str(sep), int(n[0]) - 1)),
    "join": lambda items, sep="": celtypes.StringType(str(sep).join(str(i) for i in items)),
    "trim": lambda s: celtypes.StringType(str(s).strip()),
    "replace": lambda s, old, new, *n: celtypes.StringType(str(s).replace(str(old), str(new),
                                                                          *(int(x) for x in n))),
    "indexOf": lambda s, sub: celtypes.IntType(str(s).find(str(sub))),
    "lastIndexOf": lambda s, sub: celtypes.IntType(str(s).rfind(str(sub))),
    "substring": lambda s, a, b=None: celtypes.StringType(str(s)[int(a):None if b is None
                                                                 else int(b)]),
    # Kubernetes' quantity library
    "quantity": Quantity,
    "isQuantity": lambda s: _bool(_is_quantity(s)),
    "isGreaterThan": lambda a, b: _bool(a > b),
    "isLessThan": lambda a, b: _bool(a < b),
    "compareTo": lambda a, b: celtypes.IntType((a > b) - (a < b)),
    "asInteger": lambda q: celtypes.IntType(int(q.value)),
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
    "sign": lambda q: celtypes.IntType((q.value > 0) - (q.value < 0)),
    # optionals: `oldSelf` on create (optionalOldSelf) has no value
    "hasValue": lambda opt: _bool(opt is not None),
    "orValue": lambda opt, default: default if opt is None else opt,
}


def _is_quantity(text: object) -> bool:
    try:
        quantity.parse(text)
    except ValueError:
        return False
    return True


@functools.cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule), functions=FUNCTIONS)


def with_defaults(schema: dict[str, Any], value: Any) -> Any:
    """`value` with the schema's `default`s filled in where a parent object exists."""
    if isinstance(value, dict):
        out = dict(value)
        props = schema.get("properties") or {}
        for name, sub in props.items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = with_defaults(sub, out[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in out.keys() - props.keys():
                out[name] = with_defaults(extra, out[name])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [with_defaults(schema["items"], item) for item in value]
    return value


def _evaluate(rule: dict[str, Any], value: Any) -> str | None:
    """None when the rule holds, else what went wrong."""
    text = rule.get("rule", "")
    message = rule.get("message") or rule.get("messageExpression") or f"failed rule: {text}"
    try:
        result = _program(text).evaluate(
            {"self": celpy.json_to_cel(value), "oldSelf": None})
    except Exception as exc:  # celpy raises its own and Python's errors alike
        return f"CEL rule {text!r} could not be evaluated: {_reason(exc)}"
    if isinstance(result, celpy.CELEvalError):
        return f"CEL rule {text!r} could not be evaluated: {_reason(result)}"
    return None if result is True or result == celtypes.BoolType(True) else message


def _reason(exc: BaseException) -> str:
    """celpy's message without the activation dump it appends."""
    text = str(exc.args[0]) if exc.args else type(exc).__name__
    return text.split(" (in activation")[0][:200]


def _applies(rule: dict[str, Any]) -> bool:
    return "oldSelf" not in rule.get("rule", "") or bool(rule.get("optionalOldSelf"))


def _path(path: str, name: object) -> str:
    if isinstance(name, int):
        return f"{path}[{name}]"
    return f"{path}.{name}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)) \
        else f"{path}[{name!r}]"


def rule_errors(schema: dict[str, Any], value: Any, path: str = "$") -> Iterator[tuple[str, str]]:
    """(JSON path, message) for each CEL rule that fails; call with the defaulted object."""
    for rule in schema.get("x-kubernetes-validations") or []:
        if _applies(rule):
            problem = _evaluate(rule, value)
            if problem is not None:
                yield _path(path, rule["fieldPath"].lstrip(".")) if rule.get("fieldPath") \
                    else path, problem
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for name, sub in value.items():
            sub_schema = props.get(name, extra if isinstance(extra, dict) else None)
            if sub_schema is not None:
                yield from rule_errors(sub_schema, sub, _path(path, name))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from rule_errors(schema["items"], item, _path(path, index))

"""Turn a loaded document into a typed model, translating every pydantic error to a Diagnostic."""

from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from schemas import API_VERSION, KINDS
from schemas.diagnostics import CompileError, Diagnostic, did_you_mean, shown
from schemas.source import Document, PathKey, format_path

# pydantic error type -> (code, what we expected when pydantic's message is not clearer)
_CODES: dict[str, str] = {
    "extra_forbidden": "E101",
    "missing": "E102",
    "finite_number": "E104",
    "greater_than": "E104",
    "greater_than_equal": "E104",
    "less_than": "E104",
    "less_than_equal": "E104",
    "literal_error": "E105",
    "enum": "E105",
    "string_pattern_mismatch": "E105",
    "string_too_long": "E105",
    "string_too_short": "E105",
    "value_error": "E105",
}


_BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal",
                 "finite_number")


def _range(bounds: dict[str, float], integer: bool) -> str | None:
    """'an integer from 1 to 576', 'a number > 0 and at most 3200', from the field's bounds."""
    low = bounds.get("ge", bounds.get("gt"))
    high = bounds.get("le", bounds.get("lt"))
    if low is None or high is None:
        return None
    if integer and "ge" in bounds and "le" in bounds:
        return f"an integer from {_num(low)} to {_num(high)}"
    above = ">=" if "ge" in bounds else ">"
    below = "<=" if "le" in bounds else "<"
    what = "an integer" if integer else "a number"
    return f"{what} {above} {_num(low)} and {below} {_num(high)}"


def _num(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _expected(err: dict) -> str:
    kind, ctx = err["type"], err.get("ctx", {})
    if kind in _BOUND_ERRORS and err.get("range"):
        return err["range"]
    if kind == "finite_number":
        return "a finite number"
    if kind in ("greater_than", "greater_than_equal"):
        bound = ctx.get("gt", ctx.get("ge"))
        if bound == 0 and kind == "greater_than":
            return "a positive integer" if err.get("integer") else "a positive number"
        return f"a number {'>' if kind == 'greater_than' else '>='} {bound}"
    if kind in ("less_than", "less_than_equal"):
        return f"a number {'<' if kind == 'less_than' else '<='} {ctx.get('lt', ctx.get('le'))}"
    if kind == "literal_error":
        return f"one of {ctx.get('expected', '')}"
    if kind == "string_pattern_mismatch":
        return f"text matching {ctx.get('pattern', '')}"
    if kind == "extra_forbidden":
        return "a known field"
    if kind == "missing":
        return "this required field"
    return err["msg"].replace("Input should be ", "").replace("Value error, ", "")


def _got(err: dict) -> str:
    if err["type"] == "missing":
        return "nothing"
    value = err.get("input")
    if err["type"] == "extra_forbidden":
        return f"unknown key {shown(str(err['loc'][-1]))}"
    return shown(value)


def _hint(err: dict, model: type[BaseModel], path: PathKey) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return did_you_mean(str(path[-1]), _fields_at(model, path[:-1]))
    if kind == "missing":
        return f"add `{path[-1]}:` here"
    if kind in ("int_type", "float_type") and isinstance(err.get("input"), str):
        return "write the number without quotes or units (units are in the field name)"
    if kind in ("greater_than", "greater_than_equal", "finite_number"):
        return "counts and sizes must be greater than zero"
    if kind in ("less_than", "less_than_equal"):
        return "this is beyond what the field's domain holds; check the units and digits"
    return ""


def _fields_at(model: type[BaseModel], path: PathKey) -> list[str]:
    """Field names of the sub-model at `path`, for did-you-mean on unknown keys."""
    fields = getattr(_model_at(model, path), "model_fields", None)
    return list(fields) if fields else []


def _model_at(model: type[BaseModel], path: PathKey) -> object:
    current: object = model
    for part in path:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        current = _submodel(fields[part].annotation)
    return current


def _field(model: type[BaseModel], path: PathKey) -> FieldInfo | None:
    """The pydantic FieldInfo at `path` (list indices skipped), or None."""
    names = [p for p in path if not isinstance(p, int)]
    if not names:
        return None
    parent = _model_at(model, tuple(names[:-1]))
    fields = getattr(parent, "model_fields", None) or {}
    return fields.get(names[-1])


def _is_int_field(model: type[BaseModel], path: PathKey) -> bool:
    field = _field(model, path)
    return field is not None and "int" in str(field.annotation)


def _bounds(field: object) -> dict[str, float]:
    """ge/gt/le/lt of a field, from its own metadata or an Annotated type inside its
    annotation (`Annotated[int, bounded(64)] | None`, `list[Annotated[int, bounded(1151)]]`)."""
    found: dict[str, float] = {}

    def visit(meta: object) -> None:
        for key in ("ge", "gt", "le", "lt"):
            value = getattr(meta, key, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                found.setdefault(key, value)
        for inner in getattr(meta, "metadata", ()) or ():
            visit(inner)

    def walk(annotation: object) -> None:
        for meta in getattr(annotation, "__metadata__", ()):
            visit(meta)
        for arg in getattr(annotation, "__args__", ()):
            walk(arg)

    for meta in getattr(field, "metadata", ()) or ():
        visit(meta)
    walk(getattr(field, "annotation", None))
    return found


def _submodel(annotation: object) -> object:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def to_diagnostics(exc: ValidationError, doc: Document, model: type[BaseModel]) -> list[Diagnostic]:
    out = []
    for details in exc.errors(include_url=False):
        err: dict[str, Any] = dict(details)
        path: PathKey = tuple(p for p in err["loc"] if not str(p).startswith("function-"))
        code = _CODES.get(err["type"], "E103")
        err["integer"] = _is_int_field(model, path)
        if err["type"] in _BOUND_ERRORS:
            err["range"] = _range(_bounds(_field(model, path)), err["integer"])
        if err["type"] == "missing":
            pos = doc.source.locate(path[:-1], prefer_key=True)
        else:
            pos = doc.source.locate(path, prefer_key=err["type"] == "extra_forbidden")
        out.append(Diagnostic("error", code, doc.source.file, pos.line, pos.column,
                              format_path(path), _expected(err), _got(err),
                              _hint(err, model, path)))
    return sorted(out, key=lambda d: (d.file, d.line, d.column, d.code))


def check_envelope(doc: Document, allowed: tuple[str, ...]) -> type[BaseModel]:
    """apiVersion and kind first: they decide which schema the rest is checked against."""
    file = doc.source.file
    if not isinstance(doc.data, dict):
        pos = doc.source.locate(())
        raise CompileError([Diagnostic("error", "E006", file, pos.line, pos.column, "",
                                       "a mapping with apiVersion, kind, metadata, spec",
                                       type(doc.data).__name__, "see examples/")])
    errors = []
    version = doc.data.get("apiVersion")
    if version != API_VERSION:
        pos = doc.source.locate(("apiVersion",))
        errors.append(Diagnostic("error", "E010", file, pos.line, pos.column, "apiVersion",
                                 f"`{API_VERSION}`", shown(version) if version else "nothing",
                                 f"write `apiVersion: {API_VERSION}`"))
    kind = doc.data.get("kind")
    if kind not in allowed:
        pos = doc.source.locate(("kind",))
        hint = did_you_mean(kind, allowed) if isinstance(kind, str) and kind else \
            f"write `kind: {allowed[0]}`"
        errors.append(Diagnostic("error", "E011", file, pos.line, pos.column, "kind",
                                 " or ".join(f"`{k}`" for k in allowed),
                                 shown(kind) if kind else "nothing", hint))
    if errors:
        raise CompileError(errors)
    return KINDS[str(kind)]


def validate(doc: Document, allowed: tuple[str, ...]) -> BaseModel:
    model = check_envelope(doc, allowed)
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise CompileError(to_diagnostics(exc, doc, model)) from None

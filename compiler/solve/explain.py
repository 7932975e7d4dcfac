"""Infeasible deployments: name the conflicting requirements where the user wrote them."""

from compiler.solve.problem import Problem
from schemas.diagnostics import CompileError, Diagnostic
from schemas.source import format_path


def _count_field(p: Problem) -> tuple[str, ...]:
    """The hardware count too small to hold both roles: the one the user wrote (nodes, racks,
    trays), else the system (whose full tray count was used)."""
    spec = p.inputs.hardware.spec
    for name in ("nodes", "racks", "trays"):
        if getattr(spec, name, None) is not None:
            return ("spec", name)
    return ("spec", "system")


def infeasible(p: Problem, keys: list[str], phase: str) -> CompileError:
    """Exit 3 with one diagnostic per conflicting requirement (sufficient, shrunk by deletion)."""
    if not keys:
        src = p.inputs.sources["hardware"]
        path = _count_field(p)
        pos = src.locate(path)
        gpus = sum(len(d.trays) * d.gpus_per_tray for d in p.domains)
        return CompileError([Diagnostic(
            "error", "E501", src.file, pos.line, pos.column, format_path(path),
            f"room for a prefill and a decode instance ({phase})",
            f"{gpus} GPUs that cannot hold both",
            "add trays or nodes, or serve a smaller model")], exit_code=3)
    texts = [p.requirements[k].text for k in keys]
    out = []
    for k in keys:
        r = p.requirements[k]
        src = p.inputs.sources[r.file_role]
        pos = src.locate(r.path)
        others = [t for t in texts if t != r.text]
        got = r.text + (" together with " + "; ".join(others) if others else "")
        out.append(Diagnostic(
            "error", "E501", src.file, pos.line, pos.column, format_path(r.path),
            "requirements that can hold together", got,
            "these requirements conflict (a sufficient set, shrunk by deletion); relax one"))
    return CompileError(out, exit_code=3)

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


def infeasible(p: Problem, keys: list[str], phase: str, shrunk: bool = True) -> CompileError:
    """Exit 3 with one diagnostic per conflicting requirement. `shrunk`: the set is sufficient
    and shrunk by deletion (compiler/solve/counts.py conflicting_requirements); else it is
    every requirement that may take part, said to be not minimised."""
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
    conflict = ("these requirements conflict (a sufficient set, shrunk by deletion)" if shrunk
                else "these requirements conflict together (not minimised: some may not take part)")
    reachable = _reachable(p, list(p.requirements))
    # every SLO the deployment states, also one the shrunk set left out (either alone may
    # conflict): what the user may ask of each
    beside = "".join(f"; {p.requirements[k].text} is not in the set: {text[2:]}"
                     for k, text in reachable.items() if k not in keys)
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
            conflict + "; relax one" + reachable.get(k, "") + beside))
    return CompileError(out, exit_code=3)


def unplaced(p: Problem, reasons: list[str]) -> CompileError:
    """Exit 3 when the counts hold but the GPUs cannot: the placement's own reasons
    (compiler/solve/place.py unplaceable), at the hardware count that bounds them."""
    src = p.inputs.sources["hardware"]
    path = _count_field(p)
    pos = src.locate(path)
    return CompileError([Diagnostic(
        "error", "E501", src.file, pos.line, pos.column, format_path(path),
        "instances that fit the free whole trays and aligned blocks (GPU placement)",
        reason, "add GPUs, free the unavailable ones, or pin smaller or fewer instances")
        for reason in reasons], exit_code=3)


def _reachable(p: Problem, keys: list[str]) -> dict[str, str]:
    """For an SLO requirement: the best value of its metric any searched candidate reaches
    (decode at batch 1, prefill idle) and which one, so the user knows what to ask for."""
    out = {}
    for k in keys:
        if k not in ("slo", "ttft"):
            continue
        metric = str(p.requirements[k].path[-1])
        higher = metric.startswith("tokens")
        found = [(dict(c.reach)[metric], f"{c.role} {c.shape.name}") for c in p.candidates
                 if metric in dict(c.reach)]
        if not found:
            continue
        value, where = (max if higher else min)(found, key=lambda vw: vw[0])
        unit = "tokens/s per user" if higher else "ms"
        how = "at batch 1" if higher else "when idle"
        out[k] = (f"; the best any searched layout reaches is {value:.4g} {unit} "
                  f"({metric}), with {where} {how}")
    return out

"""`--fail ID@T`: a GPU (r0-t07-g2), tray (r0-t07) or rack (r0) goes down T seconds into the
run. Instances with a GPU there stop: their requests are retried from scratch on what is left
(or reported lost when nothing of their role is left); pool segments there are gone."""

import re
from dataclasses import dataclass

from compiler.plan import Plan
from schemas.diagnostics import CompileError, Diagnostic

FAIL_FORM = re.compile(r"^(?P<id>[A-Za-z0-9-]+)@(?P<t>\d+(\.\d+)?)$")


@dataclass(frozen=True)
class Fault:
    at_us: float
    target: str
    gpus: frozenset[str]
    trays: frozenset[str]


def parse_faults(specs: list[str], plan: Plan) -> list[Fault]:
    """Each spec as a Fault over the plan's hardware; every bad one reported at once."""
    trays = plan.hardware.trays
    out, errors = [], []
    for spec in specs:
        m = FAIL_FORM.match(spec)
        if not m:
            errors.append(_bad(spec, "ID@SECONDS, e.g. r0-t03@30"))
            continue
        ident = m["id"]
        hit = [t for t in trays if t.id == ident or t.id.startswith(ident + "-")
               or ident in t.gpus]
        if not hit:
            errors.append(_bad(spec, "a GPU, tray or rack id of the plan (r0-t00-g0, r0-t00, "
                                     "r0)"))
            continue
        gpus = frozenset(g for t in hit for g in t.gpus if ident in (g, t.id)
                         or t.id.startswith(ident + "-"))
        whole = frozenset(t.id for t in hit if t.id == ident or t.id.startswith(ident + "-"))
        out.append(Fault(float(m["t"]) * 1e6, ident, gpus, whole))
    if errors:
        raise CompileError(errors)
    return sorted(out, key=lambda f: (f.at_us, f.target))


def _bad(spec: str, expected: str) -> Diagnostic:
    return Diagnostic("error", "E753", "<argument>", 0, 0, "--fail", expected, repr(spec),
                      "name what fails and when: --fail r0-t03@30 (seconds into the run)")

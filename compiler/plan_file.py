"""Reading a `plan.yaml` from disk: the plan `rackc compile` wrote, or a diagnostic. Below
`compiler.api`, so that the commands that only read a plan (`validate`, `explain`, `diff`,
`compile --from`) need not load the compile pipeline."""

from pathlib import Path

import yaml

from compiler.load import display_name
from compiler.plan import PLAN_MAX_BYTES, Plan, load_plan
from schemas.diagnostics import CompileError, Diagnostic
from schemas.reading import FileProblem, read_regular
from schemas.source import decode_utf8


def read_plan(path: Path) -> Plan:
    """A plan.yaml written by `rackc compile`, or a diagnostic."""
    file = display_name(path)
    try:
        text = decode_utf8(read_regular(path, PLAN_MAX_BYTES), file)
        return load_plan(text, file)
    except FileProblem as problem:
        raise CompileError([Diagnostic("error", problem.code, file, 0, 0, "",
                                       f"{problem.expected} (a plan.yaml)", problem.got,
                                       "run `rackc compile ... -o OUT` first")]) from None
    except (ValueError, TypeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0]
        raise CompileError([Diagnostic("error", "E701", file, 0, 0, "",
                                       "a plan.yaml written by rackc compile", first,
                                       "pass OUT/plan.yaml")]) from None

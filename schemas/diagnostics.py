"""The one error shape of rackc: what was asked, where, what was expected, and how to fix it."""

import difflib
from collections.abc import Iterable
from dataclasses import asdict, dataclass


@dataclass(frozen=True, order=True)
class Diagnostic:
    severity: str  # "error" | "warning"
    code: str
    file: str
    line: int
    column: int
    path: str
    expected: str
    got: str
    hint: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def render(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        head = f"{self.severity}[{self.code}] {where} {self.path}".rstrip()
        text = f"{head}: expected {self.expected}, got {self.got}"
        return f"{text}\n  hint: {self.hint}" if self.hint else text


def rendered(diagnostics: Iterable[Diagnostic]) -> str:
    """Every diagnostic, then the count of errors: what the CLI prints on stderr."""
    ds = list(diagnostics)
    errors = sum(1 for d in ds if d.severity == "error")
    tail = [f"{errors} error{'s' if errors != 1 else ''}"] if errors else []
    return "".join(line + "\n" for line in [*(d.render() for d in ds), *tail])


class CompileError(Exception):
    """Expected failure: carries every diagnostic found; the CLI prints them without a traceback."""

    def __init__(self, diagnostics: Iterable[Diagnostic], exit_code: int = 2,
                 result: dict | None = None):
        self.diagnostics = tuple(diagnostics)
        self.exit_code = exit_code
        self.result = result  # what was computed before the failure, for --format json
        super().__init__("\n".join(d.render() for d in self.diagnostics))


def shown(value: object, limit: int = 60) -> str:
    """A user's value as a diagnostic's `got`: short, one line, safe for any size (Python's
    str() refuses integers of 4300+ digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, dict | list):
        return type(value).__name__
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A hint naming the closest choice, or listing the choices when none is close."""
    options = sorted(set(choices))
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if close:
        return f"did you mean `{close[0]}`?"
    shown = ", ".join(options[:12]) + (", ..." if len(options) > 12 else "")
    return f"choose one of: {shown}"

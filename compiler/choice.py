"""A resolved choice: the value a pass uses, where it lands in the plan, and why (its source:
the user, a default, the catalog or a rule), which becomes the plan's decision."""

from dataclasses import dataclass
from typing import Generic, TypeVar

from compiler.plan import Decision

T = TypeVar("T")
CAPABILITY = "rule:engine-capability"
BLACKWELL_FAMILY = ("blackwell", "rubin")  # Rubin runs the sm100f kernels (SYSTEM.md)


@dataclass(frozen=True)
class Choice(Generic[T]):
    path: str  # where it lands in the plan
    value: T
    source: str  # user | default | catalog | rule:<id>
    why: str

    def decision(self) -> Decision:
        value = self.value
        if isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in sorted(value.items()))
        elif isinstance(value, float):
            value = f"{value:g}"
        return Decision(path=self.path, value=str(value), source=self.source, why=self.why)

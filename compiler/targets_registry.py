"""Targets are found through the `rackc.targets` entry-point group, so the compiler never
imports them (imports flow schemas <- compiler <- targets)."""

from collections.abc import Callable
from importlib.metadata import entry_points

from compiler.plan import Plan

Emit = Callable[[Plan], dict[str, str | bytes]]


def target_names() -> tuple[str, ...]:
    """The installed targets' names, without importing them."""
    return tuple(sorted(ep.name for ep in entry_points(group="rackc.targets")))


# Emitted only when `--targets` names them (netpol: policies a cluster must opt into)
OPTIONAL = ("netpol",)


def emitted(name: str, only: tuple[str, ...] | None) -> bool:
    """Whether a compile emits the target: one `only` names, else every default one."""
    return name in only if only is not None else name not in OPTIONAL


def targets(only: tuple[str, ...] | None = None, every: bool = False) -> dict[str, Emit]:
    """The installed targets by name that a compile with `only` emits (every one with
    `every`); the others' modules, which import the Kubernetes models, are not loaded."""
    found = entry_points(group="rackc.targets")
    return {ep.name: ep.load() for ep in sorted(found, key=lambda e: e.name)
            if every or emitted(ep.name, only)}

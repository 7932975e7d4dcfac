"""Targets: each turns a Plan into files, `emit(plan) -> {relative path: text}`, purely.

Paths are relative to the compile output directory and start with the target's folder.
"""

from collections.abc import Callable

from compiler.plan import Plan
from targets import (
    _k8s_client,  # noqa: F401  first: the Kubernetes client, lean (its docstring)
    dynamo,
    k8s,
    lws,
    mooncake,
    vllm,
)

TARGETS: dict[str, Callable[[Plan], dict[str, str]]] = {
    "vllm": vllm.emit,
    "dynamo": dynamo.emit,
    "mooncake": mooncake.emit,
    "k8s": k8s.emit,
    "lws": lws.emit,
}

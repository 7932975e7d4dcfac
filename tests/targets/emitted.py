"""Reading back what the targets emitted: launch scripts, Kubernetes documents, command lines.

The tests check the emitted text, not the targets' internals, so these readers are the only
place that knows the file layouts.
"""

import functools
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

import yaml

from compiler.plan import Plan
from targets import TARGETS

CUSTOM_GROUPS = ("nvidia.com", "resource.nvidia.com", "leaderworkerset.x-k8s.io")


def emit_all(plan: Plan) -> dict[str, str]:
    return {path: text for emit in TARGETS.values() for path, text in emit(plan).items()}


@functools.cache
def case_plan(case: str) -> Plan:
    """The plan of one of fixtures.ALL_CASES, made once per test session."""
    from tests.targets.fixtures import ALL_CASES

    return ALL_CASES[case]()


@functools.cache
def case_files(case: str) -> dict[str, str]:
    return emit_all(case_plan(case))


@dataclass(frozen=True)
class Script:
    """A `vllm/<instance>/<tray>.sh` launch script."""

    instance: str
    tray: str
    env: dict[str, str]
    argv: list[str]  # from `vllm serve`

    def flag(self, name: str) -> str | None:
        return flag_value(self.argv, name)


def flag_value(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def scripts(files: Mapping[str, str]) -> list[Script]:
    out = []
    for path, text in sorted(files.items()):
        if not path.startswith("vllm/"):
            continue
        p = PurePosixPath(path)
        env, command = {}, []
        for line in text.splitlines():
            if line.startswith("export "):
                key, value = shlex.split(line[len("export "):])[0].split("=", 1)
                env[key] = value
            elif line.startswith("exec ") or command:
                command.append(line.removesuffix("\\"))
        argv = shlex.split(" ".join(command))
        assert argv[0] == "exec", path
        out.append(Script(p.parent.name, p.stem, env, argv[1:]))
    return out


def documents(files: Mapping[str, str], folder: str) -> list[dict]:
    """The Kubernetes objects in a folder's YAML files (not kustomization.yaml, not configs)."""
    docs = [doc for path, text in sorted(files.items())
            if path.startswith(folder + "/") and path.endswith(".yaml")
            and not path.endswith("kustomization.yaml")
            for doc in yaml.safe_load_all(text)]
    return [d for d in docs if {"apiVersion", "kind", "metadata"} <= set(d)]


def is_custom(doc: Mapping) -> bool:
    return str(doc["apiVersion"]).rpartition("/")[0] in CUSTOM_GROUPS


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def main_container(pod_template: Mapping) -> dict:
    [container] = [c for c in pod_template["spec"]["containers"] if c["name"] == "main"]
    return container


def dynamo_lines(dgd: Mapping) -> dict[str, list[str]]:
    """Component name -> `python3 -m dynamo.* ...` argv, as the pod runs it."""
    return {c["name"]: [*main_container(c["podTemplate"])["command"],
                        *main_container(c["podTemplate"])["args"]]
            for c in dgd["spec"]["components"]}


def lws_lines(lws: Mapping) -> dict[str, list[str]]:
    """'leader' / 'worker-<index>' -> the `vllm serve ...` argv each pod runs; a worker's
    `sh -c` script is expanded by a real shell with the LWS variables set (index 1..size-1)."""
    template = lws["spec"]["leaderWorkerTemplate"]
    size = template["size"]
    leader = main_container(template.get("leaderTemplate", template["workerTemplate"]))
    lines = {"leader": [*leader["command"], *leader["args"]]}
    if size > 1:
        worker = main_container(template["workerTemplate"])
        assert worker["command"] == ["/bin/sh", "-c"], worker["command"]
        [script] = worker["args"]
        for index in range(1, size):
            lines[f"worker-{index}"] = expand_shell(script, {
                "LWS_LEADER_ADDRESS": "leader.example", "LWS_WORKER_INDEX": str(index)})
    return lines


def expand_shell(script: str, env: Mapping[str, str]) -> list[str]:
    """The argv `exec` would run: the script with `exec` swapped for printing its words."""
    assert script.startswith("exec "), script
    printing = "printf '%s\\0' " + script[len("exec "):]
    out = subprocess.run(["/bin/sh", "-c", printing], env=dict(env), capture_output=True,
                         check=True).stdout
    return out.decode().split("\0")[:-1]

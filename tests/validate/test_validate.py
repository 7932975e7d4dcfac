"""`rackc validate OUT`: green where a compiled example breaks nothing, red with the check and
the object named when a defect is put back into OUT; bad OUT and CRD folders are diagnostics."""

import json
import os
import re
import shutil
import sys

import pytest
import yaml

from compiler import cli
from compiler.validate import rules
from tests.conformance import harness
from tests.conftest import EXAMPLES

from .bundles import VR

CUSTOM_KINDS = {"ComputeDomain.resource.nvidia.com", "DynamoGraphDeployment.nvidia.com",
                "LeaderWorkerSet.leaderworkerset.x-k8s.io"}
SCHEMA_CODES = {"E802", "E803", "E804"}


@pytest.fixture(scope="module")
def compiled_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate") / "out"
    assert cli.main(["compile", str(EXAMPLES / VR / "deployment.yaml"), "-o", str(out)]) == 0
    return out


@pytest.fixture
def out(compiled_out, tmp_path):
    """A copy of the compiled example that a test may break."""
    copy = tmp_path / "out"
    shutil.copytree(compiled_out, copy)
    return copy


def validate(capsys, *args: str) -> tuple[int, dict]:
    rc = cli.main(["validate", *args, "--format", "json"])
    return rc, json.loads(capsys.readouterr().out)


def test_without_crds_custom_kinds_are_listed_and_the_rest_is_checked(compiled_out, capsys,
                                                                       monkeypatch):
    monkeypatch.delenv("RACKC_CRDS", raising=False)
    rc, report = validate(capsys, str(compiled_out))
    assert set(report["not_schema_checked"]) == CUSTOM_KINDS
    codes = {d["code"] for d in report["diagnostics"]}
    assert not codes & SCHEMA_CODES, report["diagnostics"]
    assert report["kustomize_built"] == ["k8s", "lws"]
    assert report["objects_schema_checked"] > 0
    assert rc == (0 if report["ok"] else 1)
    # compile wrote it, so it breaks none of the rules compile enforces
    assert not codes & {rules.RULES[r] for r in rules.ENFORCED}


def test_with_crds_every_object_is_schema_checked(compiled_out, capsys):
    harness.require_crds()
    _, report = validate(capsys, str(compiled_out), "--crds", str(harness.crd_dir()))
    assert report["not_schema_checked"] == []
    assert not {d["code"] for d in report["diagnostics"]} & SCHEMA_CODES, report["diagnostics"]


def _edit(path, kind: str, change) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    change(next(d for d in docs if d["kind"] == kind))
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def test_a_built_in_typo_is_named_at_its_line(out, capsys):
    _edit(out / "k8s/mooncake.yaml", "Deployment",
          lambda d: d["spec"].update(replcas=d["spec"].pop("replicas")))
    rc = cli.main(["validate", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    [(line, path)] = re.findall(r"error\[E803\] k8s/mooncake.yaml:(\d+):1 Deployment/\S+ (\S+):",
                                err)
    assert path == "spec" and "'replcas' was unexpected" in err
    assert (out / "k8s/mooncake.yaml").read_text().splitlines()[int(line) - 1].strip() == "spec:"


def test_a_cel_rule_of_the_crd_is_checked(out, capsys):
    harness.require_crds()

    def backend(dgd: dict) -> None:
        comp = next(c for c in dgd["spec"]["components"] if c.get("multinode"))
        comp["podTemplate"].setdefault("metadata", {})["annotations"] = {
            "nvidia.com/vllm-distributed-executor-backend": "slurm"}
    _edit(out / "k8s/dynamo-graph.yaml", "DynamoGraphDeployment", backend)
    rc, report = validate(capsys, str(out), "--crds", str(harness.crd_dir()))
    [error] = [d for d in report["diagnostics"] if d["code"] == "E802"]
    assert rc == 1 and error["file"] == "k8s/dynamo-graph.yaml"
    assert error["path"].startswith("DynamoGraphDeployment/") and "annotations" in error["path"]


def test_a_bundle_kustomize_cannot_build(out, capsys):
    (out / "k8s/namespace.yaml").unlink()
    rc, report = validate(capsys, str(out))
    [error] = [d for d in report["diagnostics"] if d["code"] == "E804"]
    assert rc == 1 and error["file"] == "k8s/kustomization.yaml"
    assert "namespace.yaml" in error["got"]


def test_a_controller_level_defect_is_named_with_its_rule(out, capsys):
    """Two pods per node, each claiming the ComputeDomain channel from the template."""
    [domain, *_] = yaml.safe_load_all((out / "k8s/compute-domains.yaml").read_text())
    template = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]

    def double(dgd: dict) -> None:
        prefill = [c for c in dgd["spec"]["components"] if c["type"] == "prefill"]
        for comp in dgd["spec"]["components"]:
            if comp["type"] == "decode" or (comp["type"] == "prefill" and comp is not prefill[0]):
                comp["replicas"] = 0
            elif comp["type"] != "frontend":  # prefill, one pod per replica whatever its shape
                comp.pop("multinode", None)
                comp["replicas"] = 4
                spec = comp["podTemplate"]["spec"]
                spec.pop("nodeSelector", None)  # multinode shapes select a clique; pinned below
                # two pods fit a tray's GPUs, memory and NICs, so only the channel claims collide
                spec["containers"][0]["resources"] = {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "limits": {"memory": "1Gi", "nvidia.com/gpu": "2"},
                    "claims": [{"name": "compute-domain-channel"}]}
                spec["affinity"] = {"nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In",
                                          "values": ["vr-a-r0-t16", "vr-a-r0-t17"]}]}]}}}
                spec["resourceClaims"] = [{"name": "compute-domain-channel",
                                           "resourceClaimTemplateName": template}]
    _edit(out / "k8s/dynamo-graph.yaml", "DynamoGraphDeployment", double)
    rc = cli.main(["validate", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "error[E822] k8s/dynamo-graph.yaml:" in err
    assert "[dra-channel-per-node] DynamoGraphDeployment/dsv41-flash spec.components[" in err
    assert "4 channel claims for 2 nodes" in err


def test_bad_out_and_crd_folders_are_diagnostics(out, tmp_path, capsys):
    assert cli.main(["validate", str(tmp_path / "missing")]) == 2
    assert "error[E801]" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["validate", str(tmp_path / "empty")]) == 2
    assert "without plan.yaml" in capsys.readouterr().err
    assert cli.main(["validate", str(out), "--crds", str(tmp_path / "none")]) == 2
    assert "error[E810]" in capsys.readouterr().err
    bad = tmp_path / "crds"
    bad.mkdir()
    (bad / "x.yaml").write_text("kind: CustomResourceDefinition\nspec: [\n")
    assert cli.main(["validate", str(out), "--crds", str(bad)]) == 2
    assert "readable YAML or JSON" in capsys.readouterr().err


def test_without_the_extra_it_says_how_to_install_it(out, capsys, monkeypatch):
    import compiler.validate

    for name in ("run", "kube", "cel"):
        monkeypatch.delitem(sys.modules, f"compiler.validate.{name}", raising=False)
        monkeypatch.delattr(compiler.validate, name, raising=False)
    monkeypatch.setitem(sys.modules, "celpy", None)
    assert cli.main(["validate", str(out)]) == 2
    err = capsys.readouterr().err
    assert "error[E800]" in err and "pip install 'rackc[validate]'" in err


def test_compile_fails_and_writes_nothing_when_an_enforced_rule_breaks(monkeypatch):
    """Every rule is enforced: a k8s target that put two channel-claiming prefill pods on each
    tray again would make compile refuse the bundle (exit 3) before anything is written."""
    from compiler import api, targets_registry
    from schemas.diagnostics import CompileError

    from .test_rules import _channel_pods

    assert frozenset(rules.RULES) == rules.ENFORCED
    real = targets_registry.targets

    def with_defect(only=None):
        emits = real(only)

        def k8s(plan):
            files = dict(emits["k8s"](plan))
            _channel_pods(plan, files, per_node=2)
            return files

        return {**emits, "k8s": k8s}

    monkeypatch.setattr(targets_registry, "targets", with_defect)
    with pytest.raises(CompileError) as info:
        api.compile(EXAMPLES / VR / "deployment.yaml")
    assert info.value.exit_code == 3
    assert any("[dra-channel-per-node]" in d.render() for d in info.value.diagnostics)


def test_requests_whose_node_capacity_is_unknown_are_named(out, capsys):
    """The plan has no CPU cores per tray: CPU sums are not checked, and the report says so."""
    _edit(out / "k8s/mooncake.yaml", "Deployment", lambda d: d["spec"]["template"]["spec"][
        "containers"][0].update(resources={"requests": {"cpu": "2"}}))
    _, report = validate(capsys, str(out))
    assert report["capacity_not_checked"] == ["cpu"]


def test_a_deleted_kustomization_is_a_difference_from_the_manifest(out, capsys):
    (out / "k8s/kustomization.yaml").unlink()
    rc, report = validate(capsys, str(out))
    drift = [d for d in report["diagnostics"] if d["code"] == "E807"]
    assert rc == 1 and [(d["file"], d["got"]) for d in drift] == [
        ("k8s/kustomization.yaml", "removed since")]


def test_edited_and_added_files_are_named(out, capsys):
    (out / "lws/extra.yaml").write_text("a: 1\n")
    (out / "vllm/notes").mkdir()
    with open(out / "k8s/namespace.yaml", "a") as f:
        f.write("# edited\n")
    rc, report = validate(capsys, str(out))
    drift = sorted((d["file"], d["got"]) for d in report["diagnostics"] if d["code"] == "E807")
    assert rc == 1 and drift == [("k8s/namespace.yaml", "changed since"),
                                 ("lws/extra.yaml", "rackc did not write"),
                                 ("vllm/notes/", "rackc did not write")]


def test_a_compiled_out_has_no_differences(compiled_out, capsys):
    _, report = validate(capsys, str(compiled_out))
    assert not [d for d in report["diagnostics"] if d["code"] == "E807"]


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_links_and_fifos_in_out_are_refused_up_front(out, capsys, kind):
    target = out / "k8s/kustomization.yaml"
    target.unlink()
    if kind == "symlink":
        target.symlink_to(out / "lws/kustomization.yaml")
    else:
        os.mkfifo(target)
    assert cli.main(["validate", str(out)]) == 2  # no wait for kustomize on the FIFO
    err = capsys.readouterr().err
    assert "error[E801]" in err and "k8s/kustomization.yaml" in err

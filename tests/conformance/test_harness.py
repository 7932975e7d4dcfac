"""The conformance harness itself: each checker passes a known-good input and
fails a known-bad one, so a green conformance run means something."""

from __future__ import annotations

import json

import pytest
import yaml

from . import harness

pytestmark = pytest.mark.conformance

DSV3_LINE = [
    "vllm",
    "serve",
    "deepseek-ai/DeepSeek-V3",
    "--tensor-parallel-size",
    "8",
    "--max-num-seqs",
    "64",
    "--kv-cache-dtype",
    "fp8",
]
NIXL = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
# Hand-written config.json files: the keys vLLM needs to pick the model class;
# transformers fills in the rest. No quantization_config (see check_vllm_engine_config).
DSV3_CONFIG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
DSV41_CONFIG = {
    "architectures": ["DeepseekV41ForCausalLM"],
    "model_type": "deepseek_v41",
    "text_config": {"num_hidden_layers": 61, "num_attention_heads": 128},
}


def check_vllm(*extra: str) -> harness.Result:
    [result] = harness.check_vllm_lines([[*DSV3_LINE, *extra]])
    return result


def test_vllm_known_good_line_passes():
    result = check_vllm()
    assert result.ok, result


def test_vllm_unknown_flag_fails():
    result = check_vllm("--no-such-flag", "1")
    assert "unrecognized arguments: --no-such-flag" in (result.error or "")
    assert not result.ok


def test_vllm_prefix_flag_parses_but_is_not_exact():
    result = check_vllm("--tensor-parallel", "8")
    assert result.error is None
    assert result.inexact_flags == ("--tensor-parallel",)
    assert not result.ok


@pytest.mark.parametrize("value", ["{not json", NIXL.replace("kv_role", "kv_rol")])
def test_vllm_bad_kv_transfer_config_fails(value):
    result = check_vllm("--kv-transfer-config", value)
    assert "argument --kv-transfer-config" in (result.error or "")


def test_vllm_checks_many_lines_in_order():
    results = harness.check_vllm_lines([DSV3_LINE, [*DSV3_LINE, "--bogus"], DSV3_LINE])
    assert [r.ok for r in results] == [True, False, True]


def test_vllm_engine_config_passes_a_good_deepseek_v3_line():
    result = harness.check_vllm_engine_config(DSV3_LINE, DSV3_CONFIG)
    assert result.ok, result


@pytest.mark.parametrize(("method", "ok"), [("dspark", True), ("mtp", False)])
def test_vllm_engine_config_checks_speculative_method_for_deepseek_v41(method, ok):
    spec = json.dumps({"method": method, "num_speculative_tokens": 1})
    line = ["vllm", "serve", "deepseek-ai/DeepSeek-V4.1", "-tp", "8", "--speculative-config", spec]
    result = harness.check_vllm_engine_config(line, DSV41_CONFIG)
    assert result.ok is ok, result
    if not ok:
        assert "Use speculative method 'dspark'" in (result.error or "")


def dynamo_worker(*extra: str) -> list[str]:
    return ["python3", "-m", "dynamo.vllm", "--model", "deepseek-ai/DeepSeek-V3", *extra]


def test_dynamo_lines():
    lines = [
        dynamo_worker("--disaggregation-mode", "prefill", "--kv-transfer-config", NIXL),
        dynamo_worker("--disaggregation-mode", "prefill"),  # a prefill worker needs a connector
        dynamo_worker("--disaggregation-mode", "bogus"),
        dynamo_worker("--tensor-parallel", "8"),
        ["python3", "-m", "dynamo.frontend", "--router-mode", "kv"],
        ["python3", "-m", "dynamo.frontend", "--router-mode", "bogus"],
        ["python3", "-m", "dynamo.frontend", "--router-mod", "kv"],
    ]
    results = harness.check_dynamo_lines(lines)
    assert [r.ok for r in results] == [True, False, False, False, True, False, False], results
    assert "--kv-transfer-config" in (results[1].error or "")
    assert "invalid choice: 'bogus'" in (results[2].error or "")
    assert results[3].inexact_flags == ("--tensor-parallel",)
    assert "argument --router-mode: invalid choice: 'bogus'" in (results[5].error or "")
    assert results[6].inexact_flags == ("--router-mod",)


BUILTIN_DOCS = """
apiVersion: v1
kind: ConfigMap
metadata: {name: mooncake-config, namespace: rackc}
data: {mooncake.json: "{}"}
---
apiVersion: v1
kind: Service
metadata: {name: mooncake-master, namespace: rackc}
spec:
  selector: {app: mooncake-master}
  ports: [{name: rpc, port: 50051, targetPort: 50051}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: mooncake-master, namespace: rackc}
spec:
  replicas: 1
  selector: {matchLabels: {app: mooncake-master}}
  template:
    metadata: {labels: {app: mooncake-master}}
    spec:
      containers:
      - name: master
        image: mooncake:0.3.13
        args: [--rpc_port=50051]
        ports: [{containerPort: 50051}]
"""


def builtin_docs() -> list[dict]:
    return list(yaml.safe_load_all(BUILTIN_DOCS))


def test_builtin_kinds_pass():
    assert harness.validate_builtin(builtin_docs()) == []


def test_builtin_typo_field_fails():
    deployment = builtin_docs()[2]
    deployment["spec"]["replcas"] = deployment["spec"].pop("replicas")
    [error] = harness.validate_builtin([deployment])
    assert "$.spec" in error and "'replcas' was unexpected" in error


def test_builtin_kind_without_schema_fails():
    typo = {"apiVersion": "v1", "kind": "Servce", "metadata": {"name": "x"}}
    [error] = harness.validate_builtin([typo])
    assert "Couldn't find schema" in error


COMPUTE_DOMAIN = {
    "apiVersion": "resource.nvidia.com/v1beta1",
    "kind": "ComputeDomain",
    "metadata": {"name": "rack-a", "namespace": "rackc"},
    "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "rack-a-channel"}}},
}
DGD = {
    "apiVersion": "nvidia.com/v1beta1",
    "kind": "DynamoGraphDeployment",
    "metadata": {"name": "dsv3", "namespace": "rackc"},
    "spec": {
        "backendFramework": "vllm",
        "components": [
            {"name": "frontend", "type": "frontend", "replicas": 2},
            {
                "name": "decode",
                "type": "decode",
                "replicas": 1,
                "multinode": {"nodeCount": 2},
                "sharedMemorySize": "80Gi",
                "podTemplate": {
                    "spec": {"containers": [{"name": "main", "image": "dynamo:1.6.1"}]}
                },
            },
        ],
    },
}


@pytest.fixture
def crds():
    harness.require_crds()


@pytest.mark.usefixtures("crds")
@pytest.mark.parametrize("doc", [COMPUTE_DOMAIN, DGD], ids=["ComputeDomain", "DGD"])
def test_custom_resources_pass(doc):
    assert harness.validate_custom(doc) == []


@pytest.mark.usefixtures("crds")
def test_custom_resource_typo_fails_with_path():
    dgd = json.loads(json.dumps(DGD))
    dgd["spec"]["components"][1]["multinode"] = {"nodeCont": 2}
    errors = harness.validate_custom(dgd)
    assert any("$.spec.components[1].multinode" in e and "'nodeCont'" in e for e in errors), errors


@pytest.mark.usefixtures("crds")
def test_custom_resource_bad_value_and_metadata_typo_fail():
    cd = json.loads(json.dumps(COMPUTE_DOMAIN))
    cd["spec"]["channel"]["allocationMode"] = "Some"
    cd["metadata"]["lables"] = {}
    errors = harness.validate_custom(cd)
    assert any("$.spec.channel.allocationMode" in e for e in errors), errors
    assert any("'lables' was unexpected" in e for e in errors), errors


@pytest.mark.usefixtures("crds")
def test_custom_resource_cel_rule_fails():
    """The DGD CRD's CEL rule on the executor-backend annotation (no schema type holds it)."""
    dgd = json.loads(json.dumps(DGD))
    dgd["spec"]["components"][1]["podTemplate"]["metadata"] = {
        "annotations": {"nvidia.com/vllm-distributed-executor-backend": "slurm"}}
    [error] = harness.validate_custom(dgd)
    assert "$.spec.components[1].podTemplate.metadata.annotations" in error, error
    dgd["spec"]["components"][1]["podTemplate"]["metadata"]["annotations"][
        "nvidia.com/vllm-distributed-executor-backend"] = "MP"  # lowerAscii() in ["mp", "ray"]
    assert harness.validate_custom(dgd) == []


@pytest.mark.usefixtures("crds")
def test_custom_resource_unserved_version_fails():
    [error] = harness.validate_custom({**COMPUTE_DOMAIN, "apiVersion": "resource.nvidia.com/v1"})
    assert "serves ['v1beta1']" in error


@pytest.mark.usefixtures("crds")
def test_kustomize_build_and_validate(tmp_path):
    (tmp_path / "objects.yaml").write_text(BUILTIN_DOCS + "---\n" + yaml.safe_dump(COMPUTE_DOMAIN))
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [objects.yaml]\ncommonLabels: {app.kubernetes.io/part-of: rackc}\n"
    )
    docs = list(yaml.safe_load_all(harness.kustomize_build(tmp_path)))
    assert {d["kind"] for d in docs} == {"ConfigMap", "Service", "Deployment", "ComputeDomain"}
    assert harness.validate_manifests(docs) == []


# What `kubectl get crd widgets.example.com gadgets.example.com -o yaml` writes: a List,
# with the metadata and status the API server adds.
KUBECTL_CRDS = """
apiVersion: v1
kind: List
metadata: {resourceVersion: ""}
items:
- apiVersion: apiextensions.k8s.io/v1
  kind: CustomResourceDefinition
  metadata:
    name: widgets.example.com
    creationTimestamp: "2026-11-30T10:00:00Z"
    generation: 1
    resourceVersion: "4242"
    uid: 0b6e7c1e-1f1e-4c2a-9d55-7a1b2c3d4e5f
    managedFields:
    - {apiVersion: apiextensions.k8s.io/v1, manager: kubectl, operation: Update}
  spec:
    group: example.com
    names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
    scope: Namespaced
    versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            apiVersion: {type: string}
            kind: {type: string}
            metadata: {type: object}
            spec:
              type: object
              properties:
                size: {type: integer, minimum: 1}
                replicas: {type: integer, default: 1}
              x-kubernetes-validations:
              - {rule: "self.replicas <= self.size", message: "replicas must not exceed size"}
              - {rule: "self.size == oldSelf.size", message: "size is immutable"}
  status:
    acceptedNames: {kind: Widget, plural: widgets}
    conditions:
    - {type: Established, status: "True", lastTransitionTime: "2026-11-30T10:00:00Z"}
    storedVersions: [v1]
"""


def test_crds_as_kubectl_writes_them(tmp_path, monkeypatch):
    (tmp_path / "widgets.yaml").write_text(KUBECTL_CRDS)
    monkeypatch.setenv("RACKC_CRDS", str(tmp_path))
    harness._crds.cache_clear()
    try:
        widget = {"apiVersion": "example.com/v1", "kind": "Widget",
                  "metadata": {"name": "w", "namespace": "rackc"}, "spec": {"size": 2}}
        assert harness.validate_manifests([widget]) == []
        widget["spec"] = {"size": 2, "replicas": 3}
        [error] = harness.validate_manifests([widget])
        assert "$.spec: replicas must not exceed size" in error
        widget["spec"] = {"size": 0, "colour": "red"}
        errors = harness.validate_manifests([widget])
        assert any("$.spec.size" in e and "minimum" in e for e in errors), errors
        assert any("'colour' was unexpected" in e for e in errors), errors
    finally:
        harness._crds.cache_clear()


def test_kustomize_build_failure_raises(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    with pytest.raises(harness.HarnessError, match=r"missing\.yaml"):
        harness.kustomize_build(tmp_path)


# KUBERNETES.md §6.2, the MOONCAKE_CONFIG_PATH file of vLLM's MooncakeStoreConnector.
MOONCAKE_CLIENT = {
    "mode": "embedded",
    "metadata_server": "P2PHANDSHAKE",
    "master_server_address": "mooncake-master.rackc.svc.cluster.local:50051",
    "global_segment_size": "80GB",
    "local_buffer_size": "4GB",
    "protocol": "rdma",
    "device_name": "",
    "enable_offload": False,
}


def test_mooncake_client_config_passes_vllm_loader():
    assert harness.check_mooncake_client_config(MOONCAKE_CLIENT) == []


def test_mooncake_client_config_problems():
    typo = {**MOONCAKE_CLIENT, "global_segmnet_size": "80GB"}
    assert harness.check_mooncake_client_config(typo) == [
        "vllm loader ignores key 'global_segmnet_size'"
    ]
    standalone = {**MOONCAKE_CLIENT, "mode": "standalone-store"}
    [error] = harness.check_mooncake_client_config(standalone)
    assert "standalone-store mode requires global_segment_size == 0" in error


def test_mooncake_loader_wants_local_hostname():
    errors = harness.check_mooncake_client_config(MOONCAKE_CLIENT, reader="mooncake")
    assert "Missing required config field: local_hostname" in errors[0]
    assert "mooncake loader ignores key 'mode'" in errors

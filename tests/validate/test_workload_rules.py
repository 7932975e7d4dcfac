"""The rules on what controllers, the kubelet and the kernel do with a pod's objects
(compiler/validate/workloads.py): each names its defect of bundle review 3 when it is planted
back into a compiled example, and says nothing of the example as compiled."""

import pytest
import yaml

from compiler.validate import rules, workloads

from .bundles import GB300, HGX, HGX_PP, VR, compiled, component, edit, main

DGD = "k8s/dynamo-graph.yaml"
LWS = "lws/leaderworkersets.yaml"


def fired(plan, files, rule: str) -> list[rules.Finding]:
    return rules.findings(plan, files, [rule])


def _worker(dgd: dict) -> dict:
    return component(dgd, "decode")["podTemplate"]["spec"]


@pytest.mark.parametrize("example", [VR, GB300, HGX])
def test_compiled_examples_break_none_of_them(example):
    plan, files = compiled(example)
    assert not rules.findings(plan, files, ["service-names", "capabilities-effective",
                                            "host-path-writable", "pod-security",
                                            "cpu-pods-arch"])


def test_a_service_named_like_its_leaderworkerset_hides_the_headless_one():
    """S3-01: the LWS controller finds the Service and makes no headless one."""
    plan, files = compiled(VR)
    docs = list(yaml.safe_load_all(files[LWS]))
    lws = next(d["metadata"]["name"] for d in docs if d["kind"] == "LeaderWorkerSet")
    edit(files, LWS, "Service", f"{lws}-http", lambda d: d["metadata"].update(name=lws))
    [finding] = fired(plan, files, "service-names")
    assert finding.got == lws and f"Service/{lws}" in finding.where
    edit(files, LWS, "Service", lws, lambda d: d["metadata"].update(name=f"{lws}-1"))
    [finding] = fired(plan, files, "service-names")  # a group's own headless Service name
    assert finding.got == f"{lws}-1"


def test_ipc_lock_for_a_non_root_user_is_no_capability():
    """S3-04: the Dynamo image runs as UID 1000; capabilities.add fills the bounding set only."""
    plan, files = compiled(VR)
    edit(files, DGD, "DynamoGraphDeployment", "",
         lambda d: main(_worker(d))["securityContext"].pop("runAsUser"))
    [finding] = fired(plan, files, "capabilities-effective")
    assert "IPC_LOCK" in finding.expected and "unset (the image user)" in finding.got
    assert "decode" in finding.where


def test_a_created_host_path_is_written_by_root_only():
    """S3-05: the kubelet makes the DirectoryOrCreate cache root:root 0755."""
    plan, files = compiled(HGX)
    edit(files, DGD, "DynamoGraphDeployment", "",
         lambda d: main(_worker(d))["securityContext"].update(runAsUser=1000))
    [finding] = fired(plan, files, "host-path-writable")
    assert "model-cache" in finding.expected and finding.got == "runAsUser 1000"


def test_cpu_pods_follow_the_sites_cpu_arch():
    """S3-06: the frontend forced onto the rack's arm64 while it keeps off the trays."""
    plan, files = compiled(GB300)
    edit(files, DGD, "DynamoGraphDeployment", "", lambda d: component(d, "frontend")[
        "podTemplate"]["spec"].update(nodeSelector={"kubernetes.io/arch": "arm64"}))
    [finding] = fired(plan, files, "cpu-pods-arch")
    assert finding.got == "kubernetes.io/arch arm64" and "frontend" in finding.where
    site = plan.site.model_copy(update={"cpu_arch": "arm64"})
    assert not fired(plan.model_copy(update={"site": site}), files, "cpu-pods-arch")


def test_pod_security_levels():
    plan, files = compiled(VR)
    assert plan.site.pod_security_level == "privileged"  # IPC_LOCK and the hostPath cache

    def frontend_cache(dgd: dict) -> None:
        spec = component(dgd, "frontend")["podTemplate"]["spec"]
        spec["volumes"] = [{"name": "tokenizer-cache", "hostPath": {"path": "/var/cache/x"}}]
    edit(files, DGD, "DynamoGraphDeployment", "", frontend_cache)
    [finding] = fired(plan, files, "pod-security")
    assert "without GPUs at restricted" in finding.expected
    assert finding.got.startswith("privileged: hostPath volume tokenizer-cache")

    plan, files = compiled(VR)
    edit(files, "k8s/namespace.yaml", "Namespace", "", lambda d: d["metadata"]["labels"].update(
        {workloads.ENFORCE: "baseline"}))
    found = fired(plan, files, "pod-security")
    assert found and all("decode" in f.where or "prefill" in f.where for f in found)
    assert all("enforce=baseline" in f.expected and "IPC_LOCK" in f.got for f in found)

    # Dynamo's pods need their token (Kubernetes discovery); the others do not
    plan, files = compiled(VR)
    edit(files, DGD, "DynamoGraphDeployment", "", lambda d: component(d, "frontend")[
        "podTemplate"]["spec"].update({"automountServiceAccountToken": False}))
    [finding] = fired(plan, files, "pod-security")
    assert "DYN_DISCOVERY_BACKEND" in finding.expected and "frontend" in finding.where
    assert not fired(*compiled(VR), "pod-security")


def test_level_reads_the_pod_security_standards():
    restricted = {"containers": [{"name": "c", "securityContext": {
        "allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 1000,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}],
        "volumes": [{"name": "v", "emptyDir": {}}]}
    assert workloads.level(restricted) == ("restricted", [])
    root = {"containers": [{"name": "c", "securityContext": {"runAsUser": 0}}]}
    assert workloads.level(root)[0] == "baseline"
    chown = {"containers": [{"name": "c", "securityContext": {"capabilities": {
        "add": ["CHOWN"]}}}]}
    assert workloads.level(chown)[0] == "baseline"
    locked = {"containers": [{"name": "c", "securityContext": {"capabilities": {
        "add": ["IPC_LOCK"]}}}]}
    assert workloads.level(locked) == ("privileged", ["c: capabilities.add ['IPC_LOCK']"])


def test_dynamo_workers_hand_off_by_a_connector_dynamo_has_a_protocol_for():
    """S3-02: NixlPushConnector under Dynamo 1.6.1 raises on every prefill request."""
    plan, files = compiled(HGX)
    assert not fired(plan, files, "dynamo-connector")

    def push(dgd: dict) -> None:
        args = main(_worker(dgd))["args"]
        i = args.index("--kv-transfer-config") + 1
        args[i] = args[i].replace('"NixlConnector"', '"NixlPushConnector"')
    edit(files, DGD, "DynamoGraphDeployment", "", push)
    [finding] = fired(plan, files, "dynamo-connector")
    assert "NixlPushConnector" in finding.got and "decode" in finding.where
    assert "Dynamo 1.6.1" in finding.expected


def test_dynamo_refuses_a_pipelined_prefill():
    plan, files = compiled(HGX_PP)
    assert "NixlPushConnector" in plan.site.engines["dynamo"].refused
    assert not any(p.startswith(("k8s/", "dynamo/")) for p in files)
    assert plan.site.engines["vllm"].refused is None and any(p.startswith("vllm/") for p in files)


def test_each_instance_is_its_own_workload_on_its_own_trays():
    """S3-09: two instances as two replicas of one template over the union of their trays."""
    plan, files = compiled(VR)
    assert not fired(plan, files, "per-instance-placement")
    [dgd] = list(yaml.safe_load_all(files[DGD]))
    prefill = [c for c in dgd["spec"]["components"] if c["type"] != "frontend"]
    assert len(prefill) >= 2 and all(c["replicas"] == 1 for c in prefill)
    first, second = (c["podTemplate"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        for c in prefill[:2])
    first.extend(t for t in second if t not in first)
    prefill[0]["replicas"] = 2
    dgd["spec"]["components"].remove(prefill[1])
    files[DGD] = yaml.safe_dump(dgd, sort_keys=False)
    [finding] = fired(plan, files, "per-instance-placement")
    assert finding.got.startswith("2 replicas") and prefill[0]["name"] in finding.where


def test_pods_pinned_by_node_name_are_matched_against_those_nodes_only():
    """rackc pins engine pods with `metadata.name In [node]` terms: the pre-filter takes the
    named nodes only (else every pod group tests every node of a fleet), and all nodes when a
    term pins nothing."""
    from compiler.validate.pods import Node, candidates

    nodes = [Node(f"n{i}", f"r0-t{i:02d}", {}, {}) for i in range(4)]

    def spec(*terms):
        return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                              {"nodeSelectorTerms": list(terms)}}}}

    def name_in(n):
        return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}

    assert candidates(spec(name_in("n1"), name_in("n2")), nodes) == [1, 2]
    host = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                  "values": ["n3"]}]}
    assert candidates(spec(name_in("n0"), host), nodes) == [0, 3]
    anything = {"matchExpressions": [{"key": "a", "operator": "Exists"}]}
    assert candidates(spec(name_in("n0"), anything), nodes) == [0, 1, 2, 3]


def test_kubernetes_validate_parses_each_schema_file_once():
    """kubernetes-validate reads its 2 MB definitions file for every object; validate parses
    each schema file once per process and still finds the same errors."""
    import kubernetes_validate.utils

    from compiler.validate import kube

    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
               "spec": {"ports": [{"port": 80}]}}
    kube.builtin_errors(service)
    before = kubernetes_validate.utils.schema_contents.cache_info()
    assert kube.builtin_errors(service) == []
    after = kubernetes_validate.utils.schema_contents.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 2
    [(where, message)] = kube.builtin_errors({**service, "spec": {"prots": []}})
    assert "prots" in message and where


MIXED = "mixed-gb300-vr-deepseek-v4.1-flash"


def test_prefill_decode_pairs_stay_in_their_fleet_group():
    """S3-10: a graph whose workers run on two groups, or a router whose selectors discover
    the leaders of both, pairs a prefill of one group with a decode of the other."""
    plan, files = compiled(MIXED)
    assert plan.mixed and not fired(plan, files, "pd-within-group")
    graphs = list(yaml.safe_load_all(files[DGD]))
    moved = graphs[1]["spec"]["components"].pop()
    assert moved["type"] in ("prefill", "decode")
    graphs[0]["spec"]["components"].append(moved)
    merged = {**files, DGD: yaml.safe_dump_all(graphs, sort_keys=False)}
    [finding] = fired(plan, merged, "pd-within-group")
    assert finding.where.startswith("DynamoGraphDeployment") and "gb300-a, vr-a" in finding.got

    lws = "lws/leaderworkersets.yaml"

    def fleet_wide(router: dict) -> None:
        args = main(router["spec"]["template"]["spec"])["args"]
        router["spec"]["template"]["spec"]["containers"][0]["args"] = [
            a for a in args if not a.startswith("rackc.dev/group=")]
    edit(files, lws, "Deployment", "gb300-a-router", fleet_wide)
    [finding] = fired(plan, files, "pd-within-group")
    assert "router" in finding.where and "gb300-a, vr-a" in finding.got


def test_a_selector_changed_in_place_is_compiled_again():
    from compiler.validate.pods import Node, mismatch

    node = Node("n0", "r0-t00", {"gpu": "True"}, {})
    spec = {"nodeSelector": {"gpu": True}}
    assert mismatch(spec, node) is None
    spec["nodeSelector"]["gpu"] = 1  # equal to True in Python, another label value
    assert mismatch(spec, node) == "nodeSelector gpu=1"

"""The controller-level rules: each goes red, naming the rule and the object, when its defect is
put into a compiled example's bundle, and stays green on the same bundle without it. The edits
pin pods with `matchFields metadata.name` so that a test does not depend on how the targets
select nodes today."""

import functools
import json
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from compiler import api
from compiler.plan import Env, Names, Sizes
from compiler.validate import placement, pods, rules
from compiler.validate.pods import Node

from .bundles import GB300, HGX, HGX_PP, VR, compiled, component, edit, main

DGD = "k8s/dynamo-graph.yaml"


def fired(plan, files, rule: str, folder: str = "k8s/") -> list[rules.Finding]:
    """The findings of a rule in one folder (the tests edit one bundle at a time)."""
    return [f for f in rules.findings(plan, files, [rule]) if f.file.startswith(folder)]


def pin(spec: dict, nodes: list[str]) -> None:
    """Run the pods on these nodes only, by node name (one term each: a field selector takes
    one value)."""
    spec.pop("nodeSelector", None)
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [n]}]} for n in nodes]}}}


def node_names(plan, count: int) -> list[str]:
    return [t.node_name for t in plan.hardware.trays if t.available][:count]


def prefill(dgd: dict) -> dict:
    """The prefill component, alone and one pod per replica (whatever shape the plan gave it):
    the other workers scaled to no pods."""
    comp = component(dgd, "prefill")
    for other in dgd["spec"]["components"]:
        if other["type"] != "frontend" and other is not comp:
            other["replicas"] = 0
    comp.pop("multinode", None)
    return comp


def set_gpus(spec: dict, n: int) -> None:
    main(spec).setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = str(n)


# --- dra-channel-per-node -------------------------------------------------------------------

def channel_template(files) -> str:
    [domain, *_] = yaml.safe_load_all(files["k8s/compute-domains.yaml"])
    return domain["spec"]["channel"]["resourceClaimTemplate"]["name"]


def _channel_pods(plan, files, per_node: int, shared: bool = False) -> None:
    """Prefill pods claiming the ComputeDomain channel from its template (the targets give
    single-tray pods no claim: put one back)."""
    nodes = node_names(plan, 2)
    template = channel_template(files)

    def change(dgd: dict) -> None:
        comp = prefill(dgd)
        comp["replicas"] = per_node * len(nodes)
        spec = comp["podTemplate"]["spec"]
        pin(spec, nodes)
        set_gpus(spec, 1)
        spec["resourceClaims"] = [{"name": "compute-domain-channel",
                                   "resourceClaimTemplateName": template}]
        main(spec)["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"},
                                   "limits": {"memory": "1Gi", "nvidia.com/gpu": "1"},
                                   "claims": [{"name": "compute-domain-channel"}]}
        [claim] = spec["resourceClaims"]
        if shared:  # one ResourceClaim for the pods: the DRA allocator puts them on one node
            claim["resourceClaimName"] = claim.pop("resourceClaimTemplateName")
    edit(files, DGD, "DynamoGraphDeployment", "", change)


@pytest.mark.parametrize("example", [VR, GB300])
def test_two_pods_per_node_each_claiming_a_channel_stay_pending(example):
    plan, files = compiled(example)
    _channel_pods(plan, files, per_node=1)
    assert not [f for f in fired(plan, files, "dra-channel-per-node") if "prefill" in f.where]
    _channel_pods(plan, files, per_node=2)
    [finding] = [f for f in fired(plan, files, "dra-channel-per-node") if "prefill" in f.where]
    assert finding.where.startswith("DynamoGraphDeployment/") and "(prefill-" in finding.where
    assert "4 channel claims for 2 nodes" in finding.got
    assert "2 pods would stay Pending" in finding.hint
    assert rules.diagnostic(finding).render().startswith(
        f"error[E822] {DGD}:{finding.line}:1 [dra-channel-per-node] DynamoGraphDeployment/")


def test_channel_claim_template_must_name_a_compute_domain_channel():
    """A claim from some other template takes no channel; pods sharing the ComputeDomain's own
    claim name are not counted per pod."""
    plan, files = compiled(VR)
    _channel_pods(plan, files, per_node=2)

    def other_template(dgd: dict) -> None:
        prefill(dgd)["podTemplate"]["spec"]["resourceClaims"][0][
            "resourceClaimTemplateName"] = "some-gpu-template"
    edit(files, DGD, "DynamoGraphDeployment", "", other_template)
    assert not [f for f in fired(plan, files, "dra-channel-per-node") if "prefill" in f.where]


# --- node-gpus, node-memory, node-rdma-devices, node-cpu ------------------------------------

def _sized(plan, files, change_spec) -> None:
    """Two bare prefill pods (1 GPU, 1 CPU, 1 GiB, no RDMA device, no capability) on two
    nodes, then `change_spec`."""
    nodes = node_names(plan, 2)

    def change(dgd: dict) -> None:
        comp = prefill(dgd)
        comp["replicas"] = 2
        spec = comp["podTemplate"]["spec"]
        pin(spec, nodes)
        spec.pop("resourceClaims", None)
        main(spec)["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"},
                                   "limits": {"memory": "1Gi"}}
        main(spec).pop("securityContext", None)
        set_gpus(spec, 1)
        change_spec(spec)
    edit(files, DGD, "DynamoGraphDeployment", "", change)


@pytest.mark.parametrize("example", [VR, HGX])
def test_gpus_per_node(example):
    plan, files = compiled(example)
    per_tray = plan.fleet[0].gpus_per_tray
    _sized(plan, files, lambda spec: set_gpus(spec, per_tray))
    assert not fired(plan, files, "node-gpus")
    _sized(plan, files, lambda spec: set_gpus(spec, per_tray + 1))
    [finding] = fired(plan, files, "node-gpus")
    assert "prefill" in finding.where and "(2 pods)" in finding.where
    assert f"{2 * (per_tray + 1)} asked" in finding.got and f"offer {2 * per_tray}" in finding.got


def _with_hardware(plan, **update):
    """A one-system plan whose only group's hardware has these fields changed."""
    [group] = plan.hardware.groups
    hw = group.hardware.model_copy(update=update)
    return plan.model_copy(update={"hardware": plan.hardware.model_copy(update={
        "groups": [group.model_copy(update={"hardware": hw})]})})


def test_gpus_of_unavailable_trays_and_gpus_do_not_count():
    plan, files = compiled(HGX)
    hw = plan.fleet[0]
    plan = _with_hardware(plan, unavailable_gpus=[hw.trays[0].gpus[0]])
    _sized(plan, files, lambda spec: set_gpus(spec, hw.gpus_per_tray))
    [finding] = fired(plan, files, "node-gpus")
    assert f"offer {2 * hw.gpus_per_tray - 1}" in finding.got


def test_memory_per_node():
    plan, files = compiled(VR)

    def memory(gib: int):
        return lambda spec: main(spec)["resources"].setdefault("requests", {}).update(
            memory=f"{gib}Gi")
    _sized(plan, files, memory(1000))
    assert not fired(plan, files, "node-memory")
    _sized(plan, files, memory(2000))  # a Vera tray has 1397 GiB (catalog)
    [finding] = fired(plan, files, "node-memory")
    # the offer is the allocatable: 1397 GiB less the site's node reserve (10%) per tray
    assert "4000 GiB asked" in finding.got and "offer 2514.6 GiB" in finding.got


def test_memory_is_checked_against_allocatable_not_capacity():
    """Requests within a tray's capacity but over its allocatable (capacity less the kubelet's
    reserves and the GPU nodes' DaemonSets, site.host.reserved_gib_per_tray) stay Pending."""
    plan, files = compiled(VR)
    reserve = plan.site.host_reserved_gib
    per_pod = 1397 - reserve / 2  # one pod a tray: over its allocatable, within its capacity

    def memory(spec):
        main(spec)["resources"].setdefault("requests", {}).update(memory=f"{per_pod:g}Gi")
    _sized(plan, files, memory)
    [finding] = fired(plan, files, "node-memory")
    assert f"offer {2 * (1397 - reserve):g} GiB" in finding.got


def test_rdma_devices_per_node():
    plan, files = compiled(HGX)
    per_tray = plan.fleet[0].rdma_devices_per_tray

    def rdma(n: int):
        return lambda spec: main(spec)["resources"]["limits"].update({"rdma/ib": str(n)})
    _sized(plan, files, rdma(per_tray))
    assert not fired(plan, files, "node-rdma-devices")
    _sized(plan, files, rdma(per_tray + 1))
    [finding] = fired(plan, files, "node-rdma-devices")
    assert "rdma/ib requests" in finding.expected


def test_placement_cpu_and_joint_resources():
    """CPU is checked where the plan carries cores per tray; and a placement can fail on two
    resources together although each alone fits."""
    two = [Node(f"n{i}", f"t{i}", {}, {"cpu": Fraction(8), "nvidia.com/gpu": Fraction(4)})
           for i in range(2)]
    fits = placement.Demand(0, 2, (0, 1), (("cpu", Fraction(6)),))
    assert placement.shortfalls([fits], two) == []
    [short] = placement.shortfalls([placement.Demand(0, 3, (0, 1), (("cpu", Fraction(6)),))],
                                   two)
    assert (short.family, short.asked, short.offered) == ("resource:cpu", 18, 16)
    # 2 pods of (5 CPU, 1 GPU) and 2 of (1 CPU, 3 GPU): each resource fits in sum, not per node
    a = placement.Demand(0, 2, (0, 1), (("cpu", Fraction(5)), ("nvidia.com/gpu", Fraction(1))))
    b = placement.Demand(1, 3, (0, 1), (("cpu", Fraction(1)), ("nvidia.com/gpu", Fraction(2))))
    assert placement.shortfalls([a, b], two) != []


# --- host-ports-per-node --------------------------------------------------------------------

SCRIPT = """#!/bin/sh
export VLLM_NIXL_SIDE_CHANNEL_HOST={node}
{port_env}exec vllm serve m \\
  --data-parallel-size 2 \\
  --port {port} \\
  --kv-transfer-config '{{"kv_connector":"NixlConnector","kv_role":"kv_both"}}'
"""


def _scripts(plan, files, second_port: int, second_nixl: int | None) -> None:
    for path in [p for p in files if p.startswith("vllm/")]:
        del files[path]
    tray = plan.hardware.trays[0]
    env = "export CUDA_VISIBLE_DEVICES=0,1\n"
    files[f"vllm/a-00/{tray.id}.sh"] = SCRIPT.format(node=tray.node_name, port=8000,
                                                     port_env=env)
    nixl = f"export VLLM_NIXL_SIDE_CHANNEL_PORT={second_nixl}\n" if second_nixl else ""
    files[f"vllm/b-00/{tray.id}.sh"] = SCRIPT.format(node=tray.node_name, port=second_port,
                                                     port_env=env + nixl)


def test_launch_scripts_on_one_node_bind_distinct_ports():
    plan, files = compiled(VR)
    _scripts(plan, files, 8100, 5700)
    assert not fired(plan, files, "host-ports-per-node", "vllm/")
    _scripts(plan, files, 8100, 5601)  # the first binds NIXL 5600 and 5601 (two DP ranks)
    [finding] = fired(plan, files, "host-ports-per-node", "vllm/")
    assert finding.file.startswith("vllm/b-00/") and "port 5601, also bound by vllm/a-00" \
        in finding.got
    _scripts(plan, files, 8000, None)
    [finding] = fired(plan, files, "host-ports-per-node", "vllm/")
    assert "ports 5600, 5601, 8000" in finding.got


def _declare(spec: dict, ports: list[int]) -> None:
    main(spec)["ports"] = [{"containerPort": p} for p in ports]


def test_host_network_pods_on_one_node_bind_distinct_ports():
    plan, files = compiled(HGX)
    _sized(plan, files, lambda spec: spec.update(hostNetwork=False))
    assert not fired(plan, files, "host-ports-per-node")
    # two pods that bind (and declare) the same ports, pinned to one node: one stays Pending
    node = node_names(plan, 1)
    ports = [8000, *range(5600, 5608)]
    _sized(plan, files, lambda spec: (spec.update(hostNetwork=True), pin(spec, node),
                                      _declare(spec, ports)))
    [finding] = fired(plan, files, "host-ports-per-node")
    assert "prefill" in finding.where and "bound once per node" in finding.expected


def test_host_network_ports_are_declared_so_the_scheduler_keeps_pods_apart():
    plan, files = compiled(HGX)
    ports = [8000, *range(5600, 5608)]  # the API port and NIXL's 5600 + DP index, DP8
    _sized(plan, files, lambda spec: (spec.update(hostNetwork=True), _declare(spec, ports)))
    assert not fired(plan, files, "host-ports-per-node")
    _sized(plan, files, lambda spec: (spec.update(hostNetwork=True), _declare(spec, [8000])))
    [finding] = fired(plan, files, "host-ports-per-node")
    assert "5600" in finding.expected and "two of its pods may run on" in finding.got


# --- selector-matches-node ------------------------------------------------------------------

@pytest.mark.parametrize(("selector", "why"), [
    ({"nodeSelector": {"nvidia.com/gpu.clique": "vr-a"}}, "<clusterUUID>.<cliqueId>"),
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-Rubin"}}, "GPU Feature Discovery"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["vr-a-r0-t00"]}]}]}}}},
     "need not be the node name"),
    ({"nodeSelector": {"kubernetes.io/arch": "amd64"}}, "node_labels are the labels"),
])
def test_selectors_must_match_a_node_of_the_manifest(selector, why):
    plan, files = compiled(VR)
    _sized(plan, files, lambda spec: None)
    assert not [f for f in fired(plan, files, "selector-matches-node") if "prefill" in f.where]
    _sized(plan, files, lambda spec: (spec.pop("affinity"), spec.update(selector)))
    [finding] = [f for f in fired(plan, files, "selector-matches-node") if "prefill" in f.where]
    assert finding.where.startswith("DynamoGraphDeployment/") and why in finding.hint


def test_hostname_label_is_known_where_the_site_says_it_is_the_node_name():
    plan, _ = compiled(VR)
    site = SimpleNamespace(pin_by_hostname=True, rdma=SimpleNamespace(resource="rdma/ib"),
                           host_reserved_gib=0.0)
    with_site = SimpleNamespace(hardware=plan.hardware, fleet=plan.fleet, site=site,
                                host_reserved_gib_of=lambda hw: 0.0)
    [first, *_] = pods.nodes(with_site, ("rdma/ib", "rdma/other"))
    assert first.labels["kubernetes.io/hostname"] == first.name
    assert "rdma/ib" in first.capacity and "rdma/other" not in first.capacity
    assert "kubernetes.io/hostname" not in pods.nodes(plan)[0].labels


def test_node_labels_of_the_manifest_match():
    plan, files = compiled(HGX)
    plan = _with_hardware(plan, node_labels={"example.com/pool": "serving"})
    _sized(plan, files, lambda spec: spec.update(nodeSelector={"example.com/pool": "serving"}))
    assert not fired(plan, files, "selector-matches-node")


# --- cpu-pods-off-trays ---------------------------------------------------------------------

@pytest.mark.parametrize(("path", "kind", "name"), [
    (DGD, "DynamoGraphDeployment", "frontend"), ("k8s/mooncake.yaml", "Deployment", "master"),
    ("lws/mooncake.yaml", "Deployment", "master")])
def test_cpu_pods_keep_off_the_trays(path, kind, name):
    """The frontend and the Mooncake master had only the arch selector and the GPU toleration:
    on a tray they take memory the pinned workers' requests count on."""
    plan, files = compiled(GB300)
    assert not fired(plan, files, "cpu-pods-off-trays", folder="")
    assert not fired(plan, files, "selector-matches-node", folder="")

    def drop(doc: dict) -> None:
        if kind == "Deployment":
            doc["spec"]["template"]["spec"].pop("affinity")
        else:
            component(doc, name)["podTemplate"]["spec"].pop("affinity")
    edit(files, path, kind, "" if kind != "Deployment" else name, drop)
    [finding] = fired(plan, files, "cpu-pods-off-trays", folder="")
    assert finding.file == path and "gb300-a-t00 .. gb300-a-t17 (18)" in finding.got
    assert "metadata.name NotIn" in finding.hint


def test_an_affinity_that_excludes_one_tray_only_still_admits_the_rest():
    plan, files = compiled(GB300)

    def keep_off_one(dgd: dict) -> None:
        [term] = component(dgd, "frontend")["podTemplate"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        term["matchFields"] = term["matchFields"][:1]  # NotIn gb300-a-t00 only
    edit(files, DGD, "DynamoGraphDeployment", "", keep_off_one)
    [finding] = fired(plan, files, "cpu-pods-off-trays")
    assert "gb300-a-t01 .. gb300-a-t17 (17)" in finding.got


def test_a_field_selector_takes_one_value():
    """The API server rejects `metadata.name NotIn [a, b]`: one value per field selector."""
    plan, files = compiled(GB300)

    def merge(dgd: dict) -> None:
        [term] = component(dgd, "frontend")["podTemplate"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        names = [v for e in term["matchFields"] for v in e["values"]]
        term["matchFields"] = [{"key": "metadata.name", "operator": "NotIn", "values": names}]
    edit(files, DGD, "DynamoGraphDeployment", "", merge)
    [finding] = fired(plan, files, "selector-matches-node")
    assert "frontend" in finding.where and "metadata.name NotIn" in finding.got
    assert not fired(plan, files, "cpu-pods-off-trays")  # it still says: off every tray


# --- connector-env ------------------------------------------------------------------------------

def _env(spec: dict) -> list[dict]:
    return main(spec).setdefault("env", [])


def _without(spec: dict, name: str) -> None:
    main(spec)["env"] = [e for e in _env(spec) if e["name"] != name]


def test_single_node_worker_with_multiconnector_needs_nixl_host():
    plan, files = compiled(HGX)
    host = {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    _sized(plan, files, lambda spec: (_without(spec, host["name"]), _env(spec).append(host)))
    assert not [f for f in fired(plan, files, "connector-env") if "prefill" in f.where]
    _sized(plan, files, lambda spec: _without(spec, host["name"]))
    [finding] = [f for f in fired(plan, files, "connector-env") if "prefill" in f.where]
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" in finding.expected and "MultiConnector" in finding.got
    assert ".containers[0] (prefill" in finding.where


def test_mooncake_store_needs_its_config_path_in_a_mounted_folder():
    plan, files = compiled(HGX)
    _sized(plan, files, lambda spec: _without(spec, "MOONCAKE_CONFIG_PATH"))
    assert any("no MOONCAKE_CONFIG_PATH" in f.got for f in fired(plan, files, "connector-env"))
    plan, files = compiled(HGX)
    _sized(plan, files, lambda spec: main(spec).pop("volumeMounts", None))
    assert any("under no volumeMount" in f.got for f in fired(plan, files, "connector-env"))


# --- rdma-transport -------------------------------------------------------------------------

def test_mooncake_rdma_needs_a_device_and_ipc_lock():
    plan, files = compiled(HGX)
    assert any(json.loads(t)["protocol"] == "rdma" for p, t in files.items()
               if p.startswith("mooncake/clients/"))

    def fit(spec: dict) -> None:
        main(spec)["resources"]["limits"]["rdma/ib"] = "1"
        main(spec)["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    _sized(plan, files, fit)
    assert not [f for f in fired(plan, files, "rdma-transport") if "prefill" in f.where]
    plan, files = compiled(HGX)
    _sized(plan, files, lambda spec: None)
    [finding] = [f for f in fired(plan, files, "rdma-transport") if "prefill" in f.where]
    assert finding.got == "no RDMA device request and no IPC_LOCK capability"


def test_kv_between_nvlink_domains_needs_an_rdma_transport():
    plan, files = compiled(HGX)  # prefill and decode on two nodes: two NVLink domains

    def tls(value: str):
        return lambda spec: (_without(spec, "UCX_TLS"),
                             _env(spec).append({"name": "UCX_TLS", "value": value}))
    _sized(plan, files, tls("rc,cuda_copy,cuda_ipc"))
    assert not [f for f in fired(plan, files, "rdma-transport") if "UCX_TLS" in f.got]
    _sized(plan, files, tls("cuda_copy,cuda_ipc,tcp"))
    [finding] = [f for f in fired(plan, files, "rdma-transport") if "UCX_TLS" in f.got]
    assert "prefill" in finding.where


# --- engine-capability ----------------------------------------------------------------------

def _fact(kind, value):
    return kind(value=value, source="test fact")


# one fact set for every release: Dynamo's workers are checked against the same
TEST_FACTS = dict(
    kernel_block_sizes={"FLASHINFER_MLA_SPARSE_DSV41": _fact(Sizes, [128])},
    moe_backends=_fact(Names, ["flashinfer_trtllm", "marlin"]),
    moe_batched=_fact(Names, ["marlin"]), batched_layout=_fact(Names, ["deepep_low_latency"]),
    multi_node_nvlink_env={"deepep_low_latency": _fact(
        Env, {"VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL": "1"})})


def with_facts(plan, **facts):
    """The plan with these engine facts on every target's release."""
    engines = {k: run.model_copy(update={"facts": run.facts.model_copy(update=facts)})
               for k, run in plan.site.engines.items()}
    return plan.model_copy(update={"site": plan.site.model_copy(update={"engines": engines})})


def _flags(spec: dict, **flags: str) -> None:
    args = main(spec)["args"]
    for flag, value in flags.items():
        name = "--" + flag.replace("_", "-")
        if name in args:
            args[args.index(name) + 1] = value
        else:
            args += [name, value]


def _engine(plan, files, block: str, moe: str, frontend_block: str, mnnvl: bool) -> list:
    def change(dgd: dict) -> None:
        for comp in dgd["spec"]["components"]:
            spec = comp["podTemplate"]["spec"]
            if comp["type"] == "frontend":
                _flags(spec, kv_cache_block_size=frontend_block)
                continue
            _flags(spec, block_size=block, moe_backend=moe,
                   attention_backend="FLASHINFER_MLA_SPARSE_DSV41")
            _without(spec, "VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL")
            if mnnvl:
                _env(spec).append({"name": "VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL", "value": "1"})
    edit(files, DGD, "DynamoGraphDeployment", "", change)
    k8s = {p: t for p, t in files.items() if p.startswith("k8s/")}
    return rules.engine_capability(rules.context(with_facts(plan, **TEST_FACTS), k8s))


def test_engine_capabilities():
    plan, files = compiled(VR)
    assert plan.model.experts_dtype == "fp4"
    assert _engine(plan, files, "256", "marlin", "256", mnnvl=True) == []
    found = _engine(plan, files, "64", "flashinfer_cutedsl", "128", mnnvl=False)
    assert {f.rule for f in found} == {"engine-capability"}
    text = [f.got for f in found]
    assert "--block-size 64" in text and "--moe-backend flashinfer_cutedsl" in text
    assert "VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL=None" in text  # the DEP32 decode spans trays
    assert "--kv-cache-block-size 128" in text
    decode = [f for f in found if "MNNVL" in f.got]
    assert decode and all("decode" in f.where for f in decode), decode
    # DeepEP low-latency hands the experts batched activations: Marlin has a kernel, TRT-LLM not
    found = _engine(plan, files, "256", "flashinfer_trtllm", "256", mnnvl=True)
    assert [f.expected.split(" (")[0] for f in found] == [
        "a --moe-backend with a kernel for deepep_low_latency's batched activations"]
    assert "decode" in found[0].where


def test_engine_capability_reads_the_plan_not_the_catalog():
    """validate checks the engines against the facts the plan recorded for the release each
    runs (copied from that release's fact set at compile time), never against the catalog."""
    from compiler import catalog

    plan, files = compiled(VR)
    engines = catalog.engines()
    for family, run in plan.site.engines.items():
        release = engines.release(run.vllm)
        assert run.facts.batched_layout.value == release.all2all.batched_layout.value, family
        assert run.facts.moe_backends.value == release.moe.accepts["mxfp4"].value, family
    assert plan.site.engines["dynamo"].facts.pd_connectors.value == \
        engines.dynamo.worker.kv_connector_protocols.value
    assert plan.site.engines["vllm"].facts.pd_connectors is None
    assert rules.engine_capability(rules.context(plan, files)) == []
    # a release whose sparse-MLA kernels read 512-token pages: the 256-token blocks are named
    backend = "FLASHINFER_MLA_SPARSE_DSV41"
    edited = with_facts(plan, kernel_block_sizes={backend: _fact(Sizes, [512])})
    found = rules.engine_capability(rules.context(edited, files))
    assert found and all(f.expected.endswith("[512]") and "test fact" in f.hint
                         for f in found)


KIMI = Path(__file__).resolve().parents[1] / "inputs" / "gb300-kimi-k3" / "deployment.yaml"


@functools.cache
def _kimi() -> tuple:
    result = api.compile(KIMI, only=("k8s",))
    return result.plan, result.artifacts


def _blocks(plan, worker: str, frontend: str) -> list:
    """The Kimi K3 bundle (TP8 and TP16 workers) with these blocks on the workers and the
    frontend, and its engine-capability findings under `plan`'s facts."""
    files = dict(_kimi()[1])

    def change(dgd: dict) -> None:
        for comp in dgd["spec"]["components"]:
            spec = comp["podTemplate"]["spec"]
            if comp["type"] == "frontend":
                _flags(spec, kv_cache_block_size=frontend)
            else:
                _flags(spec, block_size=worker)
    edit(files, DGD, "DynamoGraphDeployment", "", change)
    return rules.engine_capability(rules.context(plan, files))


def test_a_hybrid_models_block_that_vllm_raises_is_named():
    """Kimi K3's KDA state needs 1536-token blocks at TP8 (768 at TP16). The 64 rackc used to
    give every worker and the frontend agree with each other, so the frontend rule alone let
    them through, while vLLM ran larger blocks and KV-aware routing never matched."""
    plan = _kimi()[0]
    assert plan.site.engines["dynamo"].facts.hybrid_block is not None
    assert _blocks(plan, "1536", "1536") == []
    assert _blocks(plan, "3072", "3072") == []  # a larger block vLLM keeps at both TPs
    found = _blocks(plan, "64", "64")
    workers = [f for f in found if f.got == "--block-size 64"]
    assert {f.expected for f in workers} == {
        "--block-size 1536, the block vLLM raises it to at TP8",
        "--block-size 768, the block vLLM raises it to at TP16"}
    [frontend] = [f for f in found if "kv-cache-block-size" in f.got]
    assert frontend.expected == ("--kv-cache-block-size equal to the block the workers run "
                                 "[768, 1536]") and "frontend" in frontend.where
    assert len(found) == len(workers) + 1
    # without the release's hybrid facts (the rule as it was) the planted defect passes
    assert _blocks(with_facts(plan, hybrid_block=None), "64", "64") == []


def test_a_pipelined_prefill_and_its_peers_hand_kv_off_by_push():
    """vLLM 0.33's pull connector reads one pipeline stage: beside a PP prefill, a decode
    engine left on NixlConnector is named (its launch scripts, its pods alike)."""
    plan, files = compiled(HGX_PP)
    assert any(i.pp > 1 for i in plan.instances)
    assert rules.engine_capability(rules.context(plan, files)) == []
    decode = [p for p in files if p.startswith("vllm/decode-00/")]
    for path in decode:
        files[path] = files[path].replace('"NixlPushConnector"', '"NixlConnector"')
    found = rules.engine_capability(rules.context(plan, files))
    assert {f.file for f in found} == set(decode)
    assert all(f.got == "NixlConnector" and "NixlPushConnector" in f.expected for f in found)


# --- graph-components ------------------------------------------------------------------------

def test_a_graph_of_more_components_than_its_crd_admits_is_named():
    """26 components (the frontend and 25 copies of a worker under other names): the API server
    refuses the whole graph (spec.components maxItems 25)."""
    plan, files = compiled(HGX)
    assert fired(plan, files, "graph-components") == []

    def grow(dgd: dict) -> None:
        worker = next(c for c in dgd["spec"]["components"] if c["type"] != "frontend")
        others = [c for c in dgd["spec"]["components"] if c is not worker]
        dgd["spec"]["components"] = others + [{**worker, "name": f"{worker['name']}-{k}"}
                                              for k in range(26 - len(others))]
    edit(files, DGD, "DynamoGraphDeployment", "", grow)
    [f] = fired(plan, files, "graph-components")
    assert f.got == "26" and "at most 25" in f.expected and "maxItems" in f.expected
    assert plan.site.engines["dynamo"].facts.graph_components.value == 25


# --- the registry ---------------------------------------------------------------------------

def test_every_rule_has_a_code_and_a_check():
    assert set(rules.RULES) >= rules.ENFORCED
    assert len(set(rules.RULES.values())) == len(rules.RULES)
    assert set().union(*(breaks for _, breaks in rules.CHECKS)) == set(rules.RULES)


def test_only_the_checks_of_the_rules_asked_for_run(monkeypatch):
    """compile asks for the enforced rules only: a check of another rule is not run."""
    def boom(ctx):
        raise AssertionError("ran")
    checks = tuple((boom if fn is rules.engine_capability else fn, breaks)
                   for fn, breaks in rules.CHECKS)
    monkeypatch.setattr(rules, "CHECKS", checks)
    plan, files = compiled(HGX)
    assert rules.check(plan, files, ["node-gpus"]) == []
    with pytest.raises(AssertionError, match="ran"):
        rules.check(plan, files, ["engine-capability"])


@pytest.mark.parametrize("example", [VR, GB300, HGX])
def test_compiled_examples_break_no_enforced_rule(example):
    plan, files = compiled(example)
    assert rules.check(plan, files, rules.ENFORCED) == []


def test_dynamo_workers_are_checked_against_the_vllm_their_release_imports():
    """A --moe-backend that vLLM 0.33 loads MXFP4 experts with, but 0.31 has no such name for
    (catalog/engines/vllm-0.31.yaml), is named on the DGD's workers (Dynamo 1.6.1 runs 0.31)
    and not in the vllm/ scripts (0.33)."""
    plan, files = compiled(VR)
    assert rules.engine_capability(rules.context(plan, files)) == []
    only_033 = "flashinfer_moe_ep_cutedsl"
    for path in [p for p in files if p == DGD or p.startswith("vllm/prefill-00/")]:
        files[path] = files[path].replace("flashinfer_trtllm", only_033)
    found = rules.engine_capability(rules.context(plan, files))
    assert found and {f.file for f in found} == {DGD}
    assert all(f.got == f"--moe-backend {only_033}" and "mxfp4" in f.expected for f in found)

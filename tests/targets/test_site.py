"""What the cluster decides (`spec.site`, the plan's `site`) reaches every pod, and the bundle
defects of issue 10 section 3 stay fixed: each test names the defect it guards."""

import json
import math
from collections import Counter

import pytest

from compiler import catalog, site
from schemas.site import Site
from tests.targets import emitted
from tests.targets.fixtures import ALL_CASES, POOL_CASES, compiled_with_site

CASES = sorted(ALL_CASES)
# Dynamo refuses the pipelined P/D example (S3-02): no DGD to look at there.
DGD_CASES = [c for c in CASES if c != "hgx-h200-x4-deepseek-v3-128k-pp"]
BUNDLES = ("k8s", "lws")
GIB = 1024**3
VR = "vr-nvl72-deepseek-v4.1-flash"  # the default site but for the images of vLLM and router
# the site inputs the examples leave out; two DEP2 prefill instances a tray; TP8 decode over two
# trays
PINNED = "vr-nvl72-pinned-site"


plan_of, files = emitted.case_plan, emitted.case_files


def dgd_components(out: dict[str, str]) -> list[dict]:
    """The components of every graph (a mixed fleet has one per group)."""
    return [c for graph in emitted.documents(out, "dynamo") for c in graph["spec"]["components"]]


def workers(out: dict[str, str]) -> list[dict]:
    return [c for c in dgd_components(out) if c["type"] != "frontend"]


def pod_templates(out: dict[str, str], folder: str) -> list[dict]:
    """Every pod template of a bundle: DGD components, LWS templates, Deployments."""
    docs = emitted.documents(out, folder)
    found = []
    for doc in docs:
        if doc["kind"] == "DynamoGraphDeployment":
            found += [c["podTemplate"] for c in doc["spec"]["components"]]
        elif doc["kind"] == "LeaderWorkerSet":
            found += [t for t in doc["spec"]["leaderWorkerTemplate"].values()
                      if isinstance(t, dict)]
        elif doc["kind"] == "Deployment":
            found.append(doc["spec"]["template"])
    return found


def engine_templates(out: dict[str, str], folder: str) -> list[dict]:
    return [t for t in pod_templates(out, folder)
            if "nvidia.com/gpu" in main_of(t)["resources"].get("limits", {})]


def main_of(template: dict) -> dict:
    """The engine's `main` container, or a Deployment's only one."""
    containers = template["spec"]["containers"]
    return next((c for c in containers if c["name"] == "main"), containers[0])


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


# --- 1: Dynamo components run a Dynamo image ---------------------------------------------------

@pytest.mark.parametrize("case", DGD_CASES)
def test_defect_1_dynamo_components_run_the_dynamo_runtime(case):
    for component in dgd_components(files(case)):
        for container in component["podTemplate"]["spec"]["containers"]:
            assert container["image"] == plan_of(case).site.images.dynamo
    if plan_of(case).site.images.dynamo == Site().images.dynamo:
        assert "nvcr.io/nvidia/ai-dynamo/" in Site().images.dynamo  # NGC's vllm-runtime
    for template in pod_templates(files(case), "lws"):
        assert main_of(template)["image"] != plan_of(case).site.images.dynamo


def test_runtime_version_override_only_when_the_tag_is_not_the_dynamo_version():
    assert plan_of(VR).site.images.dynamo == Site().images.dynamo
    assert all("runtimeVersionOverride" not in c for c in dgd_components(files(VR)))
    custom = plan_of(PINNED).site.images
    assert custom.dynamo.rpartition(":")[2] != "1.6.1" == custom.runtime_version_override
    assert {c.get("runtimeVersionOverride") for c in dgd_components(files(PINNED))} == {"1.6.1"}


# --- 2: at most one pod per node claims the ComputeDomain channel ------------------------------

@pytest.mark.parametrize("case", DGD_CASES)
def test_defect_2_one_channel_claim_per_node(case):
    """The DRA driver prepares a node's channel for one claim; pods made from the channel
    template each get their own claim, so a node may host only one of them."""
    plan = plan_of(case)
    for folder, comps in (("k8s", workers(files(case))),):
        per_node = Counter()
        for c in comps:
            if not c["podTemplate"]["spec"].get("resourceClaims"):
                continue
            nodes = c.get("multinode", {}).get("nodeCount", 1)
            names = [t["matchFields"][0]["values"][0] for t in c["podTemplate"]["spec"]
                     ["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                     ["nodeSelectorTerms"]]
            # replicas x nodes pods over exactly as many nodes: one each
            assert c["replicas"] * nodes == len(names), (folder, c["name"])
            per_node.update(names)
        assert all(n == 1 for n in per_node.values()), per_node
    for c in workers(files(case)):  # a channel exactly for instances that span trays
        claims = bool(c["podTemplate"]["spec"].get("resourceClaims"))
        names = [t["matchFields"][0]["values"][0] for t in c["podTemplate"]["spec"]["affinity"][
            "nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]]
        tray = next(t for t in plan.hardware.trays if t.node_name == names[0])
        nvl72 = plan.hardware_of(tray.id).form == "nvl72"  # of its group, in a mixed fleet
        assert claims == (nvl72 and "multinode" in c), c["name"]


# --- 3: NIXL side channel host on single-node workers -------------------------------------------

@pytest.mark.parametrize("case", DGD_CASES)
def test_defect_3_single_node_workers_advertise_their_pod_ip_to_nixl(case):
    for c in workers(files(case)):
        env = env_of(main_of(c["podTemplate"]))
        if "multinode" in c:
            assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in env  # the operator injects it
        else:
            host = env["VLLM_NIXL_SIDE_CHANNEL_HOST"]
            assert host["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


# --- 5, 11, 18: RDMA devices, IPC_LOCK, UCX transports -----------------------------------------

@pytest.mark.parametrize("case", POOL_CASES)
def test_defect_5_rdma_pool_pods_get_rdma_devices_and_ipc_lock(case):
    plan = plan_of(case)
    clients = [json.loads(t) for p, t in files(case).items() if p.startswith("mooncake/clients/")]
    assert clients and {c["protocol"] for c in clients} == {"rdma"}
    for folder in BUNDLES:
        for template in engine_templates(files(case), folder):
            main, rdma = main_of(template), plan.site.rdma.resource
            assert int(main["resources"]["requests"][rdma]) >= 1
            assert main["resources"]["limits"][rdma] == main["resources"]["requests"][rdma]
            assert "IPC_LOCK" in main["securityContext"]["capabilities"]["add"]
    master = [d for d in emitted.documents(files(case), "k8s") if d["kind"] == "Deployment"]
    for d in master:  # the master registers no memory: no capability, not root
        context = d["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["runAsNonRoot"] and context["runAsUser"] != 0
    assert plan.site.rdma.transport == "rdma"


@pytest.mark.parametrize("case", CASES)
def test_defect_11_kv_transfer_uses_rdma_transports(case):
    for template in engine_templates(files(case), "k8s"):
        tls = env_of(main_of(template))["UCX_TLS"]["value"].split(",")
        assert "rc" in tls and "tcp" not in tls


def test_tcp_only_when_the_site_chooses_it(tmp_path):
    plan = compiled_with_site(PINNED, {"rdma": {"transport": "tcp"}}, tmp_path)
    out = emitted.emit_all(plan)
    for template in engine_templates(out, "k8s"):
        main = main_of(template)
        assert "rdma/ib" not in main["resources"]["requests"]
        assert "capabilities" not in main["securityContext"]  # registers nothing: no IPC_LOCK
        assert env_of(main)["UCX_TLS"]["value"].startswith("tcp,")
    assert {json.loads(t)["protocol"] for p, t in out.items()
            if p.startswith("mooncake/clients/")} == {"tcp"}


def test_hca_names_become_mooncake_devices_and_ucx_net_devices():
    rdma, out = plan_of(PINNED).site.rdma, files(PINNED)
    assert (rdma.resource, rdma.hca_names) == ("nvidia.com/cx9_rdma", ["mlx5_0", "mlx5_1"])
    assert {json.loads(t)["device_name"] for p, t in out.items()
            if p.startswith("mooncake/clients/")} == {"mlx5_0,mlx5_1"}
    main = main_of(engine_templates(out, "k8s")[0])
    assert env_of(main)["UCX_NET_DEVICES"]["value"] == "mlx5_0:1,mlx5_1:1"
    assert "nvidia.com/cx9_rdma" in main["resources"]["requests"]


# --- 8: a model cache and an engine timeout that fits a cold start ------------------------------

@pytest.mark.parametrize("case", CASES)
def test_defect_8_engines_read_the_checkpoint_from_a_cache_within_their_timeout(case):
    plan = plan_of(case)
    cache = plan.site.model_cache
    gbytes = site.checkpoint_bytes(catalog.model(plan.model.name).spec) / 1e9
    readers = (sum(len(i.trays) for i in plan.instances) if cache.kind == "pvc"
               else max(Counter(t for i in plan.instances for t in i.trays).values()))
    assert cache.engine_ready_timeout_s >= 600 + gbytes / 0.5 + readers * gbytes / 2.0
    for folder in BUNDLES:
        for template in engine_templates(files(case), folder):
            main = main_of(template)
            mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
            assert mounts["model-cache"] == cache.mount_path
            env = env_of(main)
            assert env["HF_HOME"]["value"].startswith(cache.mount_path + "/")
            assert int(env["VLLM_ENGINE_READY_TIMEOUT_S"]["value"]) == \
                cache.engine_ready_timeout_s
            [volume] = [v for v in template["spec"]["volumes"] if v["name"] == "model-cache"]
            if cache.kind == "pvc":
                assert volume["persistentVolumeClaim"]["claimName"] == cache.source
            else:
                assert volume["hostPath"] == {"path": cache.source, "type": "DirectoryOrCreate"}
    for script in emitted.scripts(files(case)):
        assert script.env["HF_HOME"] == cache.hf_home


def test_a_pvc_cache_is_shared_and_read_by_every_pod():
    plan, out = plan_of(PINNED), files(PINNED)
    assert plan.site.model_cache.kind == "pvc"
    for template in engine_templates(out, "k8s"):
        [volume] = [v for v in template["spec"]["volumes"] if v["name"] == "model-cache"]
        assert volume["persistentVolumeClaim"]["claimName"] == "models"
    pods = sum(len(i.trays) for i in plan.instances)
    assert plan.site.model_cache.engine_ready_timeout_s > pods * 100  # all read one claim


# --- 9, 21: node selection -----------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_defect_9_21_no_guessed_gfd_labels_and_pods_pinned_by_node_name(case):
    for folder in BUNDLES:
        for template in engine_templates(files(case), folder):
            spec = template["spec"]
            assert set(spec["nodeSelector"]) == {"kubernetes.io/arch"}
            terms = spec["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            for term in terms:
                [rule] = term["matchFields"]
                assert rule["key"] == "metadata.name" and len(rule["values"]) == 1


def test_hostname_label_only_when_the_site_says_hostnames_equal_node_names(tmp_path):
    plan = compiled_with_site(PINNED, {"scheduling": {"hostnames_equal_node_names": True}},
                              tmp_path)
    template = engine_templates(emitted.emit_all(plan), "k8s")[0]
    [term] = template["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["key"] == "kubernetes.io/hostname"


# --- 10: vllm/ scripts that share a host bind distinct ports ------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_defect_10_instances_on_one_host_bind_distinct_ports(case):
    plan = plan_of(case)
    bound: dict[str, Counter] = {}
    for s in emitted.scripts(files(case)):
        ports = bound.setdefault(s.tray, Counter())
        if "--headless" not in s.argv:
            ports[("api", int(s.flag("--port")))] += 1
        first = int(s.flag("--data-parallel-start-rank") or 0)
        ranks = len(s.env["CUDA_VISIBLE_DEVICES"].split(","))
        if "VLLM_NIXL_SIDE_CHANNEL_PORT" in s.env:
            nixl = int(s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"])
            ports.update(("nixl", nixl + first + k) for k in range(ranks))  # + DP index
        else:  # only a headless TP / PP node, whose workers run no scheduler, binds none
            assert "--headless" in s.argv and not s.flag("--data-parallel-size"), s.instance
        for flag in ("--data-parallel-rpc-port", "--master-port"):
            if s.flag(flag) and "--headless" not in s.argv and s.flag("--node-rank") in (
                    None, "0"):
                ports[(flag, int(s.flag(flag)))] += 1
    for tray, ports in bound.items():
        assert all(n == 1 for n in ports.values()), (tray, ports)
    if case == PINNED:  # two DEP2 instances per tray: the case it guards
        assert max(Counter(t for i in plan.instances for t in i.trays).values()) == 2


# --- 14, 17: host memory, /dev/shm, CPU ----------------------------------------------------------

@pytest.mark.parametrize("case", DGD_CASES)
def test_defect_14_shm_holds_the_nodes_shared_engram_tables(case):
    plan = plan_of(case)
    by_name = {c["name"]: c for c in workers(files(case))}
    for pod in plan.site.pods:
        instance = plan.instance(pod.instance)
        if pod.engram_host_gib and instance.dp > 1:
            assert pod.resources.shm_gib >= pod.engram_host_gib + 8
    for c in by_name.values():
        assert c["sharedMemorySize"].endswith("Gi")
    lws = emitted.of_kind(emitted.documents(files(case), "lws"), "LeaderWorkerSet")
    for doc in lws:
        for t in doc["spec"]["leaderWorkerTemplate"].values():
            if isinstance(t, dict):
                [shm] = [v for v in t["spec"]["volumes"] if v["name"] == "dshm"]
                assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
    if case == "vr-nvl72-deepseek-v4.1-flash":  # prefill keeps its tables on the host
        prefill = next(p for p in plan.site.pods if p.instance.startswith("prefill"))
        assert prefill.resources.shm_gib > 8  # the default 8 GiB would hold no table


@pytest.mark.parametrize("case", CASES)
def test_defect_17_every_container_requests_cpu_and_memory(case):
    for folder in (*BUNDLES, "mooncake"):
        for template in pod_templates(files(case), folder):
            for container in template["spec"]["containers"]:
                requests = container["resources"]["requests"]
                assert int(requests["cpu"]) > 0 and requests["memory"].endswith("Gi")
                assert container["resources"]["limits"]["memory"] == requests["memory"]


@pytest.mark.parametrize("case", CASES)
def test_engine_memory_covers_what_each_pod_pins(case):
    """Pool segments of its ranks, their staging buffers, host Engram tables and /dev/shm."""
    plan = plan_of(case)
    for pod in plan.site.pods:
        instance = plan.instance(pod.instance)
        ranks = max(sum(g in plan.tray(t).gpus for g in instance.gpus) for t in instance.trays)
        pinned = ranks * (pod.pool_bytes_per_rank + plan.site.mooncake_local_buffer_bytes) / GIB
        assert pod.resources.memory_gib >= pinned + pod.engram_host_gib
        assert pod.resources.memory_gib >= pod.resources.shm_gib
    dram = plan.kv_pool.segments
    for tray in {t for i in plan.instances for t in i.trays}:
        pods = [p for p in plan.site.pods if tray in plan.instance(p.instance).trays]
        segment = sum(s.gib for s in dram if s.location == tray and s.kind == "dram")
        registered = sum(p.pool_bytes_per_rank * sum(
            g in plan.tray(tray).gpus for g in plan.instance(p.instance).gpus)
            for p in pods) / GIB
        assert math.isclose(registered, segment, abs_tol=1e-6)


# --- 16, 18: lws serves requests; probes, tolerations -------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_defect_16_lws_leaders_have_a_service_and_probes(case):
    docs = emitted.documents(files(case), "lws")
    services = {d["metadata"]["name"]: d for d in emitted.of_kind(docs, "Service")}
    for lws in emitted.of_kind(docs, "LeaderWorkerSet"):
        name = lws["metadata"]["name"]
        assert name not in services  # the LWS controller's headless Service has that name
        assert services[f"{name}-http"]["spec"]["selector"] == {
            "leaderworkerset.sigs.k8s.io/name": name,
            "leaderworkerset.sigs.k8s.io/worker-index": "0"}
        template = lws["spec"]["leaderWorkerTemplate"]
        leader = template.get("leaderTemplate", template["workerTemplate"])
        main = main_of(leader)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert main[probe]["httpGet"]["path"] == "/health"
        startup = main["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= \
            plan_of(case).site.model_cache.engine_ready_timeout_s + 600  # S3-14's margin
        if "leaderTemplate" in template:
            assert "startupProbe" not in main_of(template["workerTemplate"])


def test_lws_fronts_pd_engines_with_vllm_router_when_given_its_image():
    assert plan_of(VR).site.images.router
    docs = emitted.documents(files(VR), "lws")
    [router] = [d for d in emitted.of_kind(docs, "Deployment") if "router" in
                d["metadata"]["name"]]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--vllm-pd-disaggregation" in args and "--service-discovery" in args
    prefill = args[args.index("--prefill-selector") + 2]
    assert prefill == "rackc.dev/serves=prefill"
    served = {t["metadata"]["labels"].get("rackc.dev/serves") for t in pod_templates(
        files(VR), "lws") if "nvidia.com/gpu" in main_of(t)[
        "resources"]["limits"]}
    assert served == {"prefill", "decode", None}  # None: headless decode workers
    assert emitted.of_kind(docs, "Role") and emitted.of_kind(docs, "RoleBinding")


@pytest.mark.parametrize("case", CASES)
def test_defect_18_gpu_pods_tolerate_the_gpu_taint(case):
    site_tolerations = [{k: v for k, v in t.model_dump().items() if v is not None}
                        for t in plan_of(case).site.tolerations]
    for folder in BUNDLES:
        for template in engine_templates(files(case), folder):
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
                template["spec"]["tolerations"]
            assert template["spec"]["tolerations"] == site_tolerations
    if case == PINNED:  # the site's own taints besides the GPU operator's
        assert {"key": "dedicated", "operator": "Equal", "value": "llm",
                "effect": "NoExecute"} in site_tolerations


def test_priority_class_reaches_every_pod():
    assert plan_of(PINNED).site.priority_class == "inference"
    for folder in (*BUNDLES, "mooncake"):
        for template in pod_templates(files(PINNED), folder):
            assert template["spec"]["priorityClassName"] == "inference"


# --- 19: secrets ---------------------------------------------------------------------------------

def test_defect_19_a_named_token_secret_is_referenced_by_key():
    assert plan_of(PINNED).site.hf_token_secret == "hf-token"
    for template in engine_templates(files(PINNED), "k8s"):
        token = env_of(main_of(template))["HF_TOKEN"]
        assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "HF_TOKEN"}


# --- 20, 21: parsers and the router's flags ------------------------------------------------------

@pytest.mark.parametrize("case", DGD_CASES)
def test_defect_20_tool_call_and_reasoning_parsers(case):
    plan = plan_of(case)
    for c in workers(files(case)):
        args = main_of(c["podTemplate"])["args"]
        assert emitted.flag_value(args, "--dyn-tool-call-parser") == plan.parsers.dynamo_tool_call
    for s in emitted.scripts(files(case)):
        assert s.flag("--tool-call-parser") == plan.parsers.vllm_tool_call
        assert "--enable-auto-tool-choice" in s.argv
    if plan.model.name == "deepseek-v4.1-flash":
        assert plan.parsers.vllm_reasoning == plan.parsers.dynamo_reasoning == "deepseek_v41"


@pytest.mark.parametrize("case", DGD_CASES)
def test_defect_21_no_deprecated_router_flag_at_its_default(case):
    frontends = [c for c in dgd_components(files(case)) if c["type"] == "frontend"]
    assert frontends
    for frontend in frontends:
        args = main_of(frontend["podTemplate"])["args"]
        assert "--router-kv-overlap-score-credit" not in args
        assert frontend["podTemplate"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]


@pytest.mark.parametrize("case", CASES)
def test_memory_requests_of_a_tray_fit_its_allocatable(case):
    """Compiled plans: the pool segment takes what the pods leave, so they fit what the
    scheduler allocates (the tray's DRAM less the site's node reserve)."""
    plan = plan_of(case)
    per_tray = Counter()
    for pod in plan.site.pods:
        for t in plan.instance(pod.instance).trays:
            per_tray[t] += pod.resources.memory_gib
    for t, gib in per_tray.items():
        dram = catalog.system(plan.hardware_of(t).system).tray.dram_gib.value
        assert gib <= dram - plan.site.host_reserved_gib, t



@pytest.mark.parametrize("case", DGD_CASES)
def test_cpu_only_pods_keep_off_every_tray(case):
    """Frontend, Mooncake master and router had only the arch selector and the GPU
    toleration, so they could land on a tray and take memory the pinned workers need."""
    trays = sorted(t.node_name for t in plan_of(case).hardware.trays)
    seen = set()
    for folder in BUNDLES:
        for template in pod_templates(files(case), folder):
            if "nvidia.com/gpu" in main_of(template)["resources"].get("limits", {}):
                continue
            [term] = template["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            # the API takes one value per field selector: one NotIn a tray, ANDed in one term
            assert term == {"matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": [t]} for t in trays]}
            seen.add(main_of(template)["name"])
    assert {"main"} | ({"master"} if plan_of(case).kv_pool.enabled else set()) <= seen

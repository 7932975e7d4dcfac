"""What the targets emit agrees with the plan and with itself: GPUs, ranks, batch limits,
memory budgets, names, placement; the same output every time; YAML that reloads unchanged."""

import json
from collections import Counter

import pytest
import yaml

from compiler.names import DNS_LABEL, MAX_LABEL
from compiler.plan import Plan, dump_plan, load_plan
from targets import TARGETS
from targets._yaml import dump_documents, dump_yaml
from tests.targets import emitted
from tests.targets.fixtures import ALL_CASES, POOL_CASES, POOL_FREE, compile_case

CASES = sorted(ALL_CASES)
BUNDLES = ("k8s", "lws")


plan_of, files = emitted.case_plan, emitted.case_files


def planned_gpus(plan: Plan) -> int:
    return sum(len(i.gpus) for i in plan.instances)


def pods_gpus(workloads: list[tuple[int, int, dict]]) -> int:
    """(replicas, pods per replica, pod template) -> GPUs requested over all pods."""
    return sum(replicas * pods * int(emitted.main_container(t)["resources"]["limits"]
                                     ["nvidia.com/gpu"])
               for replicas, pods, t in workloads)


def dgd_workers(case: str) -> list[dict]:
    """The workers of the DGDs (one per fleet group); none where Dynamo refuses the plan
    (S3-02)."""
    docs = emitted.documents(files(case), "dynamo")
    plan = plan_of(case)
    if plan.site.engines["dynamo"].refused:
        assert docs == []
        return []
    assert len(docs) == len(plan.hardware.groups)
    return [c for dgd in docs for c in dgd["spec"]["components"] if c["type"] != "frontend"]


def leader_worker_sets(case: str) -> list[dict]:
    return emitted.of_kind(emitted.documents(files(case), "lws"), "LeaderWorkerSet")


def pinned_nodes(component: dict) -> list[str]:
    """The node names a pod template may run on: one `metadata.name` field selector per term
    (the API allows one value each), never the hostname label unless the site says so."""
    terms = component["podTemplate"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    names = []
    for term in terms:
        assert "matchExpressions" not in term
        [rule] = term["matchFields"]
        assert rule["key"] == "metadata.name" and rule["operator"] == "In"
        [name] = rule["values"]
        names.append(name)
    return names


def instances_of(plan: Plan, node_names: list[str], role: str) -> list:
    trays = {t.id for t in plan.hardware.trays if t.node_name in node_names}
    return [i for i in plan.instances if i.role == role and set(i.trays) <= trays]


# --- GPUs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_every_planned_gpu_runs_exactly_one_vllm_rank(case):
    plan = plan_of(case)
    node_of = {t.node_name: t for t in plan.hardware.trays}
    used = Counter()
    for script in emitted.scripts(files(case)):
        tray = node_of[script.env["VLLM_NIXL_SIDE_CHANNEL_HOST"]]
        assert tray.id == script.tray
        used.update(tray.gpus[int(d)] for d in script.env["CUDA_VISIBLE_DEVICES"].split(","))
    assert set(used.values()) == {1}
    assert sorted(used) == sorted(g for i in plan.instances for g in i.gpus)


@pytest.mark.parametrize("case", CASES)
def test_each_instance_runs_on_its_own_gpus(case):
    plan = plan_of(case)
    for script in emitted.scripts(files(case)):
        tray = plan.tray(script.tray)
        gpus = {tray.gpus[int(d)] for d in script.env["CUDA_VISIBLE_DEVICES"].split(",")}
        assert gpus <= set(plan.instance(script.instance).gpus)


@pytest.mark.parametrize("case", CASES)
def test_gpus_requested_by_all_pods_equal_the_plan(case):
    plan = plan_of(case)
    dgd = [(c["replicas"], c.get("multinode", {}).get("nodeCount", 1), c["podTemplate"])
           for c in dgd_workers(case)]
    lws = []
    for s in leader_worker_sets(case):
        template = s["spec"]["leaderWorkerTemplate"]
        if "leaderTemplate" in template:
            lws.append((s["spec"]["replicas"], 1, template["leaderTemplate"]))
        workers = template["size"] - (1 if "leaderTemplate" in template else 0)
        lws.append((s["spec"]["replicas"], workers, template["workerTemplate"]))
    assert pods_gpus(dgd) == (0 if plan.site.engines["dynamo"].refused else planned_gpus(plan))
    assert pods_gpus(lws) == (0 if plan.lws_refused else planned_gpus(plan))


@pytest.mark.parametrize("case", CASES)
def test_parallel_sizes_times_nodes_equal_each_instance_gpus(case):
    plan = plan_of(case)
    by_instance: dict[str, list[emitted.Script]] = {}
    for script in emitted.scripts(files(case)):
        by_instance.setdefault(script.instance, []).append(script)
    for instance_id, scripts in by_instance.items():
        instance = plan.instance(instance_id)
        tp = int(scripts[0].flag("--tensor-parallel-size"))
        dp = int(scripts[0].flag("--data-parallel-size") or 1)
        pp = int(scripts[0].flag("--pipeline-parallel-size") or 1)
        local = {len(s.env["CUDA_VISIBLE_DEVICES"].split(",")) for s in scripts}
        assert tp * dp * pp == len(instance.gpus) == len(scripts) * local.pop()
        assert pp == instance.pp
        if len(scripts) > 1 and dp > 1:
            local_sizes = {int(s.flag("--data-parallel-size-local")) for s in scripts}
            assert local_sizes == {dp // len(scripts)}
        if len(scripts) > 1 and tp * pp > 1 and dp == 1:
            assert {int(s.flag("--nnodes")) for s in scripts} == {len(scripts)}
    for component in dgd_workers(case):
        argv = emitted.main_container(component["podTemplate"])["args"]
        gpus = int(emitted.main_container(component["podTemplate"])["resources"]["limits"]
                   ["nvidia.com/gpu"])
        nodes = component.get("multinode", {}).get("nodeCount", 1)
        world = int(emitted.flag_value(argv, "--tensor-parallel-size")) * int(
            emitted.flag_value(argv, "--data-parallel-size") or 1) * int(
            emitted.flag_value(argv, "--pipeline-parallel-size") or 1)
        assert world == nodes * gpus


@pytest.mark.parametrize("case", CASES)
def test_dp_ranks_of_a_multinode_instance_tile_without_gaps(case):
    plan = plan_of(case)
    for instance in plan.instances:
        scripts = [s for s in emitted.scripts(files(case)) if s.instance == instance.id]
        if instance.dp == 1 or len(scripts) == 1:
            continue
        local = instance.dp // len(scripts)
        starts = sorted(int(s.flag("--data-parallel-start-rank") or 0) for s in scripts)
        assert starts == list(range(0, instance.dp, local))
        leaders = [s for s in scripts if "--headless" not in s.argv]
        assert len(leaders) == 1 and leaders[0].flag("--data-parallel-start-rank") is None
        assert {s.flag("--data-parallel-address") for s in scripts} == {
            plan.tray(instance.trays[0]).node_name}


# --- engine configuration -----------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_batch_and_memory_flags_equal_the_plan(case):
    plan = plan_of(case)
    for script in emitted.scripts(files(case)):
        instance = plan.instance(script.instance)
        assert int(script.flag("--max-num-seqs")) == instance.max_batch
        assert int(script.flag("--max-num-batched-tokens")) == instance.max_batched_tokens
        assert float(script.flag("--gpu-memory-utilization")) == instance.gpu_memory_utilization
        assert int(script.flag("--max-model-len")) == plan.serving.max_model_len
    for component in dgd_workers(case):
        argv = emitted.main_container(component["podTemplate"])["args"]
        instances = [i for i in instances_of(plan, pinned_nodes(component), component["type"])
                     if component["name"].startswith(i.id)]  # one instance per component
        assert len(instances) == component["replicas"] == 1
        for instance in instances:
            assert int(emitted.flag_value(argv, "--max-num-seqs")) == instance.max_batch
            assert int(emitted.flag_value(argv, "--max-num-batched-tokens")) == \
                instance.max_batched_tokens


def engine_flags(argv: list[str], drop: tuple[str, ...]) -> list[str]:
    """The flags of a line without those in `drop` (with their values)."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in drop:
            skip = token not in BARE
        else:
            out.append(token)
    return out


BARE = ("--headless", "--enable-auto-tool-choice")
# Per node, and the API server's (vLLM's parsers; Dynamo's frontend serves the API itself)
PER_NODE = ("--headless", "--data-parallel-size-local", "--data-parallel-start-rank",
            "--data-parallel-address", "--data-parallel-rpc-port", "--distributed-executor-backend",
            "--nnodes", "--node-rank", "--master-addr", "--master-port", "--port",
            "--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser")
DYNAMO_ONLY = ("--model", "--disaggregation-mode", "--kv-events-config",
               "--dyn-tool-call-parser", "--dyn-reasoning-parser")


@pytest.mark.parametrize("case", CASES)
def test_vllm_dynamo_and_lws_run_the_same_engine(case):
    plan = plan_of(case)
    vllm = {s.instance: engine_flags(s.argv[3:], PER_NODE) for s in emitted.scripts(files(case))}
    for component in dgd_workers(case):
        argv = emitted.main_container(component["podTemplate"])["args"]
        for instance in instances_of(plan, pinned_nodes(component), component["type"]):
            assert engine_flags(argv, DYNAMO_ONLY) == vllm[instance.id]
    for lws in leader_worker_sets(case):
        lines = emitted.lws_lines(lws)
        engines = {tuple(engine_flags(line[3:], PER_NODE)) for line in lines.values()}
        assert len(engines) == 1
        assert list(engines.pop()) in vllm.values()


@pytest.mark.parametrize("case", CASES)
def test_pods_are_pinned_to_the_trays_of_their_instances(case):
    plan = plan_of(case)
    for component in dgd_workers(case):
        nodes = pinned_nodes(component)
        instances = instances_of(plan, nodes, component["type"])
        assert sorted(nodes) == sorted({plan.tray(t).node_name for i in instances
                                        for t in i.trays})
        selector = component["podTemplate"]["spec"]["nodeSelector"]
        # GPU Feature Discovery's labels are never guessed (only the user's labels pass)
        assert not {k for k in selector if k.startswith("nvidia.com/")} - {
            k for hw in plan.fleet for k in hw.node_labels}


@pytest.mark.parametrize("case", CASES)
def test_claims_reference_a_compute_domain_of_the_bundle(case):
    for folder in BUNDLES:
        docs = emitted.documents(files(case), folder)
        templates = {d["spec"]["channel"]["resourceClaimTemplate"]["name"]
                     for d in emitted.of_kind(docs, "ComputeDomain")}
        claimed = {c["resourceClaimTemplateName"] for d in docs for c in _claims(d)}
        assert claimed == templates
        plan = plan_of(case)
        assert bool(templates) == any(plan.system_of(i).form == "nvl72"
                                      and len(i.trays) > 1 for i in plan.instances)


def _claims(doc: dict) -> list[dict]:
    """Every pod-level resource claim anywhere in an object."""
    found = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            found.extend(c for c in node.get("resourceClaims", []) if
                         "resourceClaimTemplateName" in c)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return found


@pytest.mark.parametrize("case", CASES)
def test_secrets_only_by_reference(case):
    """Public checkpoints need no Secret: none is referenced unless the site names one."""
    for folder in BUNDLES:
        docs = emitted.documents(files(case), folder)
        assert not emitted.of_kind(docs, "Secret")
        text = "".join(t for p, t in files(case).items() if p.startswith(folder + "/"))
        secret = plan_of(case).site.hf_token_secret
        assert "secretRef" not in text
        assert ("secretKeyRef" in text) == (secret is not None)
        if secret:
            assert f"name: {secret}" in text


@pytest.mark.parametrize("case", POOL_CASES)
def test_mooncake_segments_cover_the_plans_dram_pool(case):
    plan = plan_of(case)
    ranks = Counter(t for i in plan.instances for g in i.gpus for t in i.trays
                    if g in plan.tray(t).gpus)
    dram = {s.location: s.gib for s in plan.kv_pool.segments if s.kind == "dram"}
    registered = 0
    for script in emitted.scripts(files(case)):
        client = json.loads(files(case)["mooncake/clients/" +
                                        script.env["MOONCAKE_CONFIG_PATH"].rsplit("/", 1)[1]])
        registered += client["global_segment_size"] * len(
            script.env["CUDA_VISIBLE_DEVICES"].split(","))
    assert set(ranks) == set(dram)
    assert abs(registered - sum(dram.values()) * 1024**3) < len(plan.instances) * 8


@pytest.mark.parametrize("case", POOL_CASES)
def test_every_engine_pod_finds_its_nodes_mooncake_file(case):
    for folder in BUNDLES:
        docs = emitted.documents(files(case), folder)
        [clients] = [d for d in emitted.of_kind(docs, "ConfigMap")
                     if d["metadata"]["name"].endswith("mooncake-client")]
        templates = [(c["podTemplate"], pinned_nodes(c)) for c in dgd_workers(case)]
        for lws in leader_worker_sets(case):
            for t in lws["spec"]["leaderWorkerTemplate"].values():
                if isinstance(t, dict):
                    templates.append((t, pinned_nodes({"podTemplate": t})))
        for template, nodes in templates:
            env = [e["name"] for e in emitted.main_container(template)["env"]]
            path = {e["name"]: e.get("value") for e in emitted.main_container(template)["env"]}
            # declared first and named to sort first: an operator that sorts the env keeps
            # the variable before the one that expands it (review R4-01)
            assert env.index("MOONCAKE_CLIENT_NODE") < env.index("MOONCAKE_CONFIG_PATH")
            assert sorted(env).index("MOONCAKE_CLIENT_NODE") < sorted(env).index(
                "MOONCAKE_CONFIG_PATH")
            assert path["MOONCAKE_CONFIG_PATH"] == "/etc/mooncake/$(MOONCAKE_CLIENT_NODE).json"
            assert {f"{n}.json" for n in nodes} <= set(clients["data"])


# --- determinism, names, YAML ------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_output_is_byte_identical_across_runs_and_plan_round_trips(case):
    plan, recompiled = plan_of(case), compile_case(case)
    again = load_plan(dump_plan(plan))
    for emit in TARGETS.values():
        assert emit(plan) == emit(recompiled) == emit(again)


@pytest.mark.parametrize("case", CASES)
def test_paths_start_with_their_target_folder(case):
    for name, emit in TARGETS.items():
        assert all(p.startswith(name + "/") for p in emit(plan_of(case)))


def object_names(doc: dict) -> list[str]:
    names = [doc["metadata"]["name"]]
    if doc["kind"] == "DynamoGraphDeployment":
        names += [c["name"] for c in doc["spec"]["components"]]
    if doc["kind"] == "ComputeDomain":
        names.append(doc["spec"]["channel"]["resourceClaimTemplate"]["name"])
    return names


@pytest.mark.parametrize("case", CASES)
def test_names_are_dns_labels(case):
    for folder in (*BUNDLES, "dynamo", "mooncake"):
        for doc in emitted.documents(files(case), folder):
            for name in object_names(doc):
                assert DNS_LABEL.match(name) and len(name) <= MAX_LABEL, name


@pytest.mark.parametrize("case", CASES)
def test_yaml_and_json_reload_unchanged(case):
    for path, text in files(case).items():
        assert text.endswith("\n") and "\r" not in text, path
        if path.endswith(".json"):
            assert json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n" == text
        elif path.endswith(".yaml"):
            docs = list(yaml.safe_load_all(text))
            if len(docs) > 1 or ("kind" in docs[0] and "metadata" in docs[0]):
                assert dump_documents(docs) == text, path
            else:
                assert dump_yaml(docs[0]) == text, path
            assert "&" not in text and "*id" not in text, path


@pytest.mark.parametrize("case", sorted(POOL_FREE))
def test_a_case_without_the_pool_emits_none_of_it(case):
    """The cases the Mooncake tests leave out really have no pool: no segment, no client, no
    master, no store connector."""
    plan = plan_of(case)
    assert not plan.kv_pool.enabled and not plan.kv_pool.segments
    assert not [p for p in files(case) if p.startswith("mooncake/")]
    assert all("MooncakeStoreConnector" not in i.kv_connectors for i in plan.instances)
    assert all("mooncake" not in text for p, text in files(case).items()
               if p.startswith(("k8s/", "lws/")))

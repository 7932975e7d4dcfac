"""netpol: every flow the lws/ bundle needs is admitted by the NetworkPolicies, and flows the plan
does not route are not. The pods, their labels and ports are read back from the emitted lws/ and
Mooncake objects; the policies are evaluated as the NetworkPolicy API defines them (a pod no
policy selects admits everything; otherwise some selecting policy's rule must admit the source
and the port)."""

from collections.abc import Mapping

import pytest

from compiler import ports
from compiler.plan import Plan
from compiler.targets_registry import emitted
from compiler.validate import kube
from targets import lws, mooncake, netpol
from tests.targets.emitted import case_plan, documents, flag_value, main_container, of_kind

NIXL_SIDE_CHANNEL = 5600  # vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default (vllm/envs.py)
EPHEMERAL = 41234  # a port the kernel may hand NCCL, Gloo or UCX
CLIENT = None  # a source outside the namespace's pods


def _matches(selector: Mapping, labels: Mapping | None) -> bool:
    if labels is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        have, op = e["key"] in labels, e["operator"]
        if (op == "Exists" and not have) or (op == "DoesNotExist" and have) or \
                (op == "In" and labels.get(e["key"]) not in e["values"]) or \
                (op == "NotIn" and labels.get(e["key"]) in e["values"]):
            return False
    return True


def admitted(policies: list[dict], src: Mapping | None, dst: Mapping, port: int) -> bool:
    selecting = [p for p in policies if _matches(p["spec"]["podSelector"], dst)]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get("ingress") or []:
            peers = rule.get("from")
            allowed = rule.get("ports")
            if peers and not any(_matches(x["podSelector"], src) for x in peers):
                continue
            if allowed and not any(r["port"] <= port <= r.get("endPort", r["port"])
                                   for r in allowed):
                continue
            return True
    return False


def _pods(files: Mapping[str, str]) -> dict[str, list[dict]]:
    """Role -> the labels of its pods (engines: leaders and workers with the LWS labels)."""
    out: dict[str, list[dict]] = {"leader": [], "worker": [], "router": [], "master": []}
    for obj in of_kind(documents(files, "lws"), "LeaderWorkerSet"):
        template = obj["spec"]["leaderWorkerTemplate"]
        size = template["size"]
        lead = template.get("leaderTemplate") or template["workerTemplate"]
        own = {lws.LWS_NAME_LABEL: obj["metadata"]["name"]}
        leader = {**lead["metadata"]["labels"], **own, lws.LWS_INDEX_LABEL: "0",
                  "_args": main_container(lead)["args"]}
        out["leader"].append(leader)
        if size > 1:
            out["worker"].append({**template["workerTemplate"]["metadata"]["labels"], **own,
                                  lws.LWS_INDEX_LABEL: "1", "_leader": leader})
    for obj in of_kind([*documents(files, "lws"), *documents(files, "mooncake")], "Deployment"):
        role = "router" if obj["metadata"]["labels"].get(
            "app.kubernetes.io/component") == "router" else "master"
        out[role].append(obj["spec"]["template"]["metadata"]["labels"])
    return out


def _role(pod: Mapping) -> str | None:
    return pod.get("app.kubernetes.io/component", "")


def _files(plan: Plan) -> dict[str, str]:
    return {**lws.emit(plan), **mooncake.emit(plan), **netpol.emit(plan)}


def _tcp(plan: Plan) -> Plan:
    rdma = plan.site.rdma.model_copy(update={"transport": "tcp"})
    return plan.model_copy(update={"site": plan.site.model_copy(update={"rdma": rdma})})


# DEP decode over trays (DP RPC); every site input, two prefill instances a tray, TP8 decode
# over two trays (torch distributed); one node each; a pipelined prefill without the pool
CASES = ["vr-nvl72-deepseek-v4.1-flash", "vr-nvl72-pinned-site", "hgx-h200-deepseek-v3",
         "hgx-h200-x4-deepseek-v3-128k-pp"]


@pytest.fixture(scope="module", params=[*CASES, "tcp:hgx-h200-deepseek-v3"])
def bundle(request):
    name = request.param
    plan = case_plan(name.removeprefix("tcp:"))
    plan = _tcp(plan) if name.startswith("tcp:") else plan
    files = _files(plan)
    return plan, files, documents(files, "netpol"), _pods(files)


def test_netpol_is_optional_and_strictly_valid(bundle):
    plan, files, policies, _ = bundle
    assert not emitted("netpol", None) and emitted("netpol", ("netpol",))
    assert policies and all(p["kind"] == "NetworkPolicy" for p in policies)
    for p in policies:
        assert kube.builtin_errors(p) == [], p["metadata"]["name"]
        assert p["metadata"]["namespace"] == plan.serving.namespace
    assert "netpol/kustomization.yaml" in files


def test_every_routed_flow_is_admitted(bundle):
    plan, files, policies, pods = bundle
    entry = pods["router"] or [p for p in pods["leader"] if lws.API_ROLE_LABEL in p]
    api_port = ports.ENGINE_API
    for pod in entry:  # clients reach the router, else the leaders
        port = ports.ROUTER_HTTP if pods["router"] else api_port
        assert admitted(policies, CLIENT, pod, port)
    for router in pods["router"]:
        for leader in pods["leader"]:
            assert admitted(policies, router, leader, api_port)
    for worker in pods["worker"]:  # torch distributed, DP RPC and NCCL within an instance
        leader = worker["_leader"]
        bound = [int(p) for p in (flag_value(leader["_args"], "--master-port"),
                                  flag_value(leader["_args"], "--data-parallel-rpc-port")) if p]
        for port in [*bound, EPHEMERAL]:
            assert admitted(policies, worker, leader, port)
            assert admitted(policies, leader, worker, port)
    engines = pods["leader"] + pods["worker"]
    prefill = [p for p in engines if "prefill" in _role(p)]
    decode = [p for p in engines if "decode" in _role(p)]
    ranks = max((i.dp for i in plan.instances if i.role == "prefill"), default=1)
    for d in decode:  # decode pulls KV: NIXL's side channel on every prefill rank's port
        for p in prefill:
            for port in (NIXL_SIDE_CHANNEL, NIXL_SIDE_CHANNEL + ranks - 1):
                assert admitted(policies, d, p, port)
            if plan.site.rdma.transport == "tcp":
                assert admitted(policies, d, p, EPHEMERAL)
                assert admitted(policies, p, d, EPHEMERAL)
    for master in pods["master"]:
        for e in engines:
            assert admitted(policies, e, master, _master_port(files))


def _master_port(files: Mapping[str, str]) -> int:
    [svc] = [s for s in of_kind(documents(files, "mooncake"), "Service")]
    return next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "rpc")


def test_unrouted_flows_are_denied(bundle):
    plan, files, policies, pods = bundle
    engines = pods["leader"] + pods["worker"]
    for worker in pods["worker"]:  # headless ranks serve no API
        assert not admitted(policies, CLIENT, worker, ports.ENGINE_API)
        assert not admitted(policies, CLIENT, worker, EPHEMERAL)
    for leader in pods["leader"]:
        assert not admitted(policies, CLIENT, leader, EPHEMERAL)
        if pods["router"]:  # with a router, clients go through it
            assert not admitted(policies, CLIENT, leader, ports.ENGINE_API)
    for master in pods["master"]:
        port = _master_port(files)
        assert not admitted(policies, CLIENT, master, port)
        for router in pods["router"]:
            assert not admitted(policies, router, master, port)
        assert not admitted(policies, engines[0], master, port + 1)
    for router in pods["router"]:
        assert not admitted(policies, engines[0], router, EPHEMERAL)
    if not pods["master"] and plan.site.rdma.transport == "rdma":  # no pool: no engine mesh
        prefill = [p for p in engines if "prefill" in _role(p)]
        decode = [p for p in engines if "decode" in _role(p)]
        for p in prefill:
            for d in decode:  # prefill never dials decode, nor decode other ports
                assert not admitted(policies, p, d, NIXL_SIDE_CHANNEL)
                assert not admitted(policies, d, p, EPHEMERAL)

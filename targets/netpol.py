"""netpol (optional: `rackc compile --targets ...,netpol`): NetworkPolicies for the `lws/`
bundle that admit only the traffic the plan routes, in `netpol/` (`kubectl apply -k
OUT/netpol` beside `-k OUT/lws`).

Ingress is denied to every pod of the deployment (its `app.kubernetes.io/name`), then each flow
is admitted at the ports the lws/ and mooncake targets bind (their constants, no second copy):
  * clients -> the router (compiler.ports ROUTER_HTTP), or without a router -> the leaders'
    API (ENGINE_API);
  * the router -> the leaders' API (its discovery reads pods from the API server: egress only);
  * within one instance (its LeaderWorkerSet): every port. The leader's torch distributed
    store (MASTER_PORT) and DP RPC (DP_RPC_PORT) are fixed, but NCCL's and Gloo's bootstrap
    and socket transports connect on ports the kernel picks;
  * decode -> prefill: NIXL's side channel, NIXL_SIDE_CHANNEL + each DP rank (vLLM
    VLLM_NIXL_SIDE_CHANNEL_PORT's default and its per-rank offset); with `site.rdma.transport:
    tcp` UCX also moves the KV over TCP on ports it picks, so every port both ways;
  * engines -> the Mooncake master (MOONCAKE_RPC), and engine <-> engine on every port: the
    store's P2P handshake and its transfer engine listen on ports Mooncake picks.
Egress is left open (the engines pull weights and the router watches pods). The metrics port
of the master is not admitted: nothing in the plan scrapes it.

Not covered: RDMA (NIXL over UCX `rc`, NCCL over InfiniBand, Mooncake's RDMA protocol) goes
through the NIC's verbs, not the pod network, so no NetworkPolicy sees it; no rackc pod uses
hostNetwork (which most CNIs exempt from NetworkPolicy). The k8s/ (Dynamo) bundle is not
covered: its request plane and system ports are the operator's and the Dynamo runtime's, not
the plan's, so a default deny there would cut the frontend off its workers.
"""

from kubernetes.client import (
    V1LabelSelector,
    V1LabelSelectorRequirement,
    V1NetworkPolicy,
    V1NetworkPolicyIngressRule,
    V1NetworkPolicyPeer,
    V1NetworkPolicyPort,
    V1NetworkPolicySpec,
)

from compiler import ports
from compiler.names import dns_label
from compiler.plan import Plan
from targets import _kube, _mooncake
from targets._components import Component, components
from targets._yaml import dump_documents, dump_yaml
from targets.lws import API_ROLE_LABEL, LWS_NAME_LABEL, lws_name, router_objects


def _app(plan: Plan, **extra: str) -> V1LabelSelector:
    return V1LabelSelector(match_labels={"app.kubernetes.io/name": _kube.app_name(plan),
                                         **extra})


def _engines(plan: Plan) -> V1LabelSelector:
    """Every engine pod: the deployment's pods of an instance's LeaderWorkerSet."""
    return V1LabelSelector(
        match_labels={"app.kubernetes.io/name": _kube.app_name(plan)},
        match_expressions=[V1LabelSelectorRequirement(key=LWS_NAME_LABEL, operator="Exists")])


def _of(plan: Plan, comps: list[Component]) -> V1LabelSelector:
    return V1LabelSelector(
        match_labels={"app.kubernetes.io/name": _kube.app_name(plan)},
        match_expressions=[V1LabelSelectorRequirement(
            key=LWS_NAME_LABEL, operator="In", values=sorted(lws_name(plan, c) for c in comps))])


def _tcp(port: int, end: int | None = None) -> V1NetworkPolicyPort:
    return V1NetworkPolicyPort(protocol="TCP", port=port, end_port=end if end != port else None)


def _policy(plan: Plan, name: str, pods: V1LabelSelector,
            rules: list[V1NetworkPolicyIngressRule]) -> dict:
    return _kube.to_dict(V1NetworkPolicy(
        api_version="networking.k8s.io/v1", kind="NetworkPolicy",
        metadata=_kube.metadata(plan, dns_label(plan.serving.name, name), "netpol"),
        spec=V1NetworkPolicySpec(pod_selector=pods, policy_types=["Ingress"],
                                 ingress=rules or None)))


def _rule(peers: list[V1LabelSelector] | None,
          ports: list[V1NetworkPolicyPort] | None) -> V1NetworkPolicyIngressRule:
    """From the pods `peers` select (None: from anywhere), at `ports` (None: every port)."""
    # the model takes `from` as `_from` (its stubs say var_from, which it ignores silently)
    return V1NetworkPolicyIngressRule(  # type: ignore[call-arg]
        _from=[V1NetworkPolicyPeer(pod_selector=p) for p in peers] if peers else None,
        ports=ports)


def _entry(plan: Plan, comps: tuple[Component, ...]) -> list[dict]:
    """Clients reach the router, the router the leaders; without a router, the leaders."""
    leaders = V1LabelSelector(
        match_labels={"app.kubernetes.io/name": _kube.app_name(plan)},
        match_expressions=[V1LabelSelectorRequirement(key=API_ROLE_LABEL, operator="Exists")])
    if not router_objects(plan, comps):
        return [_policy(plan, "api-ingress", leaders, [_rule(None, [_tcp(ports.ENGINE_API)])])]
    router = _app(plan, **{"app.kubernetes.io/component": "router"})
    return [_policy(plan, "router-ingress", router, [_rule(None, [_tcp(ports.ROUTER_HTTP)])]),
            _policy(plan, "api-from-router", leaders, [_rule([router], [_tcp(ports.ENGINE_API)])])]


def _ranks(plan: Plan, comps: tuple[Component, ...]) -> list[dict]:
    """The pods of one multi-node instance reach each other on every port."""
    out = []
    for c in comps:
        if c.nodes_per_instance > 1:
            own = _of(plan, [c])
            out.append(_policy(plan, f"{c.name}-ranks", own, [_rule([own], None)]))
    return out


def _kv_transfer(plan: Plan, comps: tuple[Component, ...]) -> list[dict]:
    prefill = [c for c in comps if c.role == "prefill"]
    decode = [c for c in comps if c.role == "decode"]
    if not (prefill and decode):
        return []
    p, d = _of(plan, prefill), _of(plan, decode)
    if plan.site.rdma.transport == "tcp":  # UCX's TCP transport: ports it picks, both ways
        return [_policy(plan, "kv-to-prefill", p, [_rule([d], None)]),
                _policy(plan, "kv-to-decode", d, [_rule([p], None)])]
    ranks = max(i.dp for c in prefill for i in c.instances)
    first = ports.NIXL_SIDE_CHANNEL
    return [_policy(plan, "kv-to-prefill", p, [_rule([d], [_tcp(first, first + ranks - 1)])])]


def _pool(plan: Plan) -> list[dict]:
    if not _mooncake.pool_enabled(plan):
        return []
    master = _app(plan, **{"app.kubernetes.io/component": "mooncake-master"})
    engines = _engines(plan)
    return [_policy(plan, "mooncake-master", master,
                    [_rule([engines], [_tcp(ports.MOONCAKE_RPC)])]),
            _policy(plan, "mooncake-peers", engines, [_rule([engines], None)])]


def policies(plan: Plan) -> list[dict]:
    comps = components(plan)
    deny = _policy(plan, "default-deny", _app(plan), [])
    return [deny, *_entry(plan, comps), *_ranks(plan, comps), *_kv_transfer(plan, comps),
            *_pool(plan)]


def emit(plan: Plan) -> dict[str, str]:
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": ["network-policies.yaml"]}
    return {"netpol/kustomization.yaml": dump_yaml(kustomization),
            "netpol/network-policies.yaml": dump_documents(policies(plan))}

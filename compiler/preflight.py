"""What a bundle needs from the site before it serves, that no input says and no object can
hold: the images the cluster must provide and what they must contain.

Read off the plan and the engine catalog (pure), once the plan is whole, and recorded in it
(`Plan.notices`): `rackc compile` prints each as a warning and the report lists them under
"Before you deploy", both from the plan. None of them stops a compile: the bundle is right,
the site has to supply its part.
"""

import re

from compiler.catalog.engine import Engines
from compiler.ids import gpu_of_domain
from compiler.names import graph_name
from compiler.plan import Notice, Plan


def _notice(path: str, target: str, problem: str, hint: str) -> Notice:
    return Notice(path=path, target=target, problem=problem, hint=hint)


def with_notices(plan: Plan, engines: Engines) -> Plan:
    """The plan with what its site must supply; `engines`: the fact set it was compiled with
    (compiler.resolve)."""
    return plan.model_copy(update={"notices": notices(plan, engines)})


def notices(plan: Plan, engines: Engines) -> list[Notice]:
    images, out = plan.site.images, []
    dynamo = plan.site.engines["dynamo"]
    worker = engines.dynamo.worker
    if dynamo.refused:
        out.append(_notice(
            "serving", "k8s",
            f"not emitted (nor dynamo/): {dynamo.refused}",
            f"serve this plan from lws/ or vllm/ (vLLM {plan.serving.vllm_version} runs it), "
            f"or compile one that Dynamo's vLLM {dynamo.vllm} can run (for the push "
            "connector: a prefill without pipeline stages)"))
    elif dynamo.vllm != plan.serving.vllm_version:
        out.append(_notice(
            "site.images.dynamo", "k8s",
            f"the workers run vLLM {dynamo.vllm}, the release Dynamo {dynamo.dynamo} imports "
            f"({worker.vllm.source.split(';')[0]}); the plan's kernels are chosen for vLLM "
            f"{plan.serving.vllm_version} and the workers run "
            + (f"{dynamo.vllm}'s own pick on {len(dynamo.kernels)} instance(s) "
               "(site.engines.dynamo.kernels), the plan's elsewhere" if dynamo.kernels else
               f"them all ({dynamo.vllm}'s fact set has each)")
            + f"; the DGD's flags parse with {dynamo.vllm}'s parser (tests/conformance)",
            f"keep {images.dynamo} or another image with vLLM {dynamo.vllm}: one rebuilt with "
            f"vLLM {plan.serving.vllm_version} cannot import dynamo.vllm (it imports "
            "get_engine_zmq_addresses, which vLLM 0.33 renamed)"))
    if plan.lws_refused:
        out.append(_notice(
            "site.images.router", "lws",
            f"not emitted: {plan.lws_refused}",
            ("set site.images.router to an image with vllm-router (PyPI vllm-router, built "
             "from vllm-project/router: no image is published)" if images.router is None else
             "serve vllm/ behind a proxy that hands decode the prefill's kv_transfer_params "
             "whole, or compile a layout whose prefill has no pipeline stages") + (
                "" if dynamo.refused else ", or serve through k8s/ (Dynamo's frontend routes "
                "P/D)")))
    if plan.kv_pool.enabled:
        wheel = engines.mooncake.wheel
        out.append(_notice(
            "site.images.vllm", "k8s",
            f"the Mooncake master runs `mooncake_master` from {images.vllm}, and every engine "
            "image imports the `mooncake` package for the store connector",
            f"check that the images have them (`which mooncake_master`), built for the image's "
            f"CUDA: {wheel.cuda13.value} on CUDA 13 (Dynamo {dynamo.dynamo}'s runtime pins "
            f"nixl[cu13]), {wheel.cuda12.value} on CUDA 12 (its store.so needs "
            "libcudart.so.12)"))
    return (out + _reserve_notices(plan) + _pool_notices(plan) + _grove_notices(plan)
            + _cluster_notices(plan))


def _pool_notices(plan: Plan) -> list[Notice]:
    """Dynamo registers every decode worker as one `backend` and every prefill worker as
    `prefill` (dynamo 1.6.1 dynamo/vllm/args.py l.257-262), and its KV router picks among them
    by KV overlap and active blocks (dynamo/router): a role of several shapes is one routing
    pool, not the solver's per-shape shares (fresh bundle review, W1)."""
    if plan.site.engines["dynamo"].refused:
        return []
    out = []
    for role in ("prefill", "decode", "aggregated"):
        shapes = sorted({i.shape for i in plan.instances if i.role == role})
        if len(shapes) > 1:
            out.append(_notice(
                "objective.shapes", "k8s",
                f"the {role} instances ({', '.join(shapes)}) are one Dynamo routing pool: its "
                "router spreads requests by KV overlap and load per worker, while the "
                "prediction gives each instance the share it sustains at the SLO",
                f"expect the {role} shapes' load to differ from the plan's split; pin one "
                f"{role} shape in objective.shapes where that matters"))
    return out


def _reserve_notices(plan: Plan) -> list[Notice]:
    """vLLM builds its NCCL communicators (every DP/EP group, MNNVL's too) before its memory
    check, which refuses to start when free memory is below utilization x HBM
    (v1/worker/gpu_worker.py, v1/worker/utils.py request_memory). The reserve's NCCL share is
    AIConfigurator's per-GPU figure, not a measurement of groups spanning nodes (bundle review
    3, S3-11)."""
    spanning = [i for i in plan.instances if len(i.rank_groups) > 1]
    # a mixed fleet names it per group (groups.<group>.memory.reserved_gib, compiler.fleet);
    # every group's comes from the one deployment
    source = next((d.source for d in plan.decisions
                   if re.fullmatch(r"(groups\.[^.]+\.)?memory\.reserved_gib", d.path)), "")
    if not spanning or source == "user":
        return []
    widest = max(spanning, key=lambda i: len(i.gpus))
    reserved = sum(m.reserved_gib for name, m in plan.memory.items()
                   if gpu_of_domain(name) == widest.gpus[0])
    return [_notice(
        "serving.gpu_reserve_gib", "vllm",
        f"{len(spanning)} instance(s) span nodes ({widest.id}: {len(widest.gpus)} ranks): "
        f"their NCCL communicators come out of the {reserved:.2f} GiB per GPU left outside "
        f"--gpu-memory-utilization {widest.gpu_memory_utilization:.2f}, sized from a per-GPU "
        "NCCL figure that was not measured on groups of that size",
        "if an engine stops at start-up with 'Free memory on device ... is less than desired "
        "GPU memory utilization', set serving.gpu_reserve_gib to what it lacked (Dynamo's "
        "DeepSeek-V4 GB200 recipe serves at 0.9)")]


# Grove and the Dynamo webhook cap PodCliqueSet + scaling group + PodClique names at 45
# characters (ai-dynamo/dynamo PR #5449, validateComponentNameLength); operators since
# PCSNameForDGD shorten the PodCliqueSet name with a hash, earlier ones reject the graph
GROVE_NAME_BUDGET = 45


def _grove_notices(plan: Plan) -> list[Notice]:
    """A multinode DGD component becomes a Grove PodCliqueSet `<graph>`, scaling group
    `<component>` and leader clique `<component>-ldr` (fresh review R4-02)."""
    if plan.site.engines["dynamo"].refused:
        return []
    over = []
    for i in plan.instances:
        if len(i.rank_groups) > 1:
            graph = graph_name(plan.serving.name, plan.route_of(i))
            total = len(graph) + len(i.workload) + len(i.workload) + len("-ldr")
            if total > GROVE_NAME_BUDGET:
                over.append(f"{graph} + {i.workload}: {total}")
    if not over:
        return []
    return [_notice(
        "metadata.name", "k8s",
        f"multinode components whose graph, component and leader-clique names add up to more "
        f"than {GROVE_NAME_BUDGET} characters ({'; '.join(over[:3])}"
        f"{'; ...' if len(over) > 3 else ''}): a Dynamo operator that does not shorten the "
        "PodCliqueSet name rejects the graph",
        "check that your operator shortens PodCliqueSet names (PCSNameForDGD), or give the "
        "deployment a shorter metadata.name")]


def _cpu_pod_notices(plan: Plan) -> list[Notice]:
    """The pods without GPUs keep off every node of the rack manifest (their memory is the
    engine pods'), so each Kubernetes bundle needs a node the manifest does not list (fresh
    review 5, R5-03)."""
    site, out = plan.site, []
    master = [("the Mooncake master", site.mooncake_master)] if plan.kv_pool.enabled else []
    each = f"{len(plan.routes)} x " if plan.routes else ""  # one per router (Plan.routes)
    for target, emitted, front in (
            ("k8s", not site.engines["dynamo"].refused, f"{each}Dynamo's frontend"),
            ("lws", not plan.lws_refused, f"{each}vllm-router" if plan.disaggregated else None)):
        pods = ([(front, site.frontend)] if front else []) + master
        if not emitted or not pods:
            continue
        out.append(_notice(
            "site.scheduling", target,
            "its pods without GPUs ("
            + ", ".join(f"{name}: {r.cpu} CPU, {r.memory_gib:g} GiB" for name, r in pods)
            + f") keep off the {len(plan.hardware.trays)} nodes of the rack manifest, whose "
            "memory the engine pods take: they need a schedulable node outside it"
            + (f" ({site.cpu_arch})" if site.cpu_arch else ""),
            "give the cluster a CPU node besides the GPU nodes the manifest lists; until then "
            "these pods stay Pending and nothing is served"))
    return out


def _mooncake_notices(plan: Plan) -> list[Notice]:
    """What the Mooncake pool leaves to the site: its one master, its HCAs, its clients'
    names outside Kubernetes."""
    site, out = plan.site, []
    out.append(_notice(
        "site", "k8s",
        "one Mooncake master (Recreate) holds the metadata of the whole pool "
        f"({plan.kv_pool.total_gib:g} GiB): a restart forgets every segment and object "
        "until the clients remount, and each Dynamo graph's frontend runs one replica",
        "keep both off nodes that are drained while serving; the pool refills from "
        "prefill"))
    if site.rdma.transport == "rdma" and not site.rdma.hca_names:
        out.append(_notice(
            "site.rdma.hca_names", "k8s",
            "Mooncake clients discover their HCAs (device_name \"\"): on multi-rail trays "
            "they may pick ones without a route to the peers",
            "list the HCAs every engine pod sees in site.rdma.hca_names"))
    out.append(_notice(
        "site.images.vllm", "vllm",
        "the launch scripts' Mooncake client files name the master by its Kubernetes "
        "Service, and read /etc/mooncake/<node>.json and the model cache at "
        f"{site.model_cache.mount_path}",
        "run vllm/ on nodes with cluster DNS and the k8s/ master applied, with "
        "mooncake/clients/ copied to /etc/mooncake and the cache mounted there"))
    return out


def _cluster_notices(plan: Plan) -> list[Notice]:
    """What the cluster must give the pods, and the risks the bundle leaves to the site."""
    site, out = plan.site, []
    why = "; ".join(f"{kind}: {sec.why}" for kind, sec in site.security.items()
                    if sec.level != "restricted")
    tokens = ", ".join(kind for kind, sec in site.security.items() if sec.service_account_token)
    out.append(_notice(
        "site.security", "k8s",
        f"the namespace enforces Pod Security {site.pod_security_level}"
        + (f" for the engine pods ({why})" if why else "") + "; every pod without GPUs meets "
        "restricted, and only pods that call the API server mount a service-account token ("
        + (tokens or "none") + ")",
        "label the namespace yourself only if your policy allows that level; nothing else "
        "runs privileged"))
    out += _cpu_pod_notices(plan)
    if site.model_cache.kind == "pvc":
        out.append(_notice(
            "site.model_cache.pvc", "k8s",
            f"the engines write the Hugging Face cache into PVC {site.model_cache.source}",
            "make it ReadWriteMany and writable by UID 1000 GID 0 (Dynamo's runtime user) "
            "and by root (the vLLM image)"))
    if plan.kv_pool.enabled:
        out += _mooncake_notices(plan)
    if len({t for i in plan.instances for t in i.trays}) > 1:
        out.append(_notice(
            "rack.node_names", "vllm",
            "the launch scripts address peers by node name (VLLM_NIXL_SIDE_CHANNEL_HOST, "
            "--data-parallel-address, --master-addr): vLLM hands those names to the peers, "
            "which dial them",
            "run vllm/ where every node name resolves, on every host, to an address on the "
            "network the engines share (DNS or /etc/hosts; fresh review 5, R5-05)"))
    if plan.routes:
        out.append(_routes_notice(plan))
    return out


def _routes_notice(plan: Plan) -> Notice:
    """Several routers (`Plan.routes`): the site splits the traffic over their frontends."""
    lost = ""
    if plan.routing.groups:
        rates = [(g.name, g.requests_per_s) for g in plan.routing.groups]
        what = ("each routing group (compiler/routes.py: an NVLink domain holding prefill and "
                "decode, the domains holding one role together, and a group of more instances "
                "than one Dynamo graph holds dealt into parts `<group>-<k>`) has")
        if plan.goodput < plan.solver.objective * (1 - 0.01):
            lost = (f"; the parts sustain {plan.goodput:g} requests/s together, "
                    f"{100 * (1 - plan.goodput / plan.solver.objective):.1f}% less than the "
                    f"{plan.solver.objective:g} the solver counted for the group as one pool "
                    "(a Dynamo graph holds at most 25 components, one per instance: fewer, "
                    "larger instances keep it whole)")
    else:
        rates = [(g.name, g.predicted.requests_per_s) for g in plan.hardware.groups
                 if g.predicted]
        what = "each group has"
    shares = ", ".join(f"{name} {rate:g} requests/s" for name, rate in rates[:8]) \
        + (f", ... ({len(rates)} groups)" if len(rates) > 8 else "")
    return _notice(
        "cluster", "k8s",
        f"{what} its own Dynamo graph and frontend, and its own vllm-router in lws/ "
        "(`rackc explain PLAN routing.groups`): requests are routed within the group whose "
        f"frontend they reach{lost}",
        f"split traffic over the graphs' frontend Services (`<graph>-frontend`) in proportion "
        f"to what each is predicted to sustain ({shares})")

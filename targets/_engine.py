"""The vLLM engine arguments and environment of a component: the one builder that the vllm,
dynamo and lws targets share, so their engines never disagree.

Flag choices (docs/targets.md explains each), for the vLLM release the target runs
(`plan.site.engines[target]`: the vllm and lws targets run the plan's release, Dynamo's worker
its own, with that release's kernels where the plan records them: compiler.engine_releases):
- parallelism: `--tensor-parallel-size`, `--pipeline-parallel-size`, `--data-parallel-size`,
  `--enable-expert-parallel`, and the instance's `--all2all-backend`;
- the plan's kernels (attention, MoE and linear backends, chosen from the engine's capabilities
  in compiler.resolve);
- the plan's batch limits, context length, KV dtype and block size, and the memory budget;
- the KV connector (NIXL for P/D, plus the Mooncake store when the plan has a pool), speculative
  decoding and Engram placement;
- weights offloaded to host memory, per instance (`--offload-backend uva` with
  `--cpu-offload-gb`, or `prefetch` with its layer groups; optionally the parameters).
The per-node launch flags (which ranks run where) are `multinode_flags`.
"""

from compiler import ports
from compiler.plan import Instance, Plan
from targets._components import Component
from targets._errors import TargetError
from targets._mooncake import pool_enabled
from targets._topology import claims_channel, multi_node_nvlink
from targets._yaml import compact_json

# The releases whose argument parsers the flags below are checked by (tests/conformance).
SUPPORTED_VLLM = ("0.31", "0.33")
# Mooncake and vLLM's prefix hashing need one seed on every instance sharing the store.
PYTHONHASHSEED = "0"


def check_vllm_version(plan: Plan, target: str) -> str:
    """The vLLM release `target` runs (plan.site.engines), if the targets write its flags."""
    version = plan.site.engines[target].vllm
    if ".".join(version.split(".")[:2]) not in SUPPORTED_VLLM:
        raise TargetError(f"site.engines.{target}.vllm: the targets emit vLLM "
                          f"{SUPPORTED_VLLM} flags, got {version}")
    return version


def runs(plan: Plan, target: str, instance: Instance) -> Instance:
    """The instance with the kernels `target`'s vLLM release runs (the plan's own unless
    plan.site.engines[target] records that release's pick)."""
    return plan.site.engines[target].run(instance)


def parallel_flags(plan: Plan, component: Component, instance: Instance) -> list[str]:
    if instance.dp > 1 and instance.tp > 1:
        raise TargetError(f"instances[{instance.id}]: tp={instance.tp} with dp={instance.dp} "
                          "has no engine shape in the targets (DEPn or TPn[EPn])")
    if instance.pp > 1 and instance.dp > 1:
        raise TargetError(f"instances[{instance.id}]: pp={instance.pp} with dp={instance.dp} "
                          "has no engine shape in the targets (TPnPPm or TPnEPnPPm)")
    if instance.dp * instance.tp * instance.pp != len(instance.gpus):
        raise TargetError(f"instances[{instance.id}]: dp x tp x pp = "
                          f"{instance.dp * instance.tp * instance.pp}, "
                          f"but it has {len(instance.gpus)} GPUs")
    flags = ["--tensor-parallel-size", str(instance.tp)]
    if instance.pp > 1:
        flags += ["--pipeline-parallel-size", str(instance.pp)]
    if instance.dp > 1:
        flags += ["--data-parallel-size", str(instance.dp)]
    if instance.ep > 1:
        flags += ["--enable-expert-parallel"]
        if instance.all2all_backend:
            flags += ["--all2all-backend", instance.all2all_backend]
        if plan.model.redundant_experts:  # EPLB: the replicas the shape was sized with
            flags += ["--enable-eplb", "--eplb-config",
                      compact_json({"num_redundant_experts": plan.model.redundant_experts})]
    return flags


def attention_flags(plan: Plan, instance: Instance) -> list[str]:
    """The backend and its options (dense MLA on Blackwell: the TRT-LLM ragged prefill), of the
    instance's system."""
    serving = plan.serving_of(instance)
    return ["--attention-backend", serving.attention_backend,
            *(f"-ac.{k}={v}" for k, v in serving.attention_options.items())]


def kernel_flags(plan: Plan, instance: Instance) -> list[str]:
    """The plan's kernels (compiler.resolve, from the engine's capabilities)."""
    flags = []
    if instance.moe_backend:
        flags += ["--moe-backend", instance.moe_backend]
    linear = plan.serving_of(instance).linear_backend
    if linear:
        flags += ["--linear-backend", linear]
    return flags + attention_flags(plan, instance)


def kv_cache_dtype(plan: Plan) -> str:
    """BF16 KV is the model's own dtype: 'auto' (vLLM 0.33 rejects an explicit float KV dtype
    that differs from the model's)."""
    return "fp8" if plan.serving.kv_cache_dtype == "fp8" else "auto"


# The Mooncake store is looked up and loaded asynchronously (SYSTEM.md routing).
CONNECTOR_EXTRA = {"MooncakeStoreConnector": {"load_async": True, "lookup_async": True}}


def kv_transfer_config(plan: Plan, component: Component) -> dict | None:
    """The instance's connectors (P/D: NIXL; with the pool also the Mooncake store, both in a
    MultiConnector)."""
    names = component.instances[0].kv_connectors
    configs = [{"kv_connector": n, "kv_role": "kv_both",
                **({"kv_connector_extra_config": CONNECTOR_EXTRA[n]} if n in CONNECTOR_EXTRA
                   else {})} for n in names]
    if len(configs) <= 1:
        return configs[0] if configs else None
    return {"kv_connector": "MultiConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": configs}}


def engram_config(plan: Plan, instance: Instance, version: str) -> dict | None:
    """Host tables (`cpu_offload`, shared by the co-located ranks of a node) or HBM shards over
    the instance's own ranks (`embedding_across_dp`), as the plan says; an HBM instance's shards
    must form its own group (vLLM 0.33 has no Engram group across instances)."""
    if instance.engram == "none":
        return None
    if instance.engram == "host":
        return {"cpu_offload": True}
    groups = plan.engram_groups(instance.gpus)
    if groups != {instance.id}:
        raise TargetError(
            f"engram_shards: instance {instance.id} holds shards of groups {sorted(groups)}; "
            f"vLLM {version} shards Engram tables only over one instance's "
            f"ranks, so its shards must form the group {instance.id!r}")
    return {"cpu_offload": False, "embedding_across_dp": instance.dp > 1}


def offload_flags(instance: Instance) -> list[str]:
    """The instance's weight offload, its backend named (vLLM's `auto` would pick it from the
    other flags): UVA's size and parameters, or the prefetch groups and parameters."""
    o = instance.weight_offload
    if o is None:
        return []
    if o.backend == "uva":
        return ["--offload-backend", "uva", "--cpu-offload-gb", f"{o.gib_per_gpu:g}",
                *(["--cpu-offload-params", *o.params] if o.params else [])]
    return ["--offload-backend", "prefetch", "--offload-group-size", str(o.group_size),
            "--offload-num-in-group", str(o.num_in_group),
            "--offload-prefetch-step", str(o.prefetch_step),
            *(["--offload-params", *o.params] if o.params else [])]


def engine_args(plan: Plan, component: Component, target: str) -> list[str]:
    """Everything after `vllm serve MODEL` (or `dynamo.vllm --model MODEL`) except the
    per-node launch flags, for the vLLM release `target` runs."""
    version = check_vllm_version(plan, target)
    instances = component.instances
    # replicas share shape and batch limits (components())
    first = runs(plan, target, instances[0])
    utilization = min(i.gpu_memory_utilization for i in instances)
    args = [
        *parallel_flags(plan, component, first),
        "--max-num-seqs", str(first.max_batch),
        "--max-num-batched-tokens", str(first.max_batched_tokens),
        "--max-model-len", str(plan.serving.max_model_len),
        "--block-size", str(plan.serving.block_size),
        "--gpu-memory-utilization", f"{utilization:.2f}",
        "--kv-cache-dtype", kv_cache_dtype(plan),
        *kernel_flags(plan, first),
    ]
    args += offload_flags(first)
    if plan.serving.speculative:
        spec = plan.serving.speculative
        args += ["--speculative-config", compact_json(
            {"method": spec.method, "num_speculative_tokens": spec.draft_tokens,
             **spec.options})]
    if plan.serving.language_model_only:
        args.append("--language-model-only")
    args += plan.serving.model_flags
    # The same for every replica (it depends on the shape); each is checked against the plan.
    engrams = [engram_config(plan, i, version) for i in instances]
    engram = engrams[0]
    if engram:
        args += ["--engram-config", compact_json(engram)]
    transfer = kv_transfer_config(plan, component)
    if transfer:
        args += ["--kv-transfer-config", compact_json(transfer)]
    return args


def ucx_tls(plan: Plan) -> str:
    """NIXL's UCX transports: RDMA (`rc`, RC verbs with UD wire-up) for KV between nodes unless
    the site chose TCP; CUDA IPC (multi-node NVLink where the pod holds an IMEX channel)."""
    network = "rc" if plan.site.rdma.transport == "rdma" else "tcp"
    return f"{network},sm,self,cuda_copy,cuda_ipc"


def engine_env(plan: Plan, component: Component, target: str) -> dict[str, str]:
    """The environment of a component's engines: the shared part, what its instances need (the
    plan's `env`, e.g. DeepEP over MNNVL) and the site's transports; each target adds where the
    Mooncake client file of the node is (`_mooncake.client_config_path`) and the model cache
    (`_site.cache_env`). The instance's own part is what `target`'s vLLM release needs."""
    env = {"PYTHONHASHSEED": PYTHONHASHSEED, "UCX_TLS": ucx_tls(plan),
           **runs(plan, target, component.instances[0]).env}
    if plan.site.rdma.hca_names:
        env["UCX_NET_DEVICES"] = ",".join(f"{h}:1" if ":" not in h else h
                                          for h in plan.site.rdma.hca_names)
    if claims_channel(plan, component.instances[0], component.nodes_per_instance):
        # NCCL and NIXL (UCX) over the rack's multi-node NVLink (the GB200 ComputeDomain recipes).
        env |= {"NCCL_MNNVL_ENABLE": "1", "NCCL_CUMEM_ENABLE": "1",
                "UCX_CUDA_IPC_ENABLE_MNNVL": "y"}
    if pool_enabled(plan) and multi_node_nvlink(plan, component.instances[0]):
        # Mooncake's transfer engine reads it (mooncake-common/src/environ.cpp, default true:
        # ibv_reg_mr through nvidia-peermem); 0 registers GPU memory by DMA-BUF
        # (rdma_context.cpp), the path on Grace/Vera (KUBERNETES.md 6.2)
        env["WITH_NVIDIA_PEERMEM"] = "0"
    return dict(sorted(env.items()))


def parser_flags(plan: Plan) -> list[str]:
    """`vllm serve`'s flags for tool calls and reasoning output (agentic clients send `tools`
    and read `reasoning_content`), on every node: in vLLM 0.33 the reasoning parser is also an
    engine setting (StructuredOutputsConfig). The names are vLLM 0.33's registries'."""
    p, flags = plan.parsers, []
    if p.vllm_tool_call:
        flags += ["--enable-auto-tool-choice", "--tool-call-parser", p.vllm_tool_call]
    if p.vllm_reasoning:
        flags += ["--reasoning-parser", p.vllm_reasoning]
    return flags


def multinode_flags(component: Component, node_rank: str, start_rank: str, leader: str,
                    leader_node: bool, dp_rpc_port: int | None = None,
                    master_port: int | None = None) -> list[str]:
    """The flags that place one node's ranks of a multi-node instance. DEP: the leader runs the
    API server and the DP coordinator (internal load balancing over all ranks); the other nodes
    run headless engines from their start rank. TP or pipeline stages across nodes: vLLM's
    multiprocessing executor over `--nnodes` (node n runs ranks n x local .. ; rank r is on
    stage r // tp). `node_rank`, `start_rank` and `leader` may be shell expressions. The ports
    are the plan's host ports where instances share a host's network (`vllm/` scripts), else
    (a pod's own network) compiler.ports' base ports."""
    if component.nodes_per_instance == 1:
        return []
    instance = component.instances[0]
    headless = [] if leader_node else ["--headless"]
    if instance.dp > 1:
        start = [] if leader_node else ["--data-parallel-start-rank", start_rank]
        return [*headless, "--data-parallel-size-local", str(component.gpus_per_node), *start,
                "--data-parallel-address", leader,
                "--data-parallel-rpc-port", str(dp_rpc_port or ports.DP_RPC)]
    return [*headless, "--distributed-executor-backend", "mp",
            "--nnodes", str(component.nodes_per_instance), "--node-rank", node_rank,
            "--master-addr", leader, "--master-port", str(master_port or ports.MASTER)]

"""The Plan IR: the single source of truth every target reads.

Frozen and canonical: collections are sorted by id, floats rounded, no timestamps, hostnames of
this machine or absolute paths, so the same inputs give a byte-identical `plan.yaml`.
Targets import this module only. One module past 500 lines on purpose: it is the IR's one
schema (49 record types and the plan's self-consistency check), the one door the targets
and the validator read.
"""

from collections.abc import Mapping
from dataclasses import replace
from functools import cached_property
from typing import Any, ClassVar, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_serializer

from compiler.ids import gpu_of_domain, natural, parse_instance
from compiler.names import workload_name
from compiler.shapes import parse_shape
from schemas.diagnostics import CompileError, Diagnostic
from schemas.source import Document, checked_events, data_of, format_path, load_yaml_text
from schemas.validate import to_diagnostics

PLAN_API = "rackc.dev/v1alpha1"
PLAN_MAX_BYTES = 32 << 20  # the plan.yaml of 64 Vera Rubin NVL72 racks is 2.1 MiB
Role = Literal["prefill", "decode", "aggregated"]
Source = str  # "user" | "default" | "solver" | "rule:<id>"


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OmitsOptional(Frozen):
    """Leaves out the fields in `OPTIONAL` while they hold their default, so that plans of
    deployments that do not use an option stay as they were."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler):
        fields = type(self).model_fields
        return {k: v for k, v in handler(self).items()
                if k not in self.OPTIONAL or v != fields[k].default}


class Tray(Frozen):
    id: str  # r0-t07
    node_name: str
    nvlink_domain: str  # nvl0
    gpus: list[str]
    available: bool


class Hardware(Frozen):
    system: str
    form: Literal["nvl72", "hgx"]
    gpu_family: Literal["hopper", "blackwell", "rubin"]
    arch: Literal["arm64", "amd64"]
    gpus_per_tray: int
    domains_per_gpu: int
    hbm_gib_per_gpu: float
    # What each tray offers its pods, as the scheduler counts it (the one record of node
    # capacity: the validator reads these, never the catalog). GPUs: `trays[].gpus` less
    # `unavailable_gpus`. CPU cores are not recorded: the catalog does not know them.
    dram_gib_per_tray: float  # the rack's override, else the catalog's
    allocatable_gib_per_tray: float  # the DRAM less the site's node reserve
    rdma_devices_per_tray: int
    node_labels: dict[str, str]
    trays: list[Tray]
    unavailable_gpus: list[str]


class ModelInfo(OmitsOptional):
    OPTIONAL: ClassVar[tuple[str, ...]] = ("assumed",)
    name: str
    hf_id: str
    architecture: str
    attention: Literal["mla", "gqa", "mha", "csa"]
    sparse_attention: bool
    weights_dtype: str
    experts_dtype: str
    expert_format: str  # how the engine loads the routed experts: mxfp4 | nvfp4 | fp8 | bf16
    moe: bool
    experts: int
    redundant_experts: int = 0  # EPLB replicas over the EP ranks (vLLM --eplb-config)
    engram_tables: int
    engram_table_bytes: int
    assumed: list[str] = []  # the catalog entry's fields without a public source


class Speculative(OmitsOptional):
    OPTIONAL: ClassVar[tuple[str, ...]] = ("options",)
    method: str
    draft_tokens: int
    acceptance: float
    options: dict[str, str | bool] = {}  # further --speculative-config keys (the catalog's)


class Serving(OmitsOptional):
    OPTIONAL: ClassVar[tuple[str, ...]] = ("language_model_only", "model_flags")
    name: str  # deployment metadata.name
    namespace: str
    vllm_version: str
    kv_cache_dtype: Literal["fp8", "bf16"]
    block_size: int  # a multiple of the attention backend's kernel block
    max_model_len: int
    attention_backend: str
    attention_options: dict[str, str]  # -ac.KEY=VALUE
    linear_backend: str | None
    speculative: Speculative | None
    engram_placement: Literal["hbm", "dram"]  # what the deployment asked for
    language_model_only: bool = False  # the vision tower is not loaded
    model_flags: list[str] = []  # what vLLM needs for the architecture (--trust-remote-code)


class RankGroup(OmitsOptional):
    """One node's share of an instance: one vLLM process serving the ranks on that tray's GPUs,
    and the host ports it binds when launched on the host (`vllm/` scripts; pods have their own
    network namespace and bind the base ports of compiler.ports). Ports are None where the
    process binds none (compiler.deploy says which)."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ("api_port", "nixl_port", "dp_rpc_port",
                                           "master_port")

    index: int  # node rank inside the instance; 0 is the leader
    tray: str
    node_name: str
    gpus: list[str]  # plan GPU ids, rank order
    cuda_devices: list[int]  # CUDA device index of each GPU on its tray
    first_rank: int
    api_port: int | None = None  # the leader's OpenAI server (`--port`)
    nixl_port: int | None = None  # VLLM_NIXL_SIDE_CHANNEL_PORT; rank r listens on it + r
    dp_rpc_port: int | None = None  # `--data-parallel-rpc-port` (multi-node DP)
    master_port: int | None = None  # `--master-port` (multi-node TP / PP)

    @property
    def is_leader(self) -> bool:
        return self.index == 0


class WeightOffload(OmitsOptional):
    """Decoder weights an instance keeps in pinned host memory (compiler.offload): `uva`
    (`--cpu-offload-gb`) reads them over the GPU-CPU link on every use; `prefetch`
    (`--offload-backend prefetch`) copies the last `num_in_group` of every `group_size`
    layers into GPU buffers `prefetch_step` offloaded layers ahead."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ("params", "group_size", "num_in_group",
                                           "prefetch_step", "buffer_gib")

    backend: Literal["uva", "prefetch"]
    gib_per_gpu: float  # in host memory, per GPU of the heaviest pipeline stage
    params: list[str] = []  # parameter-name segments offloaded (empty: any)
    group_size: int = 0  # prefetch
    num_in_group: int = 0
    prefetch_step: int = 0
    buffer_gib: float = 0.0  # prefetch: GPU buffers per GPU, inside the memory budget


class Instance(OmitsOptional):
    OPTIONAL: ClassVar[tuple[str, ...]] = ("weight_offload", "group", "pp", "stage_layers")

    id: str  # {role}-{index:02d}
    role: Role
    shape: str  # DEP2 | DEP16 | TP8 | TP8EP8 | TP8PP2 ...
    gpus: list[str]  # rank order: rank i runs on gpus[i] (stage i // tp with pipeline stages)
    trays: list[str]
    dp: int
    ep: int
    tp: int
    max_batch: int  # requests per DP rank (--max-num-seqs)
    max_batched_tokens: int  # tokens per DP rank per step (--max-num-batched-tokens)
    gpu_memory_utilization: float
    all2all_backend: str | None  # DP+EP dispatch; None without data-parallel experts
    moe_backend: str | None  # None: the engine's own choice (BF16 experts)
    engram: Literal["none", "hbm", "host"]  # where this instance reads the Engram tables
    env: dict[str, str]  # what its engines need beyond the shared environment
    kv_connectors: list[str]  # in MultiConnector order; empty: no KV transfer
    connector_env: list[str]  # variables the connectors read, set by each target
    weight_offload: WeightOffload | None = None  # None: every weight in HBM
    group: str | None = None  # a mixed fleet's group that holds it (absent otherwise)
    pp: int = 1  # pipeline stages (vLLM --pipeline-parallel-size; absent when 1)
    stage_layers: list[int] = []  # decoder layers per stage, as vLLM splits them (with pp > 1)
    rank_groups: list[RankGroup] = []  # one per tray, in rank order (compiler.deploy)
    workload: str = ""  # its Kubernetes workload's DNS label: DGD component, LWS (deploy)

    @property
    def offload_gib(self) -> float:
        """Weights per GPU in pinned host memory (0: none)."""
        return self.weight_offload.gib_per_gpu if self.weight_offload else 0.0


class DomainMemory(Frozen):
    weights_gib: float
    kv_gib: float
    engram_gib: float
    pool_gib: float
    workspace_gib: float  # activations, DeepEP buffers, the engine's margin
    reserved_gib: float  # outside --gpu-memory-utilization: CUDA context, NCCL, NIXL
    capacity_gib: float


class HostMemory(OmitsOptional):
    """What a tray's engines pin in its host DRAM (GiB)."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ("weights_gib",)

    pool_gib: float  # the Mooncake DRAM segment
    engram_gib: float  # Engram tables read from host memory
    process_gib: float  # engine processes and the store clients' transfer buffers
    reserved_gib: float  # not allocatable: the kubelet's reserves, DaemonSets (site.host)
    capacity_gib: float
    weights_gib: float = 0.0  # weights offloaded from the tray's GPUs (Instance.weight_offload)


class EngramShard(Frozen):
    table: int
    shard: int
    domain: str
    offset_bytes: int
    bytes: int
    group: str  # "prefill" (peer group) or a decode instance id


class PoolSegment(Frozen):
    kind: Literal["dram", "hbm"]
    location: str  # tray id (dram) or memory domain id (hbm)
    gib: float


class KvPool(Frozen):
    enabled: bool
    segments: list[PoolSegment]
    total_gib: float


class RouteGroup(OmitsOptional):
    """One router's share of the plan (compiler.routes): the NVLink domains whose instances
    it pairs (only those of `trays` where it is a part of a group split by tray), the share of
    its hand-offs that cross domains (over the NICs), and the requests/s the prediction gives
    it (the traffic split over the routers)."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ("trays",)
    name: str  # an NVLink domain's id (its own group), "shared", or `<group>-<k>` (a part)
    domains: list[str]
    cross_domain_share: float
    requests_per_s: float = 0.0
    trays: list[str] = []  # a part of a group split by tray: the trays its instances start on


class Routing(OmitsOptional):
    OPTIONAL: ClassVar[tuple[str, ...]] = ("groups",)
    policy: str
    overlap_score_credit: float
    block_size: int
    # one frontend / router each (compiler.routes); none: one for every instance (a mixed
    # fleet: one per fleet group, `Plan.mixed`)
    groups: list[RouteGroup] = []

    def group_of(self, domain: str, tray: str) -> str | None:
        """The routing group that serves the instances whose first GPU is on `tray`, of NVLink
        domain `domain` (None: no groups)."""
        return next((g.name for g in self.groups
                     if (tray in g.trays if g.trays else domain in g.domains)), None)


class PhaseSolve(Frozen):
    """One phase of the solve (counts: goodput, maximised; placement: summed over racks)."""

    status: str
    objective: float
    bound: float
    gap: float  # relative; placement: the worst rack's
    seconds: float  # CP-SAT deterministic time


class RackSolve(Frozen):
    """One per-rack placement model; `domains` are the racks that share its solution."""

    domains: list[str]
    status: str
    objective: float
    bound: float
    gap: float


class Considered(OmitsOptional):
    """One engine shape the counts phase weighed for a role: what one instance sustains at the
    SLO (compiler/perf/capacity.py), or why it cannot serve."""

    OPTIONAL = ("why_not", "group")
    role: Role
    shape: str
    gpus: int
    requests_per_s: float  # one instance, at the SLO; 0 when it cannot meet it
    max_batch: int  # decode: requests per DP rank at the SLO; prefill: sequences per step
    step_ms: float
    why_not: str = ""  # empty: usable
    group: str | None = None  # a mixed fleet's group


class LayoutGroup(Frozen):
    role: Role
    shape: str
    count: int


class LayoutOption(OmitsOptional):
    """One whole layout the solver weighed (compiler/layout_table.py): its instances, the
    goodput and SLO metrics the one prediction gives it (compiler.prediction), whether no
    other row beats it on goodput, P90 per-user rate and P90 TTFT at once (`pareto`), and why
    it was or was not chosen."""

    OPTIONAL = ("group",)
    mode: Literal["disaggregated", "aggregated"]
    instances: list[LayoutGroup]
    gpus: int
    goodput: float  # requests/s the layout sustains at the SLO (the admission cap)
    tokens_per_s_per_user_p50: float
    tokens_per_s_per_user_p90: float
    ttft_ms_p50: float
    ttft_ms_p90: float
    tpot_ms_p50: float
    slo_met: bool
    pareto: bool
    chosen: bool
    why: str
    group: str | None = None  # a mixed fleet's group


class SolverInfo(Frozen):
    status: str  # OPTIMAL when both phases are
    objective: float  # goodput, requests/s
    bound: float
    seconds: float  # CP-SAT deterministic time: reproducible, unlike wall time
    counts: PhaseSolve
    placement: PhaseSolve
    racks: list[RackSolve]
    considered: list[Considered]  # every candidate of the counts phase, in its order
    # whole layouts weighed, the chosen first (compiler/layout_table.py); none when pinned
    layouts: list[LayoutOption] = []


class Images(Frozen):
    dynamo: str  # Dynamo's vLLM runtime: DGD workers and frontend
    vllm: str  # plain vLLM: vllm/ scripts, lws/, the Mooncake master
    runtime_version_override: str | None  # the DGD components' field, when the tag needs it
    router: str | None  # vllm-router for lws/ P/D


class ReleaseKernels(Frozen):
    """One instance's kernels under a target's vLLM release where they are not the plan's
    (compiler.engine_releases: that release's own pick); the target renders these."""

    instance: str
    all2all_backend: str | None
    moe_backend: str | None
    env: dict[str, str]


# One engine fact each, with the engine file (and symbol) it was read from; concrete classes,
# not one generic, since plans cross a process boundary by pickle (compiler.emit_worker)
class Sizes(Frozen):
    value: list[int]
    source: str


class Names(Frozen):
    value: list[str]
    source: str


class Name(Frozen):
    value: str
    source: str


class Count(Frozen):
    value: int
    source: str


class Env(Frozen):
    value: dict[str, str]
    source: str


class HybridBlock(Frozen):
    """What vLLM sizes a hybrid model's KV block by: one block's attention page must hold one
    request's state of a linear-attention layer on each rank, so vLLM raises a smaller block
    (compiler.engine_choices.hybrid_block has the rule)."""

    state_bytes: int  # one linear-attention layer's state of one request, all TP ranks together
    page_bytes: int  # one attention layer's KV of one token in one KV head slot (the KV dtype)
    kv_heads: int  # KV head slots TP splits (1: an MLA latent, whole on every rank)
    alignment: int  # a raised block is a multiple of it (the kernel block; 128 under MLA)
    kernel_block: int  # and of the attention kernels' smallest blocks
    source: str


class EngineFacts(OmitsOptional):
    """What the release a target runs can do, as far as its engines' flags are checked
    (`rackc validate`, engine-capability and dynamo-connector): read from that release's fact
    set when the plan is made, so that validate reads the plan, never the catalog."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ("moe_backends", "moe_batched", "pd_connectors",
                                           "connector_wrappers", "hybrid_block",
                                           "graph_components")
    kernel_block_sizes: dict[str, Sizes]  # attention backend -> its KV page sizes
    moe_backends: Names | None = None  # the --moe-backend names that load the plan's expert
    # format (None: a dense model, or the release names none for it)
    moe_batched: Names | None = None  # those with a kernel for batched activations
    batched_layout: Names  # --all2all-backend names that hand experts batched rows
    multi_node_nvlink_env: dict[str, Env]  # all2all backend -> its env across trays
    pipelined_connector: Name  # the NIXL connector beside a prefill with stages
    pd_connectors: Names | None = None  # Dynamo's prefill handler's protocols
    connector_wrappers: Names | None = None  # Dynamo resolves them to one P/D member
    hybrid_block: HybridBlock | None = None  # what the release raises the block to (a hybrid
    # model's; None: no linear-attention state)
    graph_components: Count | None = None  # Dynamo: components one graph holds at most


class EngineRun(OmitsOptional):
    """What runs one target's engines: its image, the vLLM release there (the flags and
    connectors are checked against that release's code), the Dynamo release when Dynamo
    launches them, why the target refuses the plan, if it does, and the instances whose
    kernels that release picks itself (absent when it runs the plan's everywhere)."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ("kernels",)
    image: str
    vllm: str
    dynamo: str | None
    refused: str | None
    facts: EngineFacts
    kernels: list[ReleaseKernels] = []

    def run(self, instance: "Instance") -> "Instance":
        """The instance as this target's release runs it."""
        own = next((k for k in self.kernels if k.instance == instance.id), None)
        return instance if own is None else instance.model_copy(update={
            "all2all_backend": own.all2all_backend, "moe_backend": own.moe_backend,
            "env": own.env})


class Rdma(Frozen):
    transport: Literal["rdma", "tcp"]
    resource: str  # device-plugin extended resource
    hca_names: list[str]  # "" = auto-discovery


class ModelCache(Frozen):
    kind: Literal["pvc", "host_path"]
    source: str  # claim name or host directory
    mount_path: str
    hf_home: str
    engine_ready_timeout_s: int


class Toleration(Frozen):
    key: str
    operator: str
    value: str | None
    effect: str | None


class Resources(Frozen):
    """Requests (= limits for memory) of one pod."""

    cpu: int
    memory_gib: float
    shm_gib: float  # /dev/shm, inside memory_gib
    rdma_devices: int  # of Site.rdma.resource; 0 without RDMA
    registers_memory: bool  # RDMA memory registration: IPC_LOCK


class PodSize(Frozen):
    """What one pod (one node) of an instance pins on its host."""

    instance: str
    resources: Resources
    pool_bytes_per_rank: int  # Mooncake global_segment_size of each rank on the node
    engram_host_gib: float  # host Engram tables, shared by the node's ranks through /dev/shm


class Security(Frozen):
    """How the containers of one kind of pod run (their securityContext), the Pod Security
    Standards level that admits them, and why each privilege is there."""

    run_as_user: int | None  # None: the image's own user
    run_as_non_root: bool
    capabilities_add: list[str]
    drop_all_capabilities: bool
    seccomp_runtime_default: bool
    service_account_token: bool  # mounted only where the pod calls the API server
    level: Literal["restricted", "baseline", "privileged"]
    why: str


class Site(Frozen):
    images: Images
    rdma: Rdma
    model_cache: ModelCache
    hf_token_secret: str | None
    pin_by_hostname: bool  # kubernetes.io/hostname label == node name (the user says so)
    tolerations: list[Toleration]
    priority_class: str | None
    pods: list[PodSize]  # sorted by instance id
    mooncake_segment_bytes: dict[str, int]  # tray -> global_segment_size of each rank there
    mooncake_local_buffer_bytes: int
    host_reserved_gib: float  # per tray: its memory capacity less its allocatable (a mixed
    # fleet: the first group's; each group's is in its FleetGroup, Plan.host_reserved_gib_of)
    frontend: Resources
    mooncake_master: Resources
    # target family (dynamo: dynamo/ and k8s/; vllm: vllm/, lws/, the Mooncake master) -> engine
    engines: dict[str, EngineRun]
    cpu_arch: str | None  # kubernetes.io/arch of the CPU-only pods; None: any node's
    # pod kind (engine, engine-rdma, frontend, mooncake-master, router) -> how it runs
    security: dict[str, Security]
    pod_security_level: Literal["restricted", "baseline", "privileged"]  # the namespace's


class Parsers(Frozen):
    """Tool-call and reasoning parsers of the model, by engine (their registries differ)."""

    vllm_tool_call: str | None
    vllm_reasoning: str | None
    dynamo_tool_call: str | None
    dynamo_reasoning: str | None


class CurvePoint(Frozen):
    batch: int
    tokens_per_s_per_user_p50: float
    tokens_per_s_per_user_p90: float
    output_tokens_per_s_per_gpu: float
    total_tokens_per_s_per_gpu: float


class PredictedGroup(Frozen):
    """One row per instance group: decode rows carry a batch and step, prefill rows a chunk."""

    role: Role
    shape: str
    count: int
    gpus: int
    batch: float | None = None
    decode_step_us: float | None = None
    chunk_tokens: int | None = None
    prefill_step_us: float | None = None  # with pipeline stages: the slowest stage's time
    pipeline_fill_us: float | None = None  # the other stages' time a chunk also passes
    prompt_us: float | None = None  # a median prompt's own prefill: its chunks (and the fill)

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class IsolatedPhase(Frozen):
    """One role alone at the deployment's pinned operating point
    (`objective.instances[].operating_point`), as published decode and prefill results are
    measured: its step from the step model at that batch and context, without the serving
    model's queueing, admission, prefill coupling or KV hand-off (compiler/perf/isolated.py).
    Decode rows carry TPOT, ITL and output rates; prefill rows TTFT and prompt rates."""

    role: Role
    shape: str
    gpus: int  # one instance's
    batch_per_rank: int
    context_tokens: int
    cached_tokens: int | None = None  # prefill: of each prompt, read from the prefix cache
    step_ms: float  # decode: one verification step; prefill: the slowest stage's
    kv_gib_per_gpu: float  # the batch's KV at this context
    kv_cache_gib_per_gpu: float  # what the memory budget leaves for KV (compiler/memory.py)
    max_batch_per_rank: int  # requests of this context the KV cache holds
    breakdown: dict[str, float]  # the step by operator (us)
    tpot_ms: float | None = None
    itl_ms: float | None = None  # between streamed chunks: one step (speculation: k + 1 max)
    tokens_per_s_per_user: float | None = None
    output_tokens_per_s_per_gpu: float | None = None
    output_tokens_per_s_per_instance: float | None = None
    ttft_ms: float | None = None  # a prompt of the step: the step, and the pipeline fill
    prompt_tokens_per_s_per_gpu: float | None = None  # whole prompts, cached share included
    prompt_tokens_per_s_per_instance: float | None = None
    computed_tokens_per_s_per_gpu: float | None = None  # the uncached tokens only

    HEADING: ClassVar[str] = (
        "Phase-isolated: each pinned role alone at its operating point (one step of the step "
        "model; no queueing, admission, prefill-decode coupling or KV hand-off, so not the "
        "serving figures)")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}

    def summary(self) -> str:
        """One line: the operating point and what the role does there (CLI, report)."""
        n = _figure
        memory = (f"KV {n(self.kv_gib_per_gpu)} of {n(self.kv_cache_gib_per_gpu)} GiB per GPU, "
                  f"at most {self.max_batch_per_rank} requests per rank at this context")
        if self.role == "decode":
            return (f"decode {self.shape} at {self.batch_per_rank} requests per rank and "
                    f"{self.context_tokens} tokens of context: step {n(self.step_ms)} ms, TPOT "
                    f"{n(self.tpot_ms)} ms, ITL {n(self.itl_ms)} ms, "
                    f"{n(self.tokens_per_s_per_user)} tokens/s per user, "
                    f"{n(self.output_tokens_per_s_per_gpu)} output tokens/s per GPU "
                    f"({n(self.output_tokens_per_s_per_instance)} per instance); {memory}")
        cached = f" ({self.cached_tokens} cached)" if self.cached_tokens else ""
        return (f"prefill {self.shape} at {self.batch_per_rank} prompts per rank of "
                f"{self.context_tokens} tokens{cached}: step {n(self.step_ms)} ms, TTFT "
                f"{n(self.ttft_ms)} ms, {n(self.prompt_tokens_per_s_per_gpu)} prompt tokens/s "
                f"per GPU ({n(self.prompt_tokens_per_s_per_instance)} per instance, "
                f"{n(self.computed_tokens_per_s_per_gpu)} computed per GPU); {memory}")


def _figure(x: float | None) -> str:
    """A figure as people read it: thousands grouped and whole, smaller ones as recorded."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:g}"


class SloCheck(Frozen):
    """One SLO of the deployment against the prediction (compiler/prediction.py)."""

    field: str  # the deployment's field, e.g. slo.tokens_per_s_per_user_p90
    target: float
    predicted: float
    met: bool


class Percentiles(Frozen):
    p50: float | None
    p90: float | None
    p99: float | None


class Simulated(Frozen):
    """A short deterministic run of `rackc simulate` over the plan at compile time (its
    steady state: the middle of the run); `disagrees` names the closed-form figures it is
    more than 10% away from."""

    requests: int
    seed: int
    workload: str  # closed | poisson
    policy: str
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles
    tokens_per_s_per_user_p50: float | None
    tokens_per_s_per_user_p90: float | None
    requests_per_s: float
    prefix_hit_rate: float
    disagrees: list[str]


class Predicted(OmitsOptional):
    OPTIONAL: ClassVar[tuple[str, ...]] = ("simulated", "isolated")

    output_tokens_per_s_per_gpu: float
    total_tokens_per_s_per_gpu: float
    tokens_per_s_per_user_p50: float
    tokens_per_s_per_user_p90: float
    ttft_ms_p50: float
    ttft_ms_p90: float
    tpot_ms_p50: float
    prefix_hit_rate: float
    tokens_per_s_per_kw: float
    instances: list[PredictedGroup]
    breakdown: dict[str, dict[str, float]]
    requests_per_s: float
    prefill_utilisation: float
    curve: list[CurvePoint]
    # why the counts (compiler/balance.py): the binding role, what spare instances buy
    balance: dict[str, str | int | float] | None = None
    slo: list[SloCheck] = []  # each SLO the deployment states, met or missed
    simulated: Simulated | None = None  # compiler.simulate's short run (absent: none made)
    # each pinned operating point's role alone (phase-isolated; absent: none pinned)
    isolated: list[IsolatedPhase] = []


class Decision(Frozen):
    path: str
    value: str
    source: Source
    why: str


class Notice(Frozen):
    """What the site must supply before the bundle serves, that no input says and no object
    can hold (compiler/preflight.py): printed as W901 by `rackc compile`, listed by the
    report under "Before you deploy"."""

    path: str  # the input that settles it
    target: str  # the emitted folder it concerns
    problem: str
    hint: str

    def render(self) -> str:
        return f"warning[W901] {self.target}/ {self.path}: {self.problem}\n  hint: {self.hint}"


class FleetGroup(OmitsOptional):
    """One group of the fleet: its own system and trays (a one-system plan: its only group,
    named after the Rack or Cluster). A mixed fleet's group also holds its per-system engine
    settings, what the perf model predicts for its instances, and its node reserve; a
    one-system plan's group leaves them to the plan itself (`Plan.serving`, `Plan.predicted`,
    `Plan.site`). Read them through `Plan.serving_of` and `Plan.host_reserved_gib_of`."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ("serving", "predicted", "host_reserved_gib")
    name: str
    hardware: Hardware
    serving: Serving | None = None
    predicted: Predicted | None = None
    host_reserved_gib: float | None = None  # per tray: its memory capacity less allocatable


class Fleet(Frozen):
    """The plan's hardware: one group per system (a mixed fleet: groups of different systems,
    racks numbered across them, compiler.ids)."""

    groups: list[FleetGroup]

    @property
    def trays(self) -> list[Tray]:
        return [t for g in self.groups for t in g.hardware.trays]

    @property
    def unavailable_gpus(self) -> list[str]:
        return [u for g in self.groups for u in g.hardware.unavailable_gpus]

    @property
    def system(self) -> str:
        return " + ".join(g.hardware.system for g in self.groups)


class Plan(Frozen):
    apiVersion: str = PLAN_API
    kind: str = "Plan"
    inputs_digest: str
    hardware: Fleet
    model: ModelInfo
    serving: Serving
    instances: list[Instance]
    memory: dict[str, DomainMemory]
    host_memory: dict[str, HostMemory]  # per tray running engines
    engram_shards: list[EngramShard]
    kv_pool: KvPool
    routing: Routing
    solver: SolverInfo
    predicted: Predicted | None
    decisions: list[Decision]
    site: Site
    parsers: Parsers
    notices: list[Notice] = []  # set once the plan is whole (compiler.preflight.with_notices)

    @property
    def prediction(self) -> Predicted:
        """What the perf model predicts: every plan `rackc compile` writes has it (only the
        draft that lower hands the perf model has none)."""
        assert self.predicted is not None, "a draft plan, before the prediction"
        return self.predicted

    def pod_size(self, instance_id: str) -> PodSize:
        return next(p for p in self.site.pods if p.instance == instance_id)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False
                   ) -> Self:
        """A copy without this plan's indexed lookups: pydantic copies them with the fields, and
        a copy with other instances, trays or shards would answer from the old ones."""
        copy = super().model_copy(update=update, deep=deep)
        for name in _LOOKUPS:
            copy.__dict__.pop(name, None)
        return copy

    # lookups, indexed once per plan so that targets stay linear in its size
    @property
    def fleet(self) -> list[Hardware]:
        """Each system's hardware, its groups in order (one for one system)."""
        return [g.hardware for g in self.hardware.groups]

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode instances (P/D), not aggregated ones alone."""
        return {i.role for i in self.instances} >= {"prefill", "decode"}

    @property
    def lws_refused(self) -> str | None:
        """Why lws/ is not emitted (None: it is). Without a router nothing sends a request to a
        prefill engine first: the decode Service gets it, its engines prefill it themselves in
        their small decode token budget, and the prefill instances stay idle (fresh review 5,
        R5-01/R5-02)."""
        if not self.disaggregated:
            return None
        if self.site.images.router is None:
            return ("a prefill/decode layout without a router (site.images.router): every "
                    "request would reach a decode engine, which prefills it itself, and the "
                    "prefill instances would stay idle")
        push = self.site.engines["vllm"].facts.pipelined_connector.value
        if any(push in i.kv_connectors for i in self.instances):
            return ("vllm-router (0.1.17, its latest release) rebuilds the push hand-off "
                    "without the prefill's pp_size (src/routers/http/vllm_pd_router.rs "
                    "build_nixl_push_decode_params), so decode would wait for one pipeline "
                    "stage's KV and decode without the other's, and it names the request by "
                    "its own id, so decode's heartbeats never extend the prefill's KV lease "
                    "(fresh router review, RR-01/RR-02)")
        return None

    @property
    def mixed(self) -> bool:
        """A fleet of two groups or more (compiler.fleet)."""
        return len(self.hardware.groups) > 1

    @property
    def goodput(self) -> float:
        """Requests/s at the SLO: what the routers sustain together where the plan has several
        (a routing group dealt into parts to fit Dynamo's graphs can serve less than the one
        pool the solver counted: compiler/routes.py `parts`), else the solver's goodput."""
        if self.routing.groups:
            return sum(g.requests_per_s for g in self.routing.groups)
        return self.solver.objective

    @property
    def routes(self) -> list[str] | None:
        """The routers that serve the plan, each its own frontend (targets.dynamo) and
        vllm-router (targets.lws): its routing groups (compiler.routes), else a mixed fleet's
        groups; None: one for the whole plan."""
        if self.routing.groups:
            return [g.name for g in self.routing.groups]
        return [g.name for g in self.hardware.groups] if self.mixed else None

    def route_of(self, instance: Instance) -> str | None:
        """The router that serves an instance (see `routes`)."""
        return self.route_of_tray(self.tray(instance.trays[0]))

    def route_of_tray(self, tray: Tray) -> str | None:
        """The router that serves the instances of a tray (see `routes`)."""
        if self.routing.groups:
            return self.routing.group_of(tray.nvlink_domain, tray.id)
        return self._group_by_tray[tray.id].name if self.mixed else None

    def hardware_of(self, tray_id: str) -> Hardware:
        """The hardware of the group a tray belongs to."""
        return self._hardware_by_tray[tray_id]

    def system_of(self, instance: Instance) -> Hardware:
        """The hardware of the group that runs an instance (instances never straddle groups)."""
        return self.hardware_of(instance.trays[0])

    def host_reserved_gib_of(self, hw: Hardware) -> float:
        """Host memory of each of `hw`'s trays that pods cannot have (a mixed fleet: the
        reserve of the group `hw` is, which its own tray DRAM sets)."""
        group = self._group_by_tray[hw.trays[0].id]
        reserve = group.host_reserved_gib
        return self.site.host_reserved_gib if reserve is None else reserve

    def serving_of(self, instance: Instance) -> Serving:
        """The serving settings of an instance's group (its system's engine backends)."""
        group = self._group_by_tray[instance.trays[0]]
        return self.serving if group.serving is None else group.serving

    @cached_property
    def _group_by_tray(self) -> dict[str, FleetGroup]:
        return {t.id: g for g in self.hardware.groups for t in g.hardware.trays}

    @cached_property
    def _hardware_by_tray(self) -> dict[str, Hardware]:
        return {t: g.hardware for t, g in self._group_by_tray.items()}

    def instance(self, instance_id: str) -> Instance:
        return self._instances_by_id[instance_id]

    def tray(self, tray_id: str) -> Tray:
        return self._trays_by_id[tray_id]

    def tray_of_gpu(self, gpu: str) -> Tray:
        return self._tray_by_gpu[gpu]

    def engram_groups(self, gpus: list[str]) -> set[str]:
        """The Engram shard groups whose shards live on these GPUs' memory domains."""
        return {grp for g in gpus for grp in self._engram_groups_by_gpu.get(g, ())}

    @cached_property
    def _instances_by_id(self) -> dict[str, Instance]:
        return {i.id: i for i in self.instances}

    @cached_property
    def _trays_by_id(self) -> dict[str, Tray]:
        return {t.id: t for t in self.hardware.trays}

    @cached_property
    def _tray_by_gpu(self) -> dict[str, Tray]:
        return {g: t for t in self.hardware.trays for g in t.gpus}

    @cached_property
    def _engram_groups_by_gpu(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for s in self.engram_shards:
            out.setdefault(gpu_of_domain(s.domain), set()).add(s.group)
        return out


_LOOKUPS = tuple(n for n, v in vars(Plan).items() if isinstance(v, cached_property))


def dump_plan(plan: Plan) -> str:
    """plan.yaml: block style, keys in model order, final newline. The JSON-mode dump holds no
    shared objects, so no anchors or aliases can appear; libyaml's emitter is used when
    present (same output, much faster)."""
    data = plan.model_dump(mode="json")
    return yaml.dump(data, Dumper=_DUMPER, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)


def load_plan(text: str, file: str = "plan.yaml") -> Plan:
    """A plan from its text, or CompileError (E701, at the line of the field): the input
    loader's event checks (no aliases, tags or deep nesting), libyaml, the Plan model, then
    what the model alone cannot say (`consistency`). A plan read back is an input like any
    other: `compile --from` keeps its instances where they run."""
    data = data_of(checked_events(text, file, _LOADER))  # parsed once
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        doc = load_yaml_text(text, file)  # parsed again, slowly, only to place the errors
        raise CompileError(_hinted(to_diagnostics(exc, doc, Plan))) from None
    problems = consistency(plan)
    if problems:
        doc = load_yaml_text(text, file)
        raise CompileError([_diagnostic(doc, *p) for p in problems[:20]])
    return plan


def _hinted(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return [replace(d, code="E701", hint=d.hint or "pass OUT/plan.yaml as rackc compile wrote it")
            for d in diagnostics[:20]]


def _diagnostic(doc: Document, path: tuple, expected: str, got: str, hint: str) -> Diagnostic:
    pos = doc.source.locate(path)
    return Diagnostic("error", "E701", doc.source.file, pos.line, pos.column, format_path(path),
                      expected, got, hint)


EDITED = "rackc wrote this plan otherwise; pass OUT/plan.yaml as rackc compile wrote it"


def consistency(plan: Plan) -> list[tuple[tuple, str, str, str]]:
    """(field path, expected, got, hint) of each way the plan contradicts itself: instance
    ids unique and of their role, each instance's GPUs known to the hardware, in its trays,
    used by no other instance and as many as its shape runs on."""
    problems: list[tuple[tuple, str, str, str]] = []
    tray_of: dict[str, str] = {}
    for n, group in enumerate(plan.hardware.groups):
        for t, tray in enumerate(group.hardware.trays):
            for k, gpu in enumerate(tray.gpus):
                if tray_of.setdefault(gpu, tray.id) != tray.id:
                    problems.append((("hardware", "groups", n, "hardware", "trays", t, "gpus", k),
                                     "GPU ids unique", f"{gpu} a second time", EDITED))
    groups = {g.name for g in plan.hardware.groups} if plan.mixed else set()
    ids: dict[str, int] = {}
    owner: dict[str, str] = {}
    for n, i in enumerate(plan.instances):
        at = ("instances", n)
        problems += _identity_problems(at, i, ids, groups)
        problems += _gpu_problems(at, i, tray_of, owner)
        problems += _rank_group_problems(plan, at, i, tray_of)
    return problems


def _identity_problems(at: tuple, i: Instance, ids: dict[str, int], groups: set[str]
                       ) -> list[tuple[tuple, str, str, str]]:
    """The instance's id (of its role, once), shape, group and workload name."""
    problems: list[tuple[tuple, str, str, str]] = []
    iid = parse_instance(i.id)
    if iid is None or iid.role != i.role:
        problems.append(((*at, "id"), f"`{i.role}-NN` (its role, a number)", repr(i.id),
                         EDITED))
    if i.id in ids:
        problems.append(((*at, "id"), "each instance id once",
                         f"{i.id} again (instances[{ids[i.id]}] has it)",
                         "two instances would share one launch folder; give one a new id"))
    ids.setdefault(i.id, at[1])
    shape = parse_shape(i.shape)
    if shape is None:
        problems.append(((*at, "shape"), "an engine shape (DEP8, TP8, TP8EP8, TP4PP2)",
                         repr(i.shape), EDITED))
    elif (shape.gpus, shape.dp, shape.tp, shape.ep, shape.pp) != (
            len(i.gpus), i.dp, i.tp, i.ep, i.pp):
        problems.append(((*at, "shape"), f"{shape.gpus} GPUs, dp {shape.dp}, tp {shape.tp}, "
                         f"ep {shape.ep}, pp {shape.pp} (its shape {i.shape})",
                         f"{len(i.gpus)} GPUs, dp {i.dp}, tp {i.tp}, ep {i.ep}, pp {i.pp}",
                         EDITED))
    if i.group is not None and i.group not in groups:
        problems.append(((*at, "group"), "a group of the plan's fleet" if groups
                         else "no group (a one-system plan)", repr(i.group), EDITED))
    expected = workload_name(i.id, i.shape)
    if i.workload != expected:
        problems.append(((*at, "workload"), f"{expected} (its id and shape)",
                         repr(i.workload), EDITED))
    return problems


def _gpu_problems(at: tuple, i: Instance, tray_of: dict[str, str], owner: dict[str, str]
                  ) -> list[tuple[tuple, str, str, str]]:
    """The instance's GPUs: of the hardware, of no other instance, in its trays."""
    problems: list[tuple[tuple, str, str, str]] = []
    for k, gpu in enumerate(i.gpus):
        if gpu not in tray_of:
            problems.append(((*at, "gpus", k), "a GPU of hardware.trays", repr(gpu),
                             "the plan's hardware has no such GPU"))
        elif gpu in owner:
            problems.append(((*at, "gpus", k), "a GPU of one instance",
                             f"{gpu}, also {owner[gpu]}'s", EDITED))
        owner.setdefault(gpu, i.id)
    trays = sorted({tray_of[g] for g in i.gpus if g in tray_of}, key=natural)
    if sorted(i.trays, key=natural) != trays:
        problems.append(((*at, "trays"), f"the trays of its GPUs ({', '.join(trays)})",
                         ", ".join(i.trays) or "none", EDITED))
    return problems


def _rank_group_problems(plan: Plan, at: tuple, i: Instance, tray_of: dict[str, str]
                         ) -> list[tuple[tuple, str, str, str]]:
    """The rank groups cover the instance's GPUs in rank order, one per tray, on the tray's
    node and CUDA indices (compiler.deploy made them so)."""
    first, out = 0, []
    if [g for r in i.rank_groups for g in r.gpus] != i.gpus:
        return [((*at, "rank_groups"), "its GPUs in rank order, one group per tray",
                 f"{len(i.rank_groups)} groups over other GPUs", EDITED)]
    for k, r in enumerate(i.rank_groups):
        tray = plan.tray(tray_of[r.gpus[0]]) if r.gpus and r.gpus[0] in tray_of else None
        if (tray is None or r.index != k or r.first_rank != first or r.tray != tray.id
                or r.node_name != tray.node_name
                or r.cuda_devices != [tray.gpus.index(g) if g in tray.gpus else -1
                                      for g in r.gpus]):
            out.append(((*at, "rank_groups", k), "node rank, tray, node name, CUDA indices and "
                        "first rank of its GPUs", f"{r.tray} {r.node_name} {r.cuda_devices}",
                        EDITED))
        first += len(r.gpus)
    return out


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

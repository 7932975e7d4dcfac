"""The engine capability contract: what the pinned vLLM, Dynamo and Mooncake can run, each fact
with the engine source it was read from (`catalog/engines/*.yaml`)."""

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")
Family = Literal["blackwell", "hopper", "any"]
ExpertFormat = Literal["mxfp4", "nvfp4", "fp8", "bf16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fact(_Strict, Generic[T]):
    value: T
    source: str = Field(min_length=3, description="Engine file (and symbol), or 'assumed: why'")


class AttentionPick(_Strict):
    match: str  # an architecture, or an attention kind: sparse_mla | mla | gqa
    blackwell: str
    hopper: str
    source: str = Field(min_length=3)


class Attention(_Strict):
    select: list[AttentionPick]
    kernel_block_sizes: dict[str, Fact[list[int]]]
    dense_mla_prefill_blackwell: Fact[dict[str, str]]
    dense_mla_prefill_fp8_kv: Fact[dict[str, str]]
    default_block_size: Fact[int]
    hybrid_mla_block: Fact[int]  # a hybrid MLA model's raised block is a multiple of it


class MoePick(_Strict):
    family: Family
    format: ExpertFormat
    layout: Literal["standard", "batched", "any"]
    value: str
    source: str = Field(min_length=3)


class Moe(_Strict):
    fp4_format: dict[str, Fact[Literal["mxfp4", "nvfp4"]]]
    fp4_format_default: Fact[Literal["mxfp4", "nvfp4"]]
    accepts: dict[str, Fact[list[str]]]
    batched: dict[str, Fact[list[str]]]
    prefer: list[MoePick]
    weight_only: Fact[list[str]]
    draft_inherits: Fact[bool]


class LinearPick(_Strict):
    family: Family
    dtype: str
    value: str
    source: str = Field(min_length=3)


class Linear(_Strict):
    backends: Fact[list[str]]  # the --linear-backend names the release's parser takes
    prefer: list[LinearPick]


class All2All(_Strict):
    backends: Fact[list[str]]  # the --all2all-backend names the release's parser takes
    decode: Fact[str]
    prefill_one_node: Fact[str]
    prefill_multi_node_nvlink: Fact[str]
    prefill_multi_node_rdma: Fact[str]
    multi_node_nvlink_env: dict[str, Fact[dict[str, str]]]
    batched_layout: Fact[list[str]]


class EngineMemory(_Strict):
    nixl_gib: Fact[float]
    redundancy_gib: Fact[float]
    deepep_nvl_gib: Fact[float]
    deepep_rdma_gib: Fact[float]
    deepep_ll_rdma_gib: Fact[float]


class Engram(_Strict):
    shard_across_instances: Fact[bool]
    host_copy_per_node: Fact[bool]


class KvConnectors(_Strict):
    disaggregated: Fact[str]
    disaggregated_pipelined: Fact[str]
    store: Fact[str]
    combine: Fact[str]
    env: dict[str, Fact[list[str]]]


class Pipeline(_Strict):
    flag: Fact[str]
    architectures: Fact[list[str]]
    with_data_parallel: Fact[bool]
    in_flight_batches: Fact[str]
    stage_tensors: Fact[int]
    stage_send: Fact[str]
    layer_split: Fact[str]
    dual_batch_overlap: Fact[bool]
    multi_node: Fact[list[str]]
    kv_transfer_full_attention_only: Fact[bool]
    store_connector: Fact[str]
    hybrid_kv_architectures: Fact[list[str]]


class Offload(_Strict):
    """Weight offload: the backends the release runs, what they offload and how a forward
    pass reaches the offloaded weights (compiler/offload.py, compiler/perf/offload.py)."""

    backends: Fact[list[Literal["uva", "prefetch"]]]
    wrapped: Fact[str]  # the modules the offloaders see: the decoder layers
    towers: dict[Literal["uva", "prefetch"], Fact[bool]]  # the backend offloads towers too
    uva_reads: Fact[str]
    prefetch_layers: Fact[str]
    prefetch_schedule: Fact[str]
    prefetch_join: Fact[str]
    prefetch_buffers: Fact[str]


class SpeculativeOptions(_Strict):
    """Extra --speculative-config keys per draft method (the engine's defaults otherwise)."""

    options: dict[str, Fact[dict[str, str | bool]]]


class ModelNeeds(_Strict):
    """What the release needs to serve one architecture beyond what its attention kind and
    experts ask for."""

    block_sizes: Fact[list[int]] | None = None  # kernel blocks its own attention layers read
    flags: Fact[list[str]] | None = None  # flags every engine serving it takes


class Vllm(_Strict):
    name: Literal["vllm"]
    version: str
    attention: Attention
    moe: Moe
    linear: Linear
    speculative: SpeculativeOptions
    all2all: All2All
    memory: EngineMemory
    engram: Engram
    kv_connectors: KvConnectors
    pipeline: Pipeline
    offload: Offload
    models: dict[str, ModelNeeds] = Field(default_factory=dict)  # by architecture


class Router(_Strict):
    block_size_matches_worker: Fact[bool]


class Graph(_Strict):
    max_components: Fact[int]


class RuntimeImage(_Strict):
    repository: Fact[str]
    vllm: Fact[str]


class Worker(_Strict):
    vllm: Fact[str]
    import_check: Fact[str]
    kv_connector_protocols: Fact[list[str]]
    multi_connector_wrappers: Fact[list[str]]


class Dynamo(_Strict):
    name: Literal["dynamo"]
    version: str
    router: Router
    graph: Graph
    runtime_image: RuntimeImage
    worker: Worker


class Store(_Strict):
    hbm_segment: Fact[bool]
    local_buffer_gib: Fact[float]


class Wheel(_Strict):
    cuda12: Fact[str]
    cuda13: Fact[str]


class Mooncake(_Strict):
    name: Literal["mooncake"]
    version: str
    store: Store
    wheel: Wheel


def release_of(version: str) -> str:
    """A vLLM version's release key: `0.31.0` -> `0.31`."""
    return ".".join(version.split(".")[:2])


class Engines(_Strict):
    """The pinned engines the targets emit for: `vllm` is the release the plan's kernels are
    chosen for (serving.vllm_version), `vllm_releases` every release with a fact set (the one
    Dynamo's worker imports among them)."""

    vllm: Vllm
    vllm_releases: dict[str, Vllm]
    dynamo: Dynamo
    mooncake: Mooncake

    def release(self, version: str) -> Vllm | None:
        """The fact set of the vLLM release `version` belongs to (None: rackc has none)."""
        return self.vllm_releases.get(release_of(version))

"""`Deployment.spec.site`: what the cluster decides, not the compiler. Images, the RDMA device
plugin, where the checkpoint is cached, secrets, scheduling and host-side sizing. Every field has
a default that deploys on a stock cluster with the NVIDIA GPU operator and DRA driver; the
README's "Site" section says where each default comes from."""

from typing import Annotated, Literal

from pydantic import Field, model_validator

from schemas.base import PATH_MAX, LabelKey, LabelValue, Name, StrictModel, bounded, positive

IMAGE = (r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
         r"((:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})(@sha256:[a-f0-9]{64})?|@sha256:[a-f0-9]{64})$")
IMAGE_MAX = 512
SEMVER = r"^(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})$"
# Extended resource names: `<domain>/<name>` (rdma/ib, nvidia.com/cx8_sriov, ...).
RESOURCE_NAME = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)"
                 r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
HCA = r"^[A-Za-z0-9_]+(:[0-9]+)?$"
ABSOLUTE_PATH = r"^(/[A-Za-z0-9._-]+)+/?$"
HcaName = Annotated[str, Field(max_length=64, pattern=HCA)]


class Images(StrictModel):
    dynamo: str = Field(
        "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1", max_length=IMAGE_MAX, pattern=IMAGE,
        description="Dynamo's vLLM runtime image: the DGD's workers and frontend. It must hold "
                    "the vLLM its Dynamo release imports (1.6.1: vLLM 0.31.0, which the stock "
                    "image ships); the workers get that release's flags")
    vllm: str = Field(
        "vllm/vllm-openai:v0.33.0", max_length=IMAGE_MAX, pattern=IMAGE,
        description="A plain vLLM image: the vllm/ scripts, lws/ and the Mooncake master (the "
                    "MooncakeStoreConnector's mooncake-transfer-engine ships mooncake_master)")
    dynamo_version: Literal["1.6.1"] = Field(
        "1.6.1", description="The Dynamo release of the operator and of the runtime image")
    runtime_version_override: str | None = Field(
        None, pattern=SEMVER,
        description="DGD components' runtimeVersionOverride; default: dynamo_version when the "
                    "dynamo image's tag is not that version")
    router: str | None = Field(
        None, max_length=IMAGE_MAX, pattern=IMAGE,
        description="An image with vllm-router (PyPI vllm-router; none is published): lws/ "
                    "fronts P/D engines with it, and is not emitted for a P/D plan without "
                    "it (its decode engines would prefill every request themselves)")


class Rdma(StrictModel):
    transport: Literal["rdma", "tcp"] = Field(
        "rdma", description="KV transfer and the Mooncake pool; tcp only if the site has no RDMA")
    resource: str = Field(
        "rdma/ib", max_length=253, pattern=RESOURCE_NAME,
        description="The RDMA device plugin's extended resource (Dynamo's wide-EP recipes and "
                    "llm-d use rdma/ib; SR-IOV sites name theirs, e.g. nvidia.com/cx8_sriov)")
    hca_names: list[HcaName] = Field(
        default_factory=list, max_length=64,
        description="HCAs every engine pod sees (mlx5_0, ...): Mooncake device_name and "
                    "UCX_NET_DEVICES; empty: each discovers its own (right when the device "
                    "plugin hands each pod a subset)")


class ModelCache(StrictModel):
    """Exactly one of `pvc` (an existing ReadWriteMany claim) or `host_path` (a directory on
    every node); default: a host path, filled once per node."""

    pvc: Name | None = Field(None, description="An existing ReadWriteMany PVC for the HF cache")
    host_path: str | None = Field(None, max_length=PATH_MAX, pattern=ABSOLUTE_PATH,
                                  description="Default /var/cache/rackc/huggingface")
    mount_path: str = Field("/models", max_length=PATH_MAX, pattern=ABSOLUTE_PATH)
    download_gbytes_per_s: Annotated[float, positive(1000.0)] = Field(
        0.5, description="Hub download rate for the first fill (assumed)")
    read_gbytes_per_s: Annotated[float, positive(10000.0)] = Field(
        2.0, description="Aggregate read rate of the cache storage (assumed)")
    engine_ready_timeout_s: Annotated[int, bounded(7 * 86400)] | None = Field(
        None, description="VLLM_ENGINE_READY_TIMEOUT_S; default: derived from the checkpoint "
                          "size and the two rates")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelCache":
        if self.pvc and self.host_path:
            raise ValueError("give either pvc or host_path, not both")
        return self


class Toleration(StrictModel):
    key: LabelKey
    operator: Literal["Exists", "Equal"] = "Exists"
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class Scheduling(StrictModel):
    hostnames_equal_node_names: bool = Field(
        False, description="Pin by the kubernetes.io/hostname label (true) or by node name "
                           "(metadata.name field selectors, always exact)")
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration(key="nvidia.com/gpu", effect="NoSchedule")],
        max_length=64,
        description="Tolerations of GPU pods (default: the GPU operator's nvidia.com/gpu taint)")
    priority_class: Name | None = None
    cpu_arch: Literal["amd64", "arm64"] | None = Field(
        None, description="kubernetes.io/arch of the pods without GPUs (frontend, Mooncake "
                          "master, router); default: any, their images being multi-arch. They "
                          "keep off the rack's trays either way")


class HostSizing(StrictModel):
    """Engine pods' CPU and /dev/shm (their memory is the plan's host budget), and the share of
    each tray's memory that pods cannot have."""

    cpu_per_gpu: Annotated[int, bounded(1024)] = Field(
        8, description="Cores per GPU rank (assumed)")
    shm_gib: Annotated[float, positive(65536.0)] = Field(
        8.0, description="/dev/shm besides shared Engram tables (the Dynamo operator's default)")
    reserved_gib_per_tray: Annotated[float, positive(65536.0)] | None = Field(
        None, description="Host memory of a tray the scheduler does not give to pods: its "
                          "capacity less its allocatable (kube-reserved, system-reserved, the "
                          "eviction threshold) less what the GPU nodes' DaemonSets request "
                          "(GPU operator, DRA driver, IMEX, network operator). The host budget "
                          "fits engine pods and pool segments in the rest; default: 10% of "
                          "the tray's DRAM, at least 32 GiB (assumed)")


class Secrets(StrictModel):
    hf_token: Name | None = Field(
        None, description="A Secret with key HF_TOKEN, for gated checkpoints (public: none)")


class Site(StrictModel):
    images: Images = Images()
    rdma: Rdma = Rdma()
    model_cache: ModelCache = ModelCache()
    secrets: Secrets = Secrets()
    scheduling: Scheduling = Scheduling()
    host: HostSizing = HostSizing()

"""The hardware catalog's contract: every number is a `Sourced` value that says where it is from."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Sourced(_Strict):
    value: float
    source: str = Field(min_length=3, description="Where the number is from, or 'assumed: why'")


class SourcedShapes(_Strict):
    value: list[str]
    source: str = Field(min_length=3)


class EngineShapes(_Strict):
    """The engine shapes the serving system runs on this hardware, per role; the solver
    searches these (a deployment may name others in objective.shapes)."""

    prefill: SourcedShapes
    decode: SourcedShapes
    latency: SourcedShapes


class Tflops(_Strict):
    fp4: Sourced
    fp8: Sourced
    bf16: Sourced


class Gpu(_Strict):
    name: str
    family: Literal["hopper", "blackwell", "rubin"]
    hbm_gib: Sourced
    memory_domains: Sourced
    sm_count: Sourced
    sms_per_domain: Sourced
    hbm_tbytes_per_s: Sourced
    hbm_interleaved_factor: Sourced = Field(description="Share of full bandwidth, interleaved")
    hbm_remote_factor: Sourced = Field(description="Share of full bandwidth, other domain")
    tflops: Tflops
    nvlink_gbytes_per_s: Sourced = Field(description="Per direction")
    c2c_gbytes_per_s: Sourced = Field(description="GPU to its CPU, per direction")
    exp_tera_per_s: Sourced = Field(
        description="Exponentials per second (10^12) the special function units compute "
                    "(MUFU.EX2, softmax)")
    power_w: Sourced


class Tray(_Strict):
    gpus: Sourced
    cpus: Sourced
    cpu_name: str
    dram_gib: Sourced
    dram_tbytes_per_s: Sourced
    nic_gbps_per_gpu: Sourced


class RackShape(_Strict):
    trays: Sourced
    nvlink_domain_gpus: Sourced


class Latency(_Strict):
    mem_op_us: Sourced
    p2p_us: Sourced
    inter_rack_us: Sourced
    cross_tray_allreduce_us: Sourced


class Reserve(_Strict):
    runtime_gib: Sourced
    nccl_gib: Sourced


class System(_Strict):
    """One catalog system. `form` nvl72: a rack of trays is one NVLink domain; hgx: each node is."""

    name: str
    description: str
    form: Literal["nvl72", "hgx"]
    arch: Literal["arm64", "amd64"]
    gpu: Gpu
    tray: Tray
    rack: RackShape
    latency: Latency
    reserve: Reserve
    engine_shapes: EngineShapes | None = None

    @property
    def gpus_per_tray(self) -> int:
        return int(self.tray.gpus.value)

    @property
    def domains_per_gpu(self) -> int:
        return int(self.gpu.memory_domains.value)

    @property
    def hbm_gib_per_domain(self) -> float:
        return self.gpu.hbm_gib.value / self.domains_per_gpu

    def tflops(self, dtype: str) -> float:
        return float(getattr(self.gpu.tflops, dtype).value)

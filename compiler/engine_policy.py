"""The engine policy of one instance: what vLLM runs for its role, shape and trays.

The dispatch (all-to-all) backend and the environment it needs, the MoE kernels for the
checkpoint's expert format and the dispatch's activation layout, the KV connectors and the
buffers DeepEP allocates. One place: `lower` records each instance's policy on the Instance;
the memory budget and the perf model ask the same function of a candidate shape before any
instance exists; a Dynamo worker's other vLLM release asks it with that release's facts
(compiler.engine_releases).
"""

from dataclasses import dataclass

from compiler.catalog.engine import Vllm
from compiler.catalog.system import System
from compiler.choice import BLACKWELL_FAMILY, CAPABILITY, Choice
from compiler.resolve import Resolved, is_multi_node_nvlink, nodes_of
from compiler.shapes import Shape


@dataclass(frozen=True)
class EnginePolicy:
    all2all: Choice[str] | None  # None: no DP+EP dispatch
    env: Choice[dict[str, str]]  # what the dispatch backend must be told
    moe_backend: Choice[str | None]  # None: vLLM's own choice (or no experts)
    batched_experts: bool  # the experts see the dispatch's batched activation layout
    weight_only: bool  # the MoE kernel dequantises to BF16 and computes there
    buffers_gib: float  # DeepEP's buffers, inside the engine's memory budget

    @property
    def all2all_backend(self) -> str | None:
        return self.all2all.value if self.all2all else None


def of(inputs, role: str, shape: Shape) -> EnginePolicy:
    """`of_shape` for the inputs of one compile (compiler.load.Inputs)."""
    return of_shape(inputs.resolved, inputs.system, inputs.model.spec.moe is not None, role,
                    shape)


def of_shape(r: Resolved, system: System, moe: bool, role: str, shape: Shape) -> EnginePolicy:
    """The policy of an instance of `shape` in `role`, on the trays placement gives it (whole
    trays once it outgrows one: compiler.resolve.nodes_of)."""
    vllm, nodes = r.engines.vllm, nodes_of(shape, system)
    multi = is_multi_node_nvlink(system, nodes)
    a2a = all2all(vllm, role, nodes, multi) if shape.dp > 1 and shape.ep > 1 else None
    backend = a2a.value if a2a else None
    kernels = moe_backend(vllm, r.expert_format.value, moe, system.gpu.family, backend)
    return EnginePolicy(
        all2all=a2a, env=all2all_env(vllm, backend, nodes, multi), moe_backend=kernels,
        batched_experts=batched(vllm, backend),
        weight_only=kernels.value in vllm.moe.weight_only.value,
        buffers_gib=engine_buffers_gib(vllm, backend, nodes))


def all2all(vllm: Vllm, role: str, nodes: int, multi_node_nvlink: bool) -> Choice[str]:
    """The DP+EP dispatch backend of an instance spanning `nodes` trays."""
    a = vllm.all2all
    if role == "decode":
        fact, why = a.decode, "decode dispatch"
    elif nodes == 1:
        fact, why = a.prefill_one_node, "prefill inside one node"
    elif multi_node_nvlink:
        fact, why = a.prefill_multi_node_nvlink, "prefill across trays of one NVLink domain"
    else:
        fact, why = a.prefill_multi_node_rdma, "prefill across nodes over RDMA"
    return Choice("all2all_backend", fact.value, "catalog", f"{why} ({fact.source})")


def all2all_env(vllm: Vllm, backend: str | None, nodes: int, multi_node_nvlink: bool
                ) -> Choice[dict[str, str]]:
    env = vllm.all2all.multi_node_nvlink_env.get(backend) if backend else None
    if env is None or nodes == 1 or not multi_node_nvlink:
        return Choice("env", {}, "catalog", "no extra environment")
    return Choice("env", dict(env.value), CAPABILITY,
                  f"{backend} across trays must be told to use MNNVL ({env.source})")


def batched(vllm: Vllm, backend: str | None) -> bool:
    return backend in vllm.all2all.batched_layout.value


def moe_backend(vllm: Vllm, fmt: str, moe: bool, family: str, backend: str | None
                ) -> Choice[str | None]:
    """The expert kernels for the checkpoint's format `fmt` and the dispatch's layout."""
    if not moe or fmt == "bf16":
        return Choice("moe_backend", None, "default", "vLLM's own choice for BF16 experts")
    m = vllm.moe
    layout = "batched" if batched(vllm, backend) else "standard"
    fam = "blackwell" if family in BLACKWELL_FAMILY else "hopper"
    for pick in m.prefer:
        if pick.family in (fam, "any") and pick.format == fmt \
                and pick.layout in (layout, "any") \
                and moe_accepts(vllm, fmt, pick.value, layout == "batched"):
            fallback = fmt == "mxfp4" and fam == "blackwell"
            why = (f"{fmt} experts, {layout} activations ({pick.source})"
                   + ("; SYSTEM.md's NVFP4 flashinfer_cutedsl does not load MXFP4 ("
                      f"{m.accepts[fmt].source})" if fallback else ""))
            return Choice("moe_backend", pick.value, CAPABILITY if fallback else "catalog", why)
    return Choice("moe_backend", None, "default",
                  f"no listed backend for {fmt} {layout} experts on {family}: vLLM picks")


def moe_accepts(vllm: Vllm, fmt: str, backend: str, batched_layout: bool) -> bool:
    """Does `--moe-backend backend` load `fmt` experts (in the batched layout, if asked)?"""
    accepts, layouts = vllm.moe.accepts.get(fmt), vllm.moe.batched.get(fmt)
    return bool(accepts and backend in accepts.value
                and (not batched_layout or (layouts and backend in layouts.value)))


def kv_connectors(vllm: Vllm, role: str, pool: bool, pipelined: bool = False
                  ) -> Choice[list[str]]:
    """P/D instances hand KV over with NIXL (by push, all of them, where a prefill is
    `pipelined`); with the `pool`, the Mooncake store rides along (MultiConnector); aggregated
    ones only use the store."""
    c = vllm.kv_connectors
    chosen = []
    if role in ("prefill", "decode"):
        chosen.append(c.disaggregated_pipelined if pipelined else c.disaggregated)
    if pool:
        chosen.append(c.store)
    names = [f.value for f in chosen]
    why = "; ".join(f.source for f in chosen) or "no P/D hand-off and no pool"
    if len(chosen) > 1:
        why += f"; together in {c.combine.value} ({c.combine.source})"
    return Choice("kv_connectors", names, "catalog", why)


def connector_env(vllm: Vllm, connectors: list[str]) -> list[str]:
    """The environment variables the connectors read (the targets set them)."""
    env = vllm.kv_connectors.env
    return sorted({v for n in connectors if n in env for v in env[n].value})


def engine_buffers_gib(vllm: Vllm, backend: str | None, nodes: int) -> float:
    """DeepEP's buffers, allocated inside the engine's budget before the profile run."""
    mem = vllm.memory
    if backend == "deepep_low_latency":
        return mem.deepep_nvl_gib.value + mem.deepep_ll_rdma_gib.value
    if backend == "deepep_high_throughput":
        return mem.deepep_nvl_gib.value + (mem.deepep_rdma_gib.value if nodes > 1 else 0.0)
    return 0.0

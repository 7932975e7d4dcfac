"""Pass 2, the engine's part: the kernels, block size, expert and linear formats and the
fallbacks the pinned vLLM runs for a model on a system, each a Choice with its source in the
engine catalog (compiler/catalog/engines/), read by compiler.resolve alone. The block a hybrid
model's engines run depends on their TP: `served_block` takes the instances' (through
`Resolved.block_for`), and `rackc validate` checks emitted flags by `hybrid_block`."""

from collections.abc import Iterable
from math import lcm

from compiler import arch
from compiler.catalog.engine import Engines, Vllm
from compiler.catalog.system import System
from compiler.choice import BLACKWELL_FAMILY, CAPABILITY, Choice
from compiler.plan import HybridBlock
from schemas import ModelV1
from schemas.model import ModelSpec


def attention(e: Engines, architecture: str, kind: str, sparse: bool,
               family: str) -> Choice[str]:
    key = "sparse_mla" if kind == "mla" and sparse else ("mla" if kind == "mla" else "gqa")
    picks = {p.match: p for p in e.vllm.attention.select}
    pick = picks.get(architecture) or picks[key]
    value = pick.blackwell if family in BLACKWELL_FAMILY else pick.hopper
    return Choice("serving.attention_backend", value, "catalog", pick.source)


def attention_options(e: Engines, kind: str, sparse: bool, family: str,
                       kv_dtype: str) -> Choice[dict[str, str]]:
    a = e.vllm.attention
    if kind != "mla" or sparse or family not in BLACKWELL_FAMILY:
        return Choice("serving.attention_options", {}, "default",
                      "only dense MLA on Blackwell takes the TRT-LLM ragged prefill")
    facts = [a.dense_mla_prefill_blackwell] + ([a.dense_mla_prefill_fp8_kv]
                                               if kv_dtype == "fp8" else [])
    return Choice("serving.attention_options", {k: v for f in facts for k, v in f.value.items()},
                  "catalog", "; ".join(f.source for f in facts))


def block_size(e: Engines, backend: str, architecture: str, given: int | None) -> Choice[int]:
    """The KV block: a multiple of the attention backend's kernel block (vLLM refuses others),
    or of the architecture's own attention layers' where it has some (MiniMax M3's MSA).
    The user's value is checked in load (check_block_size)."""
    needs = e.vllm.models.get(architecture)
    if given is not None:
        return Choice("serving.block_size", given, "user", "written in the deployment")
    if needs and needs.block_sizes:
        return Choice("serving.block_size", max(64, min(needs.block_sizes.value)),
                      "rule:kernel-block", f"{architecture}'s attention kernel block "
                      f"({needs.block_sizes.source}), at least 64 tokens for the KV router's "
                      "prefix hashing")
    kernel = e.vllm.attention.kernel_block_sizes.get(backend)
    if kernel is None:
        d = e.vllm.attention.default_block_size
        return Choice("serving.block_size", d.value, "default", d.source)
    return Choice("serving.block_size", max(64, min(kernel.value)), "rule:kernel-block",
                  f"{backend}'s kernel block ({kernel.source}), at least 64 tokens for the KV "
                  "router's prefix hashing")


def hybrid_facts(vllm: Vllm, spec: ModelSpec, backend: str, kv_dtype: str,
                 draft_tokens: int) -> HybridBlock | None:
    """What `vllm` sizes the KV block of a model with linear-attention state by (None: a model
    without): the state and attention page of one layer, and the kernels' alignment."""
    if not spec.linear_attention:
        return None
    needs = vllm.models.get(spec.architecture)
    kernels = [k for k in (needs and needs.block_sizes,
                           vllm.attention.kernel_block_sizes.get(backend)) if k]
    kernel = lcm(*(min(k.value) for k in kernels))  # 1 where no kernel is listed (any size)
    page, heads = arch.attention_page(spec, kv_dtype)
    mla = vllm.attention.hybrid_mla_block
    return HybridBlock(
        state_bytes=arch.linear_state_bytes_per_layer(spec, draft_tokens), page_bytes=page,
        kv_heads=heads, alignment=max(kernel, mla.value if spec.attention.kind == "mla" else 1),
        kernel_block=kernel, source=mla.source)


def hybrid_block(h: HybridBlock, tp: int, given: int) -> int:
    """The KV block vLLM runs for an instance of `tp` ranks per DP rank started with
    `--block-size given`: `given` when its attention page holds one request's state of a
    linear-attention layer on a rank, else the least aligned block that does (h.source)."""
    page = h.page_bytes * max(1, h.kv_heads // tp)
    state = h.state_bytes // tp
    align = max(h.alignment, given)
    raised = align * -(-state // (align * page))
    raised = h.kernel_block * -(-raised // h.kernel_block)
    return max(given, raised)


def served_block(base: Choice[int], h: HybridBlock | None, tps: Iterable[int]
                 ) -> Choice[int]:
    """The one KV block every engine runs and the router hashes in: `base` (the kernel's, or
    the user's), raised as vLLM raises a hybrid model's for its instances of smallest TP (the
    most state per rank). vLLM keeps a given block whose page already holds the state, so with
    it every instance, whatever its TP, runs the same block."""
    if h is None:
        return base
    need = {tp: hybrid_block(h, tp, base.value) for tp in sorted(set(tps))}
    block = max(need.values(), default=base.value)
    if block == base.value:
        return base
    each = ", ".join(f"TP{tp} {b}" for tp, b in need.items())
    return Choice("serving.block_size", block,
                  CAPABILITY if base.source == "user" else "rule:hybrid-block",
                  f"a request's linear-attention state must fit one KV block's attention page "
                  f"of each layer, so vLLM raises --block-size {base.value} to "
                  f"{each} tokens; every engine is given {block}, which vLLM keeps at each TP, "
                  f"and the router hashes prompts in it ({h.source})")


def model_flags(e: Engines, architecture: str) -> Choice[list[str]] | None:
    """Flags vLLM needs for this architecture whatever the deployment (None: none)."""
    needs = e.vllm.models.get(architecture)
    if not (needs and needs.flags):
        return None
    return Choice("serving.model_flags", list(needs.flags.value), "catalog", needs.flags.source)

def expert_format(e: Engines, model: ModelV1) -> Choice[str]:
    d = model.spec.dtypes.experts
    if d != "fp4":
        return Choice("model.expert_format", d, "catalog", "the model's expert dtype")
    fact = e.vllm.moe.fp4_format.get(model.spec.architecture, e.vllm.moe.fp4_format_default)
    return Choice("model.expert_format", fact.value, "catalog", fact.source)


def linear_format(spec) -> str:
    """The linears' checkpoint format: MXFP8 where FP8 weights carry microscaling scales."""
    return "mxfp8" if spec.dtypes.scales == "mx" and spec.dtypes.weights == "fp8" \
        else spec.dtypes.weights


def linear(e: Engines, dtype: str, family: str) -> Choice[str | None]:
    fam = "blackwell" if family in BLACKWELL_FAMILY else "hopper"
    for p in e.vllm.linear.prefer:
        if p.family in (fam, "any") and p.dtype == dtype:
            return Choice("serving.linear_backend", p.value, "catalog", p.source)
    return Choice("serving.linear_backend", None, "default", f"vLLM's choice for {dtype}")


def draft_moe(e: Engines, model: ModelV1, speculative: bool) -> Choice[str] | None:
    if not (speculative and model.spec.draft and model.spec.moe):
        return None
    fact = e.vllm.moe.draft_inherits
    if not fact.value:
        raise ValueError("catalog/engines/vllm-0.33.yaml: a draft that does not inherit "
                         "--moe-backend needs its own backend choice")
    return Choice("speculative.moe_backend", "inherits --moe-backend", "catalog",
                  f"the draft's experts load in the target's format, so each engine's "
                  f"--moe-backend fits them too ({fact.source})")


def engram_kind(model: ModelV1, placement: str) -> str:
    if not model.spec.engram:
        return "none"
    return "hbm" if placement == "hbm" else "host"


def engram_prefill(e: Engines, model: ModelV1, placement: str) -> Choice[str]:
    kind = engram_kind(model, placement)
    fact = e.vllm.engram.shard_across_instances
    if kind != "hbm":
        return Choice("engram.prefill", kind, "default", "no Engram, or placement dram")
    if fact.value:
        return Choice("engram.prefill", "hbm", "catalog",
                      f"peer group over prefill ({fact.source})")
    return Choice("engram.prefill", "host", CAPABILITY,
                  "SYSTEM.md shards the tables over every prefill GPU, but vLLM "
                  f"{e.vllm.version} cannot shard Engram across instances ({fact.source}): "
                  "prefill reads them from pinned host memory, one copy per node "
                  f"({e.vllm.engram.host_copy_per_node.source})")


def pool_hbm(e: Engines, wanted: bool) -> Choice[bool]:
    fact = e.mooncake.store.hbm_segment
    if not wanted:
        return Choice("kv_pool.hbm", False, "default", "no HBM pool asked for")
    if fact.value:
        return Choice("kv_pool.hbm", True, "user", "written in the deployment")
    return Choice("kv_pool.hbm", False, CAPABILITY,
                  f"Mooncake {e.mooncake.version} cannot take an HBM segment ({fact.source}): "
                  "the prefill ranks' spare HBM stays their own KV (prefix) cache")


def gpu_reserve(e: Engines, system: System, given: float | None) -> Choice[float]:
    if given is not None:
        return Choice("memory.reserved_gib", given, "user", "serving.gpu_reserve_gib, written "
                      "in the deployment")
    r = system.reserve
    value = r.runtime_gib.value + r.nccl_gib.value + e.vllm.memory.nixl_gib.value
    return Choice("memory.reserved_gib", round(value, 3), "catalog",
                  f"CUDA context ({r.runtime_gib.source}) + NCCL ({r.nccl_gib.source}) + NIXL "
                  f"({e.vllm.memory.nixl_gib.source}): in use before the engine's memory "
                  "snapshot, so outside --gpu-memory-utilization")

"""A role alone at a pinned operating point (phase-isolated), as published decode and prefill
results are measured: the other phase runs elsewhere, the batch and context are held fixed.

The figures are one step of the step model (compiler.perf.step) at that batch and context on
the group's own perf context, the one the serving model prices the layout with; nothing of
the serving model's closed loop (queueing, admission, the prefill-decode coupling, the KV
hand-off, the request's HTTP and tokenising work) enters. Memory comes from the one budget
(compiler.memory): the batch's KV at that context against the KV cache of one rank.
"""

from compiler.load import Inputs
from compiler.memory import requests_that_fit
from compiler.perf.serving import Group
from compiler.perf.step import decode_step, prefill_step
from compiler.resolve import PinnedPoint


def phase_alone(inputs: Inputs, point: PinnedPoint, g: Group) -> dict:
    """The fields of a plan `IsolatedPhase` for `point` on group `g` (its role and shape)."""
    most, budget = requests_that_fit(inputs, g.role, g.shape, g.ctx.engram_gpus,
                                     point.context_tokens)
    common = {"role": point.role, "shape": point.shape, "gpus": g.shape.gpus,
              "batch_per_rank": point.batch_per_rank, "context_tokens": point.context_tokens,
              "kv_gib_per_gpu": round(point.batch_per_rank
                                      * budget.request_kv_gib(point.context_tokens), 3),
              "kv_cache_gib_per_gpu": round(budget.kv_gib, 3), "max_batch_per_rank": most}
    if point.role == "decode":
        return {**common, **_decode(point, g)}
    return {**common, **_prefill(point, g)}


def _decode(point: PinnedPoint, g: Group) -> dict:
    """Each rank's batch verifies 1 + k tokens per request in one step and emits `acceptance`
    of them on average: TPOT is the step over that, ITL the step (one streamed chunk)."""
    st = decode_step(g.ctx, g.shape, point.batch_per_rank, point.context_tokens)
    per_user = 1e6 * g.ctx.acceptance / st.us
    per_instance = g.shape.dp * point.batch_per_rank * per_user
    return {"step_ms": round(st.us / 1e3, 3), "breakdown": st.rounded(),
            "tpot_ms": round(st.us / g.ctx.acceptance / 1e3, 3),
            "itl_ms": round(st.us / 1e3, 3), "tokens_per_s_per_user": round(per_user, 2),
            "output_tokens_per_s_per_instance": round(per_instance, 1),
            "output_tokens_per_s_per_gpu": round(per_instance / g.shape.gpus, 1)}


def _prefill(point: PinnedPoint, g: Group) -> dict:
    """Each rank prefills its prompts in one step of their uncached tokens, whose attention
    also spans the cached prefix; with pipeline stages a step enters every slowest-stage
    time and a prompt's first token also waits for the other stages (the fill)."""
    new, batch = point.new_tokens, point.batch_per_rank
    st = prefill_step(g.ctx, g.shape, batch * new, new, point.cached_tokens)
    prompts = g.shape.dp * batch * 1e6 / st.us  # per second, one instance
    return {"cached_tokens": point.cached_tokens, "step_ms": round(st.us / 1e3, 3),
            "breakdown": st.rounded(), "ttft_ms": round((st.us + st.fill_us) / 1e3, 3),
            "prompt_tokens_per_s_per_instance": round(prompts * point.context_tokens, 1),
            "prompt_tokens_per_s_per_gpu": round(prompts * point.context_tokens
                                                 / g.shape.gpus, 1),
            "computed_tokens_per_s_per_gpu": round(prompts * new / g.shape.gpus, 1)}

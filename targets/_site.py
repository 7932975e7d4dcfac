"""What the site's choices put into every engine's environment, whatever launches it."""

from compiler.plan import Plan


def cache_env(plan: Plan) -> dict[str, str]:
    """The Hugging Face cache inside the model cache volume, and an engine-ready timeout that
    covers a cold start from it (vLLM's default of 600 s does not)."""
    cache = plan.site.model_cache
    return {"HF_HOME": cache.hf_home,
            "VLLM_ENGINE_READY_TIMEOUT_S": str(cache.engine_ready_timeout_s)}

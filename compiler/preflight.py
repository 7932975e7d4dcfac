"""What a bundle needs from the site before it serves, that no input says and no object can
hold: the images the cluster must provide and what they must contain.

Read off the plan (pure); `rackc compile` prints each as a warning and the report lists them
under "Before you deploy". None of them stops a compile: the bundle is right, the site has to
supply its part.
"""

from dataclasses import dataclass

from compiler import catalog
from compiler.plan import Plan


@dataclass(frozen=True)
class Notice:
    path: str  # the input that settles it
    target: str  # the emitted folder it concerns
    problem: str
    hint: str

    def render(self) -> str:
        return f"warning[W901] {self.target}/ {self.path}: {self.problem}\n  hint: {self.hint}"


def _stock_runtime(image: str) -> bool:
    repository = catalog.engines().dynamo.runtime_image.repository.value
    return image.rsplit("@", 1)[0].rsplit(":", 1)[0] == repository


def notices(plan: Plan) -> list[Notice]:
    images, out = plan.site.images, []
    runtime_vllm = catalog.engines().dynamo.runtime_image.vllm
    if _stock_runtime(images.dynamo) and runtime_vllm.value != plan.serving.vllm_version:
        out.append(Notice(
            "site.images.dynamo", "k8s",
            f"{images.dynamo} runs vLLM {runtime_vllm.value} ({runtime_vllm.source}), but the "
            f"workers' flags and engine choices are vLLM {plan.serving.vllm_version}'s",
            f"name a Dynamo runtime image built with vLLM {plan.serving.vllm_version} "
            "(its tag gets runtimeVersionOverride), or check every flag against "
            f"{runtime_vllm.value}"))
    disaggregated = {i.role for i in plan.instances} >= {"prefill", "decode"}
    if disaggregated and images.router is None:
        out.append(Notice(
            "site.images.router", "lws",
            "a prefill/decode layout without a router: a request sent to the decode Service is "
            "prefilled by the decode engines, and the prefill instances stay idle",
            "set site.images.router to a vllm-router image, or serve through k8s/ (Dynamo's "
            "frontend routes P/D)"))
    if plan.kv_pool.enabled:
        out.append(Notice(
            "site.images.vllm", "k8s",
            f"the Mooncake master runs `mooncake_master` from {images.vllm}",
            "check that the image has it (`which mooncake_master`) and that the Dynamo runtime "
            "image has the `mooncake` Python package the store connector imports"))
    return out

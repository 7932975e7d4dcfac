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


def notices(plan: Plan) -> list[Notice]:
    images, out = plan.site.images, []
    dynamo = plan.site.engines["dynamo"]
    worker = catalog.engines().dynamo.worker
    if dynamo.refused:
        out.append(Notice(
            "serving", "k8s",
            f"not emitted (nor dynamo/): {dynamo.refused}",
            f"serve this plan from lws/ or vllm/ (vLLM {plan.serving.vllm_version} runs the "
            "push connector), or compile a prefill without pipeline stages for Dynamo"))
    elif dynamo.vllm != plan.serving.vllm_version:
        out.append(Notice(
            "site.images.dynamo", "k8s",
            f"the workers run vLLM {dynamo.vllm}, the release Dynamo {dynamo.dynamo} imports "
            f"({worker.vllm.source.split(';')[0]}); the plan's engine facts are vLLM "
            f"{plan.serving.vllm_version}'s, and the DGD's flags parse with {dynamo.vllm}'s "
            "parser (tests/conformance)",
            f"keep {images.dynamo} or another image with vLLM {dynamo.vllm}: one rebuilt with "
            f"vLLM {plan.serving.vllm_version} cannot import dynamo.vllm (it imports "
            "get_engine_zmq_addresses, which vLLM 0.33 renamed)"))
    disaggregated = {i.role for i in plan.instances} >= {"prefill", "decode"}
    if disaggregated and images.router is None:
        out.append(Notice(
            "site.images.router", "lws",
            "a prefill/decode layout without a router: a request sent to the decode Service is "
            "prefilled by the decode engines, and the prefill instances stay idle",
            "set site.images.router to a vllm-router image, or serve through k8s/ (Dynamo's "
            "frontend routes P/D)"))
    if plan.kv_pool.enabled:
        wheel = catalog.engines().mooncake.wheel
        out.append(Notice(
            "site.images.vllm", "k8s",
            f"the Mooncake master runs `mooncake_master` from {images.vllm}, and every engine "
            "image imports the `mooncake` package for the store connector",
            f"check that the images have them (`which mooncake_master`), built for the image's "
            f"CUDA: {wheel.cuda13.value} on CUDA 13 (Dynamo {dynamo.dynamo}'s runtime pins "
            f"nixl[cu13]), {wheel.cuda12.value} on CUDA 12 (its store.so needs "
            "libcudart.so.12)"))
    return out

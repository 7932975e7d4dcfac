"""A kustomize bundle: the shared objects (Namespace, Mooncake, ComputeDomains) plus a target's
workloads, one file per group, listed in install order in kustomization.yaml."""

from compiler.plan import Plan
from targets import _kube
from targets._components import Component
from targets._yaml import dump_documents, dump_yaml


def bundle(plan: Plan, folder: str, comps: tuple[Component, ...],
           workloads: tuple[str, list[dict] | str]) -> dict[str, str]:
    """`workloads`: the file name and objects (or their written text) of the target's own
    workloads."""
    groups = [
        ("namespace.yaml", [_kube.namespace(plan)]),
        ("mooncake.yaml", _kube.mooncake_bundle(plan)),
        ("compute-domains.yaml", _kube.compute_domains(plan, comps)),
        workloads,
    ]
    files = {name: docs if isinstance(docs, str) else dump_documents(docs)
             for name, docs in groups if docs}
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": list(files)}
    files["kustomization.yaml"] = dump_yaml(kustomization)
    return {f"{folder}/{name}": text for name, text in sorted(files.items())}

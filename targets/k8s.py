"""k8s: the kustomize bundle a user deploys with `kubectl apply -k OUT/k8s`: Namespace, the
Mooncake master and client configs, a ComputeDomain per NVLink domain (whose channel claim every
engine pod references) and the DynamoGraphDeployment."""

from compiler.plan import Plan
from targets._bundle import bundle
from targets._components import components
from targets.dynamo import graphs_text


def emit(plan: Plan) -> dict[str, str]:
    """Nothing for a plan Dynamo cannot serve (`site.engines.dynamo.refused`, a W901 warning)."""
    if plan.site.engines["dynamo"].refused:
        return {}
    return bundle(plan, "k8s", components(plan), ("dynamo-graph.yaml", graphs_text(plan)))

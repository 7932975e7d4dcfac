"""`rackc validate OUT`: check a compiled bundle the way a cluster would before it runs.

Two halves. `rules` holds the controller-level rules no schema can: what the DRA driver, the
scheduler, the kubelet and the engines decide between objects (pure; `rackc compile` runs it on
what it emits). The other modules need the `validate` extra (`pip install 'rackc[validate]'`):
kubernetes-validate for built-in kinds, the cluster's CRD schemas with their CEL rules for custom
resources, and `kubectl kustomize` for the bundles.
"""

"""Import the Kubernetes client (its typed models build the targets' objects) without the
optional validator its dynamic client looks for.

`import kubernetes` imports every subpackage, and `kubernetes.dynamic.client` tries `import
kubernetes_validate` (for `DynamicClient.validate`, which rackc never calls); where the
`validate` extra is installed that pulls in jsonschema and its format checkers, about a tenth
of a compile's CPU time. While the client is first imported `kubernetes_validate` is marked
absent (`sys.modules[name] = None`, which makes that import raise ImportError, as the client
expects when the package is not installed), then unmarked: `rackc validate`'s own
`import kubernetes_validate` (compiler/validate/kube.py) loads it as usual. Imported first by
targets/__init__.py; where either is already loaded, nothing is blocked.
"""

import sys

_OPTIONAL = "kubernetes_validate"

if "kubernetes" not in sys.modules and _OPTIONAL not in sys.modules:
    sys.modules[_OPTIONAL] = None  # type: ignore[assignment]
    try:
        import kubernetes.client  # noqa: F401
    finally:
        if sys.modules.get(_OPTIONAL, ...) is None:
            del sys.modules[_OPTIONAL]

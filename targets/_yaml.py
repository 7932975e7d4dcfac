"""The one canonical YAML and JSON writer of every target.

YAML: apiVersion, kind and metadata first, every other key sorted; block style; no aliases;
strings that YAML 1.1 readers (Kubernetes' go-yaml among them) take for booleans are quoted;
LF and a final newline. Several objects in one file follow Helm's install order, then custom
resources, each group by kind and name.
"""

import json
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import yaml

from compiler.documents import Documents

_FIRST_KEYS = ("apiVersion", "kind", "metadata")
# Helm's InstallOrder for the built-in kinds the targets emit; other kinds (custom resources)
# come after them.
_INSTALL_ORDER = ("Namespace", "ServiceAccount", "Secret", "ConfigMap", "PersistentVolumeClaim",
                  "Service", "DaemonSet", "Deployment", "StatefulSet", "Job")
# YAML 1.1 booleans that PyYAML's 1.1 resolver would leave unquoted (it knows only yes/no/
# true/false/on/off); go-yaml also reads y/n as booleans.
_YAML11_BOOL = re.compile(r"^(?:y|Y|n|N)$")


_NO_FOLDING = 1 << 20


if TYPE_CHECKING:
    from yaml import SafeDumper as _Base
else:  # libyaml's, where the yaml package was built with it
    _Base = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_Base):
    """libyaml's emitter when present (the goldens pin its output to the pure-Python one's)."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    if _YAML11_BOOL.match(value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="'")
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _represent_dict(dumper: yaml.SafeDumper, value: Mapping[str, Any]) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map",
                                    [(k, value[k]) for k in _key_order(value)])


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(dict, _represent_dict)


def dump_yaml(data: Any) -> str:
    """Long values stay on one line (no folding), so a changed flag is a one-line diff."""
    return yaml.dump(data, Dumper=_Dumper, default_flow_style=False, allow_unicode=True,
                     width=_NO_FOLDING, sort_keys=False)


def _install_key(doc: Mapping[str, Any]) -> tuple[int, str, str]:
    kind = doc["kind"]
    rank = _INSTALL_ORDER.index(kind) if kind in _INSTALL_ORDER else len(_INSTALL_ORDER)
    return rank, kind, doc["metadata"]["name"]


def _key_order(value: Mapping[str, Any]) -> list[str]:
    """The order keys are written in: apiVersion, kind, metadata first, the rest sorted."""
    first = [k for k in _FIRST_KEYS if k in value]
    return first + sorted(k for k in value if k not in _FIRST_KEYS)


def _as_written(data: Any) -> Any:
    """`data` as reading its YAML back gives it: mappings in written key order, sequences as
    lists (so a reader of the carried objects sees what a reader of the file sees)."""
    if isinstance(data, Mapping):
        return {k: _as_written(data[k]) for k in _key_order(data)}
    if isinstance(data, list | tuple):
        return [_as_written(x) for x in data]
    return data


def dump_documents(docs: Iterable[Mapping[str, Any]]) -> Documents:
    """Several Kubernetes objects in install order, `---` between them (the text, carrying
    the objects it was written from, as written: compiler.documents)."""
    ordered = sorted(docs, key=_install_key)
    return Documents([dump_yaml(doc) for doc in ordered], [_as_written(d) for d in ordered])


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def compact_json(data: Any) -> str:
    """JSON for a command-line value (vLLM's JSON-valued flags): one line, keys sorted."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))

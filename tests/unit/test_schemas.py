"""Exported JSON Schemas match the models; the models are strict."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from schemas import KINDS
from schemas.export import schema_files

JSON_DIR = Path(__file__).resolve().parents[2] / "schemas" / "json"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_json_schemas_have_not_drifted():
    files = schema_files()
    on_disk = {p.name: p.read_text() for p in JSON_DIR.glob("*.schema.json")}
    assert on_disk == files, "run: python -c 'from schemas.export import ...' (see README)"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*/*.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_examples_validate_against_exported_schema(path: Path):
    doc = yaml.safe_load(path.read_text())
    schema = json.loads((JSON_DIR / f"{doc['kind'].lower()}.schema.json").read_text())
    jsonschema.validate(doc, schema)


def test_models_forbid_unknown_keys_and_coercion():
    for model in KINDS.values():
        assert model.model_config["extra"] == "forbid"
        assert model.model_config["strict"] is True
        assert model.model_config["frozen"] is True


def test_cluster_takes_one_system_or_groups_of_systems():
    one = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "c"},
           "spec": {"system": "gb300-nvl72", "racks": 2}}
    assert KINDS["Cluster"].model_validate(one).spec.groups is None
    mixed = {**one, "spec": {"groups": [{"name": "a", "system": "gb300-nvl72", "racks": 1},
                                        {"name": "b", "system": "hgx-h200", "nodes": 4}]}}
    spec = KINDS["Cluster"].model_validate(mixed).spec
    assert spec.system is None and [g.name for g in spec.groups] == ["a", "b"]
    schema = json.loads((JSON_DIR / "cluster.schema.json").read_text())
    jsonschema.validate(mixed, schema)
    for bad in ({"system": "hgx-h200", "nodes": 4},  # a group needs its name
                {"name": "a", "system": "hgx-h200", "groups": []}):  # groups do not nest
        with pytest.raises(ValueError):
            KINDS["Cluster"].model_validate({**one, "spec": {"groups": [bad]}})
    with pytest.raises(ValueError):  # at least one group
        KINDS["Cluster"].model_validate({**one, "spec": {"groups": []}})

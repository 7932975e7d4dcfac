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

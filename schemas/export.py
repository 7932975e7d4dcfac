"""JSON Schema files for editors (yaml-language-server) and other tools, one per kind."""

import json

from schemas import KINDS


def schema_text(kind: str) -> str:
    schema = KINDS[kind].model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://rackc.dev/schemas/v1alpha1/{kind.lower()}.schema.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def schema_files() -> dict[str, str]:
    return {f"{kind.lower()}.schema.json": schema_text(kind) for kind in KINDS}

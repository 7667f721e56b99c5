"""JSON Schemas of the recipe and the RunPolicy, generated from the models.

They are checked in under ``schemas/`` so an editor (yaml-language-server)
completes and checks a recipe as it is typed; a test regenerates them and
fails when they drift. A number, boolean or choice may also be written as an
interpolation (``workers: ${vars.workers}``): the schema accepts a string
holding ``${...}`` there, since the loader checks the value after filling it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import Recipe

DRAFT = "https://json-schema.org/draft/2020-12/schema"
INTERPOLATION = {"type": "string", "pattern": r"\$\{[^}]+\}", "description": "An interpolation: ${vars.NAME} or ${env:NAME}."}
FILES = {"recipe.schema.json": Recipe, "run-policy.schema.json": RunPolicy}


class _Interpolatable(GenerateJsonSchema):
    """Pydantic's generator, with typed leaves that also accept an interpolation string."""

    def _or_interpolation(self, schema: JsonSchemaValue) -> JsonSchemaValue:
        return {"anyOf": [schema, dict(INTERPOLATION)]}

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        return self._or_interpolation(super().int_schema(schema))

    def float_schema(self, schema: core_schema.FloatSchema) -> JsonSchemaValue:
        return self._or_interpolation(super().float_schema(schema))

    def bool_schema(self, schema: core_schema.BoolSchema) -> JsonSchemaValue:
        return self._or_interpolation(super().bool_schema(schema))

    def literal_schema(self, schema: core_schema.LiteralSchema) -> JsonSchemaValue:
        plain = super().literal_schema(schema)
        if len(schema["expected"]) == 1:  # a constant (the format version) is written as is
            return plain
        return self._or_interpolation(plain)


def schema_of(model: type[Any], filename: str) -> dict[str, Any]:
    """The JSON Schema of ``model``, with ``$schema`` and a title an editor shows."""
    body = model.model_json_schema(schema_generator=_Interpolatable)
    return {"$schema": DRAFT, **body}


def schema_text(model: type[Any], filename: str) -> str:
    """Stable text of a schema file (fields in model order, so a diff reads like the models)."""
    return json.dumps(schema_of(model, filename), indent=2, ensure_ascii=False) + "\n"


def write_schemas(folder: str | Path) -> list[Path]:
    """Write every schema file into ``folder``; return the paths written."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, model in FILES.items():
        target = out / filename
        target.write_text(schema_text(model, filename), encoding="utf-8")
        written.append(target)
    return written

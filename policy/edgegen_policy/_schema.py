"""The policy file's JSON Schema, generated from the model the loader validates with.

pydantic's default generator describes the types a model *holds*; the loader is more
generous about what a file may *say*, and an editor that checks a file against a narrower
schema flags valid policies as wrong. This generator describes the loader's inputs instead,
so that every document the loader accepts passes the schema (the schema may accept more:
checks that need several fields at once stay in the model and in lint):

- a list of names may be one name (``methods: POST``): ``json_schema_input_type`` on the
  model's ``BeforeValidator`` says so, and pydantic's generator reads it;
- a duration may be a number of seconds (``timeout: 1``): ``Duration.JSON_SCHEMA``;
- booleans and whole numbers are read the way pydantic reads them outside strict mode
  (``"true"``, ``"on"``, ``1`` for a boolean; ``"5"`` for a number), which is also what a
  ``${VAR}`` reference becomes once expanded;
- any value with a fixed spelling (a pattern, an enum, a number, a boolean) may instead be a
  ``${VAR}`` reference, which the loader expands before validation.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

# The words pydantic reads as a boolean outside strict mode, in any letter case.
_BOOL_WORDS = ("0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes")
# A whole number written as text: pydantic strips whitespace, takes a sign, '_' between
# digits and a zero fraction ("5.0"). The pattern may accept more; never less.
INT_TEXT = r"^\s*[+-]?[0-9][0-9_]*(\.0*)?\s*$"
# A value that the loader's ${VAR} / ${VAR:-default} expansion replaces before validation.
ENV_REFERENCE: dict[str, Any] = {
    "type": "string",
    "pattern": r"\$\{",
    "description": "A ${VAR} or ${VAR:-default} reference, expanded from the environment.",
}
# Keys that describe a value rather than constrain it: they stay on the outer schema when a
# value is widened to "this, or a ${VAR} reference".
_ANNOTATIONS = ("title", "description", "default", "examples", "deprecated")


def _any_case(word: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


BOOL_TEXT = "^(" + "|".join(_any_case(word) for word in _BOOL_WORDS) + ")$"


def _fixed_spelling(node: dict[str, Any]) -> bool:
    """A value the environment could supply: constrained text, a number or a boolean."""
    if "enum" in node or "const" in node or "pattern" in node:
        return True
    return node.get("type") in ("integer", "number", "boolean")


def _is_env_reference(node: object) -> bool:
    return isinstance(node, dict) and node.get("pattern") == ENV_REFERENCE["pattern"]


def _widen(branches: list[Any]) -> list[Any]:
    """The branches of an ``anyOf``/``oneOf``, with a ``${VAR}`` alternative when any has a
    fixed spelling (added once here, not nested inside each branch)."""
    fixed = [b for b in branches if isinstance(b, dict) and _fixed_spelling(b)]
    out = [b if any(b is f for f in fixed) else _allow_env(b) for b in branches]
    if any(not _is_env_reference(b) for b in fixed) and not any(map(_is_env_reference, out)):
        out.append(dict(ENV_REFERENCE))
    return out


def _allow_env(node: Any) -> Any:
    """Let every value with a fixed spelling be a ``${VAR}`` reference instead."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in ("properties", "$defs"):
        if isinstance(out.get(key), dict):
            out[key] = {name: _allow_env(value) for name, value in out[key].items()}
    for key in ("items", "additionalProperties"):
        if key in out:
            out[key] = _allow_env(out[key])
    for combinator in ("anyOf", "oneOf"):
        if isinstance(out.get(combinator), list):
            # A reference could match a plain-string branch too: "anyOf" lets both match.
            out["anyOf"] = _widen(out.pop(combinator))
            return out
    if _fixed_spelling(out) and not _is_env_reference(out):
        outer = {key: out[key] for key in _ANNOTATIONS if key in out}
        inner = {key: value for key, value in out.items() if key not in _ANNOTATIONS}
        return {**outer, "anyOf": [inner, dict(ENV_REFERENCE)]}
    return out


class LoaderJsonSchema(GenerateJsonSchema):
    """JSON Schema of what the loader accepts (see the module docstring)."""

    def bool_schema(self, schema: core_schema.BoolSchema) -> JsonSchemaValue:
        """A boolean, 0 or 1, or one of the words pydantic reads as a boolean."""
        return {
            "anyOf": [
                {"type": "boolean"},
                {"enum": [0, 1]},
                {"type": "string", "pattern": BOOL_TEXT},
            ]
        }

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        """A whole number within the field's bounds, or one written as text (a boolean,
        which pydantic would read as 0 or 1, the model refuses)."""
        return {"anyOf": [super().int_schema(schema), {"type": "string", "pattern": INT_TEXT}]}

    def encode_default(self, dft: Any) -> Any:
        """Defaults as a file writes them: ``50ms``, not the object that holds it."""
        if hasattr(type(dft), "JSON_SCHEMA"):
            return str(dft)
        return super().encode_default(dft)

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        """The schema, with ``${VAR}`` references allowed wherever a value has a fixed form."""
        generated: JsonSchemaValue = _allow_env(super().generate(schema, mode))
        return generated

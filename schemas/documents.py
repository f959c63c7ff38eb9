"""What a saved JSON Schema must be: a JSON object the engine contract accepts as a constraint (its size and
nesting limits, measured exactly as the contract measures the ``{"json": schema}`` the gateway forwards), a valid
JSON Schema by the meta-schema of its ``$schema`` draft (2020-12 without one), and text PostgreSQL can store."""

import json

from django.core.exceptions import ValidationError
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from engine.contract.fields import MAX_CONSTRAINT_CHARS, MAX_SCHEMA_DEPTH


def check_document(document, *, field: str = "schema") -> None:
    """ValidationError on ``field`` unless ``document`` is a schema the engines can be sent."""
    if not isinstance(document, dict):
        raise ValidationError({field: f"A JSON Schema must be a JSON object, not {_json_type(document)}."})
    text = json.dumps({"json": document}, ensure_ascii=False)
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise ValidationError({field: f"The schema is {len(text)} characters as the engine counts it; the limit is "
                                      f"{MAX_CONSTRAINT_CHARS}."})
    if _depth({"json": document}) > MAX_SCHEMA_DEPTH:
        raise ValidationError({field: f"The schema nests deeper than {MAX_SCHEMA_DEPTH} levels."})
    check_text(text, field)
    if any("\x00" in string for string in _strings(document)):  # json.dumps writes it escaped, as \u0000
        raise ValidationError({field: "Text may not contain NUL characters (\\u0000)."})
    if not isinstance(document.get("$schema", ""), str):
        raise ValidationError({field: "'$schema' must be a string (the URI of a JSON Schema draft)."})
    try:
        validator_for(document).check_schema(document)
    except SchemaError as exc:
        where = exc.json_path.removeprefix("$") or " (the top level)"
        raise ValidationError({field: f"Not a valid JSON Schema at {'schema' + where}: {exc.message}"}) from None


def check_text(text: str, field: str) -> None:
    """PostgreSQL text and jsonb hold neither NUL characters nor lone surrogates (JSON's ``\\u0000``, ``\\ud800``)."""
    if "\x00" in text:
        raise ValidationError({field: "Text may not contain NUL characters (\\u0000)."})
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError({field: "Text may not contain lone surrogates (such as \\ud800)."}) from None


def _depth(value, level: int = 0) -> int:
    if level > MAX_SCHEMA_DEPTH:
        return level
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return max((_depth(child, level + 1) for child in children), default=level)


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, child in value.items():
            yield key
            yield from _strings(child)
    elif isinstance(value, list):
        for child in value:
            yield from _strings(child)


def _json_type(value) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")

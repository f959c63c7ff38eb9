"""``StructuredOutputsParams``: the constraint one request puts on its output (vLLM's names and semantics).

Torch-free and library-free: ``SamplingParams`` and the server validate requests with it before any backend loads.
"""

import hashlib
from dataclasses import dataclass, field
from json import JSONDecodeError, dumps, loads

KINDS = ("json", "regex", "choice", "grammar", "json_object")


class StructuredOutputsParamsError(ValueError):
    """A field of StructuredOutputsParams that is missing, conflicting or malformed; ``param`` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class StructuredOutputsParams:
    """Exactly one constraint: ``json`` (a JSON Schema, as a dict or its JSON text), ``regex``, ``choice`` (the
    output is one of these strings), ``grammar`` (Lark or GBNF/EBNF text, as llguidance reads it) or
    ``json_object=True`` (any JSON object). ``disable_any_whitespace`` (json and json_object) allows no
    whitespace between JSON tokens, which keeps small models from looping on newlines."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    disable_any_whitespace: bool = False
    _schema: dict | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        kinds = self._set_kinds()
        if len(kinds) != 1:
            found = " and ".join(kinds) if kinds else "none"
            raise StructuredOutputsParamsError(
                "structured_outputs", f"structured_outputs needs exactly one of {', '.join(KINDS)}; got {found}")
        if not isinstance(self.disable_any_whitespace, bool):
            raise StructuredOutputsParamsError(
                "structured_outputs.disable_any_whitespace", "structured_outputs.disable_any_whitespace must be a bool")
        getattr(self, f"_check_{kinds[0]}")()

    @property
    def kind(self) -> str:
        """The name of the one constraint field that is set."""
        return self._set_kinds()[0]

    @property
    def schema(self) -> dict:
        """The JSON Schema of a ``json`` constraint, parsed."""
        if self._schema is None:
            raise AttributeError(f"a {self.kind} constraint has no JSON schema")
        return self._schema

    def key(self) -> str:
        """sha256 of a canonical form: equal constraints (a schema dict and its JSON text) share compiled grammars."""
        canonical = f"{self.kind}\n{int(self.disable_any_whitespace)}\n{self._canonical_value()}"
        return hashlib.sha256(canonical.encode()).hexdigest()

    def _set_kinds(self) -> list[str]:
        values = {"json": self.json, "regex": self.regex, "choice": self.choice, "grammar": self.grammar}
        kinds = [name for name, value in values.items() if value is not None]
        # False and None both mean "not set" (vLLM counts any non-None value, so json_object=False conflicts there)
        return kinds + (["json_object"] if self.json_object not in (False, None) else [])

    def _canonical_value(self) -> str:
        if self.kind == "json":
            # no sort_keys: property order is the order the output is generated in, so it is part of the grammar
            return dumps(self._schema, ensure_ascii=False, separators=(",", ":"))
        if self.kind == "choice":
            return dumps(self.choice, ensure_ascii=False)
        return "" if self.kind == "json_object" else getattr(self, self.kind)

    def _check_json(self):
        schema = self.json
        if isinstance(schema, str):
            try:
                schema = loads(schema)
            except JSONDecodeError as exc:
                raise StructuredOutputsParamsError(
                    "structured_outputs.json", f"structured_outputs.json is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise StructuredOutputsParamsError(
                "structured_outputs.json", "structured_outputs.json must be a JSON Schema object (a dict or its "
                f"JSON text), got {type(schema).__name__}")
        self._schema = schema

    def _check_regex(self):
        _check_text("regex", self.regex)

    def _check_grammar(self):
        _check_text("grammar", self.grammar)

    def _check_choice(self):
        choice = self.choice
        if not isinstance(choice, list | tuple) or not choice or not all(isinstance(c, str) and c for c in choice):
            raise StructuredOutputsParamsError(
                "structured_outputs.choice", "structured_outputs.choice must be a non-empty list of non-empty strings")

    def _check_json_object(self):
        if self.json_object is not True:
            raise StructuredOutputsParamsError(
                "structured_outputs.json_object", "structured_outputs.json_object must be a bool")


def _check_text(name: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise StructuredOutputsParamsError(
            f"structured_outputs.{name}", f"structured_outputs.{name} must be a non-empty string")

"""What the default backend (llguidance) refuses at compile, by name: regexes that can never match, grammars over
its work limits (stated in DEFAULT_LIMITS), and JSON Schema keywords it does not implement; none of them is
silently ignored. Such schemas stay out of the 30-schema suite (tests/structured/schema_suite.py)."""

import pytest

from engine.structured import GrammarCompileError, StructuredOutputsParams, make_backend
from engine.structured.llguidance_backend import DEFAULT_LIMITS


@pytest.fixture(scope="module")
def guidance(backends):
    return backends["guidance"]


@pytest.mark.parametrize("regex, says", [
    ("a^b", "lookarounds not supported"),  # an anchor inside: nothing can match it
    ("[]", "unclosed character class"),
    ("[^\\s\\S]", "can match no text"),  # parses, but the class is empty
    ("x[^\\s\\S]", "can match no text"),  # a dead end after the first character
])
def test_a_regex_that_can_never_match_is_refused(guidance, regex, says):
    with pytest.raises(GrammarCompileError) as refused:
        guidance.compile(StructuredOutputsParams(regex=regex))
    assert refused.value.param == "structured_outputs.regex" and says in str(refused.value)


def test_a_pattern_that_can_never_match_is_refused_inside_a_schema(guidance):
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[^\\s\\S]$"}},
              "required": ["code"]}
    with pytest.raises(GrammarCompileError, match="Unsatisfiable schema"):
        guidance.compile(StructuredOutputsParams(json=schema))


def test_the_default_limits_are_the_stated_ones_and_a_grammar_over_them_is_refused(guidance, smollm2_tokenizer):
    assert guidance.limits == DEFAULT_LIMITS
    schema = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(30)}}
    guidance.compile(StructuredOutputsParams(json=schema))  # well inside the defaults
    tight = make_backend(smollm2_tokenizer, "guidance", limits={"initial_lexer_fuel": 1000})
    with pytest.raises(GrammarCompileError) as refused:
        tight.compile(StructuredOutputsParams(json=schema))
    assert refused.value.param == "structured_outputs.json" and "too big (limit for this grammar: 1000)" in str(
        refused.value)


def test_an_unknown_limit_is_refused(smollm2_tokenizer):
    with pytest.raises(ValueError, match="unknown llguidance limits"):
        make_backend(smollm2_tokenizer, "guidance", limits={"max_fuel": 1})


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "contains": {"type": "integer"}}, "contains"),
    ({"not": {"type": "string"}}, "not"),
    ({"if": {"type": "string"}, "then": {"maxLength": 3}}, "if"),
    ({"type": "object", "propertyNames": {"pattern": "^a"}}, "propertyNames"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),  # overlapping branches: not exclusive
])
def test_an_unsupported_schema_keyword_is_refused_by_name(guidance, schema, keyword):
    with pytest.raises(GrammarCompileError) as refused:
        guidance.compile(StructuredOutputsParams(json=schema))
    assert refused.value.param == "structured_outputs.json" and keyword in str(refused.value)

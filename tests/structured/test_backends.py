"""Each backend on SmolLM2's real tokenizer: constrained walks produce valid outputs, EOS comes exactly when the
grammar is complete, refused tokens change nothing, rollback restores, bad constraints are refused by name."""

import json
import re

import jsonschema
import pytest

from engine.structured import GrammarCache, GrammarCompileError, StructuredOutputsParams, make_backend
from tests.structured.walk import allowed_after, allowed_ids, matcher_after, walk_text

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "height_m": {"type": "number", "minimum": 0.5, "maximum": 2.5},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "active": {"type": "boolean"},
        "joined": {"type": "string", "format": "date"},
        "manager": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-z]{2,6}$"}]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,10}$"},
                           "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100},
                   "minItems": 1, "maxItems": 4},
    },
    "required": ["name", "age", "height_m", "role", "active", "joined", "manager", "address", "scores"],
    "additionalProperties": False,
}
CHOICES = ["yes", "no", "maybe so", 'say "hi"\n', "café"]
LARK = 'start: expr\nexpr: term (("+" | "-") term)*\nterm: /[0-9]{1,3}/\n'
GBNF = 'root ::= term (("+" | "-") term)*\nterm ::= [0-9] [0-9]? [0-9]?\n'
SEEDS = range(4)


@pytest.mark.parametrize("seed", SEEDS)
def test_json_schema_walk_is_valid_against_the_schema(backend, seed):
    text = walk_text(backend, StructuredOutputsParams(json=PERSON, disable_any_whitespace=True), seed=seed)
    jsonschema.validate(json.loads(text), PERSON, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("seed", SEEDS)
def test_regex_walk_matches(backend, seed):
    pattern = r"[0-9]{3}-[a-z]{2,4}( [A-Z]{1,6})?"
    assert re.fullmatch(pattern, walk_text(backend, StructuredOutputsParams(regex=pattern), seed=seed))


@pytest.mark.parametrize("seed", SEEDS)
def test_choice_walk_is_one_of_the_choices(backend, seed):
    assert walk_text(backend, StructuredOutputsParams(choice=CHOICES), seed=seed) in CHOICES


@pytest.mark.parametrize("grammar", [LARK, GBNF], ids=["lark", "gbnf"])
@pytest.mark.parametrize("seed", SEEDS)
def test_grammar_walk_is_in_the_language(backend, grammar, seed):
    text = walk_text(backend, StructuredOutputsParams(grammar=grammar), seed=seed)
    assert re.fullmatch(r"[0-9]{1,3}([+-][0-9]{1,3})*", text)


def test_json_object_takes_any_object_and_nothing_else(backend):
    params = StructuredOutputsParams(json_object=True)
    text = '{"a": [1, 2.5, {"b": null}], "c": "d\\"e", "f": true}'
    assert matcher_after(backend, params, text).is_complete()
    assert json.loads(text)
    for not_an_object in ("[1]", '"x"', "1"):
        first = backend.tokenizer.hf_tokenizer.encode(not_an_object)[0]
        assert not backend.new_matcher(backend.compile(params)).accept_token(first)


def test_json_allows_whitespace_unless_disabled(backend):
    decode = backend.tokenizer.hf_tokenizer.decode
    for params in (StructuredOutputsParams(json=PERSON), StructuredOutputsParams(json_object=True)):
        assert any(decode([t]).isspace() for t in allowed_after(backend, params, "{"))
        compact = StructuredOutputsParams(json=params.json, json_object=params.json_object, disable_any_whitespace=True)
        assert not any(decode([t]).strip() == "" for t in allowed_after(backend, compact, "{"))


def test_a_refused_token_leaves_the_matcher_where_it_was(backend):
    encode = backend.tokenizer.hf_tokenizer.encode
    matcher = backend.new_matcher(backend.compile(StructuredOutputsParams(choice=["yes", "no"])))
    assert not matcher.accept_token(encode("maybe")[0])
    assert not matcher.accept_token(backend.tokenizer.eos_token_ids[0])
    assert all(matcher.accept_token(t) for t in encode("no")) and matcher.is_complete()


def test_eos_ends_a_complete_grammar_and_only_eos_follows(backend):
    eos = backend.tokenizer.eos_token_ids[0]
    for params, text in ((StructuredOutputsParams(choice=["yes", "no"]), "yes"),  # nothing may follow "yes"
                         (StructuredOutputsParams(regex="a+"), "aa")):  # more "a" may follow
        matcher = matcher_after(backend, params, text)
        assert matcher.is_complete() and not matcher.is_terminated()
        assert matcher.accept_token(eos) and matcher.is_terminated()
        bitmask = backend.allocate_bitmask(1)
        matcher.fill_bitmask(bitmask, 0)
        assert allowed_ids(bitmask[0]) == set(backend.tokenizer.eos_token_ids)


def test_rollback_restores_earlier_masks_including_after_eos(backend):
    params = StructuredOutputsParams(json=PERSON, disable_any_whitespace=True)
    token_ids = backend.tokenizer.hf_tokenizer.encode('{"name":"Ann","age":4')
    matcher = backend.new_matcher(backend.compile(params))
    bitmask = backend.allocate_bitmask(len(token_ids) + 1)
    for row, token_id in enumerate(token_ids):
        matcher.fill_bitmask(bitmask, row)
        assert matcher.accept_token(token_id)
    again = backend.allocate_bitmask(1)
    for row in reversed(range(len(token_ids))):
        matcher.rollback(1)
        matcher.fill_bitmask(again, 0)
        assert (again[0] == bitmask[row]).all()
    choice = matcher_after(backend, StructuredOutputsParams(choice=["yes", "no"]), "yes")
    assert choice.accept_token(backend.tokenizer.eos_token_ids[0])
    choice.rollback(1)
    assert not choice.is_terminated() and choice.is_complete()
    choice.rollback(len(backend.tokenizer.hf_tokenizer.encode("yes")))
    assert not choice.is_complete()


def test_rolling_back_more_than_was_accepted_is_refused(backend):
    with pytest.raises(ValueError, match="roll back"):
        matcher_after(backend, StructuredOutputsParams(regex="a+"), "a").rollback(2)


@pytest.mark.parametrize("params, param", [
    (StructuredOutputsParams(regex="(a"), "structured_outputs.regex"),
    (StructuredOutputsParams(regex="a{5,2}"), "structured_outputs.regex"),
    (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "strin"}}}),
     "structured_outputs.json"),
    (StructuredOutputsParams(grammar="start: undefined_rule"), "structured_outputs.grammar"),
    (StructuredOutputsParams(grammar='start: "a" ) "b"'), "structured_outputs.grammar"),
    (StructuredOutputsParams(grammar="root ::= undefined"), "structured_outputs.grammar"),
], ids=["regex-group", "regex-repeat", "json-type", "lark-name", "lark-syntax", "gbnf-name"])
def test_a_constraint_that_does_not_compile_is_refused_by_name(backend, params, param):
    with pytest.raises(GrammarCompileError) as refused:
        backend.compile(params)
    assert refused.value.param == param and refused.value.reason
    assert str(refused.value).startswith(f"{param} does not compile: ")


def test_llguidance_refuses_an_unknown_string_format(backends):
    # xgrammar ignores formats it does not know; llguidance names them, which the issue's 400s need
    unknown = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "string", "format": "x"}}})
    with pytest.raises(GrammarCompileError, match="Unknown format"):
        backends["guidance"].compile(unknown)


@pytest.mark.parametrize("name", ["guidance", "xgrammar"])
def test_the_same_schema_compiles_once(smollm2_tokenizer, name):
    backend = make_backend(smollm2_tokenizer, name, cache=GrammarCache())
    first = backend.compile(StructuredOutputsParams(json=PERSON))
    assert backend.compile(StructuredOutputsParams(json=json.dumps(PERSON))) is first
    assert (backend.cache.num_hits, backend.cache.num_misses) == (1, 1)
    backend.compile(StructuredOutputsParams(json=PERSON, disable_any_whitespace=True))
    assert (backend.cache.num_hits, backend.cache.num_misses) == (1, 2)
    assert first.backend == name and first.kind == "json"
    assert first.key == backend.cache_key(StructuredOutputsParams(json=PERSON))


def test_matchers_from_one_grammar_are_independent(backend):
    grammar = backend.compile(StructuredOutputsParams(choice=["yes", "no"]))
    one, other = backend.new_matcher(grammar), backend.new_matcher(grammar)
    assert all(one.accept_token(t) for t in backend.tokenizer.hf_tokenizer.encode("yes"))
    assert one.is_complete() and not other.is_complete()


def test_a_grammar_from_another_backend_is_refused(backends):
    grammar = backends["xgrammar"].compile(StructuredOutputsParams(regex="a+"))
    with pytest.raises(ValueError, match="compiled by 'xgrammar'"):
        backends["guidance"].new_matcher(grammar)


def test_unknown_backend_name(smollm2_tokenizer):
    with pytest.raises(ValueError, match="unknown structured outputs backend 'outlines'"):
        make_backend(smollm2_tokenizer, "outlines")

import subprocess
import sys

import pytest

from engine.structured import StructuredOutputsParams, StructuredOutputsParamsError

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}


@pytest.mark.parametrize("kwargs, kind", [
    ({"json": SCHEMA}, "json"),
    ({"json": '{"type": "object"}'}, "json"),
    ({"regex": "[0-9]+"}, "regex"),
    ({"choice": ["yes", "no"]}, "choice"),
    ({"grammar": 'start: "a"'}, "grammar"),
    ({"json_object": True}, "json_object"),
])
def test_exactly_one_constraint_names_its_kind(kwargs, kind):
    assert StructuredOutputsParams(**kwargs).kind == kind


@pytest.mark.parametrize("kwargs, param, words", [
    ({}, "structured_outputs", "got none"),
    ({"json_object": False}, "structured_outputs", "got none"),
    ({"json": SCHEMA, "regex": "a"}, "structured_outputs", "got json and regex"),
    ({"choice": ["a"], "json_object": True}, "structured_outputs", "got choice and json_object"),
    ({"json": "{not json"}, "structured_outputs.json", "not valid JSON"),
    ({"json": "[1, 2]"}, "structured_outputs.json", "got list"),
    ({"json": 3}, "structured_outputs.json", "got int"),
    ({"regex": ""}, "structured_outputs.regex", "non-empty string"),
    ({"regex": 5}, "structured_outputs.regex", "non-empty string"),
    ({"choice": []}, "structured_outputs.choice", "non-empty list"),
    ({"choice": "yes"}, "structured_outputs.choice", "non-empty list"),
    ({"choice": ["yes", ""]}, "structured_outputs.choice", "non-empty strings"),
    ({"choice": ["yes", 1]}, "structured_outputs.choice", "non-empty strings"),
    ({"grammar": ""}, "structured_outputs.grammar", "non-empty string"),
    ({"json_object": "yes"}, "structured_outputs.json_object", "must be a bool"),
    ({"json_object": True, "disable_any_whitespace": 1}, "structured_outputs.disable_any_whitespace", "bool"),
])
def test_invalid_params_are_refused_by_name(kwargs, param, words):
    with pytest.raises(StructuredOutputsParamsError, match=words) as refused:
        StructuredOutputsParams(**kwargs)
    assert refused.value.param == param and isinstance(refused.value, ValueError)


def test_key_is_the_same_for_a_schema_dict_and_its_json_text():
    as_text = '{"type": "object",  "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}'
    key = StructuredOutputsParams(json=SCHEMA).key()
    assert key == StructuredOutputsParams(json=as_text).key()
    assert len(key) == 64 and int(key, 16) >= 0


def test_key_tells_apart_what_changes_the_grammar():
    reordered = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    keys = {
        StructuredOutputsParams(json=SCHEMA).key(),
        StructuredOutputsParams(json=reordered).key(),  # property order is generation order
        StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True).key(),
        StructuredOutputsParams(regex="a").key(),
        StructuredOutputsParams(grammar="a").key(),
        StructuredOutputsParams(choice=["a"]).key(),
        StructuredOutputsParams(choice=["a", "b"]).key(),
        StructuredOutputsParams(json_object=True).key(),
    }
    assert len(keys) == 8


def test_schema_is_the_parsed_json_constraint():
    assert StructuredOutputsParams(json='{"type": "string"}').schema == {"type": "string"}
    with pytest.raises(AttributeError):
        _ = StructuredOutputsParams(regex="a").schema


def test_importing_the_package_and_params_loads_neither_torch_nor_the_libraries():
    code = ("import sys, engine.structured, engine.structured.params; "
            "print(sorted(m for m in ('torch', 'transformers', 'llguidance', 'xgrammar') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

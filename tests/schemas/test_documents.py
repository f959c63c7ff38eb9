"""What a saved schema must be (schemas.documents): an object, within the engine contract's limits as the contract
measures them, valid against its draft's meta-schema, storable text."""

import pytest
from django.core.exceptions import ValidationError

from engine.contract import ContractError, parse_request
from engine.contract.fields import MAX_CONSTRAINT_CHARS, MAX_SCHEMA_DEPTH
from schemas.documents import check_document
from tests.schemas.conftest import INVOICE


def refusal(document) -> str:
    with pytest.raises(ValidationError) as caught:
        check_document(document)
    return " ".join(caught.value.message_dict["schema"])


def nested(depth: int) -> dict:
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_a_valid_schema_passes_and_so_does_the_contract_when_sent_inline():
    check_document(INVOICE)
    check_document({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"})
    assert parse_request("chat", inline(INVOICE)).sampling["structured_outputs"].schema == INVOICE


@pytest.mark.parametrize("document, words", [
    ([{"type": "string"}], "not an array"),
    ("{}", "not a string"),
    (True, "not a boolean"),
    ({"type": "integer2"}, "schema.type"),
    ({"properties": {"age": {"minimum": "one"}}}, "schema.properties.age.minimum"),
    ({"type": "string", "pattern": "(unclosed"}, "schema.pattern"),
    ({"$schema": {"draft": 7}}, "'$schema' must be a string"),
    ({"description": "a\x00b"}, "NUL"),
    ({"description": "\ud800"}, "lone surrogates"),
])
def test_what_is_not_a_storable_json_schema_is_refused_with_where_and_why(document, words):
    assert words in refusal(document)


def inline(schema: dict) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}


def test_the_contract_limits_apply_as_the_contract_measures_them():
    """The deepest and the largest documents the gateway can forward are saved; one level or one character more
    is refused here as the contract refuses it inline."""
    deepest = nested(MAX_SCHEMA_DEPTH - 2)  # {"json": ...} and the leaf's "string" are a level each
    check_document(deepest)
    parse_request("chat", inline(deepest))
    assert f"deeper than {MAX_SCHEMA_DEPTH}" in refusal(nested(MAX_SCHEMA_DEPTH - 1))
    with pytest.raises(ContractError):
        parse_request("chat", inline(nested(MAX_SCHEMA_DEPTH - 1)))
    base = {"type": "string", "description": ""}
    room = MAX_CONSTRAINT_CHARS - len('{"json": {"type": "string", "description": ""}}')
    largest = {**base, "description": "x" * room}
    check_document(largest)
    parse_request("chat", inline(largest))
    over = {**base, "description": "x" * (room + 1)}
    assert f"the limit is {MAX_CONSTRAINT_CHARS}" in refusal(over)
    with pytest.raises(ContractError):
        parse_request("chat", inline(over))

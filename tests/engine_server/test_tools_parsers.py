"""Tool-call formats and parsers without a server: which templates have a format, the Hermes parser on
real-looking outputs (whole and fed piece by piece), the forced choices' JSON parsers, and the grammar that auto
puts on generation, checked token by token with llguidance on the tiny tokenizer."""

import json

import llguidance
import llguidance.hf
import pytest

from engine.contract.tools import parse_tools
from engine.models.prepare import resolve_model
from engine.server.tool_formats import HermesFormat, auto_refusal, detect, parser_for, template_messages
from engine.server.tool_parsers import ArgumentsParser, JsonCallsParser
from tests.support.tiny_llama import CHAT_TEMPLATE, EOS_TOKEN, build_tokenizer
from tests.support.tool_templates import HERMES_TEMPLATE, OTHER_FORMAT_TEMPLATE

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Tbilisi"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}
TOOLS = parse_tools({"tools": [WEATHER, CLOCK]})
TWO_CALLS = ('Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tbilisi", "days": 3}}'
             '\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>')


def streamed(parser, text: str, step: int) -> tuple[str, dict[int, dict]]:
    """Feed ``text`` ``step`` characters at a time; the content and the calls as a client accumulates them."""
    content, calls = "", {}
    pieces = [p for at in range(0, len(text), step) for p in parser.feed(text[at:at + step])] + parser.finish()
    for piece in pieces:
        content += piece.content
        if piece.id is not None:
            assert piece.index not in calls and piece.arguments == ""  # the first delta of a call: name, no args
            calls[piece.index] = {"id": piece.id, "name": piece.name, "arguments": ""}
        elif piece.index is not None:
            calls[piece.index]["arguments"] += piece.arguments
    return content, calls


def test_templates_are_told_apart_by_what_they_render_and_the_syntax_they_document():
    assert detect(HERMES_TEMPLATE)[0] and isinstance(detect(HERMES_TEMPLATE)[1], HermesFormat)
    assert detect(CHAT_TEMPLATE) == (False, None)
    assert detect(OTHER_FORMAT_TEMPLATE) == (True, None)
    assert auto_refusal(HERMES_TEMPLATE) is None
    assert "does not parse" in auto_refusal(OTHER_FORMAT_TEMPLATE)


def test_smollm2s_template_has_no_tool_format_and_auto_is_refused_saying_so():
    template = (resolve_model("smollm2-135m-instruct") / "chat_template.jinja").read_text()
    assert detect(template) == (False, None)
    message = auto_refusal(template)
    assert "chat template has no tool-call format" in message and "'required'" in message


def test_hermes_output_with_text_and_two_calls():
    content, calls = HermesFormat().parser(TOOLS).parse(TWO_CALLS)
    assert content == "Let me look that up."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Tbilisi", "days": 3}), ("now", {})]
    assert calls[0]["function"]["arguments"] == '{"city": "Tbilisi", "days": 3}'  # the model's own text
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_hermes_output_streamed_in_pieces_reads_as_the_whole(step):
    content, calls = streamed(HermesFormat().parser(TOOLS), TWO_CALLS, step)
    whole_content, whole_calls = HermesFormat().parser(TOOLS).parse(TWO_CALLS)
    assert content == whole_content  # the whitespace before the call is held back, then dropped
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole_calls]


def test_text_that_only_looks_like_the_start_of_a_call_is_content():
    parser = HermesFormat().parser(TOOLS)
    assert streamed(parser, "Use <tool or <b>bold</b> \n", 1)[0] == "Use <tool or <b>bold</b> \n"
    assert parser.valid_calls() is None
    assert HermesFormat().parser(TOOLS).parse("plain answer") == ("plain answer", None)


@pytest.mark.parametrize("text", [
    'Sure <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}\n</tool_call>',  # no }
    '<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>',  # not a given tool
    '<tool_call>\n{"name": "now", "arguments": {}}',  # never closed
    '<tool_call>\n{"name": "now", "arguments": []}\n</tool_call>',  # arguments not an object
    '<tool_call>\nnot json at all\n</tool_call>',
    '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "now"',  # second cut
])
def test_a_malformed_call_leaves_the_whole_output_as_content_with_no_calls(text):
    assert HermesFormat().parser(TOOLS).parse(text) == (text, None)


def test_forced_json_parsers_stream_arguments_that_join_to_the_final_string():
    array = '[{"name":"get_weather","arguments":{"city":"Paris","days":2}},{"name":"now","arguments":{}}]'
    content, calls = streamed(JsonCallsParser(TOOLS.names), array, 3)
    assert content == "" and [(c["name"], c["arguments"]) for c in calls.values()] == [
        ("get_weather", '{"city":"Paris","days":2}'), ("now", "{}")]
    assert JsonCallsParser(TOOLS.names).parse(array)[1][1]["function"]["name"] == "now"
    assert JsonCallsParser(TOOLS.names).parse('[{"name":"now","arguments":{}}')[1] is None  # array not closed
    arguments = '{"city":"Tbilisi","days":7}'
    _, calls = streamed(ArgumentsParser(TOOLS.names, "get_weather"), arguments, 4)
    assert calls[0]["name"] == "get_weather" and calls[0]["arguments"] == arguments
    assert ArgumentsParser(TOOLS.names, "get_weather").parse('{"city":')[1] is None


def test_each_tool_choice_gets_the_parser_of_its_output_shape():
    named = parse_tools({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert type(parser_for(TOOLS, HERMES_TEMPLATE)).__name__ == "HermesParser"
    assert type(parser_for(named, HERMES_TEMPLATE)).__name__ == "HermesParser"
    assert isinstance(parser_for(parse_tools({"tools": [WEATHER], "tool_choice": "required"}), CHAT_TEMPLATE),
                      JsonCallsParser)
    assert isinstance(parser_for(named, CHAT_TEMPLATE), ArgumentsParser)
    assert parser_for(parse_tools({"tools": [WEATHER], "tool_choice": "none"}), HERMES_TEMPLATE) is None
    assert parser_for(None, HERMES_TEMPLATE) is None


def test_an_assistant_turns_calls_reach_the_template_as_objects_without_the_text_copy():
    raw = [{"role": "user", "content": "weather?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": '{"tz": "UTC"}'}}]}]
    normalized = [raw[0], {"role": "assistant", "content": '[{"name": "now", ...}]',
                           "tool_calls": raw[1]["tool_calls"]}]
    messages = template_messages(normalized, raw)
    assert messages[0] == raw[0] and messages[1]["content"] == ""
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"}


@pytest.fixture(scope="module")
def matcher_for():
    tokenizer = build_tokenizer(512)
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer),
                                                eos_token=[tokenizer.convert_tokens_to_ids(EOS_TOKEN)])

    def consume(grammar: str, text: str) -> tuple[bool, bool]:
        """(every token of ``text`` accepted, the grammar complete after them)."""
        matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.grammar_from("grammar", grammar), log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        ids = tokenizer.encode(text)
        return matcher.try_consume_tokens(ids) == len(ids), matcher.is_accepting()

    return consume


def test_the_auto_grammar_lets_text_through_and_holds_whatever_follows_the_trigger_to_a_call(matcher_for):
    grammar = HermesFormat().grammar(TOOLS)
    assert matcher_for(grammar, "Any text at all, even <b>tags</b> and {json}.") == (True, True)
    assert matcher_for(grammar, TWO_CALLS) == (True, True)
    assert matcher_for(grammar, "Sure <tool_call>\nnot a call")[0] is False
    assert matcher_for(grammar, '<tool_call>\n{"name": "launch_rocket", "arguments": {}}')[0] is False
    assert matcher_for(grammar, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"')[0] is False
    assert matcher_for(grammar, '<tool_call>\n{"name":"now","arguments":{}}')[0] is False  # the template's spacing
    assert matcher_for(grammar, TWO_CALLS + "\nand some text after")[0] is False
    assert matcher_for(grammar, TWO_CALLS[:-5]) == (True, False)  # a call cut short is not complete


def test_forced_grammars_in_the_template_format_admit_only_calls(matcher_for):
    one_call = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    required = parse_tools({"tools": [WEATHER, CLOCK], "tool_choice": "required", "parallel_tool_calls": False})
    assert matcher_for(HermesFormat().grammar(required), one_call) == (True, True)
    assert matcher_for(HermesFormat().grammar(required), "text first")[0] is False
    assert matcher_for(HermesFormat().grammar(required), one_call + "\n<tool_call>")[0] is False  # not parallel
    named = parse_tools({"tools": [WEATHER, CLOCK], "tool_choice": {"type": "function", "function": {"name": "now"}}})
    assert matcher_for(HermesFormat().grammar(named), one_call + "\n" + one_call) == (True, True)
    assert matcher_for(HermesFormat().grammar(named), TWO_CALLS.split("\n", 1)[1])[0] is False

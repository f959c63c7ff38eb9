"""Chat templates' own tool-call formats: which one a template documents, the grammar that keeps a call in it
valid, and the parser that reads calls out of the text.

A template "has a tool format" when it renders the request's ``tools`` (jinja2's undeclared variables) and
documents a call syntax this engine knows; one :class:`ToolCallFormat` subclass per syntax, so another is one
class more. With a format, every tool choice uses it: ``auto`` lets the model write text and, once it opens a
call, holds the rest of that call to a valid call of a given tool (llguidance's lazy trigger in a Lark grammar);
``required`` and a named function force calls in the same syntax, the one the model was trained on.
"""

import functools
import json
from abc import ABC, abstractmethod

from engine.contract.tools import ToolRequest
from engine.server.tool_parsers import (
    ArgumentsParser,
    CallObjectScanner,
    JsonCallsParser,
    ToolCallDelta,
    ToolCallParser,
)


class ToolCallFormat(ABC):
    name: str

    @classmethod
    @abstractmethod
    def documented_by(cls, template: str) -> bool:
        """The template shows this format's call syntax."""

    @abstractmethod
    def grammar(self, tools: ToolRequest) -> str:
        """The Lark grammar (llguidance's dialect) an output follows under ``tools.choice``."""

    @abstractmethod
    def parser(self, tools: ToolRequest) -> ToolCallParser: ...


class HermesFormat(ToolCallFormat):
    """Hermes 2 Pro / Qwen2.5: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` after any text,
    calls one per line (what vLLM's ``hermes`` parser reads)."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    @classmethod
    def documented_by(cls, template: str) -> bool:
        return cls.OPEN in template and cls.CLOSE in template

    def grammar(self, tools: ToolRequest) -> str:
        # json.dumps' separators, as the template renders calls and these models were trained on
        schema = {"anyOf": tools.call_schemas(),
                  "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}}
        more = ' ("\\n" "<tool_call>" body)*' if tools.parallel else ""
        if tools.forced:
            start = f'start: "<tool_call>" body{more}'
        else:  # any text; once it writes <tool_call>, the lazy lexeme ends the text and the call must follow
            start = f"start: TEXT | call_hd body{more}\nTEXT: /(.|\\n)*/\ncall_hd[lazy]: TEXT \"<tool_call>\""
        return f'%llguidance {{}}\n{start}\nbody: "\\n" %json {json.dumps(schema)} "\\n</tool_call>"\n'

    def parser(self, tools: ToolRequest) -> ToolCallParser:
        return HermesParser(tools.names)


class HermesParser(ToolCallParser):
    """Text, then ``<tool_call>`` objects. The content is the text before the first call, its trailing
    whitespace dropped (a stream holds that whitespace back until text follows it); text after the calls is not
    content (vLLM's reading; the grammar allows none)."""

    def __init__(self, names: frozenset[str]):
        super().__init__(names)
        self._state = "text"  # text | call | close | between | after
        self._pending = ""  # text not yet handed out: a tail that may begin the tag, or held whitespace
        self._scanner: CallObjectScanner | None = None

    def feed(self, text: str) -> list[ToolCallDelta]:
        self._pending += text
        deltas: list[ToolCallDelta] = []
        while True:
            step = getattr(self, f"_{self._state}")()
            if step is None:
                return deltas
            deltas += step

    def finish(self) -> list[ToolCallDelta]:
        if self._state != "text" or not self._pending:
            return []
        self.content.append(self._pending)
        tail, self._pending = self._pending, ""
        return [ToolCallDelta(content=tail)]

    def _text(self) -> list[ToolCallDelta] | None:
        at = self._pending.find(HermesFormat.OPEN)
        if at >= 0:
            before, self._pending = self._pending[:at].rstrip(), self._pending[at + len(HermesFormat.OPEN):]
            self._open_call()
            return self._content(before)
        keep = _partial_suffix(self._pending, HermesFormat.OPEN)
        text = self._pending[:len(self._pending) - keep]
        sendable = text.rstrip()
        self._pending = self._pending[len(sendable):]
        return self._content(sendable) or None

    def _content(self, text: str) -> list[ToolCallDelta]:
        if not text:
            return []
        self.content.append(text)
        return [ToolCallDelta(content=text)]

    def _open_call(self) -> None:
        self._scanner = CallObjectScanner(len(self.calls))
        self.calls.append(self._scanner.call)
        self._state = "call"

    def _call(self) -> list[ToolCallDelta] | None:
        if not self._pending:
            return None
        deltas, self._pending = self._scanner.feed(self._pending)
        if self._scanner.failed:
            self._state = "after"
        elif self._scanner.done:
            self._scanner.call.complete = False  # until its closing tag
            self._state = "close"
        return deltas or ([] if self._state != "call" else None)

    def _close(self) -> list[ToolCallDelta] | None:
        at = self._pending.find(HermesFormat.CLOSE)
        if at < 0:
            return None
        if self._pending[:at].strip():
            self._state = "after"
            return []
        self.calls[-1].complete = True
        self._pending, self._state = self._pending[at + len(HermesFormat.CLOSE):], "between"
        return []

    def _between(self) -> list[ToolCallDelta] | None:
        self._pending = self._pending.lstrip()
        if self._pending.startswith(HermesFormat.OPEN):
            self._pending = self._pending[len(HermesFormat.OPEN):]
            self._open_call()
            return []
        if not self._pending or HermesFormat.OPEN.startswith(self._pending):
            return None
        self._state = "after"
        return []

    def _after(self) -> None:
        self._pending = ""
        return None


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest tail of ``text`` that begins ``tag``."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


FORMATS: tuple[type[ToolCallFormat], ...] = (HermesFormat,)


@functools.lru_cache(maxsize=8)
def detect(template: str | None) -> tuple[bool, ToolCallFormat | None]:
    """Whether ``template`` renders ``tools``, and the known format it documents (None: none this engine knows)."""
    if not template:
        return False, None
    import jinja2
    from jinja2 import meta

    try:
        renders_tools = "tools" in meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError:  # an extension tag transformers adds (``{% generation %}``): read the text
        renders_tools = "tools" in template
    if not renders_tools:
        return False, None
    return True, next((fmt() for fmt in FORMATS if fmt.documented_by(template)), None)


def auto_refusal(template: str | None) -> str | None:
    """Why tool_choice ``auto`` cannot be served with ``template`` (None when it can)."""
    renders_tools, fmt = detect(template)
    if fmt is not None:
        return None
    reason = ("this model's chat template has no tool-call format" if not renders_tools else
              "this model's chat template has a tool-call format this engine does not parse (it reads: "
              + ", ".join(f.name for f in FORMATS) + ")")
    return f"tool_choice 'auto' lets the model call tools in its own format, but {reason}: use tool_choice " \
           "'required' or name a function, which constrain the output to the tools' argument schemas"


def template_messages(messages: list[dict], raw_messages: list) -> list[dict]:
    """The conversation for a template with a tool format: assistant turns keep their own content and hand their
    calls to the template with arguments as objects (the contract wrote calls into the text for templates
    without one; transformers' templates render ``arguments`` with ``tojson``)."""
    out = []
    for message, raw in zip(messages, raw_messages, strict=True):
        if "tool_calls" not in message:
            out.append(message)
            continue
        content = raw.get("content")
        if isinstance(content, list):
            content = "".join(part["text"] for part in content)
        calls = [{**call, "function": {"name": call["function"]["name"],
                                       "arguments": _arguments_object(call["function"].get("arguments", ""))}}
                 for call in message["tool_calls"]]
        out.append({**message, "content": content or "", "tool_calls": calls})
    return out


def _arguments_object(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # as sent: the template shows it as a string


def parser_for(tools: ToolRequest | None, template: str | None) -> ToolCallParser | None:
    """The parser of an output generated under ``tools`` (None when no calls can come: no tools, or ``none``)."""
    if tools is None or tools.choice == "none":
        return None
    fmt = detect(template)[1]
    if fmt is not None:
        return fmt.parser(tools)
    if tools.choice == "required":
        return JsonCallsParser(tools.names)
    if tools.forced:
        return ArgumentsParser(tools.names, tools.choice)
    return None

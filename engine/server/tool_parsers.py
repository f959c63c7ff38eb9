"""Reading tool calls out of generated text as it grows, so a stream can send OpenAI's tool-call deltas: a call's
first delta (index, id, name, empty arguments), then its ``arguments`` as raw fragments of the model's own JSON
text. The final ``arguments`` string is that same raw text, so the fragments of a stream concatenate to exactly
what a whole response carries.

One parser per output shape: the forced choices' JSON (an array of calls, or one function's arguments) when the
chat template has no tool format, and each template format's own syntax (``engine.server.tool_formats``).
Hand-written scanning: partial-JSON libraries re-serialize what they parse, which would break that equality.
"""

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(slots=True)
class ToolCallDelta:
    """One piece of streamed output: ``content`` text, or for the call at ``index`` its start (``id`` and
    ``name`` set) or an ``arguments`` fragment."""

    content: str = ""
    index: int | None = None
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class ToolCall:
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    name: str | None = None
    arguments: str = ""  # the raw JSON text generated so far
    complete: bool = False

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class ToolCallParser(ABC):
    """Generated text in (``feed`` each new piece, then ``finish``), deltas out; ``result`` after ``finish``."""

    def __init__(self, names: frozenset[str]):
        self.names = names
        self.calls: list[ToolCall] = []
        self.content: list[str] = []  # what went out as content

    @abstractmethod
    def feed(self, text: str) -> list[ToolCallDelta]: ...

    def finish(self) -> list[ToolCallDelta]:
        """Whatever was held back (a tail that might have begun a call), once the text is final."""
        return []

    def valid_calls(self) -> list[ToolCall] | None:
        """The calls, when there are some and every one is a complete call of a given tool with JSON-object
        arguments; None otherwise (the output is then text)."""
        if not self.calls:
            return None
        for call in self.calls:
            if not call.complete or call.name not in self.names or not _is_json_object(call.arguments):
                return None
        return self.calls

    def parse(self, text: str) -> tuple[str | None, list[dict] | None]:
        """A whole output as OpenAI's message ``content`` and ``tool_calls``: with no valid calls, the text."""
        self.feed(text)
        self.finish()
        calls = self.valid_calls()
        if calls is None:
            return text, None
        return "".join(self.content) or None, [call.openai() for call in calls]


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


class CallObjectScanner:
    """One JSON object ``{"name": ..., "arguments": {...}}`` read char by char: the name once its string closes,
    the arguments' raw text as it grows (held back until the name is known). ``failed`` on anything else."""

    def __init__(self, index: int):
        self.index = index
        self.call = ToolCall()
        self.done = self.failed = False
        self._expect = "open"  # open | key | colon | value | comma
        self._key: str | None = None
        self._buf: list[str] = []
        self._in_string = self._escape = False
        self._depth = 0  # > 0 while inside the arguments value
        self._num_sent = -1  # arguments characters sent; -1 before the call's first delta

    def feed(self, text: str) -> tuple[list[ToolCallDelta], str]:
        """The deltas ``text`` makes, and what follows the object's closing brace (once it closed)."""
        rest = ""
        for at, char in enumerate(text):
            if self.done or self.failed:
                rest = text[at:]
                break
            if self._depth:
                self.call.arguments += char
                self._arguments_char(char)
            else:
                self._object_char(char)
        return self._deltas(), rest

    def _deltas(self) -> list[ToolCallDelta]:
        if self.call.name is None:
            return []
        deltas = []
        if self._num_sent < 0:
            deltas.append(ToolCallDelta(index=self.index, id=self.call.id, name=self.call.name))
            self._num_sent = 0
        if len(self.call.arguments) > self._num_sent:
            deltas.append(ToolCallDelta(index=self.index, arguments=self.call.arguments[self._num_sent:]))
            self._num_sent = len(self.call.arguments)
        return deltas

    def _arguments_char(self, char: str) -> None:
        if self._in_string:
            self._in_string = self._escape or char != '"'
            self._escape = not self._escape and char == "\\"
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            self._expect = "value" if self._depth else "comma"

    def _object_char(self, char: str) -> None:
        if self._in_string:
            if self._escape or char not in '"\\':
                self._escape = False
                self._buf.append(char)
            elif char == "\\":
                self._escape = True
                self._buf.append(char)
            else:
                self._in_string = False
                self._string_done()
            return
        if char.isspace():
            return
        expect = self._expect
        if expect == "open" and char == "{":
            self._expect = "key"
        elif char == '"' and expect in ("key", "value"):
            self._in_string, self._buf = True, []
        elif expect == "colon" and char == ":":
            self._expect = "value"
        elif expect == "value" and self._key == "arguments" and char == "{" and not self.call.arguments:
            self._depth, self.call.arguments = 1, char
        elif expect == "comma" and char == ",":
            self._expect = "key"
        elif expect == "comma" and char == "}":
            self.done = self.call.complete = self.call.name is not None and bool(self.call.arguments)
            self.failed = not self.done
        else:
            self.failed = True

    def _string_done(self) -> None:
        try:
            value = json.loads('"' + "".join(self._buf) + '"')
        except ValueError:
            self.failed = True
            return
        if self._expect == "key" and value in ("name", "arguments"):
            self._key, self._expect = value, "colon"
        elif self._expect == "value" and self._key == "name" and self.call.name is None:
            self.call.name, self._expect = value, "comma"
        else:
            self.failed = True


class JsonCallsParser(ToolCallParser):
    """tool_choice ``required`` without a template format: the output is ``[{"name", "arguments"}, ...]``."""

    def __init__(self, names: frozenset[str]):
        super().__init__(names)
        self._expect = "["  # "[" | "element" | "," | "end"
        self._scanner: CallObjectScanner | None = None
        self.failed = False

    def feed(self, text: str) -> list[ToolCallDelta]:
        deltas: list[ToolCallDelta] = []
        while text and not self.failed:
            if self._scanner is not None:
                new, text = self._scanner.feed(text)
                deltas += new
                if self._scanner.failed:
                    self.failed = True
                elif self._scanner.done:
                    self._scanner, self._expect = None, ","
                continue
            char, text = text[0], text[1:]
            if char.isspace():
                continue
            if self._expect == "[" and char == "[":
                self._expect = "element"
            elif self._expect == "element" and char == "{":
                self._scanner = CallObjectScanner(len(self.calls))
                self.calls.append(self._scanner.call)
                text = char + text
            elif self._expect == "," and char in ",]":
                self._expect = "element" if char == "," else "end"
            else:
                self.failed = True
        return deltas

    def valid_calls(self) -> list[ToolCall] | None:
        return None if self.failed or self._expect != "end" else super().valid_calls()


class ArgumentsParser(ToolCallParser):
    """A named function forced without a template format: the whole output is that function's arguments."""

    def __init__(self, names: frozenset[str], name: str):
        super().__init__(names)
        self.calls.append(ToolCall(name=name))
        self._started = False

    def feed(self, text: str) -> list[ToolCallDelta]:
        call, deltas = self.calls[0], []
        if text and not self._started:
            self._started = True
            deltas.append(ToolCallDelta(index=0, id=call.id, name=call.name))
        if text:
            call.arguments += text
            deltas.append(ToolCallDelta(index=0, arguments=text))
        return deltas

    def finish(self) -> list[ToolCallDelta]:
        self.calls[0].complete = _is_json_object(self.calls[0].arguments)
        return []

"""OpenAI function tools: ``tools`` and ``tool_choice`` checked, and the output constraint that forced tool calls
put on generation (``required``: an array of calls of the given tools; a named function: its arguments).

``auto`` lets the model choose between text and a call in its chat template's own tool-call format; whether the
template has one, and the constraint and parser of that format, are the engine's (``engine.server.tool_formats``:
it knows the model). With such a format the engine also forces ``required`` and named calls in it. ``none``
generates text and ignores the tools.
"""

import re
from dataclasses import dataclass

from engine.contract.errors import ContractError, excerpt

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """The request's tools and what it forces: ``choice`` is "none", "auto", "required" or a function's name."""

    tools: tuple[dict, ...]  # {"name", "description", "parameters"} of each function
    choice: str
    parallel: bool

    @property
    def forced(self) -> bool:
        return self.choice not in ("none", "auto")

    @property
    def names(self) -> frozenset[str]:
        return frozenset(tool["name"] for tool in self.tools)

    def call_schemas(self) -> list[dict]:
        """One JSON Schema per callable tool (all of them, or the named one) of a call object
        ``{"name", "arguments"}``, in that order: the name is generated first, as streams want it."""
        tools = [tool for tool in self.tools if self.choice in ("auto", "required") or tool["name"] == self.choice]
        return [{"type": "object", "properties": {"name": {"const": tool["name"]}, "arguments": tool["parameters"]},
                 "required": ["name", "arguments"], "additionalProperties": False} for tool in tools]

    def constraint_schema(self) -> dict:
        """The JSON Schema a forced choice constrains the output to (where the template has no tool format)."""
        if self.choice != "required":
            return next(tool["parameters"] for tool in self.tools if tool["name"] == self.choice)
        return {"type": "array", "items": {"anyOf": self.call_schemas()}, "minItems": 1,
                **({} if self.parallel else {"maxItems": 1})}


def parse_tools(body: dict) -> ToolRequest | None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise ContractError("'tool_choice' needs 'tools'.", param="tool_choice")
        return None
    if not isinstance(tools, list) or not 0 < len(tools) <= MAX_TOOLS:
        raise ContractError(f"'tools' must be a list of 1 to {MAX_TOOLS} tools.", param="tools")
    functions = tuple(_function(tool, i) for i, tool in enumerate(tools))
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise ContractError("'tools' names a function twice.", param="tools")
    parallel = body.get("parallel_tool_calls")
    return ToolRequest(functions, _choice(choice, names), True if parallel is None else parallel)


def _function(tool, i: int) -> dict:
    param = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise ContractError(f"{param} must be {{\"type\": \"function\", \"function\": {{...}}}}.", param=param)
    function = tool["function"]
    unknown = set(function) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise ContractError(f"Unrecognized argument '{param}.function.{excerpt(sorted(unknown)[0])}'.", param=param)
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ContractError(f"{param}.function.name must be 1 to 64 letters, digits, '_' or '-'.", param=param)
    parameters = function.get("parameters", EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise ContractError(f"{param}.function.parameters must be a JSON Schema object.", param=param)
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ContractError(f"{param}.function.description must be a string.", param=param)
    return {"name": name, "description": description or "", "parameters": parameters}


def _choice(choice, names: list[str]) -> str:
    if choice is None:
        return "auto"  # OpenAI's default when tools are given
    if choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name in names:
            return name
        raise ContractError(f"'tool_choice' names '{excerpt(str(name))}', which is not in 'tools'.",
                            param="tool_choice")
    raise ContractError("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}.", param="tool_choice")

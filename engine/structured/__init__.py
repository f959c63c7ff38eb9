"""Constrained decoding: JSON Schema, regex, choice and grammar constraints as per-step token bitmasks.

``StructuredOutputsParams`` (torch-free) says what a request wants; ``make_backend`` binds a grammar library
(``guidance``, the default, or ``xgrammar``) to the model's tokenizer; ``apply_bitmask`` masks the logits.
Importing this package stays cheap: the libraries and torch load on first attribute access.
"""

from importlib import import_module
from typing import TYPE_CHECKING

BACKENDS = {
    "guidance": ("engine.structured.llguidance_backend", "LLGuidanceBackend"),
    "xgrammar": ("engine.structured.xgrammar_backend", "XGrammarBackend"),
}
DEFAULT_BACKEND = "guidance"

_LAZY = {
    "StructuredOutputsParams": "engine.structured.params",
    "StructuredOutputsParamsError": "engine.structured.params",
    "GrammarTokenizer": "engine.structured.tokenizer",
    "GrammarCache": "engine.structured.grammar_cache",
    "GrammarCompileError": "engine.structured.backend",
    "GrammarCompileTimeout": "engine.structured.backend",
    "CompiledGrammar": "engine.structured.backend",
    "GrammarMatcher": "engine.structured.backend",
    "StructuredOutputBackend": "engine.structured.backend",
    "allocate_bitmask": "engine.structured.bitmask",
    "apply_bitmask": "engine.structured.bitmask",
}

__all__ = [
    "BACKENDS", "DEFAULT_BACKEND", "CompiledGrammar", "GrammarCache", "GrammarCompileError", "GrammarCompileTimeout",
    "GrammarMatcher", "GrammarTokenizer", "StructuredOutputBackend", "StructuredOutputsParams",
    "StructuredOutputsParamsError", "allocate_bitmask", "apply_bitmask", "make_backend",
]

if TYPE_CHECKING:  # pragma: no cover
    from engine.structured.backend import (
        CompiledGrammar,
        GrammarCompileError,
        GrammarCompileTimeout,
        GrammarMatcher,
        StructuredOutputBackend,
    )
    from engine.structured.bitmask import allocate_bitmask, apply_bitmask
    from engine.structured.grammar_cache import GrammarCache
    from engine.structured.params import StructuredOutputsParams, StructuredOutputsParamsError
    from engine.structured.tokenizer import GrammarTokenizer


def make_backend(tokenizer: "GrammarTokenizer", name: str = DEFAULT_BACKEND, **options) -> "StructuredOutputBackend":
    """The backend called ``name`` for ``tokenizer``; ``options`` go to its constructor (``cache``,
    ``num_threads``)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown structured outputs backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name]
    return getattr(import_module(module), cls)(tokenizer, **options)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.structured' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value

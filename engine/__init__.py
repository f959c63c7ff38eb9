"""The serving engine: one base model, a paged KV cache, continuous batching and multi-LoRA.

Importing ``engine`` (or ``engine.lora.format``) must stay cheap and torch-free, because the Django
processes import the adapter rules from here; the public classes load on first attribute access.
"""

from importlib import import_module
from typing import TYPE_CHECKING

_LAZY = {
    "LLM": "engine.llm",
    "SamplingParams": "engine.sampling_params",
    "LoRARequest": "engine.lora.request",
    "RequestOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
}

__all__ = ["LLM", "CompletionOutput", "LoRARequest", "RequestOutput", "SamplingParams"]

if TYPE_CHECKING:  # pragma: no cover
    from engine.llm import LLM
    from engine.lora.request import LoRARequest
    from engine.outputs import CompletionOutput, RequestOutput
    from engine.sampling_params import SamplingParams


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value

"""The OpenAI request contract, one for the gateway and the engine server: field specs, parsing, validation and
error codes, and the engine's request extensions. Torch-free (the Django processes import it)."""

from engine.contract.errors import ContractError, excerpt
from engine.contract.requests import (
           AdapterSource,
           OpenAIRequest,
           fit_completion,
           parse_adapter,
           parse_json,
           parse_request,
)

__all__ = ["AdapterSource", "ContractError", "OpenAIRequest", "excerpt", "fit_completion", "parse_adapter",
           "parse_json", "parse_request"]

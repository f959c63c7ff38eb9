"""What the server knows of the model it serves: tokenization, context limits, sampling defaults and adapters.

Adapter ids are opaque and immutable (ENGINE_PROTOCOL.md): a request names one in ``model`` and may carry its
source (``adapter: {id, uri, sha256}``) so the engine loads it on first use. Sources are remembered per id, so
later requests may name the id alone once it has been seen or loaded through the admin API.
"""

import asyncio
from concurrent.futures import Future

from engine.async_engine import AsyncEngine
from engine.server.errors import APIError, bad_request
from engine.server.protocol import AdapterSource, GenerationRequest, parse_adapter


def adapter_error(exc: Exception) -> APIError:
    """The protocol's status for an adapter refusal (engine.lora.errors)."""
    from engine.lora.errors import AdapterFormatError, AdapterSourceNotAllowed

    code = getattr(exc, "code", "adapter_invalid")
    message = getattr(exc, "message", str(exc))
    if isinstance(exc, AdapterSourceNotAllowed):
        return APIError(403, message, code=code, param="adapter.uri")
    if code == "store_unreachable":
        return APIError(503, message, code=code, retry_after=5)
    if isinstance(exc, AdapterFormatError) or code:
        return APIError(422, message, code=code, param="adapter")
    return APIError(422, message, code="adapter_invalid", param="adapter")


class ServingModel:
    def __init__(self, engine: AsyncEngine, *, served_name: str, lora_enabled: bool):
        self.async_engine = engine
        self.served_name = served_name
        self.lora_enabled = lora_enabled
        core = engine.engine
        self.tokenizer = core.tokenizer
        self.max_model_len = core.max_model_len
        self._sources: dict[str, AdapterSource] = {}

    # ---------------------------------------------------------------- tokens

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return list(prompt)
        return self.tokenizer.encode(prompt)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        if not self.tokenizer.chat_template:
            raise bad_request("this model has no chat template; use /v1/completions", code="no_chat_template")
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    def sampling_params(self, parsed: GenerationRequest, prompt_ids: list[list[int]]) -> list:
        """One SamplingParams per prompt; 413 when a prompt and its max_tokens cannot fit the context."""
        from engine.sampling_params import SamplingParamError, SamplingParams

        params = []
        for ids in prompt_ids:
            room = self.max_model_len - len(ids)
            if room <= 0:
                raise APIError(413, f"the prompt has {len(ids)} tokens; the context is {self.max_model_len}",
                               code="context_length_exceeded", param="messages" if parsed.messages else "prompt")
            kwargs = dict(parsed.params)
            if kwargs.get("max_tokens") is None:
                kwargs["max_tokens"] = room
            elif kwargs["max_tokens"] > room:
                raise APIError(413, f"prompt ({len(ids)} tokens) + max_tokens ({kwargs['max_tokens']}) is over the "
                                    f"context of {self.max_model_len} tokens", code="context_length_exceeded",
                               param=_client_field(parsed, "max_tokens"))
            try:
                params.append(SamplingParams(**kwargs))
            except SamplingParamError as exc:
                raise bad_request(str(exc), param=_client_field(parsed, exc.param)) from None
            except (TypeError, ValueError) as exc:
                raise bad_request(str(exc)) from None
        return params

    def check_prompt_ids(self, parsed: GenerationRequest, prompt_ids: list[list[int]]) -> None:
        """400 naming the field for a prompt the engine would refuse: empty, or token ids outside the vocabulary."""
        param = "messages" if parsed.kind == "chat" else "prompt"
        vocab = self.async_engine.engine.model_config.vocab_size
        for ids in prompt_ids:
            if not ids:
                raise bad_request(f"'{param}' is empty: at least one token is needed", param=param)
            if not all(type(t) is int and 0 <= t < vocab for t in ids):
                raise bad_request(f"'{param}' token ids must be integers in [0, {vocab})", param=param)

    # ---------------------------------------------------------------- adapters

    async def resolve(self, model: str, source: AdapterSource | None):
        """The LoRARequest for ``model`` (None for the base model); 404 for a model nobody described."""
        if model == self.served_name and source is None:
            return None
        if source is not None and source.id != model:
            raise bad_request("'adapter.id' must equal 'model'", param="adapter.id")
        if not self.lora_enabled:
            raise APIError(404, f"model {model!r} does not exist (this engine serves no adapters)",
                           code="model_not_found", param="model")
        if source is not None and source.uri:
            self._sources[model] = source
        known = self._sources.get(model)
        if known is None or not known.uri:
            raise APIError(404, f"model {model!r} does not exist", code="model_not_found", param="model")
        return self._lora_request(known)

    def _lora_request(self, source: AdapterSource):
        from engine.lora.request import LoRARequest

        try:
            request = LoRARequest(name=source.id, id=source.id, path=source.uri, sha256=source.sha256)
            self.async_engine.engine.check_adapter_source(request)
        except ValueError as exc:
            raise bad_request(str(exc), param="adapter") from None
        except Exception as exc:  # noqa: BLE001 - adapter refusals map to protocol statuses
            raise adapter_error(exc) from None
        return request

    async def load(self, value) -> dict:
        """Fetch and verify an adapter into the engine's host tier; waits for the load, not the engine loop."""
        if not self.lora_enabled:
            raise APIError(400, "this engine serves no adapters (started with --no-enable-lora)",
                           code="lora_disabled")
        source = parse_adapter(value)
        if source is None or not source.uri:
            raise bad_request("'adapter' with 'id' and 'uri' is required", param="adapter")
        request = self._lora_request(source)
        try:
            future: Future = await self.async_engine.call(lambda engine: engine.load_adapter(request))
            info = await asyncio.wrap_future(future)
        except Exception as exc:  # noqa: BLE001 - adapter refusals map to protocol statuses
            raise adapter_error(exc) from None
        self._sources[source.id] = source
        return {**info, "id": source.id}

    async def unload(self, adapter_id: str) -> dict:
        """Drop an adapter everywhere (after the requests running with it); 404 if this engine never saw it."""
        remembered = self._sources.pop(adapter_id, None) is not None
        if not self.lora_enabled:
            raise APIError(404, f"adapter {adapter_id!r} is not loaded", code="not_found", param="id")
        result = await self.async_engine.call(lambda engine: engine.unload_adapter(adapter_id))
        if not (result["known"] or remembered):
            raise APIError(404, f"adapter {adapter_id!r} is not loaded", code="not_found", param="id")
        return {"id": adapter_id, "pending": not result["unloaded"]}

    async def adapters(self) -> list[dict]:
        """What the engine holds (in a slot or the host tier), for ``GET /v1/models``."""
        if not self.lora_enabled:
            return []
        return await self.async_engine.call(lambda engine: engine.list_adapters())


def _client_field(parsed: GenerationRequest, param: str) -> str:
    """The request's own name for a SamplingParams field (chat's top_logprobs, max_completion_tokens)."""
    if parsed.kind == "chat" and param == "logprobs":
        return "top_logprobs"
    if param == "max_tokens" and parsed.raw.get("max_completion_tokens") is not None:
        return "max_completion_tokens"
    return param

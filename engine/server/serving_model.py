"""What the server knows of the model it serves: tokenization, context limits, sampling defaults and adapters.

Adapter ids are opaque and immutable (ENGINE_PROTOCOL.md): a request names one in ``model`` and may carry its
source (``adapter: {id, uri, sha256}``) so the engine loads it on first use. Sources are remembered per id, so
later requests may name the id alone once it has been seen or loaded through the admin API.
"""

import asyncio
from concurrent.futures import Future

from engine.async_engine import AsyncEngine
from engine.contract import AdapterSource, ContractError, OpenAIRequest, fit_completion, parse_adapter
from engine.contract.tools import ToolRequest
from engine.server import tool_formats
from engine.server.errors import APIError, bad_request, contract_error


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
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self._sources: dict[str, AdapterSource] = {}

    # ---------------------------------------------------------------- tokens

    def prompt_token_ids(self, parsed: OpenAIRequest) -> list[list[int]]:
        """Each prompt's token ids: as given (token-id prompts, the gateway's ``prompt_token_ids``), else encoded
        (the chat template applied); 400 naming the field for ids outside the vocabulary."""
        self._check_tool_choice(parsed)
        if parsed.kind == "completion":
            prompt_ids = [list(p) if isinstance(p, list) else self.tokenizer.encode(p) for p in parsed.prompts]
        elif parsed.prompt_token_ids is not None:
            prompt_ids = [list(parsed.prompt_token_ids)]
        else:
            prompt_ids = [self._encode_chat(parsed.messages, parsed.tools, parsed.body.get("messages"))]
        vocab = self.async_engine.vocab_size
        param = "prompt_token_ids" if parsed.prompt_token_ids is not None else parsed.prompt_field
        for ids in prompt_ids:
            if not ids:
                raise bad_request(f"'{param}' is empty: at least one token is needed", param=param)
            if not all(0 <= t < vocab for t in ids):
                raise bad_request(f"'{param}' token ids must be integers in [0, {vocab})", param=param)
        return prompt_ids

    def _check_tool_choice(self, parsed: OpenAIRequest) -> None:
        """400 for tool_choice ``auto`` where the chat template has no tool format this engine parses (whether
        the messages or the gateway's token ids came), and for ``auto`` beside an output constraint."""
        if parsed.tools is None or parsed.tools.choice != "auto":
            return
        refusal = tool_formats.auto_refusal(self.tokenizer.chat_template)
        if refusal is not None:
            raise bad_request(refusal, param="tool_choice", code="tool_choice_unsupported")
        if "structured_outputs" in parsed.sampling:
            raise bad_request("tool_choice 'auto' constrains the tool calls already; drop 'response_format' or "
                              "'structured_outputs', or use tool_choice 'none'", param="tool_choice")

    def _encode_chat(self, messages: list[dict], tools: ToolRequest | None, raw_messages: list | None = None
                     ) -> list[int]:
        template = self.tokenizer.chat_template
        if not template:
            raise bad_request("this model has no chat template; use /v1/completions", code="no_chat_template")
        functions = None
        if tools is not None and tools.choice != "none":
            functions = [{"type": "function", "function": tool} for tool in tools.tools]
        if tool_formats.detect(template)[1] is not None and raw_messages is not None:
            messages = tool_formats.template_messages(messages, raw_messages)
        encoded = self.tokenizer.apply_chat_template(messages, tools=functions, add_generation_prompt=True,
                                                     tokenize=True)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    def _tool_constraint(self, parsed: OpenAIRequest) -> dict:
        """Where the template has a tool format, every tool choice but ``none`` is constrained in that format
        (``auto``: only once the model opens a call), in place of the contract's JSON constraint."""
        tools = parsed.tools
        fmt = tool_formats.detect(self.tokenizer.chat_template)[1]
        if tools is None or tools.choice == "none" or fmt is None:
            return {}
        from engine.structured.params import StructuredOutputsParams

        return {"structured_outputs": StructuredOutputsParams(grammar=fmt.grammar(tools))}

    def sampling_params(self, parsed: OpenAIRequest, prompt_ids: list[list[int]]) -> list:
        """One SamplingParams per prompt; 413 when a prompt and its max_tokens cannot fit the context."""
        from engine.sampling_params import SamplingParamError, SamplingParams

        # OpenAI's legacy completions default to 16 tokens; a null max_tokens (and chat's default) is the room left
        asked = 16 if parsed.kind == "completion" and "max_tokens" not in parsed.body else parsed.max_tokens
        params, sampling = [], {**parsed.sampling, **self._tool_constraint(parsed)}
        for ids in prompt_ids:
            try:
                max_tokens = fit_completion([len(ids)], asked, self.max_model_len, prompt_field=parsed.prompt_field,
                                            max_tokens_field=parsed.max_tokens_field)
                params.append(SamplingParams(**sampling, max_tokens=max_tokens))
            except ContractError as exc:
                raise contract_error(exc) from None
            except SamplingParamError as exc:
                raise bad_request(str(exc), param=_client_field(parsed, exc.param)) from None
            except (TypeError, ValueError) as exc:
                raise bad_request(str(exc)) from None
        return params

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
            self.async_engine.check_adapter_source(request)
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
        try:
            source = parse_adapter(value)
        except ContractError as exc:
            raise contract_error(exc) from None
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


def _client_field(parsed: OpenAIRequest, param: str) -> str:
    """The request's own name for a SamplingParams field (chat's top_logprobs, max_completion_tokens)."""
    if parsed.kind == "chat" and param == "logprobs":
        return "top_logprobs"
    if param == "max_tokens":
        return parsed.max_tokens_field
    return param

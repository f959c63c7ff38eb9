"""``LLM``: the offline API (``generate``, ``chat``) over one ``LLMEngine``, shaped like vLLM's."""

import itertools
import time
from collections.abc import Iterable
from collections.abc import Sequence as Seq

from tqdm.auto import tqdm

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.lora.request import LoRARequest
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

Prompt = str | list[int] | dict


class LLM:
    """Load a model once, then run batches of prompts to completion with continuous batching.

    ``model`` is an HF folder, a ``.gguf`` file (its Q8_0/Q4_0/Q4_1 tensors run quantized) or a known model name
    (``smollm2-135m-instruct``). Every other keyword is an ``EngineConfig`` field (``block_size``,
    ``max_num_seqs``, ``max_num_batched_tokens``, ``kv_cache_memory``, ``gpu_memory_utilization``,
    ``enable_prefix_caching``, ``dtype``, ``kv_cache_dtype``, ``gemm``, ``quantization``, ``device``, ``seed``,
    ...). ``dtype="auto"`` is bf16 on CPUs with native bf16 dot products and on CUDA, else fp32;
    ``quantization="int8"`` quantizes the decoder's projections at load (CPU). ``tensor_parallel_size=N`` splits
    the model over N processes (this one and N - 1 it spawns, ``engine.distributed``; with ``nnodes=K`` and
    ``distributed_init="tcp://HOST:PORT"`` N / K of them here, the rest from ``python -m engine worker`` on the other
    nodes); :meth:`shutdown` stops them.
    """

    def __init__(self, model: str, **engine_kwargs):
        self.llm_engine = LLMEngine(EngineConfig(model=model, **engine_kwargs))
        self._request_ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def shutdown(self) -> None:
        """Stop the engine's tensor-parallel worker processes and its adapter loader (the LLM is unusable after)."""
        self.llm_engine.shutdown()

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request=None,
    ) -> list[RequestOutput]:
        """Complete every prompt (a string, a list of token ids, or a dict of ``prompt`` and/or
        ``prompt_token_ids``, and optionally ``cache_salt``, as vLLM's prompt dicts)."""
        prompts = _as_prompt_list(prompts)
        return self._run(prompts, sampling_params, lora_request, use_tqdm)

    def chat(
        self,
        messages: list[dict] | Seq[list[dict]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request=None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tokenizer = self.get_tokenizer()
        prompts = []
        for conversation in conversations:
            text = tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                chat_template=chat_template, **(chat_template_kwargs or {}),
            )
            # The template already holds the special tokens: tokenize without adding any.
            prompts.append({"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)})
        return self._run(prompts, sampling_params, lora_request, use_tqdm)

    def _run(self, prompts: list, sampling_params, lora_request, use_tqdm: bool) -> list[RequestOutput]:
        params = _broadcast("sampling_params", SamplingParams() if sampling_params is None else sampling_params,
                            len(prompts), SamplingParams)
        loras = _broadcast("lora_request", lora_request, len(prompts), LoRARequest)
        engine = self.llm_engine
        order: dict[str, int] = {}
        try:
            for i, (prompt, p, lora) in enumerate(zip(prompts, params, loras, strict=True)):
                request_id = str(next(self._request_ids))
                if isinstance(prompt, dict):
                    _check_prompt_keys(prompt)
                    engine.add_request(request_id, prompt.get("prompt"), p,
                                       prompt_token_ids=prompt.get("prompt_token_ids"), lora_request=lora,
                                       cache_salt=prompt.get("cache_salt"))
                else:
                    engine.add_request(request_id, prompt, p, lora_request=lora)
                order[request_id] = i
            results = self._drain(order, use_tqdm)
        except BaseException:
            engine.abort_request(list(order))  # leave the engine clean for the next call
            raise
        return [results[i] for i in range(len(prompts))]

    def _drain(self, order: dict[str, int], use_tqdm: bool) -> dict[int, RequestOutput]:
        results: dict[int, RequestOutput] = {}
        bar = tqdm(total=len(order), desc="Processed prompts", dynamic_ncols=True, disable=not use_tqdm)
        start, num_in, num_out = time.perf_counter(), 0, 0
        while len(results) < len(order):
            if not self.llm_engine.has_unfinished_requests():
                raise RuntimeError("the engine dropped requests it was asked to run")  # a bug: never hide it
            for output in self.llm_engine.step():
                if output.finished and output.request_id in order:
                    results[order[output.request_id]] = output
                    num_in += len(output.prompt_token_ids)
                    num_out += output.num_generated_tokens
                    elapsed = max(time.perf_counter() - start, 1e-9)
                    bar.set_postfix_str(f"in {num_in / elapsed:.1f} tok/s, out {num_out / elapsed:.1f} tok/s",
                                        refresh=False)
                    bar.update(1)
        bar.close()
        return results


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, str | dict):
        return [prompts]
    if hasattr(prompts, "tolist"):  # a numpy array or a tensor of token ids (one prompt, or one per row)
        prompts = prompts.tolist()
    if isinstance(prompts, bytes | bytearray) or not isinstance(prompts, Iterable):
        raise ValueError(f"prompts must be a string, a list of token ids, a dict or a list of these, got "
                         f"{type(prompts).__name__}")
    prompts = list(prompts)
    if prompts and all(type(t) is int for t in prompts):  # one prompt given as token ids
        return [prompts]
    return [_as_prompt(p) for p in prompts]


def _as_prompt(prompt):
    if hasattr(prompt, "tolist") and not isinstance(prompt, str | dict):
        prompt = prompt.tolist()
    if isinstance(prompt, str | dict) or (isinstance(prompt, list | tuple) and all(type(t) is int for t in prompt)):
        return list(prompt) if isinstance(prompt, tuple) else prompt
    raise ValueError(f"each prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}")


_PROMPT_KEYS = {"prompt", "prompt_token_ids", "cache_salt"}


def _check_prompt_keys(prompt: dict) -> None:
    unknown = set(prompt) - _PROMPT_KEYS
    if unknown:
        raise ValueError(f"unknown prompt key {sorted(map(str, unknown))[0]!r} (known: {sorted(_PROMPT_KEYS)})")


def _broadcast(name: str, value, count: int, kind: type) -> list:
    values = list(value) if isinstance(value, list | tuple) else [value] * count
    if len(values) != count:
        raise ValueError(f"{name} has {len(values)} entries for {count} prompts")
    for entry in values:
        if entry is not None and not isinstance(entry, kind):
            raise ValueError(f"{name} must be an engine.{kind.__name__} or a list of them, got {type(entry).__name__}")
    return values

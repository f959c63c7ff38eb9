"""``InputProcessor``: a request as it arrives (a prompt, its parameters, an adapter) checked and turned into the
sequences the scheduler runs, one per completion (``params.n``)."""

import itertools
import reprlib

from engine.detokenizer import IncrementalDetokenizer
from engine.lora.request import LoRARequest
from engine.sampling_params import SamplingParamError, SamplingParams
from engine.sequence import Sequence

MAX_CACHE_SALT_LEN = 256


class InputProcessor:
    def __init__(self, tokenizer, *, vocab_size: int, max_model_len: int, num_kv_blocks: int, block_size: int,
                 lora_enabled: bool, device, structured=None):
        self.tokenizer = tokenizer
        self.structured = structured  # engine.structured.decoding.StructuredDecoding
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.lora_enabled = lora_enabled
        self.device = device
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()

    def process(self, request_id: str, prompt: str | list[int] | None, params: SamplingParams, *,
                prompt_token_ids: list[int] | None, lora_request, cache_salt: str | None
                ) -> tuple[str | None, list[int], list[Sequence]]:
        """The prompt's text (if given), its token ids and the request's sequences; ValueError (a
        SamplingParamError naming its field) for anything the engine cannot run."""
        text, token_ids = self._tokenize(prompt, prompt_token_ids)
        self._validate(token_ids, params, lora_request, cache_salt)
        grammar = None
        if params.structured_outputs is not None:
            # the server compiled it off the loop already (a cache hit here); the offline API pays it now, inside
            # the backend's limits. Once per request, a matcher per sequence.
            grammar = self.structured.compile(params.structured_outputs, cache_salt).grammar
        seqs = []
        for i in range(params.n):
            seq = Sequence(next(self._seq_ids), request_id, token_ids, params, index=i,
                           arrival_index=next(self._arrivals), lora_request=lora_request, cache_salt=cache_salt,
                           device=self.device)
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer.backend_tokenizer, token_ids, params)
            if grammar is not None:
                seq.matcher = self.structured.new_matcher(grammar)
            seqs.append(seq)
        return text, token_ids, seqs

    def _tokenize(self, prompt, prompt_token_ids) -> tuple[str | None, list[int]]:
        if prompt_token_ids is None and isinstance(prompt, list):
            prompt, prompt_token_ids = None, prompt
        if prompt_token_ids is not None:
            return prompt, list(prompt_token_ids)
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        return prompt, self.tokenizer.encode(prompt)

    def _validate(self, token_ids: list[int], params: SamplingParams, lora_request, cache_salt) -> None:
        vocab = self.vocab_size
        if not token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        if not all(type(t) is int and 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be ints in [0, {vocab})")
        if any(t >= vocab for t in params.stop_token_ids):  # the sampler masks these logits by index
            too_big = [t for t in params.stop_token_ids if t >= vocab]
            raise SamplingParamError("stop_token_ids", f"stop_token_ids must be token ids below {vocab}, "
                                                       f"got {reprlib.repr(too_big)}")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(token_ids)} tokens but max_model_len is {self.max_model_len} "
                             "(at least one token must be generated)")
        longest = min(len(token_ids) + (params.max_tokens or self.max_model_len), self.max_model_len)
        needed = -(-longest // self.block_size)
        if needed > self.num_kv_blocks:
            raise ValueError(f"a sequence of {longest} tokens needs {needed} KV blocks, the cache has "
                             f"{self.num_kv_blocks}")
        if cache_salt is not None and not (isinstance(cache_salt, str) and 0 < len(cache_salt) <= MAX_CACHE_SALT_LEN):
            raise ValueError(f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT_LEN} characters")
        if lora_request is not None:
            if not self.lora_enabled:
                raise ValueError("this engine serves the base model only (LoRA is not enabled)")
            if not isinstance(lora_request, LoRARequest):
                raise ValueError(f"lora_request must be an engine.LoRARequest, got {type(lora_request).__name__}")

"""``Sequence``: the passive record of one generation (one of a request's ``n`` completions).

``cache_salt`` (set once, from the request) scopes the prefix cache: blocks are shared only between sequences
with the same salt (the gateway sends one per tenant), so one tenant cannot time another's prompts.

Who writes what: the scheduler writes ``status``, ``num_computed_tokens``, ``lora_slot``, ``cache_key`` (the adapter's
content hash once it is loaded) and ``arrival_step``, and appends sampled tokens; the
block manager writes ``block_table``, ``block_hashes`` and ``num_hashed_blocks``; the engine's output processor
writes the detokenizer, the constraint's matcher, logprobs and finish fields. The model runner only reads (the
sampler reads each matcher's allowed tokens).
"""

import enum
from collections.abc import Hashable

import torch

from engine.fair_share import UNKEYED
from engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def adapter_cache_key(lora_request) -> Hashable | None:
    """The extra key of prefix-cache block hashes: None for the base model, else the adapter's identity.

    The adapter's content hash (sha256 of its weights) when the request states it, so two versions never share KV;
    else a provisional key from its id, which the scheduler replaces with the loaded weights' hash at admission
    (:func:`adapter_content_key`), before any block is hashed.
    """
    if lora_request is None:
        return None
    return adapter_content_key(lora_request.sha256) if lora_request.sha256 else ("adapter-id", lora_request.id)


def adapter_content_key(sha256: str) -> Hashable:
    """The prefix-cache key of an adapter whose weights file has this sha256."""
    return ("adapter", sha256)


class Sequence:
    __slots__ = (
        "seq_id", "request_id", "index", "arrival_index", "arrival_step", "params", "lora_request", "lora_slot",
        "cache_key", "cache_salt", "generator",
        "token_ids", "num_prompt_tokens", "num_computed_tokens", "num_cached_tokens", "status",
        "block_table", "block_hashes", "num_hashed_blocks",
        "detokenizer", "matcher", "logprobs", "cumulative_logprob", "finish_reason", "stop_reason",
        "num_preemptions", "fair_share", "spec_token_ids", "spec_state",
    )

    def __init__(
        self,
        seq_id: int,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        index: int = 0,
        arrival_index: int = 0,
        lora_request=None,
        cache_salt: str | None = None,
        device: torch.device | str = "cpu",
    ):
        self.seq_id = seq_id
        self.request_id = request_id
        self.index = index  # which of the request's n completions
        self.arrival_index = arrival_index  # FCFS order across requests
        self.arrival_step = 0  # the scheduler's step count when it was queued (bounded waiting)
        self.params = params
        self.lora_request = lora_request
        self.lora_slot = -1  # the adapter slot it pins while running; -1: none (base model, or not running)
        self.cache_key = adapter_cache_key(lora_request)
        self.cache_salt = cache_salt  # mixed into the first block's hash: no sharing across salts
        self.generator = _generator(params.seed, index, device) if params.seed is not None else None
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at (the last) admission
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of full blocks: tokens, cache_key, cache_salt
        self.num_hashed_blocks = 0  # blocks of block_table already offered to the prefix cache
        self.detokenizer = None
        self.matcher = None  # the constraint's state (engine.structured), advanced by the output processor
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.finish_reason: str | None = None  # "stop" | "length" | "abort"
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        self.num_preemptions = 0
        self.fair_share = UNKEYED  # whose it is, for fair admission (engine.fairness); set once by the engine
        self.spec_token_ids: list[int] = []  # this step's draft (engine.spec_decode): verified, then cleared
        self.spec_state = None  # its drafting's state (engine.spec_decode.decoder.SpecState)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, request={self.request_id!r}, status={self.status.value}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, blocks={self.block_table})"
        )


def _generator(seed: int, index: int, device) -> torch.Generator:
    # Each of a request's n completions draws from its own stream, reproducible whatever the batch holds.
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + index) % (2**63))
    return generator

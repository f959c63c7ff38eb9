"""What the engine returns: ``RequestOutput`` with one ``CompletionOutput`` per completion (vLLM's shapes)."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, float]] | None = None  # per token: {token id: logprob}, the sampled token first
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"; None while running
    stop_reason: int | str | None = None  # the stop token id or stop string, when one ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock times (``time.monotonic()``) of a request's life, for TTFT/TPOT."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (first completion, last admission)
    metrics: RequestMetrics | None = None
    lora_request: object = field(default=None, repr=False)
    # Why the request failed (finish_reason "error"): an ``engine.lora.errors.AdapterError`` whose ``code`` names
    # the check (source_not_allowed, sha256_mismatch, rank_too_large, store_unreachable, ...).
    error: Exception | None = None

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

"""``SamplingParams``: how to pick each next token and when to stop (the fields vLLM users know)."""

import math
import reprlib
from dataclasses import dataclass

from engine.structured.params import StructuredOutputsParams


class SamplingParamError(ValueError):
    """A field of SamplingParams out of its range; ``param`` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


# Temperatures below this are greedy (argmax): dividing logits by ~0 would overflow.
GREEDY_EPSILON = 1e-5
MAX_LOGPROBS = 20


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling. ``temperature=0`` is greedy; ``max_tokens=None`` runs to the model's context.

    Penalties follow OpenAI (presence, frequency: over generated tokens) and vLLM (repetition: over prompt and
    generated tokens, dividing positive logits). ``seed`` makes a request's samples reproducible whatever else
    is in the batch. ``logprobs=k`` returns the sampled token's and the top-``k`` log-probabilities of the
    model's raw distribution at each step. ``structured_outputs`` constrains the output to a JSON schema, a
    regex, a choice or a grammar (:class:`engine.structured.StructuredOutputsParams`, vLLM's names): every step
    masks the tokens the constraint does not allow, and the request ends when the constraint is complete.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self):
        _check_int("n", self.n, minimum=1)
        _check_float("temperature", self.temperature, 0.0, None)
        _check_float("top_p", self.top_p, 0.0, 1.0)
        if self.top_p <= 0.0:
            raise SamplingParamError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, minimum=-1)
        if self.top_k == 0:  # OpenAI-style clients send 0 for "off"
            self.top_k = -1
        _check_float("min_p", self.min_p, 0.0, 1.0)
        _check_float("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, None)
        if self.repetition_penalty <= 0.0:
            raise SamplingParamError("repetition_penalty",
                                    f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=-(2**63))
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, minimum=1)
        _check_int("min_tokens", self.min_tokens, minimum=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingParamError(
                "min_tokens", f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        self.stop = _stop_strings(self.stop)
        self.stop_token_ids = _stop_token_ids(self.stop_token_ids)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise SamplingParamError("structured_outputs", "structured_outputs must be an "
                                                           "engine.structured.StructuredOutputsParams")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, minimum=0)
            if self.logprobs > MAX_LOGPROBS:
                raise SamplingParamError("logprobs", f"logprobs must be <= {MAX_LOGPROBS}, got {self.logprobs}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


def _check_int(name: str, value, *, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise SamplingParamError(name, f"{name} must be an int >= {minimum}, got {reprlib.repr(value)}")


def _check_float(name: str, value, low: float | None, high: float | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SamplingParamError(name, f"{name} must be a finite number, got {reprlib.repr(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise SamplingParamError(name, f"{name} must be in {bounds}, got {value}")


def _stop_strings(stop) -> list[str]:
    if stop is None:
        return []
    values = [stop] if isinstance(stop, str) else stop
    if not isinstance(values, list | tuple) or not all(isinstance(s, str) and s for s in values):
        raise SamplingParamError("stop", f"stop must be a non-empty string or a list of them, "
                                         f"got {reprlib.repr(stop)}")
    return list(values)


def _stop_token_ids(ids) -> list[int]:
    if ids is None:
        return []
    if not isinstance(ids, list | tuple) or not all(type(i) is int and i >= 0 for i in ids):
        raise SamplingParamError("stop_token_ids", f"stop_token_ids must be a list of non-negative ints, "
                                                   f"got {reprlib.repr(ids)}")
    return list(ids)

"""``OutputProcessor``: what a step's sampled tokens mean for each request. Each token is recorded with its
logprobs, detokenized and checked against the stop conditions; the requests it touched are reported as
``RequestOutput``s (vLLM's shapes)."""

from collections import defaultdict
from dataclasses import dataclass, field

from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.sampler import SamplerOutput
from engine.sequence import Sequence
from engine.structured.decoding import StructuredDecoding


@dataclass(slots=True)
class Request:
    """A request in the engine: its prompt, its sequences (one per completion) and its life so far."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]
    metrics: RequestMetrics
    lora_request: object = None
    error: Exception | None = None  # why it failed (an adapter that cannot be served)

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)


@dataclass(slots=True)
class StepResult:
    """The sequences that stop after this step, by finish reason, and the requests the step touched."""

    finished: dict[str, list[Sequence]] = field(default_factory=lambda: defaultdict(list))
    touched: dict[str, Request] = field(default_factory=dict)


class OutputProcessor:
    def __init__(self, eos_token_ids: set[int], max_model_len: int):
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def process(self, seqs: list[Sequence], sampled: SamplerOutput, requests: dict[str, Request],
                now: float) -> StepResult:
        """Record the token each of ``seqs`` (the step's, in order) sampled, if it did, and find who stops."""
        result = StepResult()
        for i, seq in enumerate(seqs):
            token_id = sampled.token_ids[i]
            if token_id is None:  # a prompt chunk before the last
                continue
            if sampled.emitted is not None and sampled.emitted[i] is not None:
                reason = self._process_emitted(seq, sampled.emitted[i], sampled.emitted_logprobs[i])
            else:
                if seq.logprobs is not None:
                    seq.logprobs.append(sampled.logprobs[i])
                    seq.cumulative_logprob += sampled.sampled_logprobs[i]
                reason = self._check_stop(seq, token_id)
            if reason is not None:
                result.finished[reason].append(seq)
            request = result.touched[seq.request_id] = requests[seq.request_id]
            request.metrics.first_token_time = request.metrics.first_token_time or now
        return result

    def _process_emitted(self, seq: Sequence, tokens: list[int], logprobs: list | None) -> str | None:
        """A verified draft's tokens (already appended), each checked in turn as if it came alone; those after
        one that stops the sequence are dropped."""
        del seq.token_ids[len(seq.token_ids) - len(tokens):]
        for j, token in enumerate(tokens):
            seq.token_ids.append(token)
            if seq.logprobs is not None:
                seq.logprobs.append(logprobs[j][0])
                seq.cumulative_logprob += logprobs[j][1]
            reason = self._check_stop(seq, token)
            if reason is not None:
                seq.num_computed_tokens = min(seq.num_computed_tokens, seq.num_tokens)
                return reason
        return None

    def _check_stop(self, seq: Sequence, token_id: int) -> str | None:
        params = seq.params
        if seq.matcher is not None and StructuredDecoding.advance(seq.matcher, token_id):
            return "stop"  # the constraint is complete and its EOS came
        if token_id in self.eos_token_ids and not params.ignore_eos:
            return "stop"
        if token_id in params.stop_token_ids:
            seq.stop_reason = token_id
            return "stop"
        if seq.detokenizer.append(token_id, check_stops=seq.num_output_tokens >= params.min_tokens):
            seq.stop_reason = seq.detokenizer.stop_string
            return "stop"
        if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
            return "length"
        if seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    @staticmethod
    def request_output(request: Request) -> RequestOutput:
        outputs = [
            CompletionOutput(
                index=seq.index,
                text=seq.detokenizer.text if seq.is_finished else seq.detokenizer.emittable_text,
                token_ids=seq.output_token_ids,
                cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
                logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
            )
            for seq in request.seqs
        ]
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, outputs, request.finished,
                             num_cached_tokens=request.seqs[0].num_cached_tokens, metrics=request.metrics,
                             lora_request=request.lora_request, error=request.error)

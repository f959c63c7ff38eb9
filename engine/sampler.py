"""``Sampler``: the next token of every sampling sequence of a step, in one batched pass.

Greedy rows are an argmax. Random rows draw by the exponential race (``argmax(p / E)``, ``E ~ Exp(1)``),
which needs no sort and no cumulative sum; each seeded sequence draws ``E`` from its own generator, so its
samples do not depend on what else is in the batch. A full-vocabulary sort happens only for rows that ask for
top-p; top-k uses ``topk``. Log-probabilities are those of the model's raw distribution.
"""

from dataclasses import dataclass

import torch

from engine.sequence import Sequence
from kernels.cpu import argmax


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int | None]  # per row; None: the row did not sample (a step's prompt chunk before its last)
    logprobs: list[dict[int, float] | None]  # per row: {token id: logprob}, sampled token first; None if unasked
    sampled_logprobs: list[float | None]
    # Rows that verified a draft (engine.spec_decode): every token they emit (kept drafts, then one), with the
    # logprobs of each; token_ids/logprobs then hold the last one's. None when no row drafted.
    emitted: list[list[int] | None] | None = None
    emitted_logprobs: list[list | None] | None = None

    @classmethod
    def empty(cls, num_rows: int) -> "SamplerOutput":
        return cls([None] * num_rows, [None] * num_rows, [None] * num_rows)

    def scatter_verified(self, rows: list[int], verified: list) -> None:
        """Put each ``engine.spec_decode.verify.Verified`` at its row."""
        if self.emitted is None:
            self.emitted, self.emitted_logprobs = [None] * len(self.token_ids), [None] * len(self.token_ids)
        for i, v in zip(rows, verified, strict=True):
            self.emitted[i] = v.tokens
            self.token_ids[i] = v.tokens[-1]
            if v.logprobs is not None:
                self.emitted_logprobs[i] = list(zip(v.logprobs, v.sampled_logprobs, strict=True))

    def scatter(self, rows: list[int], sampled: "SamplerOutput") -> None:
        """Put ``sampled``'s row ``j`` at row ``rows[j]``."""
        for j, i in enumerate(rows):
            self.token_ids[i] = sampled.token_ids[j]
            self.logprobs[i] = sampled.logprobs[j]
            self.sampled_logprobs[i] = sampled.sampled_logprobs[j]


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...], generator: torch.Generator, structured=None):
        self.eos_token_ids = list(eos_token_ids)
        self.generator = generator  # unseeded requests; seeded by the engine's seed
        self.structured = structured  # engine.structured.decoding.StructuredDecoding: masks constrained rows

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:  # logits [N, V] float32
        """The next token of each row. The rows of constrained sequences (``seq.matcher``) of ``logits`` are
        masked in place: the model runner hands over each step's fresh logits, and a copy of [64, 49152] float32
        logits costs about as much as masking them (logprobs come from the raw logits, taken before)."""
        want_logprobs = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        raw_logprobs = torch.log_softmax(logits[want_logprobs], dim=-1) if want_logprobs else None
        logits = self._adjust(logits, seqs)
        if self.structured is not None:
            self.structured.mask(logits, [s.matcher for s in seqs])
        token_ids = argmax.argmax_rows(logits)  # [N]: torch's answer, 9x faster on CPU; None elsewhere
        if token_ids is None:
            token_ids = logits.argmax(dim=-1)
        random_rows = [i for i, s in enumerate(seqs) if not s.params.is_greedy]
        if random_rows:
            token_ids[random_rows] = self._sample(logits[random_rows], [seqs[i] for i in random_rows])
        token_list = token_ids.tolist()
        logprobs: list[dict[int, float] | None] = [None] * len(seqs)
        sampled: list[float | None] = [None] * len(seqs)
        for row, i in enumerate(want_logprobs):
            logprobs[i], sampled[i] = _logprobs(raw_logprobs[row], token_list[i], seqs[i].params.logprobs)
        return SamplerOutput(token_list, logprobs, sampled)

    def _adjust(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Penalties and min_tokens (EOS and stop tokens banned until enough tokens came out; a constrained
        sequence ends when its constraint says). A copy when anything changes, so the caller's logits stay as
        they were; a constraint's mask is applied in place after this (``__call__``)."""
        penalized = [i for i, s in enumerate(seqs) if s.params.needs_penalties]
        banned = [i for i, s in enumerate(seqs) if s.num_output_tokens < s.params.min_tokens and s.matcher is None]
        if not penalized and not banned:
            return logits
        logits = logits.clone()
        if penalized:
            logits[penalized] = _apply_penalties(logits[penalized], [seqs[i] for i in penalized])
        for i in banned:
            logits[i, self.eos_token_ids + seqs[i].params.stop_token_ids] = float("-inf")
        return logits

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:  # [R, V] -> [R]
        temperatures = torch.tensor([s.params.temperature for s in seqs], dtype=logits.dtype, device=logits.device)
        logits = logits / temperatures[:, None]
        top_k = [s.params.top_k for s in seqs]
        if any(k > 0 for k in top_k):
            logits = _top_k(logits, top_k)
        top_p = [s.params.top_p for s in seqs]
        if any(p < 1.0 for p in top_p):
            logits = _top_p(logits, top_p)
        probs = torch.softmax(logits, dim=-1)
        min_p = [s.params.min_p for s in seqs]
        if any(p > 0.0 for p in min_p):
            floor = torch.tensor(min_p, dtype=probs.dtype, device=probs.device)[:, None]
            probs = probs.masked_fill(probs < floor * probs.amax(dim=-1, keepdim=True), 0.0)
        noise = torch.empty_like(probs)
        unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
        if unseeded:
            noise[unseeded] = torch.empty_like(probs[unseeded]).exponential_(generator=self.generator)
        for i, seq in enumerate(seqs):
            if seq.generator is not None:
                noise[i].exponential_(generator=seq.generator)
        # exponential_ can return exactly 0, and 0 / 0 would be NaN, which argmax picks.
        return (probs / noise.clamp_min_(1e-20)).argmax(dim=-1)


def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:  # [R, V] -> [R, V]
    num_rows, vocab = logits.shape
    counts = torch.zeros(num_rows, vocab + 1, dtype=logits.dtype, device=logits.device)
    seen = torch.zeros(num_rows, vocab + 1, dtype=torch.bool, device=logits.device)
    for i, seq in enumerate(seqs):
        output = torch.tensor(seq.output_token_ids, dtype=torch.long, device=logits.device)
        counts[i].index_add_(0, output, torch.ones_like(output, dtype=logits.dtype))
        seen[i, torch.tensor(seq.prompt_token_ids, dtype=torch.long, device=logits.device)] = True
    counts, seen = counts[:, :vocab], seen[:, :vocab] | (counts[:, :vocab] > 0)
    repetition = torch.tensor([s.params.repetition_penalty for s in seqs], device=logits.device)[:, None]
    penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, penalized, logits)
    frequency = torch.tensor([s.params.frequency_penalty for s in seqs], device=logits.device)[:, None]
    presence = torch.tensor([s.params.presence_penalty for s in seqs], device=logits.device)[:, None]
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def _top_k(logits: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    vocab = logits.shape[-1]
    ks = [min(k, vocab) if k > 0 else vocab for k in top_k]
    values = logits.topk(max(ks), dim=-1).values  # [R, max_k], no full sort
    index = torch.tensor([k - 1 for k in ks], device=logits.device)[:, None]
    threshold = values.gather(-1, index)  # [R, 1]
    keep = torch.tensor([k < vocab for k in ks], device=logits.device)[:, None]
    return logits.masked_fill(keep & (logits < threshold), float("-inf"))


def _top_p(logits: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    rows = [i for i, p in enumerate(top_p) if p < 1.0]
    sorted_logits, order = logits[rows].sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly above each token: the top token always stays
    limits = torch.tensor([top_p[i] for i in rows], dtype=probs.dtype, device=probs.device)[:, None]
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, before > limits)
    logits = logits.clone()
    logits[rows] = logits[rows].masked_fill(drop, float("-inf"))
    return logits


def _logprobs(row: torch.Tensor, token_id: int, k: int) -> tuple[dict[int, float], float]:
    chosen = float(row[token_id])
    result = {token_id: chosen}
    if k:
        values, ids = row.topk(k)
        for value, i in zip(values.tolist(), ids.tolist(), strict=True):
            result.setdefault(i, value)
    return result, chosen

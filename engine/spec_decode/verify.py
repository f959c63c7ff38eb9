"""Verification of drafts against the model's own distributions, exact for greedy and for sampling.

A sequence that drafted ``d`` tokens gets ``d + 1`` logits rows in one forward pass: row ``j`` is the distribution
of the token after the draft's first ``j`` tokens. Greedy keeps the drafts while each equals the row's argmax and
then emits that argmax: token for token what decoding one at a time gives. Sampling treats each draft as a point
mass ``q = delta(x)`` (the proposers are deterministic): draft ``x_j`` is kept with probability ``p_j(x_j)``; at the
first rejection the token is drawn from ``p_j`` with ``x_j`` removed and renormalised (``(p - q)+``), and when all
are kept a bonus token is drawn from the last row. So every emitted token follows the distribution decoding one at
a time would draw from (speculative sampling; Leviathan et al., Chen et al., 2023). ``p`` is the distribution the
sampler draws from: temperature, top-k, top-p and min-p applied. A seeded sequence draws from its own generator.
Logprobs are those of the model's raw distribution at each emitted token's row, as the sampler reports them.
"""

from dataclasses import dataclass

import torch

from engine.sampler import _logprobs, _top_k, _top_p
from engine.sequence import Sequence


@dataclass(slots=True)
class Verified:
    tokens: list[int]  # the kept drafts, then one more token
    logprobs: list[dict[int, float]] | None  # per emitted token, when the sequence asked
    sampled_logprobs: list[float] | None


def verify(logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]], generator: torch.Generator,
           structured=None) -> list[Verified]:
    """``logits``: [sum(len(d) + 1), V] float32, each sequence's rows in order. One ``Verified`` per sequence.
    Constrained sequences' rows are masked first (``structured``: the engine's StructuredDecoding); logprobs stay
    the raw distribution's."""
    raw = logits
    if structured is not None and any(seq.matcher is not None for seq in seqs):
        logits = logits.clone()
        mask_drafts(structured, logits, seqs, drafts)
    starts, row = [], 0
    for draft in drafts:
        starts.append(row)
        row += len(draft) + 1
    greedy_rows = [r for seq, draft, s in zip(seqs, drafts, starts, strict=True) if seq.params.is_greedy
                   for r in range(s, s + len(draft) + 1)]
    argmax = {}
    if greedy_rows:
        argmax = dict(zip(greedy_rows, logits[greedy_rows].argmax(dim=-1).tolist(), strict=True))
    random_rows = [r for seq, draft, s in zip(seqs, drafts, starts, strict=True) if not seq.params.is_greedy
                   for r in range(s, s + len(draft) + 1)]
    probs = {}
    if random_rows:
        row_params = [seq.params for seq, draft in zip(seqs, drafts, strict=True) if not seq.params.is_greedy
                      for _ in range(len(draft) + 1)]
        probs = dict(zip(random_rows, _distributions(logits[random_rows], row_params), strict=True))
    out = []
    for seq, draft, start in zip(seqs, drafts, starts, strict=True):
        if seq.params.is_greedy:
            tokens = _verify_greedy(draft, [argmax[start + j] for j in range(len(draft) + 1)])
        else:
            gen = seq.generator if seq.generator is not None else generator
            tokens = _verify_sampled(draft, [probs[start + j] for j in range(len(draft) + 1)], gen)
        out.append(_with_logprobs(seq, tokens, raw[start:start + len(tokens)]))
    return out


def mask_drafts(structured, logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]]) -> None:
    """Mask, in place, the rows of constrained sequences: row ``j`` by the grammar's state after the draft's first
    ``j`` tokens (the matcher walks the draft, filling a row at each step, and rolls back)."""
    constrained = [i for i, seq in enumerate(seqs) if seq.matcher is not None]
    if not constrained:
        return
    from engine.structured.bitmask import apply_bitmask

    backend = structured.backend
    bitmask = backend.allocate_bitmask(logits.shape[0])
    rows, start = [], 0
    starts = []
    for draft in drafts:
        starts.append(start)
        start += len(draft) + 1
    for i in constrained:
        matcher, draft = seqs[i].matcher, drafts[i]
        for j in range(len(draft) + 1):
            matcher.fill_bitmask(bitmask, starts[i] + j)
            rows.append(starts[i] + j)
            if j < len(draft) and not matcher.accept_token(draft[j]):
                raise RuntimeError(f"draft token {draft[j]} was checked against the grammar and is refused now")
        matcher.rollback(len(draft))
    apply_bitmask(logits, bitmask, rows)


def _verify_greedy(draft: list[int], targets: list[int]) -> list[int]:
    kept = 0
    while kept < len(draft) and draft[kept] == targets[kept]:
        kept += 1
    return draft[:kept] + [targets[kept]]


def _verify_sampled(draft: list[int], rows: list[torch.Tensor], generator: torch.Generator) -> list[int]:
    tokens = []
    for j, token in enumerate(draft):
        p = rows[j]
        if torch.rand((), generator=generator, device=p.device).item() < p[token].item():
            tokens.append(token)
            continue
        residual = p.clone()
        residual[token] = 0.0
        total = residual.sum()
        if total.item() <= 0.0:  # p was a point mass on the draft: the rejection had probability 0
            tokens.append(token)
            continue
        tokens.append(int(torch.multinomial(residual / total, 1, generator=generator).item()))
        return tokens
    tokens.append(int(torch.multinomial(rows[len(draft)], 1, generator=generator).item()))
    return tokens


def _distributions(logits: torch.Tensor, params: list) -> list[torch.Tensor]:
    temperatures = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=logits.device)
    logits = logits / temperatures[:, None]
    top_k = [p.top_k for p in params]
    if any(k > 0 for k in top_k):
        logits = _top_k(logits, top_k)
    top_p = [p.top_p for p in params]
    if any(p < 1.0 for p in top_p):
        logits = _top_p(logits, top_p)
    probs = torch.softmax(logits, dim=-1)
    min_p = [p.min_p for p in params]
    if any(p > 0.0 for p in min_p):  # as the sampler filters, then renormalised: acceptance reads p(x) itself
        floor = torch.tensor(min_p, dtype=probs.dtype, device=probs.device)[:, None]
        probs = probs.masked_fill(probs < floor * probs.amax(dim=-1, keepdim=True), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return list(probs)


def _with_logprobs(seq: Sequence, tokens: list[int], rows: torch.Tensor) -> Verified:
    if seq.params.logprobs is None:
        return Verified(tokens, None, None)
    raw = torch.log_softmax(rows, dim=-1)
    pairs = [_logprobs(raw[j], token, seq.params.logprobs) for j, token in enumerate(tokens)]
    return Verified(tokens, [p[0] for p in pairs], [p[1] for p in pairs])

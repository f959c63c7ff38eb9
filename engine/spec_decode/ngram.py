"""``NgramProposer``: drafts copied from earlier in the sequence (prompt lookup; vLLM's ``ngram`` method).

The longest suffix of the sequence, between ``prompt_lookup_max`` and ``prompt_lookup_min`` tokens, that also
occurs earlier is looked up, and the ``k`` tokens that followed its latest earlier occurrence are the draft.
Extraction, editing and RAG answers copy long runs from their prompt, where this accepts most drafts; elsewhere
it finds nothing and costs nothing but the lookup.
"""

import numpy as np


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4,
                 max_lookback: int = 8192):
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {prompt_lookup_min} and "
                             f"{prompt_lookup_max}")
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max
        self.max_lookback = max_lookback  # tokens searched back from the end: bounds the lookup's cost

    def propose(self, token_ids: list[int], k: int | None = None) -> list[int]:
        """Up to ``k`` (default ``num_speculative_tokens``) drafted tokens to follow ``token_ids``; [] if none."""
        k = self.k if k is None else k
        if k <= 0 or len(token_ids) <= self.min_n:
            return []
        tokens = np.asarray(token_ids[-self.max_lookback:], dtype=np.int64)
        total = len(tokens)
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            pattern = tokens[total - n:]
            # windows starting at 0 .. total-n-1: every earlier occurrence (not the suffix itself)
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:total - 1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n  # the latest occurrence: closest context, most likely to continue alike
                return tokens[start:start + k].tolist()
        return []

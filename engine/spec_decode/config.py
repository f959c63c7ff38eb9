"""``SpeculativeConfig``: ``speculative_config`` as ``LLM`` and ``engine serve --speculative-config`` take it (vLLM's
field names where vLLM has them)."""

from dataclasses import dataclass, fields

METHODS = ("ngram", "suffix")
MAX_SPECULATIVE_TOKENS = 16
_DEFAULT_LOOKUP = 5  # n-gram length when neither bound is given (vLLM's)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int = 4
    # ngram: the longest repeated suffix between these lengths is looked up in the sequence itself. Defaults as
    # vLLM's: one given alone is the other too (a lone prompt_lookup_max of 4 means 4-grams only), neither means 5.
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    # suffix: tries cut at this depth; a continuation is drafted while its share of the counts is at least this
    suffix_decoding_max_tree_depth: int = 32
    suffix_decoding_min_token_prob: float = 0.1
    # suffix: a draft is at most this many times as long as the match it continues (vLLM's name). None: no cap but
    # num_speculative_tokens. vLLM's default is 1.0; here, at one request, verifying a longer draft costs little on a
    # CPU, and 1.0 cost the editing workload 15% of its speculative throughput (offline, batch 1, k=5: 67-70 output
    # tokens per CPU second against 78-84 uncapped; the json set 44-49 against 42-48), so it is not the default.
    suffix_decoding_max_spec_factor: float | None = None
    suffix_decoding_max_tree_nodes: int = 4_000_000  # over every scope's tree (about 120 bytes a node)
    # No drafts in a step with more sequences running than this: at a large enough batch a CPU step is compute-bound
    # and verifying drafts costs more than it saves. bench.spec_decode measures where: on the Intel AMX VM drafts still
    # paid 1.4-1.55x at 32 sequences (input-grounded prompts), the largest batch measured, so the cut is there.
    max_batch_size: int = 32
    # A sequence whose acceptance (exponential average) falls under this drafts again only after a back-off.
    min_acceptance_rate: float = 0.25

    @classmethod
    def from_dict(cls, value: "dict | SpeculativeConfig | None") -> "SpeculativeConfig | None":
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config has unknown fields {unknown}; known: {sorted(known)}")
        if "method" not in value:
            raise ValueError(f"speculative_config needs 'method' ({' or '.join(METHODS)})")
        return cls(**value)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {METHODS}, got {self.method!r}")
        _int_in("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            low = high = _DEFAULT_LOOKUP
        object.__setattr__(self, "prompt_lookup_min", high if low is None else low)
        object.__setattr__(self, "prompt_lookup_max", low if high is None else high)
        _int_in("prompt_lookup_min", self.prompt_lookup_min, 1, 64)
        _int_in("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min, 64)
        _int_in("suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth, 2, 256)
        _int_in("suffix_decoding_max_tree_nodes", self.suffix_decoding_max_tree_nodes, 1, 1 << 31)
        _int_in("max_batch_size", self.max_batch_size, 1, 1 << 20)
        for name in ("suffix_decoding_min_token_prob", "min_acceptance_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise ValueError(f"speculative_config.{name} must be in [0, 1], got {value!r}")
        factor = self.suffix_decoding_max_spec_factor
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, int | float)
                                   or not 0 < factor <= MAX_SPECULATIVE_TOKENS):
            raise ValueError("speculative_config.suffix_decoding_max_spec_factor must be in (0, "
                             f"{MAX_SPECULATIVE_TOKENS}], got {factor!r}")


def _int_in(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"speculative_config.{name} must be an integer in [{low}, {high}], got {value!r}")

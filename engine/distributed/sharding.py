"""Which part of a Llama-family model one tensor-parallel rank holds (Megatron-style; torch-free).

Column-parallel (a rank computes a slice of the outputs): q/k/v by attention heads, gate/up by rows of the
intermediate size, the vocabulary projection by vocabulary rows. Row-parallel (a rank multiplies a slice of the
inputs; the partial sums are all-reduced): o_proj over the rank's heads and down_proj over its intermediate slice.
Embeddings and norms stay whole on every rank (the embedding is a lookup: replicating it costs memory, no time).

Heads split by KV group: a rank holds whole KV heads and the query heads that attend to them, so grouped-query
attention never crosses ranks. Counts that do not divide split as evenly as they can, the first ranks holding one
more (SmolLM2-135M's 3 KV heads over 2 ranks: 2 and 1, with 6 and 3 query heads): every rank must hold a KV head.
"""

from dataclasses import dataclass

Span = tuple[int, int]  # (first index, count)
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")


def balanced_span(total: int, size: int, rank: int) -> Span:
    """Rank ``rank``'s part of ``total`` items over ``size`` ranks, the first ``total % size`` ranks one more."""
    base, extra = divmod(total, size)
    return rank * base + min(rank, extra), base + (rank < extra)


@dataclass(frozen=True, slots=True)
class ModelShard:
    """Rank ``rank`` of ``size``: the heads, intermediate rows and vocabulary rows it holds."""

    rank: int
    size: int
    head_dim: int
    q_heads: Span
    kv_heads: Span
    intermediate: Span
    vocab: Span
    vocab_spans: tuple[Span, ...]  # every rank's vocabulary rows, to put the gathered logits together

    @classmethod
    def of(cls, config, rank: int, size: int) -> "ModelShard":
        """From a ``ModelConfig`` (``num_heads``, ``num_kv_heads``, ``head_dim``, ``intermediate_size``,
        ``vocab_size``). ValueError, naming the limit, for a size the model cannot be split into."""
        if type(size) is not int or size < 1:
            raise ValueError(f"tensor_parallel_size must be a positive int, got {size!r}")
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is outside a tensor-parallel group of {size}")
        if config.num_kv_heads < size:
            raise ValueError(
                f"tensor_parallel_size {size} exceeds the model's {config.num_kv_heads} KV heads: each "
                "rank holds whole KV heads with their query heads, so at most "
                f"{config.num_kv_heads} ranks"
            )
        group = config.num_heads // config.num_kv_heads
        kv_first, kv_count = balanced_span(config.num_kv_heads, size, rank)
        vocab_spans = tuple(balanced_span(config.vocab_size, size, r) for r in range(size))
        return cls(
            rank,
            size,
            config.head_dim,
            (kv_first * group, kv_count * group),
            (kv_first, kv_count),
            balanced_span(config.intermediate_size, size, rank),
            vocab_spans[rank],
            vocab_spans,
        )

    @property
    def max_vocab_rows(self) -> int:
        """The rows every rank's logits are padded to for the gather (collectives take equal shapes)."""
        return max(count for _, count in self.vocab_spans)

    def lora_spans(self, module: str) -> tuple[Span | None, Span | None]:
        """(input span, output span) of a LoRA module on this rank, None where the rank holds all of it: a
        column-parallel module's B is split by output rows (A whole), a row-parallel one's A by input columns
        (B whole), as the base weight is."""
        heads = {"q_proj": self.q_heads, "k_proj": self.kv_heads, "v_proj": self.kv_heads, "o_proj": self.q_heads}
        if module in heads:
            first, count = heads[module]
            span = (first * self.head_dim, count * self.head_dim)
        elif module in ("gate_proj", "up_proj", "down_proj"):
            span = self.intermediate
        else:
            raise ValueError(f"unknown module {module!r}")
        return (span, None) if module in ROW_PARALLEL else (None, span)

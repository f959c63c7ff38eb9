"""``ModelRunner``: owns the model and the KV cache; runs one forward pass per step and samples.

It only reads sequences: the scheduler decided how many tokens each computes, the block manager where
their KV goes. The step's batch is flattened (prefill chunks and decode tokens one after another) and
described by one ``BatchMetadata``.

With ``tensor_parallel_size`` N > 1 the runner of rank 0 spawns the workers (``engine.distributed.workers``) and
holds its own shard; each step's batch goes to them in one broadcast before its forward pass, whose collectives
meet theirs. The workers build a runner of their own (``parallel``: their group) and call :meth:`forward`.
"""

import logging
from pathlib import Path

import torch

from engine.batch_metadata import BatchMetadata
from engine.config import EngineConfig, ModelConfig, parse_memory
from engine.host_memory import keep_freed_memory, prefault, zeroed
from engine.models.gemm_choice import choose_gemm
from engine.models.loader import load_model
from engine.sampler import Sampler, SamplerOutput
from engine.scheduler import SchedulerOutput
from engine.spec_decode.verify import verify
from kernels import kv_int8
from kernels.cpu import attention

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE = 2 * 2**30
# Room left on a GPU for activations of a max_num_batched_tokens step, per token (hidden states, logits rows).
_GPU_ACTIVATION_BYTES_PER_TOKEN = 64 * 2**10


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, folder: Path, *, max_model_len: int,
                 eos_token_ids: tuple[int, ...], structured=None, parallel=None):
        self.workers = None  # rank 0 of a tensor-parallel group: engine.distributed.workers.TensorParallelWorkers
        if parallel is None and config.tensor_parallel_size > 1:
            from engine.distributed.workers import TensorParallelWorkers

            self.workers = TensorParallelWorkers(config, model_config, folder, max_model_len)
            parallel = self.workers.group
        try:
            self._build(config, model_config, folder, max_model_len, eos_token_ids, structured, parallel)
        except BaseException:
            if self.workers is not None:
                self.workers.abort()
            raise

    def _build(self, config, model_config, folder, max_model_len, eos_token_ids, structured, parallel) -> None:
        self.config = config
        self.parallel = parallel  # engine.distributed.group.TensorParallelGroup, or None: the whole model here
        self.model_config = model_config
        self.device = config.torch_device
        self.dtype = config.torch_dtype(model_config)
        self.kv_cache_dtype = config.kv_cache_torch_dtype(model_config)
        if self.device.type == "cuda" and self.kv_cache_dtype != self.dtype:
            raise ValueError(f"kv_cache_dtype {config.kv_cache_dtype} differs from the model's {self.dtype}: only "
                             "the CPU kernels read a KV cache of another dtype")
        if self.kv_cache_dtype == torch.int8 and not attention.reads_int8_in_c(self.dtype):
            logger.warning("kv_cache_dtype int8 with a %s model on this CPU: attention dequantizes each sequence's "
                           "context in torch (slower than the model's dtype); the C loop reads int8 rows with bf16 "
                           "activations on CPUs with AVX512-BF16", str(self.dtype).removeprefix("torch."))
        self.block_size = config.block_size
        if self.device.type == "cpu":
            keep_freed_memory()
        self.model = load_model(folder, model_config, dtype=self.dtype, device=self.device,
                                max_positions=max_model_len, quantization=config.quantization, group=parallel)
        self.gemm = choose_gemm(self.model, mode=config.gemm, dtype=self.dtype, device=self.device,
                                max_num_batched_tokens=config.max_num_batched_tokens,
                                max_num_seqs=config.max_num_seqs)
        self.kv_cache = self._allocate_kv_cache(model_config, max_model_len, parallel)
        self.model.bind_kv_cache(list(self.kv_cache[0]), list(self.kv_cache[1]))
        if self.device.type == "cpu" and self.model.use_native_forward():
            logger.info("decoder layers: replayed as C kernel calls at steps of up to %d tokens without adapters",
                        self.model.native.max_tokens)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(config.seed)
        self.sampler = Sampler(eos_token_ids, generator, structured)

    def _allocate_kv_cache(self, model_config, max_model_len: int, parallel) -> torch.Tensor:
        """[2, L, blocks, bs, Hkv, D] (int8: D + 4, kernels.kv_int8). On CPU zeroed pages (start-up pays nothing for
        them), each faulted in as a step first writes it or, with ``kv_prefault``, ahead by a background thread from
        the lowest blocks up (host_memory.prefault)."""
        self.num_kv_heads = parallel.shard.kv_heads[1] if parallel is not None else model_config.num_kv_heads
        self.num_blocks = self._num_kv_blocks(max_model_len)
        if parallel is not None:  # every rank holds the same blocks (of its own heads)
            self.num_blocks = parallel.min_over_ranks(self.num_blocks)
        shape = (2, model_config.num_layers, self.num_blocks, self.block_size, self.num_kv_heads,
                 kv_int8.row_elements(model_config.head_dim, self.kv_cache_dtype))
        self.kv_prefault = None
        if self.device.type != "cpu":
            return torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
        cache = zeroed(shape, self.kv_cache_dtype)
        if self.config.kv_prefault:  # the thread faulting it in, lowest blocks first
            self.kv_prefault = prefault(cache, parts=2 * model_config.num_layers)
        return cache

    @property
    def kv_block_bytes(self) -> int:
        c = self.model_config
        row = kv_int8.row_elements(c.head_dim, self.kv_cache_dtype)
        return 2 * c.num_layers * self.block_size * self.num_kv_heads * row * self.kv_cache_dtype.itemsize

    def _num_kv_blocks(self, max_model_len: int) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        if self.config.kv_cache_memory is not None:
            budget = parse_memory(self.config.kv_cache_memory, "kv_cache_memory")
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            reserve = total * (1.0 - self.config.gpu_memory_utilization)
            budget = int(free - reserve - self.config.max_num_batched_tokens * _GPU_ACTIVATION_BYTES_PER_TOKEN)
        else:  # no point in more than every sequence at full length
            full = self.config.max_num_seqs * -(-max_model_len // self.block_size) * self.kv_block_bytes
            budget = min(DEFAULT_CPU_KV_CACHE, full)
        num_blocks = budget // self.kv_block_bytes
        if num_blocks < 1:
            raise ValueError(f"KV cache budget of {budget} bytes holds no block of {self.kv_block_bytes} bytes")
        logger.info("KV cache: %d blocks of %d tokens (%.2f GiB, %s)", num_blocks, self.block_size,
                    num_blocks * self.kv_block_bytes / 2**30, str(self.kv_cache_dtype).removeprefix("torch."))
        return num_blocks

    def prepare(self, out: SchedulerOutput) -> tuple[torch.Tensor, BatchMetadata, list[int]]:
        """Flatten the step: token ids [T], the batch metadata, and for each sampling sequence the index in
        ``out.seqs`` (its logits rows come in that order: one, or a draft's ``d + 1``).

        Sequences with adapters are laid out by slot, so each adapter's tokens are one run for the LoRA kernels.
        A sequence's draft (``spec_token_ids``) follows its last token as more query tokens of it: causal
        attention over its context, a logits row at each of them.
        """
        bs = self.block_size
        input_ids, positions, slots, tables, seq_lens, starts, logits_indices = [], [], [], [], [], [0], []
        token_slots, rows = [], []
        scheduled = list(enumerate(zip(out.seqs, out.num_new_tokens, strict=True)))
        with_lora = any(seq.lora_slot >= 0 for seq in out.seqs)
        if with_lora:
            scheduled.sort(key=lambda item: item[1][0].lora_slot)
        for index, (seq, num_new) in scheduled:
            first, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
            table = seq.block_table
            input_ids.extend(seq.token_ids[first:end])
            if end > seq.num_tokens:  # the draft's tokens after the sequence's own
                input_ids.extend(seq.spec_token_ids[:end - seq.num_tokens])
            positions.extend(range(first, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(first, end))
            token_slots.extend([seq.lora_slot] * num_new)
            tables.append(table)
            seq_lens.append(end)
            starts.append(starts[-1] + num_new)
            if end >= seq.num_tokens:  # context complete: its last token's logits pick the next token
                logits_indices.extend(range(starts[-1] - 1 - (end - seq.num_tokens), starts[-1]))
                rows.append(index)
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        batch = BatchMetadata(
            positions=self._tensor(positions, torch.int64),
            slot_mapping=self._tensor(slots, torch.int64),
            block_tables=self._tensor(padded, torch.int32),
            seq_lens=self._tensor(seq_lens, torch.int32),
            query_start_loc=self._tensor(starts, torch.int32),
            logits_indices=self._tensor(logits_indices, torch.int64),
            token_slots=self._tensor(token_slots, torch.int32) if with_lora else None,
        )
        return self._tensor(input_ids, torch.int64), batch, rows

    def _tensor(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        if self.device.type == "cpu":
            return torch.tensor(values, dtype=dtype)
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(self.device, non_blocking=True)

    def bind_lora(self, slots) -> None:
        """Point the model's projections at the adapter slots (an ``AdapterSlotCache`` or a worker's
        ``SlotBuffers``); rank 0 of a group also sends every slot write to the workers."""
        self.model.bind_lora(slots)
        if self.workers is not None:
            self.workers.follow_slots(slots.buffers)

    def forward(self, input_ids: torch.Tensor, batch: BatchMetadata) -> torch.Tensor | None:
        """The logits [num_logits_rows, vocab] of the step's sampled rows (None when it samples none, and on the
        workers of a group)."""
        hidden = self.model(input_ids, batch)  # [T, hidden]
        if batch.logits_indices.numel() == 0:
            return None
        return self.model.compute_logits(hidden[batch.logits_indices])

    def check_workers(self) -> None:
        """Raise ``TensorParallelError`` if a rank of the group has died; nothing to check without one."""
        if self.workers is not None:
            self.workers.check()

    def parallel_stats(self) -> dict | None:
        return self.workers.stats() if self.workers is not None else None

    def native_stats(self) -> dict | None:
        """The C replay of the decoder layers: steps and kernel seconds by kind; None where it does not run."""
        native = getattr(self.model, "native", None)
        return native.stats() if native is not None else None

    def shutdown(self) -> None:
        """Stop the workers of a tensor-parallel group (a no-op without one)."""
        if self.workers is not None:
            self.workers.stop()

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> SamplerOutput:
        """Run the step's forward pass and sample for the sequences whose context is complete: one row per
        scheduled sequence, in the order of ``out.seqs`` (None for one that computed a prompt chunk only)."""
        input_ids, batch, rows = self.prepare(out)
        if self.workers is None:
            logits = self.forward(input_ids, batch)  # [num_logits_rows, vocab] or None
        else:
            logits = self.workers.run_step(input_ids, batch, self.forward)
        result = SamplerOutput.empty(len(out.seqs))
        if not rows:
            return result
        drafting = [i for i in rows if out.seqs[i].spec_token_ids]
        if not drafting:
            result.scatter(rows, self.sampler(logits, [out.seqs[i] for i in rows]))
            return result
        plain, plain_rows, draft_rows, position = [], [], [], 0
        for i in rows:
            width = len(out.seqs[i].spec_token_ids) + 1
            (draft_rows if width > 1 else plain_rows).extend(range(position, position + width))
            if width == 1:
                plain.append(i)
            position += width
        if plain:
            result.scatter(plain, self.sampler(logits[plain_rows], [out.seqs[i] for i in plain]))
        seqs = [out.seqs[i] for i in drafting]
        result.scatter_verified(drafting, verify(logits[draft_rows], seqs, [s.spec_token_ids for s in seqs],
                                                 self.sampler.generator, self.sampler.structured))
        return result

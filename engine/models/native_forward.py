"""The decoder layers of a step as one replay of C kernel calls (``kernels.cpu.program``), without Python between them.

At a decode step of one sequence each kernel is short and the Python around it (checks, allocations, ctypes'
argument conversions, module calls) cost as much as every non-GEMM kernel together: 3.5 ms of an 11.6 ms step
(SmolLM2 in bf16, 2-vCPU AMD EPYC Zen 4, perf). :class:`NativeForward` records each layer's nine calls once (fused
add and norm, q|k|v GEMM, rotary with the KV write, attention, o GEMM, add and norm, gate|up GEMM, SiLU and multiply,
down GEMM) against buffers of its own, and a step passes only its token count and metadata.

The same kernels run on the same values as the module path (``LlamaForCausalLM``'s ``forward`` through each
module), so the outputs are the same bit for bit; only the Python between them is gone. A program exists per band of
token counts in which every projection's chosen GEMM path (``engine.models.gemm``) is a C kernel (``gemv``, ``packed``,
``widened``, ``w8a8g``, ``dequantized`` where its dense copy runs the packed kernel), and one more with each
projection's LoRA shrink and expand (``lora.c``, as ``Projection._add_lora`` calls them) for steps with adapters. A
step outside those bands, with more than ``max_tokens`` tokens, with adapters the C LoRA loop does not take (float16,
ranks that are not multiples of 8), on a tensor-parallel shard or off CPU runs the module path.
``ENGINE_NATIVE_FORWARD=0`` turns the replay off.
"""

import ctypes
import logging
import os
from bisect import bisect_left

import torch

import kernels
from engine.models import gemm
from kernels.cpu import attention, int8_gemm, program, rms_norm, rotary_kv, silu_mul
from kernels.cpu import lora as lora_cpu
from kernels.cpu.program import ProgramError, Step

logger = logging.getLogger(__name__)

# the step values a program reads (program.Step indices)
NUM_VALUES = 14
(TOKENS, COS, SIN, SLOTS, BLOCK_TABLES, MAX_BLOCKS, SEQ_LENS, QUERY_START, SEQ_IDS, NUM_SEQS, THREADS, LORA_ROWS,
 LORA_SLOTS, LORA_COUNT) = map(Step, range(NUM_VALUES))
MAX_TOKENS = 256  # the most tokens a replayed step takes: past that the GEMMs' time dwarfs the Python's
REPLAYED_PATHS = ("gemv", "packed", "widened", "w8a8g", "dequantized")  # the GEMM paths a program records


def enabled() -> bool:
    value = os.environ.get("ENGINE_NATIVE_FORWARD", "1").strip().lower()
    if value not in ("0", "1", "false", "true", "no", "yes", "off", "on"):
        raise ValueError(f"ENGINE_NATIVE_FORWARD must be a boolean (1/0), got {value!r}")
    return value in ("1", "true", "yes", "on")


class NativeForward:
    """The layers of ``model`` (a ``LlamaForCausalLM`` with its KV cache bound) replayed in C; build with
    :meth:`build`, which says None where the model cannot be replayed at all."""

    def __init__(self, model, max_tokens: int):
        config = model.config
        self.model = model
        self.max_tokens = max_tokens
        self.dtype = model.embed_tokens.dtype
        first = model.layers[0]
        attn, mlp = first.self_attn, first.mlp
        self.hidden = config.hidden_size
        buffer = lambda width: torch.empty(max_tokens, width, dtype=self.dtype)
        self.residual, self.h, self.delta = buffer(self.hidden), buffer(self.hidden), buffer(self.hidden)
        self.qkv = buffer(attn.qkv_proj.out_features)
        self.q, self.attn = buffer(attn.num_heads * attn.head_dim), buffer(attn.num_heads * attn.head_dim)
        self.gate_up, self.act = buffer(mlp.gate_up_proj.out_features), buffer(mlp.size)
        # every token count at which some projection changes path, up to max_tokens: programs hold between two
        limits = {limit for layer in model.layers for p in _projections(layer) for limit, _ in p.kernel.bands}
        self.bounds = sorted({limit for limit in limits if limit < max_tokens} | {max_tokens})
        self.programs: dict[tuple[int, bool], program.Program | None] = {}  # (band, with adapters) -> program
        self.h_lora: torch.Tensor | None = None  # [max_tokens, the widest shrink] float32, once recorded
        self.lora_slots = 0  # the slots every projection's adapter buffers hold (bind_lora)
        self.disabled = False
        self.values = (ctypes.c_int64 * NUM_VALUES)()
        self.times = program.KernelTimes()  # every replay's time per kernel kind
        self.steps = 0  # the steps replayed
        self.adapters_bound()

    @classmethod
    def build(cls, model, max_tokens: int = MAX_TOKENS) -> "NativeForward | None":
        if not (enabled() and program.available() and model.group is None
                and model.embed_tokens.device.type == "cpu" and model.embed_tokens.dtype in (torch.float32,
                                                                                           torch.bfloat16)):
            return None
        for layer in model.layers:
            attn = layer.self_attn
            if attn.k_cache is None or not (attn.k_cache.is_contiguous() and attn.v_cache.is_contiguous()):
                return None
            if any(p.kernel is None or p.reduce is not None for p in _projections(layer)):
                return None
        return cls(model, max_tokens)

    def forward(self, input_ids: torch.Tensor, batch) -> torch.Tensor | None:
        """The hidden states [T, hidden] of the step (what ``LlamaForCausalLM.forward`` returns), or None where the
        step is not one a program takes (nothing done then)."""
        num_tokens = input_ids.shape[0]
        if self.disabled or not 1 <= num_tokens <= self.max_tokens or kernels.backend_for(input_ids.device) != "cpu":
            return None  # (a forced kernels backend, e.g. the reference one, runs through the modules)
        lora_rows = lora_slots = None
        if batch.token_slots is not None:  # the rows with an adapter in slot order, as the modules' C LoRA takes them
            plan = lora_cpu._plan(batch.token_slots)
            if plan.native_rows is not None:  # else no token has one: nothing to add
                if not lora_cpu._takes_native(plan, self.dtype) or plan.max_slot >= self.lora_slots:
                    return None
                lora_rows, lora_slots = plan.native_rows, plan.native_slots
        key = (bisect_left(self.bounds, num_tokens), lora_rows is not None)
        if key not in self.programs:
            self.programs[key] = self._record(self.bounds[key[0]], key[1])
        recorded = self.programs[key]
        if recorded is None or not _metadata_fits(batch):
            return None
        model = self.model
        torch.index_select(model.embed_tokens, 0, input_ids, out=self.residual[:num_tokens])
        cos, sin = model.rotary(batch.positions)  # [T, 1, D / 2] float32, contiguous
        seq_ids = attention._all_seq_ids(batch.num_seqs)
        values = self.values
        values[:] = (num_tokens, cos.data_ptr(), sin.data_ptr(), batch.slot_mapping.data_ptr(),
                     batch.block_tables.data_ptr(), batch.block_tables.shape[1], batch.seq_lens.data_ptr(),
                     batch.query_start_loc.data_ptr(), seq_ids.data_ptr(), batch.num_seqs, torch.get_num_threads(),
                     0, 0, 0)
        if lora_rows is not None:
            values[LORA_ROWS.index:] = (lora_rows.data_ptr(), lora_slots.data_ptr(), lora_rows.shape[0])
        try:
            recorded.run(values, self.times)
        except ProgramError as error:
            return self._failed(recorded, error)
        self.steps += 1
        return self.residual[:num_tokens] + self.delta[:num_tokens]

    def _failed(self, recorded: program.Program, error: ProgramError) -> None:
        kind = recorded.kinds[error.index]
        if kind == program.ROTARY_QKV and error.status == -2:
            raise IndexError("rotary_qkv: a slot in slot_mapping is past the cache's slots")
        if kind == program.ATTENTION and error.status == -2:
            raise ValueError(attention.METADATA_ERROR)
        # a kernel declined a shape (its compiled limits): the modules run this step, and every later one; the
        # layers before it wrote the same KV the modules write again
        logger.warning("native forward: op %d (kind %d) returned %d; the module path runs from now on", error.index,
                       kind, error.status)
        self.disabled = True
        return None

    def stats(self) -> dict:
        """The steps replayed and the seconds their kernels took, by kind (the layers only: not the embedding, the
        final norm, the logits or sampling)."""
        return {"steps": self.steps, "disabled": self.disabled,
                "kernel_seconds": {name: round(seconds, 6) for name, seconds in self.times.seconds().items()}}

    def adapters_bound(self) -> None:
        """The projections' adapter buffers changed (``bind_lora``): programs are recorded again."""
        self.programs.clear()
        loras = [p.lora for layer in self.model.layers for p in _projections(layer)]
        self.lora_slots = min((lora.lora_a.shape[0] for lora in loras if lora is not None), default=0)
        if any(lora is None for lora in loras):
            self.lora_slots = 0

    def _record(self, num_tokens: int, with_lora: bool) -> program.Program | None:
        """The program of the band that ends at ``num_tokens`` (with each projection's LoRA shrink and expand after
        its GEMM if ``with_lora``), or None where a kernel there is not a C one."""
        model, dtype = self.model, self.dtype
        norm = rms_norm._library(dtype)
        silu = silu_mul._library(dtype)
        if norm is None or silu is None or not silu.silu_mul_available():
            return None
        recorded = program.Program(NUM_VALUES)
        recorded.keep(self.residual, self.h, self.delta, self.qkv, self.q, self.attn, self.gate_up, self.act)
        ptr = torch.Tensor.data_ptr
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            kv_dtype = attn.k_cache.dtype
            rotary = rotary_kv._library(dtype, kv_dtype) if (dtype, kv_dtype) in rotary_kv._VARIANTS else None
            paged = attention._native_library(self.q.view(-1, attn.num_heads, attn.head_dim), attn.k_cache,
                                              attn.v_cache)
            if rotary is None or paged is None:
                return None
            for ln in (layer.input_layernorm, layer.post_attention_layernorm):
                if ln.weight.dtype != dtype or not ln.weight.is_contiguous():
                    return None
            num_slots = attn.k_cache.shape[0] * attn.k_cache.shape[1]
            recorded.add(program.ADD_RMS_NORM, norm.add_rms_norm,
                         (ptr(self.residual), None if i == 0 else ptr(self.delta),
                          ptr(layer.input_layernorm.weight), ptr(self.h), TOKENS, self.hidden, THREADS),
                         layer.input_layernorm.eps)
            if not self._gemm(recorded, attn.qkv_proj, num_tokens, self.h, self.qkv, with_lora):
                return None
            recorded.add(program.ROTARY_QKV, rotary.rotary_qkv,
                         (ptr(self.qkv), self.qkv.shape[1], TOKENS, attn.num_heads, attn.num_kv_heads, attn.head_dim,
                          COS, SIN, ptr(self.q), SLOTS, ptr(attn.k_cache), ptr(attn.v_cache), num_slots, THREADS))
            recorded.add(program.ATTENTION, paged.paged_attention,
                         (ptr(self.q), ptr(self.attn), ptr(attn.k_cache), ptr(attn.v_cache), attn.k_cache.shape[0],
                          BLOCK_TABLES, MAX_BLOCKS, SEQ_LENS, QUERY_START, SEQ_IDS, NUM_SEQS, attn.num_heads,
                          attn.num_kv_heads, attn.head_dim, attn.k_cache.shape[1], THREADS), attn.scale)
            if not self._gemm(recorded, attn.o_proj, num_tokens, self.attn, self.delta, with_lora):
                return None
            recorded.add(program.ADD_RMS_NORM, norm.add_rms_norm,
                         (ptr(self.residual), ptr(self.delta), ptr(layer.post_attention_layernorm.weight), ptr(self.h),
                          TOKENS, self.hidden, THREADS), layer.post_attention_layernorm.eps)
            if not self._gemm(recorded, mlp.gate_up_proj, num_tokens, self.h, self.gate_up, with_lora):
                return None
            recorded.add(program.SILU_MUL, silu.silu_mul, (ptr(self.gate_up), ptr(self.act), TOKENS, mlp.size, THREADS))
            if not self._gemm(recorded, mlp.down_proj, num_tokens, self.act, self.delta, with_lora):
                return None
        return recorded

    def _gemm(self, recorded: program.Program, projection, num_tokens: int, x: torch.Tensor, y: torch.Tensor,
              with_lora: bool) -> bool:
        """Record ``y = projection(x)`` as the C kernel its band at ``num_tokens`` runs (and its LoRA after it if
        ``with_lora``); False where one of them is not a C one."""
        return self._base_gemm(recorded, projection, num_tokens, x, y) and (
            not with_lora or self._lora(recorded, projection, x, y))

    def _lora(self, recorded: program.Program, projection, x: torch.Tensor, y: torch.Tensor) -> bool:
        """``y += the adapters' x A^T B^T`` of the step's rows with one: ``lora.c``'s shrink and expand, as
        ``Projection._add_lora`` calls them; False where the C loop does not take this projection's shapes."""
        lora, sizes = projection.lora, tuple(piece.size for piece in projection.output_slices)
        library = lora_cpu._library(self.dtype)
        a, b = lora.lora_a, lora.lora_b  # [slots, parts * max_rank, in], [slots, sum of sizes, max_rank]
        if (library is None or a.dtype != self.dtype or b.dtype != self.dtype or not a.is_contiguous()
                or not b.is_contiguous() or lora.scales.dtype != torch.float32 or not lora.scales.is_contiguous()
                or a.shape[2] != x.shape[1] or sum(sizes) != y.shape[1] or b.shape[1] != y.shape[1]
                or any(n % 8 for n in (a.shape[1], a.shape[2], b.shape[2], *sizes))):  # lora.c's LANES
            return False
        if self.h_lora is None or self.h_lora.shape[1] < a.shape[1]:
            self.h_lora = torch.empty(self.max_tokens, a.shape[1], dtype=torch.float32)
        h, part_sizes = self.h_lora, torch.tensor(sizes, dtype=torch.int64)  # h's rows: a.shape[1] apart
        recorded.keep(h, part_sizes)
        recorded.add(program.LORA_SHRINK, library.lora_shrink,
                     (x.data_ptr(), x.shape[1], a.data_ptr(), a.shape[2], a.shape[1], LORA_ROWS, LORA_SLOTS, LORA_COUNT,
                      h.data_ptr(), THREADS))
        recorded.add(program.LORA_EXPAND, library.lora_expand,
                     (y.data_ptr(), y.shape[1], h.data_ptr(), a.shape[1], b.data_ptr(), b.shape[1], b.shape[2],
                      part_sizes.data_ptr(), len(sizes), lora.scales.data_ptr(), LORA_ROWS, LORA_SLOTS, LORA_COUNT,
                      THREADS))
        return True

    def _base_gemm(self, recorded: program.Program, projection, num_tokens: int, x: torch.Tensor,
                   y: torch.Tensor) -> bool:
        """Record ``y = x W^T + b`` as the C kernel the band at ``num_tokens`` runs; False where it is not one."""
        path, operand = projection.kernel.band(num_tokens)
        if path == "dequantized":  # the packed kernel on a dense copy of the quantized values, where it takes them
            path, operand = "packed", (gemm.dequantized_packed(operand, self.dtype), None)
        bias = projection.kernel.bias
        if bias is not None and not (bias.dtype == self.dtype and bias.is_contiguous()):
            return False
        bias_ptr = None if bias is None else bias.data_ptr()
        if path in ("gemv", "packed", "widened"):
            weight = operand[0]
            if weight is None or (path == "gemv" and num_tokens > 4):  # gemv.MAX_ROWS
                return False
            data = weight.weight if path == "gemv" else weight.data
            if data.dtype != self.dtype or (weight.n, weight.k) != (y.shape[1], x.shape[1]):
                return False
            recorded.add(program.GEMM, weight.kernel,
                         (x.data_ptr(), TOKENS, data.data_ptr(), bias_ptr, weight.n, weight.k, y.data_ptr(), THREADS))
            return True
        if path == "w8a8g":
            weight = operand["packed"]
            if weight is None or (weight.n, weight.k) != (y.shape[1], x.shape[1]):
                return False
            bias32 = None if bias is None else bias.detach().float().contiguous()
            recorded.keep(bias32)
            recorded.add(program.GEMM_INT8, int8_gemm._library().int8_gemm,
                         (x.data_ptr(), TOKENS, int(self.dtype == torch.bfloat16), weight.data.data_ptr(),
                          weight.scales.data_ptr(), None if bias32 is None else bias32.data_ptr(), weight.n, weight.k,
                          y.data_ptr(), THREADS))
            return True
        return False


def _projections(layer):
    return (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)


def _metadata_fits(batch) -> bool:
    """The step's metadata is what the kernels read: int64 positions and slots, int32 tables, all contiguous."""
    return (batch.slot_mapping.dtype == torch.int64 and batch.positions.dtype == torch.int64
            and batch.block_tables.dtype == torch.int32 and batch.seq_lens.dtype == torch.int32
            and batch.query_start_loc.dtype == torch.int32 and batch.slot_mapping.is_contiguous()
            and batch.block_tables.is_contiguous() and batch.seq_lens.is_contiguous()
            and batch.query_start_loc.is_contiguous() and batch.slot_mapping.device.type == "cpu")

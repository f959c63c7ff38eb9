"""The Llama family (Llama, Mistral, Qwen2 config differences: GQA, rope scaling, tied embeddings, biases).

Weights come from HF safetensors by name (``engine.models.loader``); no transformers model class runs here.
Every projection, the vocabulary's included, is an ``engine.models.linear.Projection`` (adapters on the decoder
layers' ones, via :meth:`bind_lora` and the batch's token-to-slot index); attention reads and writes the paged KV cache
through ``kernels.write_kv`` and ``kernels.paged_attention`` over the whole flattened batch.

Inside the model, submodules are run through ``.forward``, not called: ``nn.Module.__call__``'s hook machinery cost
~1.5 us a call, seven calls a layer, 2-3% of a one-sequence decode step (SmolLM2 in bf16, 2-vCPU AMD EPYC Zen 5 VM).
Forward hooks on the layers, attention, MLP and projections therefore do not run; none are used.

Given a ``TensorParallelGroup`` the model is one rank's shard (``engine.distributed.sharding``): its heads in
attention, its intermediate rows in the MLP, its vocabulary rows in ``lm_head``; o_proj and down_proj all-reduce
their partial outputs, ``compute_logits`` gathers the vocabulary to rank 0. Without one nothing is split and no
collective runs.
"""

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from engine.batch_metadata import BatchMetadata
from engine.config import ModelConfig
from engine.models.linear import LoRAWeights, Projection, ProjectionShard
from engine.models.native_forward import NativeForward
from engine.models.rotary import RotaryEmbedding, apply_rotary
from kernels.cpu import rms_norm, rotary_kv, silu_mul


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden]
        # On CPU one C call with torch's roundings in bfloat16, torch's to a few units in the last place in float32
        # (kernels.cpu.rms_norm, None where it does not apply: then torch's op, HF's formula).
        out = rms_norm.add_rms_norm(x, None, self.weight, self.eps)
        return out if out is not None else F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_forward(self, residual: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """``residual += delta`` in place, then the norm of it: the residual stream's add fused with the next norm."""
        out = rms_norm.add_rms_norm(residual, delta, self.weight, self.eps)
        if out is not None:
            return out
        residual += delta
        return F.rms_norm(residual, self.weight.shape, self.weight, self.eps)


def _column(group, *starts: int) -> ProjectionShard | None:
    return None if group is None else ProjectionShard(0, starts)


def _row(group, start: int) -> ProjectionShard | None:
    return None if group is None else ProjectionShard(1, (start,), group.all_reduce, keep_bias=group.rank == 0)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, prefix: str, group=None):
        super().__init__()
        self.head_dim = config.head_dim
        q_first, self.num_heads = group.shard.q_heads if group else (0, config.num_heads)
        kv_first, self.num_kv_heads = group.shard.kv_heads if group else (0, config.num_kv_heads)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.sizes = (q_size, kv_size, kv_size)
        q_start, kv_start = q_first * self.head_dim, kv_first * self.head_dim
        self.qkv_proj = Projection(
            prefix, config.hidden_size, [("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)],
            bias=config.qkv_bias, shard=_column(group, q_start, kv_start, kv_start),
        )
        self.o_proj = Projection(prefix, q_size, [("o_proj", config.hidden_size)], bias=config.o_bias,
                                 shard=_row(group, q_start))
        self.scale = self.head_dim**-0.5
        self.k_cache: torch.Tensor | None = None  # [num_blocks, block_size, num_kv_heads, head_dim]
        self.v_cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: BatchMetadata):
        num_tokens = x.shape[0]
        qkv = self.qkv_proj.forward(x, batch)  # [T, (Hq + 2 Hkv) * D]
        q = None
        if qkv.device.type == "cpu" and kernels.backend_for(qkv.device) == "cpu":
            # the split, both rotaries and the KV write below in one C call, same numbers: at a decode token the
            # Python around those ops cost more than they did
            q = rotary_kv.rotary_qkv(qkv, self.num_heads, self.num_kv_heads, self.head_dim, *rope, self.k_cache,
                                     self.v_cache, batch.slot_mapping)  # [T, Hq, D]
        if q is None:
            q, k, v = qkv.split(self.sizes, dim=-1)  # [T, Hq*D], [T, Hkv*D], [T, Hkv*D]
            q = apply_rotary(q.view(num_tokens, self.num_heads, self.head_dim), *rope)  # [T, Hq, D]
            k = apply_rotary(k.view(num_tokens, self.num_kv_heads, self.head_dim), *rope)  # [T, Hkv, D]
            v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
            kernels.write_kv(k, v, self.k_cache, self.v_cache, batch.slot_mapping)
        out = kernels.paged_attention(
            q, self.k_cache, self.v_cache, batch.block_tables, batch.seq_lens, batch.query_start_loc, self.scale
        )  # [T, Hq, D]
        return self.o_proj.forward(out.view(num_tokens, -1), batch)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, prefix: str, group=None):
        super().__init__()
        first, size = group.shard.intermediate if group else (0, config.intermediate_size)
        self.gate_up_proj = Projection(
            prefix, config.hidden_size, [("gate_proj", size), ("up_proj", size)], bias=config.mlp_bias,
            shard=_column(group, first, first),
        )
        self.down_proj = Projection(prefix, size, [("down_proj", config.hidden_size)], bias=config.mlp_bias,
                                    shard=_row(group, first))
        self.size = size

    def forward(self, x: torch.Tensor, batch: BatchMetadata | None = None) -> torch.Tensor:  # [T, hidden]
        gate_up = self.gate_up_proj.forward(x, batch)  # [T, 2 x intermediate]
        # On CPU one C call with torch's roundings (kernels.cpu.silu_mul; None where it does not apply: torch's ops)
        hidden = silu_mul.silu_mul(gate_up)
        if hidden is None:
            gate, up = gate_up.split(self.size, dim=-1)
            hidden = F.silu(gate) * up
        return self.down_proj.forward(hidden, batch)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int, group=None):
        super().__init__()
        prefix = f"model.layers.{index}"
        self.self_attn = Attention(config, f"{prefix}.self_attn", group)
        self.mlp = MLP(config, f"{prefix}.mlp", group)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope,
                batch: BatchMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(the MLP's output, the residual stream before it): the caller's next layer adds the two (as vLLM's
        layers do), so each add runs fused with the norm after it. ``residual`` None: ``x`` is the embedding."""
        if residual is None:
            residual = x
            h = self.input_layernorm(x)
        else:
            h = self.input_layernorm.add_forward(residual, x)  # residual = x + residual
        h = self.post_attention_layernorm.add_forward(residual, self.self_attn.forward(h, rope, batch))
        return self.mlp.forward(h, batch), residual


class LlamaForCausalLM(nn.Module):
    """``forward`` maps a flattened batch to hidden states; ``compute_logits`` projects only the sampled rows.
    ``group``: an ``engine.distributed.group.TensorParallelGroup`` whose rank's shard this model is."""

    def __init__(self, config: ModelConfig, max_positions: int, group=None):
        super().__init__()
        self.config = config
        self.group = group
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(config, i, group) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, max_positions, config.rope_theta, config.rope_scaling)
        vocab_first, vocab_rows = group.shard.vocab if group else (0, config.vocab_size)
        tied = config.tie_word_embeddings and group is None  # a shard's tied rows are bound by tie_lm_head()
        self.lm_head = Projection("", config.hidden_size, [("lm_head", vocab_rows)], bias=False,
                                  weight=self.embed_tokens if tied else None, shard=_column(group, vocab_first))
        self.native = None  # engine.models.native_forward.NativeForward, once use_native_forward() found one

    def tie_lm_head(self) -> None:
        """After loading a shard with tied embeddings: its vocabulary projection views its rows of the embedding.
        (A view made before loading would not survive the dtype cast that precedes it.)"""
        if self.group is not None and self.config.tie_word_embeddings:
            first, rows = self.group.shard.vocab
            self.lm_head.weight = nn.Parameter(self.embed_tokens.detach()[first : first + rows], requires_grad=False)

    def bind_kv_cache(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]) -> None:
        self.native = None  # a replay records the caches' addresses: use_native_forward() again after this
        for layer, k_cache, v_cache in zip(self.layers, k_caches, v_caches, strict=True):
            layer.self_attn.k_cache, layer.self_attn.v_cache = k_cache, v_cache

    def use_native_forward(self) -> bool:
        """Replay the layers as recorded C kernel calls from now on where a step allows it
        (``engine.models.native_forward``); call after the GEMM paths and the KV cache are bound. Whether it could."""
        self.native = NativeForward.build(self)
        return self.native is not None

    def bind_lora(self, slot_cache) -> None:
        """Point every projection at its part of the adapter slot cache's buffers (``AdapterSlotCache``)."""
        for i, layer in enumerate(self.layers):
            for projection in layer.modules():
                if isinstance(projection, Projection):
                    lora_a, lora_b = slot_cache.group_weights(i, projection.module_names)
                    projection.lora = LoRAWeights(lora_a, lora_b, slot_cache.scales, slot_cache.slot_ranks)
        if self.native is not None:
            self.native.adapters_bound()

    def forward(self, input_ids: torch.Tensor, batch: BatchMetadata) -> torch.Tensor:
        # input_ids: [T] -> hidden states [T, hidden]
        if self.native is not None:
            hidden = self.native.forward(input_ids, batch)
            if hidden is not None:
                return hidden
        x = F.embedding(input_ids, self.embed_tokens)
        rope = self.rotary(batch.positions)
        residual = None
        for layer in self.layers:
            x, residual = layer.forward(x, residual, rope, batch)
        return residual + x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:  # [N, hidden] -> [N, vocab] float32
        """The logits of ``hidden``'s rows; a shard's gather to rank 0, None on the other ranks."""
        logits = self.lm_head(self.norm(hidden)).float()
        return logits if self.group is None else self.group.gather_logits(logits)

    def checkpoint_parts(self) -> dict[str, tuple[int, int, int] | None]:
        """A shard's ``(dim, start, length)`` of each sharded checkpoint tensor (``Projection.checkpoint_parts``)."""
        parts = {}
        for module in self.modules():
            if isinstance(module, Projection):
                parts.update(module.checkpoint_parts())
        return parts

    def hf_names(self) -> dict[str, tuple[nn.Parameter, int, int]]:
        """Every HF tensor name this model loads -> (parameter, first row, rows)."""
        names = {"model.embed_tokens.weight": (self.embed_tokens, 0, self.config.vocab_size),
                 "model.norm.weight": (self.norm.weight, 0, self.config.hidden_size)}
        if not self.config.tie_word_embeddings:
            names.update(self.lm_head.hf_names())
        for i, layer in enumerate(self.layers):
            for norm in ("input_layernorm", "post_attention_layernorm"):
                names[f"model.layers.{i}.{norm}.weight"] = (getattr(layer, norm).weight, 0, self.config.hidden_size)
        for module in self.layers.modules():
            if isinstance(module, Projection):
                names.update(module.hf_names())
        return names

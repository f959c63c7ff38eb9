"""Weights of a Llama-family model read directly from a GGUF file (llama.cpp's format), quantized tensors kept
quantized: the model is never dequantized whole.

Per tensor type of a decoder projection (GGUF's per-32 blocks run along the input axis):
  * ``Q4_0`` / ``Q4_1``: onto torch's int4 layout as they are (``quant.Int4Weight``; Q4_0 is ``x = d * (q - 8)``,
    Q4_1 ``x = d * q + m``, so zero is 0 or ``m + 8d``), when every part of a fused projection (q|k|v, gate|up)
    is one of them and its outputs are a multiple of 16 (else int8);
  * ``Q8_0``: requantized per output channel (``quant.Int8Weight``: one scale per row instead of one per 32
    values, so a block whose scale is below its row's largest loses low bits; ``tests/engine/test_quant_gguf.py``
    states the error);
  * ``F32`` / ``F16`` / ``BF16``: as from safetensors (quantized to int8 when ``quantization="int8"``);
  * any other type (K-quants, ...): dequantized with the ``gguf`` package for that tensor alone, then int8.
A fused projection whose parts differ in type runs int8. Embeddings and norms are read into the model's dtype
(a quantized embedding is dequantized: it is a lookup table, not a GEMM).

llama.cpp's converter permutes the rows of q and k (its rotary layout pairs neighbours, HF's halves); the
inverse permutation is applied here, to quantized rows and their scales alike.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from engine.config import ModelConfig
from engine.models.linear import Projection
from engine.models.quant import INT4_GROUP, INT4_ROWS, Int4Weight, Int8Weight, quantize_int8

GGUF_FILE = "model.gguf"  # the name a prepared GGUF folder links the file under (engine.models.prepare)
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None for a name with no HF twin."""
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    if len(parts) == 1 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{suffix}"
    return None


@dataclass(slots=True)
class _Piece:
    """One GGUF tensor's rows of a projection, decoded but not dequantized."""

    kind: str  # "float", "q8" or "q4"
    tensors: tuple[torch.Tensor, ...]  # float: (w [rows, in],); q8: (q [rows, in] int8, d [rows, in/32]);
    #                                     q4: (q [rows, in] uint8 0..15, scale [rows, in/32], zero [rows, in/32])

    def permute_rows(self, order: torch.Tensor) -> "_Piece":
        return _Piece(self.kind, tuple(t[order] for t in self.tensors))

    def to_float(self) -> torch.Tensor:  # [rows, in] float32
        if self.kind == "float":
            return self.tensors[0].float()
        if self.kind == "q8":
            q, d = self.tensors
            return (q.float().unflatten(1, (-1, INT4_GROUP)) * d[..., None]).flatten(1)
        return Int4Weight(*self.tensors).dequantize()

    def to_int8(self) -> Int8Weight:
        if self.kind != "q8":
            return quantize_int8(self.to_float())
        q, d = self.tensors  # per row: scale = the row's largest |d * q| / 127
        blocks = q.float().unflatten(1, (-1, INT4_GROUP))  # [rows, in/32, 32]
        amax = blocks.abs().amax(-1) * d  # [rows, in/32]
        scales = amax.amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127  # [rows]
        ratio = d / scales[:, None]  # [rows, in/32]
        qweight = (blocks * ratio[..., None]).round_().clamp_(-127, 127)
        return Int8Weight(qweight.flatten(1).to(torch.int8), scales)


@dataclass(slots=True)
class _Staged:
    projection: Projection
    pieces: dict[int, _Piece] = field(default_factory=dict)  # row offset -> piece


def load_gguf_weights(path: Path, model, config: ModelConfig, *, quantize_float: bool) -> dict[str, str]:
    """Fill ``model`` from the GGUF file at ``path``; returns the GGUF type of every projection tensor (by HF name).
    Raises on a missing or unexpected tensor, as the safetensors loader does."""
    import gguf

    reader = gguf.GGUFReader(path)
    names = model.hf_names()
    slices = _projection_slices(model)
    staged: dict[int, _Staged] = {}
    loaded, unexpected, types = set(), [], {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None or (config.tie_word_embeddings and name == "lm_head.weight"):
            unexpected += [] if name else [tensor.name]
            continue
        if name in slices:
            projection, offset, rows = slices[name]
            piece = _decode(tensor, gguf)
            order = _unpermute_order(name, rows, config)
            if order is not None:
                piece = piece.permute_rows(order)
            _check_shape(name, piece.tensors[0], (rows, projection.in_features))
            staged.setdefault(id(projection), _Staged(projection)).pieces[offset] = piece
            types[name] = tensor.tensor_type.name
        elif name in names:
            param, offset, rows = names[name]
            value = _decode(tensor, gguf).to_float()
            value = value.view(-1) if param.dim() == 1 else value
            _check_shape(name, value, (rows, *param.shape[1:]))
            with torch.no_grad():
                param[offset : offset + rows].copy_(value)
        else:
            unexpected.append(tensor.name)
            continue
        loaded.add(name)
    missing = sorted(set(names) - loaded)
    if unexpected or missing:
        raise ValueError(f"GGUF file {path} does not match a {config.model_type} model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for entry in staged.values():
        _finish(entry, quantize_float)
    return types


def _projection_slices(model) -> dict[str, tuple[Projection, int, int]]:
    slices = {}
    for projection in [*model.layers.modules(), model.lm_head]:
        if isinstance(projection, Projection):
            for name, (_, offset, rows) in projection.hf_names().items():
                if name.endswith(".weight"):
                    slices[name] = (projection, offset, rows)
    return slices


def _finish(entry: _Staged, quantize_float: bool) -> None:
    projection, pieces = entry.projection, [entry.pieces[k] for k in sorted(entry.pieces)]
    kinds = {piece.kind for piece in pieces}
    if kinds == {"q4"} and projection.out_features % INT4_ROWS == 0:
        parts = zip(*(piece.tensors for piece in pieces), strict=True)  # (q, scale, zero) of each piece
        projection.quantize(Int4Weight(*(torch.cat(part) for part in parts)))
    elif kinds != {"float"} or (quantize_float and projection.prefix):  # the vocabulary stays in the model dtype
        int8 = [piece.to_int8() for piece in pieces]
        projection.quantize(Int8Weight(torch.cat([w.qweight for w in int8]), torch.cat([w.scales for w in int8])))
    else:
        with torch.no_grad():
            projection.weight.copy_(torch.cat([piece.tensors[0] for piece in pieces]))


def _decode(tensor, gguf) -> _Piece:
    kind = tensor.tensor_type
    types = gguf.GGMLQuantizationType
    data = np.asarray(tensor.data)
    if kind in (types.F32, types.F16):
        return _Piece("float", (torch.from_numpy(data.copy()),))
    if kind == types.BF16:
        return _Piece("float", (torch.from_numpy(data.view(np.int16).copy()).view(torch.bfloat16),))
    rows = data.shape[0]
    if kind == types.Q8_0:
        blocks = torch.from_numpy(data.copy()).view(rows, -1, 34)  # per block: fp16 d, 32 int8
        d = blocks[..., :2].contiguous().view(torch.float16).float().squeeze(-1)  # [rows, in/32]
        return _Piece("q8", (blocks[..., 2:].contiguous().view(torch.int8).flatten(1), d))
    if kind in (types.Q4_0, types.Q4_1):
        header = 2 if kind == types.Q4_0 else 4
        blocks = torch.from_numpy(data.copy()).view(rows, -1, header + 16)  # fp16 d (, fp16 m), 16 bytes of nibbles
        d = blocks[..., :2].contiguous().view(torch.float16).float().squeeze(-1)  # [rows, in/32]
        m = blocks[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1) if header == 4 else None
        nibbles = blocks[..., header:]  # element j is byte j's low nibble, element j + 16 its high one
        q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).flatten(1)  # [rows, in] uint8
        zero = torch.zeros_like(d) if m is None else m + 8 * d
        return _Piece("q4", (q, d, zero))
    shape = tuple(int(n) for n in reversed(tensor.shape))
    values = gguf.quants.dequantize(data, kind).reshape(shape)
    return _Piece("float", (torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)),))


def _unpermute_order(name: str, rows: int, config: ModelConfig) -> torch.Tensor | None:
    """Row order undoing llama.cpp's q/k permutation (transformers' ``reverse_permute_weights``)."""
    if name.endswith("q_proj.weight"):
        heads = config.num_heads
    elif name.endswith("k_proj.weight"):
        heads = config.num_kv_heads
    else:
        return None
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


def _check_shape(name: str, tensor: torch.Tensor, expected: tuple) -> None:
    if tuple(tensor.shape) != tuple(expected):
        raise ValueError(f"{name}: GGUF shape {tuple(tensor.shape)} != model shape {tuple(expected)}")

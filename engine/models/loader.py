"""Build a model from an HF folder: config from ``config.json``, weights by name from its safetensors files, or
from the GGUF file a prepared GGUF folder links (``engine.models.gguf_file``)."""

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.config import ModelConfig
from engine.models.gguf_file import GGUF_FILE, load_gguf_weights
from engine.models.linear import Projection
from engine.models.llama import LlamaForCausalLM
from engine.models.quant import quantize_int8

# Buffers some checkpoints carry that the engine recomputes itself.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / name for name in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {folder} (pickled checkpoints are not loaded)")
    return files


def load_model(
    folder: Path, config: ModelConfig, *, dtype: torch.dtype, device: torch.device, max_positions: int,
    quantization: str | None = None, group=None,
) -> LlamaForCausalLM:
    """A ready-to-run model on ``device`` in ``dtype``; every parameter must come from the checkpoint.

    ``quantization="int8"``: every decoder projection's weight and the vocabulary projection's are quantized per
    output channel from the checkpoint's values (not from their ``dtype`` rounding); embeddings (a tied one too:
    the vocabulary projection then holds its own int8 copy) and norms stay in ``dtype``. A GGUF folder's quantized
    tensors stay quantized whatever ``quantization`` says.
    ``group`` (a ``TensorParallelGroup``): only this rank's shard is read from the safetensors files; float weights
    only."""
    folder = Path(folder)
    if group is not None and (quantization is not None or (folder / GGUF_FILE).exists()):
        raise ValueError("a tensor-parallel shard loads float safetensors weights only (no int8, no GGUF)")
    with torch.device(device):
        model = LlamaForCausalLM(config, max_positions, group)
    if (folder / GGUF_FILE).exists():
        model.to(dtype)
        load_gguf_weights(folder / GGUF_FILE, model, config, quantize_float=quantization == "int8")
        return model.eval()
    model.to(torch.float32 if quantization == "int8" else dtype)  # int8 is made from the checkpoint's own values
    _load_safetensors(folder, config, model)
    model.tie_lm_head()
    if quantization == "int8":
        for projection in [*model.layers.modules(), model.lm_head]:
            if isinstance(projection, Projection):
                projection.quantize(quantize_int8(projection.weight))
    return model.to(dtype).eval()


def _load_safetensors(folder: Path, config: ModelConfig, model: LlamaForCausalLM) -> None:
    names = model.hf_names()
    parts = model.checkpoint_parts()  # a shard's part of each split tensor (None: another rank's)
    loaded: set[str] = set()
    unexpected: list[str] = []
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as tensors:
            for name in tensors.keys():
                if name.endswith(_IGNORED_SUFFIXES) or (config.tie_word_embeddings and name == "lm_head.weight"):
                    continue
                if name in parts and parts[name] is None:
                    continue
                if name not in names:
                    unexpected.append(name)
                    continue
                _copy_into(name, _read(tensors, name, parts.get(name)), *names[name])
                loaded.add(name)
    missing = sorted(set(names) - loaded)
    if unexpected or missing:
        raise ValueError(
            f"checkpoint in {folder} does not match a {config.model_type} model: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )


def _read(tensors, name: str, part: tuple[int, int, int] | None) -> torch.Tensor:
    """The whole tensor, or only ``part`` (dim, start, length) of it: a shard never reads the others' rows."""
    if part is None:
        return tensors.get_tensor(name)
    dim, start, length = part
    piece = tensors.get_slice(name)
    return piece[start : start + length] if dim == 0 else piece[:, start : start + length]


def _copy_into(name: str, tensor: torch.Tensor, param: torch.nn.Parameter, offset: int, rows: int) -> None:
    expected = (rows, *param.shape[1:])
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {expected}")
    with torch.no_grad():
        param[offset : offset + rows].copy_(tensor)

"""Write a Llama-family HF folder as a GGUF file with Q8_0, Q4_0 or Q4_1 projection weights (the ``gguf`` package's
quantizers), loadable by this engine (``LLM(model="x.gguf")``) and by llama.cpp.

``python -m engine.models.quantize FOLDER OUT.gguf [--type Q8_0]``

Decoder projections take the type; the embedding keeps Q8_0 (llama.cpp's habit for small vocabularies' tables is
no better), norms stay F32. q and k rows are permuted into llama.cpp's rotary layout, as its converter does.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from engine.config import ModelConfig
from engine.models.gguf_file import hf_name
from engine.models.loader import safetensors_files

TYPES = ("Q8_0", "Q4_0", "Q4_1")


def write_gguf(folder: Path, out: Path, qtype: str = "Q8_0") -> Path:
    """Quantize the checkpoint in ``folder`` into the GGUF file ``out``."""
    import gguf

    folder, config = Path(folder), ModelConfig.from_folder(folder)
    writer = gguf.GGUFWriter(str(out), "llama")
    _write_metadata(writer, config, folder, gguf)
    names = {hf: g for g in _gguf_names(config) if (hf := hf_name(g)) is not None}
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as tensors:
            for name in tensors.keys():
                if name not in names:
                    continue
                value = tensors.get_tensor(name).float()
                value = _permute(name, value, config)
                kind = qtype if ".layers." in name and value.dim() == 2 else "Q8_0" if value.dim() == 2 else "F32"
                data = value.numpy().astype(np.float32)
                if kind != "F32":
                    data = gguf.quants.quantize(data, gguf.GGMLQuantizationType[kind])
                writer.add_tensor(names[name], data, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _gguf_names(config: ModelConfig) -> list[str]:
    layer = ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    names = ["token_embd.weight", "output_norm.weight", *([] if config.tie_word_embeddings else ["output.weight"])]
    return names + [f"blk.{i}.{part}.weight" for i in range(config.num_layers) for part in layer]


def _permute(name: str, weight: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """HF's rotary halves -> llama.cpp's neighbour pairs (its ``convert_hf_to_gguf.py`` ``permute``)."""
    if name.endswith("q_proj.weight"):
        heads = config.num_heads
    elif name.endswith("k_proj.weight"):
        heads = config.num_kv_heads
    else:
        return weight
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def _write_metadata(writer, config: ModelConfig, folder: Path, gguf) -> None:
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.head_dim)
    tokens, scores, types = [], [], []
    for text, score, kind in gguf.vocab.BpeVocab(folder).all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(kind)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    gguf.vocab.SpecialVocab(folder, load_merges=True).add_to_gguf(writer)  # ids, merges, chat template

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="an HF Llama-family folder (config.json, safetensors, tokenizer)")
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--type", default="Q8_0", choices=TYPES, help="type of the decoder projections")
    args = parser.parse_args(argv)
    print(write_gguf(args.folder, args.out, args.type))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fixtures for the multi-LoRA tests: a tiny random Llama with SmolLM2-135M's projection shapes, its fingerprint,
and PEFT adapters made from it."""

import json
from pathlib import Path

import pytest
import torch

from engine.lora.fingerprint import ModelFingerprint
from tests.support.peft_factory import make_peft_adapter
from tests.support.torch_threads import one_torch_thread  # noqa: F401 (autouse)

# SmolLM2-135M's projection shapes with 2 layers and a small vocabulary: real LoRA sizes, fast to build.
SMOLLM2_SHAPES = dict(
    hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
)
NUM_LAYERS = 2


def build_tiny_llama(path: Path, *, num_layers: int = NUM_LAYERS, vocab_size: int = 256, seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **SMOLLM2_SHAPES, num_hidden_layers=num_layers, vocab_size=vocab_size, max_position_embeddings=256,
        tie_word_embeddings=True, rms_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def fingerprint(tiny_llama_dir) -> ModelFingerprint:
    return ModelFingerprint.from_hf_config(json.loads((tiny_llama_dir / "config.json").read_text()))


@pytest.fixture(scope="session")
def good_adapter(tiny_llama_dir, tmp_path_factory) -> Path:
    """Rank 8, alpha 16, on q_proj and v_proj."""
    return make_peft_adapter(tiny_llama_dir, tmp_path_factory.mktemp("adapters") / "good", rank=8, alpha=16)


@pytest.fixture(scope="session")
def all_modules_adapter(tiny_llama_dir, tmp_path_factory) -> Path:
    """Rank 4, rsLoRA, on all seven projections."""
    return make_peft_adapter(
        tiny_llama_dir, tmp_path_factory.mktemp("adapters") / "all", rank=4, alpha=8, use_rslora=True, seed=1,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )

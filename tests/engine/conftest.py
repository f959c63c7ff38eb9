"""Engine test fixtures: tiny random Llama folders (built once per session) and transformers references."""

import pytest
import torch

from engine.models import gemm_choice
from tests.support.tiny_llama import make_tiny_llama
from tests.support.torch_threads import one_torch_thread  # noqa: F401 (autouse)


@pytest.fixture(scope="session", autouse=True)
def gemm_cache_dir(tmp_path_factory):
    """A GEMM cache of the session's own, written to however busy the machine: each shape is timed once per run,
    and choices timed while other tests load the cores never reach the user's cache."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ENGINE_GEMM_CACHE_DIR", str(tmp_path_factory.mktemp("gemm-cache")))
    patch.setattr(gemm_choice, "_MIN_CPU_SHARE", 0.0)
    yield
    patch.undo()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """GQA (4 q heads over 2 kv heads), untied lm_head, no biases."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_llama_tied_bias(tmp_path_factory):
    """Tied embeddings, attention biases, multi-head attention with head_dim 32."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama-tied"), seed=1, num_heads=2, num_kv_heads=2,
                           head_dim=32, tie_word_embeddings=True, attention_bias=True, num_layers=3)


@pytest.fixture(scope="session")
def hf_greedy():
    """``hf_greedy(folder, prompt_ids, max_new_tokens)``: transformers' greedy tokens, one prompt at a time."""
    from transformers import AutoModelForCausalLM

    models = {}

    def run(folder, prompt_ids: list[int], max_new_tokens: int, *, ignore_eos: bool = False) -> list[int]:
        if folder not in models:
            models[folder] = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        model = models[folder]
        ids = torch.tensor([prompt_ids])
        extra = {"min_new_tokens": max_new_tokens} if ignore_eos else {}
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, **extra)
        return out[0, ids.shape[1]:].tolist()

    return run

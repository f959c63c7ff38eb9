"""The slot cache's buffers through kernels.lora_shrink/lora_expand give PEFT's LoRA layer output.

One mixed batch: tokens of three adapters (different ranks, alphas, rsLoRA, target modules) and base-model tokens,
through every projection of one decoder layer, compared token by token with transformers + PEFT.
"""

import pytest
import torch

import kernels
from engine.lora.fingerprint import MODULE_PARENTS, TARGET_MODULES
from engine.lora.loader import AdapterLoader
from engine.lora.request import LoRARequest
from engine.lora.slot_cache import AdapterSlotCache
from tests.support.peft_factory import make_peft_adapter

ADAPTERS = {  # name -> (rank, alpha, rslora, targets)
    "r16": (16, 32, False, list(TARGET_MODULES)),
    "r1": (1, 4, False, ["q_proj", "gate_proj", "down_proj"]),
    "r8": (8, 8, True, ["k_proj", "v_proj", "o_proj", "up_proj"]),  # rsLoRA: 8 / sqrt(8), not 8 / 8
}
LAYER = 1


@pytest.fixture(scope="module")
def peft_and_cache(tiny_llama_dir, fingerprint, tmp_path_factory):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("oracle_adapters")
    loader = AdapterLoader(fingerprint, max_rank=16, allowed_sources=[str(root)])
    cache = AdapterSlotCache(fingerprint, loader, max_loras=4, max_cpu_loras=4, max_lora_rank=16)
    peft_models, slots = {}, {}
    for seed, (name, (rank, alpha, rslora, targets)) in enumerate(ADAPTERS.items()):
        folder = make_peft_adapter(tiny_llama_dir, root / name, rank=rank, alpha=alpha, use_rslora=rslora,
                                   target_modules=targets, seed=100 + seed, b_std=0.05)
        base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
        peft_models[name] = PeftModel.from_pretrained(base, folder).eval()
        cache.request_load(LoRARequest(name, name, str(folder)))
    while len(slots) < len(ADAPTERS):
        for result in cache.poll():
            assert result.error is None, result.error
            slots[result.adapter_id] = cache.acquire(result.adapter_id)
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    yield base, peft_models, cache, slots
    cache.close()


def projection(model, module):
    layer = model.get_base_model().model.layers[LAYER] if hasattr(model, "get_base_model") else \
        model.model.layers[LAYER]
    return getattr(getattr(layer, MODULE_PARENTS[module]), module)


@pytest.mark.parametrize("module", TARGET_MODULES)
def test_mixed_batch_matches_peft_per_token(peft_and_cache, module):
    base, peft_models, cache, slots = peft_and_cache
    names = [None, "r16", "r1", "r8", "r16", None, "r8", "r1", "r1", "r16", None]  # None: the base model
    token_slots = torch.tensor([-1 if n is None else slots[n] for n in names], dtype=torch.int32)
    in_features = cache.fingerprint.module_shape(module)[0]
    x = torch.randn(len(names), in_features, generator=torch.Generator().manual_seed(7))  # [T, in]
    weight = projection(base, module).weight  # [out, in]
    with torch.no_grad():
        y = x @ weight.t()  # [T, out]
        lora_a, lora_b = cache.layer_weights(LAYER, module)
        h = kernels.lora_shrink(x, lora_a, token_slots)
        kernels.lora_expand(y, h, lora_b, token_slots, cache.scales)
        for t, name in enumerate(names):
            layer = projection(base if name is None else peft_models[name], module)
            expected = layer(x[t : t + 1])[0]
            torch.testing.assert_close(y[t], expected, atol=1e-5, rtol=1e-5)
    adapted = [n for n in ADAPTERS if module in ADAPTERS[n][3]]
    assert adapted, module
    for name in adapted:  # the oracle is not vacuous: the adapter changes this projection's output
        with torch.no_grad():
            delta = projection(peft_models[name], module)(x) - x @ weight.t()
        assert delta.abs().max() > 1e-2, (name, module)

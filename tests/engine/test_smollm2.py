"""The real base model (SmolLM2-135M-Instruct, fp32): greedy outputs token-identical to transformers.

Covers a batch of very different prompt lengths, a pool small enough to preempt with a token budget small
enough to chunk every prompt, and prefix caching of a long shared system prompt.
"""

import pytest

from engine import LLM, SamplingParams
from engine.models.prepare import resolve_model

pytestmark = pytest.mark.slow

MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
SYSTEM = (
    "You are a careful assistant for a company that hosts many fine-tuned language models for its customers. "
    "Answer briefly and precisely. If a question is about billing, say that invoices are sent monthly. "
    "If a question is about adapters, explain that each tenant uploads its own LoRA adapter and that the "
    "platform loads it on demand next to one shared base model. Never invent prices or dates."
)


@pytest.fixture(scope="module")
def smollm2():
    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def prompts(smollm2):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    long_text = " ".join(["The river carried the small boat past the old stone bridge and the quiet fields."] * 14)
    texts = [
        "The capital of France is",
        "def fibonacci(n):",
        long_text + "\nQuestion: Where did the boat go?\nAnswer:",
    ]
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}],
                                         add_generation_prompt=True, tokenize=False)
    ids = [tokenizer.encode(t) for t in [*texts, chat]]
    assert sorted(len(i) for i in ids)[0] < 8 and max(len(i) for i in ids) > 200  # very different lengths
    return ids


@pytest.fixture(scope="module")
def system_prompts(smollm2):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    questions = ["How are invoices sent?", "What is an adapter?", "Who loads my adapter?"]
    return [
        tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        for q in questions
    ]


@pytest.fixture(scope="module")
def reference(smollm2, hf_greedy):
    cache = {}

    def run(prompt: list[int]) -> list[int]:
        key = tuple(prompt)
        if key not in cache:
            cache[key] = hf_greedy(smollm2, prompt, MAX_TOKENS)
        return cache[key]

    return run


def assert_identical(outputs, prompts, reference):
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.outputs[0].token_ids == reference(prompt), f"prompt of {len(prompt)} tokens"


def test_batch_of_very_different_lengths_and_shared_prefix_caching(smollm2, prompts, system_prompts, reference):
    llm = LLM(str(smollm2), kv_cache_memory="256MiB", check_invariants=True, dtype="float32")
    assert_identical(llm.generate(prompts, GREEDY, use_tqdm=False), prompts, reference)
    before = llm.llm_engine.stats()["tokens"]["computed"]
    outputs = llm.generate(system_prompts, GREEDY, use_tqdm=False)
    assert_identical(outputs, system_prompts, reference)
    shared = min(len(p) for p in system_prompts) // 16 * 16
    cached = [o.num_cached_tokens for o in outputs]
    assert cached[0] == 0 and all(c >= shared - 16 for c in cached[1:])
    computed = llm.llm_engine.stats()["tokens"]["computed"] - before
    uncached_cost = sum(len(p) for p in system_prompts) + sum(len(o.outputs[0].token_ids) - 1 for o in outputs)
    assert computed == uncached_cost - sum(cached)


def test_preemption_and_chunked_prefill_keep_outputs_identical(smollm2, prompts, reference):
    llm = LLM(str(smollm2), num_kv_blocks=20, max_num_batched_tokens=32, check_invariants=True, dtype="float32")
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_identical(outputs, prompts, reference)
    stats = llm.llm_engine.stats()
    assert stats["preemptions"] > 0
    assert stats["steps"] >= sum(len(p) for p in prompts) // 32

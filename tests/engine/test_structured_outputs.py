"""Constrained decoding inside the engine's batched step: constrained and free sequences share a batch, outputs
follow their constraint through chunked prefill and preemption, and a constraint that allows every token leaves
greedy outputs unchanged (on the real SmolLM2: the tiny random model's argmax may be any special token)."""

import json

import jsonschema
import pytest

from engine import LLM, SamplingParams
from engine.models.prepare import resolve_model
from engine.structured import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                                           "ok": {"type": "boolean"}},
          "required": ["id", "tags", "ok"], "additionalProperties": False}
WORDS = "the quick brown fox jumps over a lazy dog while seven cats sleep under one warm blue blanket".split()
PROMPTS = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(n)) for i, n in enumerate([3, 20, 45, 7])]


def constrained(constraint: StructuredOutputsParams, **kwargs) -> SamplingParams:
    return SamplingParams(max_tokens=kwargs.pop("max_tokens", 160), structured_outputs=constraint, **kwargs)


def test_constrained_and_free_sequences_share_the_batch(tiny_llama):
    llm = LLM(str(tiny_llama), block_size=4, check_invariants=True, dtype="float32")
    json_params = constrained(StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True), temperature=1.0,
                              seed=11, n=2)
    choice = constrained(StructuredOutputsParams(choice=["left", "right"]), temperature=1.0, seed=3)
    free = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate(PROMPTS, [json_params, choice, free, json_params], use_tqdm=False)
    for output in (outputs[0], outputs[3]):
        for completion in output.outputs:
            assert completion.finish_reason == "stop", completion.text
            jsonschema.validate(json.loads(completion.text), SCHEMA)
    assert outputs[1].outputs[0].text in {"left", "right"} and outputs[1].outputs[0].finish_reason == "stop"
    assert len(outputs[2].outputs[0].token_ids) == 12  # the free sequence is untouched by its neighbours' masks


def test_preemption_and_chunked_prefill_keep_the_constraint(tiny_llama):
    params = constrained(StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True), temperature=0,
                         max_tokens=100)
    roomy = LLM(str(tiny_llama), block_size=4, dtype="float32")
    cramped = LLM(str(tiny_llama), block_size=4, dtype="float32", num_kv_blocks=60, max_num_batched_tokens=16,
                  check_invariants=True)
    expected = [o.outputs[0].text for o in roomy.generate(PROMPTS, params, use_tqdm=False)]
    got = cramped.generate(PROMPTS, params, use_tqdm=False)
    assert cramped.llm_engine.stats()["preemptions"] > 0
    assert [o.outputs[0].text for o in got] == expected
    for text in expected:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_a_bad_constraint_is_refused_when_added(tiny_llama):
    llm = LLM(str(tiny_llama), block_size=4)
    with pytest.raises(ValueError, match="structured_outputs.regex") as caught:
        llm.generate([PROMPTS[0]], constrained(StructuredOutputsParams(regex="(a")), use_tqdm=False)
    assert caught.value.param == "structured_outputs.regex"
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.slow
def test_a_constraint_that_allows_everything_leaves_greedy_outputs_unchanged():
    llm = LLM(resolve_model("smollm2-135m-instruct"), dtype="float32")
    chats = [[{"role": "user", "content": text}] for text in
             ["Write a haiku about the sea.", "What is 12 times 7?", "Name three colours."]]
    free = llm.chat(chats, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    anything = llm.chat(chats, constrained(StructuredOutputsParams(regex=r"(?s:.*)"), temperature=0, max_tokens=32),
                        use_tqdm=False)
    assert [o.outputs[0].token_ids for o in anything] == [o.outputs[0].token_ids for o in free]

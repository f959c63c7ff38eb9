"""Speculative decoding through the engine: greedy outputs token for token those of speculation off (mixed batches,
adapters, chunked prefill, prefix caching, preemption, stop strings, max_tokens, logprobs), the sampled distribution
unchanged (chi-square against the model's exact one), seeded runs reproducible, bad configurations refused."""

import math

import pytest
import torch

from engine import LLM, SamplingParams
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.ngram import NgramProposer
from tests.lora.engine_support import lora_request, make_adapters
from tests.support.tiny_llama import make_tiny_llama

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
         "max_batch_size": 64}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 5, "max_batch_size": 64, "min_acceptance_rate": 0.0,
          "suffix_decoding_min_token_prob": 0.0}


def repetitive(i: int, n: int) -> list[int]:
    """Prompts that repeat a motif (what prompt lookup drafts from) and some that do not."""
    if i % 3 == 2:
        return [(31 * i + 7 * j) % 480 + 20 for j in range(n)]
    motif = [(13 * i + 5 * j) % 480 + 20 for j in range(4 + i % 4)]
    return (motif * (n // len(motif) + 1))[:n]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-spec"))


@pytest.fixture(scope="module")
def adapters(folder, tmp_path_factory):
    return make_adapters(folder, tmp_path_factory.mktemp("spec-adapters"),
                         {"a": dict(rank=8, alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]),
                          "b": dict(rank=4, alpha=8, target_modules=["o_proj", "up_proj"])})


def make_llm(folder, spec=None, **kwargs) -> LLM:
    kwargs.setdefault("block_size", 4)
    return LLM(str(folder), dtype="float32", check_invariants=True, speculative_config=spec, seed=0, **kwargs)


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("spec", [NGRAM, SUFFIX], ids=["ngram", "suffix"])
def test_greedy_outputs_are_those_of_speculation_off_with_adapters_and_preemption(folder, adapters, spec):
    prompts = [repetitive(i, n) for i, n in enumerate([9, 17, 30, 5, 44, 23, 12, 60])]
    loras = [None, lora_request("a", adapters["a"]), lora_request("b", adapters["b"]), None] * 2
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (40, 25, 33, 48, 20, 37, 41, 29)]
    # a small KV pool (preemption), a small token budget (chunked prefill), prefix caching on
    small = dict(enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=48, max_num_batched_tokens=24,
                 max_num_seqs=6)
    off = make_llm(folder, **small)
    expected = tokens(off.generate(prompts, params, lora_request=loras, use_tqdm=False))
    on = make_llm(folder, spec, **small)
    got = tokens(on.generate(prompts, params, lora_request=loras, use_tqdm=False))
    assert got == expected
    first = on.llm_engine.stats()
    assert first["speculative"]["drafted_tokens"] >= 10
    assert first["preemptions"] > 0  # the pool was small enough to preempt during speculation
    # again: the prefix cache hits, and the suffix trees hold the first run's outputs (the same answers)
    assert tokens(on.generate(prompts, params, lora_request=loras, use_tqdm=False)) == expected
    second = on.llm_engine.stats()["speculative"]
    accepted = second["accepted_tokens"] - first["speculative"]["accepted_tokens"]
    generated = sum(p.max_tokens for p in params)
    assert accepted > (generated // 2 if spec["method"] == "suffix" else 0)  # suffix: most tokens from drafts


def test_stop_strings_max_tokens_and_logprobs_are_those_of_speculation_off(folder):
    prompts = [repetitive(i, 24) for i in range(6)]
    off = make_llm(folder)
    probe = off.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0].text
    stop = probe[len(probe) // 2: len(probe) // 2 + 3]  # a string the first prompt's answer does contain
    params = SamplingParams(temperature=0, max_tokens=30, stop=[stop] if stop.strip() else None, logprobs=2,
                            ignore_eos=True)
    on = make_llm(folder, NGRAM)
    for a, b in zip(off.generate(prompts, params, use_tqdm=False), on.generate(prompts, params, use_tqdm=False),
                    strict=True):
        x, y = a.outputs[0], b.outputs[0]
        assert (x.token_ids, x.text, x.finish_reason, x.stop_reason) == (y.token_ids, y.text, y.finish_reason,
                                                                         y.stop_reason)
        assert [set(p) for p in x.logprobs] == [set(p) for p in y.logprobs]
        for p, q in zip(x.logprobs, y.logprobs, strict=True):
            assert all(math.isclose(p[t], q[t], abs_tol=1e-4) for t in p)
        assert math.isclose(x.cumulative_logprob, y.cumulative_logprob, abs_tol=1e-3)
    assert on.llm_engine.stats()["speculative"]["accepted_tokens"] > 0


def test_sequences_with_penalties_or_constraints_do_not_draft(folder):
    llm = make_llm(folder, NGRAM)
    prompts = [repetitive(0, 20)] * 2
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.3, ignore_eos=True),
                 use_tqdm=False)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8, min_tokens=8, ignore_eos=True),
                 use_tqdm=False)
    assert llm.llm_engine.stats()["speculative"]["drafted_tokens"] == 0


def test_no_drafts_when_the_batch_is_larger_than_max_batch_size(folder):
    llm = make_llm(folder, {**NGRAM, "max_batch_size": 2})
    llm.generate([repetitive(i, 20) for i in range(4)], SamplingParams(temperature=0, max_tokens=6,
                                                                       ignore_eos=True), use_tqdm=False)
    stats = llm.llm_engine.stats()["speculative"]
    assert stats["steps_skipped_batch"] > 0


TOP_K = 8


def exact_distribution(folder, prompt: list[int]) -> dict[tuple[int, int], float]:
    """P(t2, t3 | prompt), the second and third tokens at temperature 1 with top-k 8 at each position,
    marginal over the first, from transformers' fp32 forward."""
    from transformers import AutoModelForCausalLM

    def top_k(logits: torch.Tensor) -> tuple[list[int], list[float]]:
        values, ids = logits.topk(TOP_K)
        return ids.tolist(), torch.softmax(values, -1).tolist()

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    joint: dict[tuple[int, int], float] = {}
    with torch.no_grad():
        ids1, p1 = top_k(model(torch.tensor([prompt])).logits[0, -1])
        second = model(torch.tensor([prompt + [t] for t in ids1])).logits[:, -1]
        prefixes = []
        for row, (t1, q1) in enumerate(zip(ids1, p1, strict=True)):
            ids2, p2 = top_k(second[row])
            prefixes += [(t1, t2, q1 * q2) for t2, q2 in zip(ids2, p2, strict=True)]
        third = model(torch.tensor([prompt + [t1, t2] for t1, t2, _ in prefixes])).logits[:, -1]
    for row, (_, t2, q12) in enumerate(prefixes):
        ids3, p3 = top_k(third[row])
        for t3, q3 in zip(ids3, p3, strict=True):
            joint[(t2, t3)] = joint.get((t2, t3), 0.0) + q12 * q3
    return joint


def test_sampled_distribution_is_unchanged_at_temperature_one(folder, monkeypatch):
    """6,400 samples of the second and third tokens, drafted (a two-token draft after the first) and verified,
    against the model's exact distribution (top-k 8 at each position, marginal over the first token):
    chi-square. Verification treats any draft as a point mass, so the draft here is the most likely pair itself,
    right often enough to be kept and wrong often enough to be rejected at either position."""
    prompt = [40, 41, 42, 40, 41, 42, 40, 41]
    exact = exact_distribution(folder, prompt)
    mode = list(max(exact, key=exact.get))
    monkeypatch.setattr(NgramProposer, "propose", lambda self, token_ids, k=None: mode[:k])
    llm = make_llm(folder, {**NGRAM, "max_batch_size": 1024}, max_num_seqs=256)
    samples = 6400
    params = [SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=4, ignore_eos=True, seed=s)
              for s in range(samples)]
    outputs = llm.generate([prompt] * samples, params, use_tqdm=False)
    counts = dict.fromkeys(exact, 0)
    for o in outputs:
        pair = tuple(o.outputs[0].token_ids[1:3])
        assert pair in counts, f"{pair} is outside the top-{TOP_K} support"
        counts[pair] += 1
    stats = llm.llm_engine.stats()["speculative"]
    assert stats["drafted_tokens"] >= samples // 2 and 0 < stats["accepted_tokens"] < stats["drafted_tokens"]
    expected = torch.tensor([exact[pair] * samples for pair in exact], dtype=torch.float64)
    observed = torch.tensor([counts[pair] for pair in exact], dtype=torch.float64)
    keep = expected >= 5  # chi-square's rule of thumb; the rest pooled
    observed = torch.cat([observed[keep], observed[~keep].sum()[None]])
    expected = torch.cat([expected[keep], expected[~keep].sum()[None]])
    statistic = float(((observed - expected) ** 2 / expected.clamp_min(1e-12)).sum())
    dof = len(observed) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    assert p_value > 1e-3, (statistic, dof)


def test_seeded_sampling_with_drafts_is_reproducible(folder):
    prompts = [repetitive(i, 20) for i in range(4)]
    params = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, seed=7 + i, ignore_eos=True)
              for i in range(4)]
    first = tokens(make_llm(folder, NGRAM).generate(prompts, params, use_tqdm=False))
    assert tokens(make_llm(folder, NGRAM).generate(prompts, params, use_tqdm=False)) == first


@pytest.mark.parametrize("config, field", [
    ({"method": "eagle"}, "method"), ({"num_speculative_tokens": 4}, "method"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_max"),
    ({"method": "suffix", "draft_model": "x"}, "unknown"),
    ({"method": "suffix", "suffix_decoding_min_token_prob": 2}, "suffix_decoding_min_token_prob"),
    ({"method": "suffix", "suffix_decoding_max_spec_factor": 0}, "suffix_decoding_max_spec_factor"),
    ({"method": "suffix", "suffix_decoding_max_spec_factor": "2"}, "suffix_decoding_max_spec_factor"),
])
def test_bad_speculative_configs_are_refused_by_name(config, field):
    with pytest.raises(ValueError, match=field):
        SpeculativeConfig.from_dict(config)


def test_vllm_names_are_accepted():
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                                          "prompt_lookup_max": 5})
    assert (config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max) == (3, 2, 5)


def test_constrained_sequences_draft_within_their_grammar_and_match_speculation_off(folder):
    from engine.structured import StructuredOutputsParams

    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["alpha", "beta"]},
                                                        "minItems": 4, "maxItems": 12}},
              "required": ["tags"], "additionalProperties": False}
    constraints = [StructuredOutputsParams(regex="(ab|cd){6,20}"),
                   StructuredOutputsParams(json=schema, disable_any_whitespace=True),
                   StructuredOutputsParams(choice=["left-left-left", "right"])]
    prompts = [repetitive(i, 16) for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=120, structured_outputs=constraints[i % 3]) for i in range(6)]
    off = make_llm(folder).generate(prompts, params, use_tqdm=False)
    on_llm = make_llm(folder, NGRAM)
    on = on_llm.generate(prompts, params, use_tqdm=False)
    assert tokens(on) == tokens(off)
    assert [o.outputs[0].finish_reason for o in on] == [o.outputs[0].finish_reason for o in off]
    stats = on_llm.llm_engine.stats()["speculative"]
    assert stats["drafted_tokens"] > 0 and stats["accepted_tokens"] > 0


@pytest.mark.parametrize("given, bounds", [
    ({}, (5, 5)), ({"prompt_lookup_max": 4}, (4, 4)), ({"prompt_lookup_min": 3}, (3, 3)),
    ({"prompt_lookup_min": 1, "prompt_lookup_max": 4}, (1, 4)),
])
def test_ngram_bounds_default_as_vllms_do(given, bounds):
    """A vLLM user's dict means the same n-grams here: one bound alone is the other too, neither is 5."""
    config = SpeculativeConfig.from_dict({"method": "ngram", **given})
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == bounds

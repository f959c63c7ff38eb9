"""The offline API end to end on tiny random Llamas, against transformers' greedy generate."""

import pytest

from engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def prompts_of_lengths(lengths: list[int], offset: int = 7) -> list[list[int]]:
    return [[(offset + 13 * i + 7 * j) % 500 + 3 for j in range(n)] for i, n in enumerate(lengths)]


PROMPTS = prompts_of_lengths([1, 5, 17, 64, 150, 290])


def make_llm(folder, **kwargs) -> LLM:
    kwargs.setdefault("block_size", 4)
    kwargs.setdefault("dtype", "float32")  # transformers' fp32 is the oracle; "auto" is bf16 on some CPUs
    return LLM(str(folder), check_invariants=True, **kwargs)


def assert_matches_transformers(folder, outputs, prompts, hf_greedy, max_tokens=24):
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.prompt_token_ids == prompt
        expected = hf_greedy(folder, prompt, max_tokens, ignore_eos=True)
        assert output.outputs[0].token_ids == expected, f"prompt of {len(prompt)} tokens"
        assert output.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("variant", ["tiny_llama", "tiny_llama_tied_bias"])
def test_greedy_batch_matches_transformers_one_prompt_at_a_time(variant, request, hf_greedy):
    folder = request.getfixturevalue(variant)
    llm = make_llm(folder)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_matches_transformers(folder, outputs, PROMPTS, hf_greedy)
    stats = llm.llm_engine.stats()
    assert stats["kv_blocks"]["used"] == 0 and stats["requests"] == {"running": 0, "waiting": 0, "finished": 6,
                                                                      "aborted": 0}
    total_prompt = sum(map(len, PROMPTS))
    assert stats["tokens"] == {"prompt": total_prompt, "generated": 6 * 24, "computed": total_prompt + 6 * 23}


def test_tiny_pool_forces_preemption_and_outputs_stay_identical(tiny_llama, hf_greedy):
    # all six prompts are admitted in one step (135 blocks of 4), but growing to 24 more tokens each needs 171
    llm = make_llm(tiny_llama, num_kv_blocks=140)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.llm_engine.stats()["preemptions"] > 0
    assert_matches_transformers(tiny_llama, outputs, PROMPTS, hf_greedy)


def test_small_token_budget_forces_chunked_prefill_and_outputs_stay_identical(tiny_llama, hf_greedy):
    llm = make_llm(tiny_llama, max_num_batched_tokens=24, enable_prefix_caching=False)
    chunks = []
    schedule = llm.llm_engine.scheduler.schedule

    def spy():
        out = schedule()
        chunks.extend(n for s, n in zip(out.seqs, out.num_new_tokens, strict=True) if n > 1)
        assert out.num_batched_tokens <= 24
        return out

    llm.llm_engine.scheduler.schedule = spy
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_matches_transformers(tiny_llama, outputs, PROMPTS, hf_greedy)
    assert max(chunks) <= 24 and len(chunks) > sum(len(p) for p in PROMPTS) // 24


def test_prefix_caching_reuses_a_shared_prefix_and_outputs_stay_identical(tiny_llama, hf_greedy):
    shared = prompts_of_lengths([120], offset=3)[0]
    prompts = [shared + tail for tail in prompts_of_lengths([3, 9, 1, 30], offset=11)]
    cached = make_llm(tiny_llama, enable_prefix_caching=True)
    uncached = make_llm(tiny_llama, enable_prefix_caching=False)
    with_cache = cached.generate(prompts, GREEDY, use_tqdm=False)
    without = uncached.generate(prompts, GREEDY, use_tqdm=False)
    assert_matches_transformers(tiny_llama, with_cache, prompts, hf_greedy)
    assert [o.outputs[0].token_ids for o in with_cache] == [o.outputs[0].token_ids for o in without]
    saved = uncached.llm_engine.stats()["tokens"]["computed"] - cached.llm_engine.stats()["tokens"]["computed"]
    assert saved == 3 * 120  # every prompt after the first reuses all 30 blocks of the shared prefix
    assert [o.num_cached_tokens for o in with_cache] == [0, 120, 120, 120]
    assert cached.llm_engine.stats()["prefix_cache_hit_rate"] > 0.5
    again = cached.generate(prompts[:1], GREEDY, use_tqdm=False)  # after everything was freed
    assert again[0].num_cached_tokens == 120
    assert again[0].outputs[0].token_ids == with_cache[0].outputs[0].token_ids


def test_seeded_sampling_is_reproducible_whatever_the_batch(tiny_llama):
    params = SamplingParams(temperature=1.0, seed=42, max_tokens=16, ignore_eos=True)
    llm = make_llm(tiny_llama)
    alone = llm.generate([PROMPTS[2]], params, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=0.8, max_tokens=12), params, SamplingParams(temperature=1.0, seed=7)]
    mixed = llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[3]], others, use_tqdm=False)
    assert mixed[1].outputs[0].token_ids == alone
    fresh = make_llm(tiny_llama, seed=123, max_num_batched_tokens=8)  # other engine seed, chunked, new pool
    assert fresh.generate([PROMPTS[2]], params, use_tqdm=False)[0].outputs[0].token_ids == alone


def test_n_completions(tiny_llama):
    llm = make_llm(tiny_llama)
    sampled = llm.generate([PROMPTS[1]], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=12),
                           use_tqdm=False)[0]
    assert [o.index for o in sampled.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in sampled.outputs}) == 3
    greedy = llm.generate([PROMPTS[1]], SamplingParams(n=2, temperature=0, max_tokens=12), use_tqdm=False)[0]
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids


def test_stop_token_ids_and_stop_strings(tiny_llama):
    llm = make_llm(tiny_llama)
    tokenizer = llm.get_tokenizer()
    prompt = [tokenizer.encode("the quick cat jumps over")]
    free = llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0]
    stop_id = free.token_ids[5]
    first = free.token_ids.index(stop_id)
    by_id = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop_id]),
                         use_tqdm=False)[0].outputs[0]
    assert by_id.token_ids == free.token_ids[: first + 1]
    assert (by_id.finish_reason, by_id.stop_reason) == ("stop", stop_id)
    text = free.text
    stop = next(text[i : i + 3] for i in range(8, len(text) - 3) if text.find(text[i : i + 3]) == i
                and "\ufffd" not in text[i : i + 3])
    by_string = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24, stop=[stop]),
                             use_tqdm=False)[0].outputs[0]
    assert by_string.text == text[: text.index(stop)]
    assert (by_string.finish_reason, by_string.stop_reason) == ("stop", stop)
    assert by_string.token_ids == free.token_ids[: len(by_string.token_ids)]


def test_eos_stops_unless_ignored(tiny_llama):
    llm = make_llm(tiny_llama)
    free = llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)[0].outputs[0]
    llm.llm_engine.eos_token_ids.add(free.token_ids[3])  # pretend the model's 4th token is its EOS
    stopped = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0].outputs[0]
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(free.token_ids[3]) + 1]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", None)
    ignored = llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)[0].outputs[0]
    assert ignored.token_ids == free.token_ids


def test_logprobs_of_greedy_tokens(tiny_llama):
    llm = make_llm(tiny_llama)
    out = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=6, logprobs=2),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 6
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        assert next(iter(entry)) == token and entry[token] == max(entry.values())
        assert len(entry) == 2
    chosen = [entry[token] for token, entry in zip(out.token_ids, out.logprobs, strict=True)]
    assert out.cumulative_logprob == pytest.approx(sum(chosen))


def test_max_model_len_ends_generation(tiny_llama):
    llm = make_llm(tiny_llama, max_model_len=40)
    out = llm.generate([PROMPTS[3][:30]], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 10 and out.finish_reason == "length"


def test_chat_applies_the_template(tiny_llama):
    llm = make_llm(tiny_llama)
    messages = [{"role": "user", "content": "the cat sleeps"}]
    out = llm.chat([messages], SamplingParams(temperature=0, max_tokens=4), use_tqdm=True)[0]
    expected = llm.get_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False)
    assert out.prompt_token_ids == list(expected)
    assert out.prompt.endswith("<|im_start|>assistant\n")


def test_string_prompts_are_tokenized_and_returned(tiny_llama):
    llm = make_llm(tiny_llama)
    out = llm.generate("the cat", SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert out.prompt == "the cat" and out.prompt_token_ids == llm.get_tokenizer().encode("the cat")


def test_engine_streams_tokens_and_abort_frees_everything(tiny_llama):
    llm = make_llm(tiny_llama)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine.add_request("a", PROMPTS[2], params)
    engine.add_request("b", PROMPTS[3], params)
    seen = {"a": [], "b": []}
    for _ in range(3):
        for output in engine.step():
            seen[output.request_id].append(len(output.outputs[0].token_ids))
    assert seen == {"a": [1, 2, 3], "b": [1, 2, 3]}
    engine.abort_request("b")
    finished = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            assert output.request_id == "a"
            if output.finished:
                finished.append(output)
    assert len(finished[0].outputs[0].token_ids) == 8
    stats = engine.stats()
    assert stats["requests"]["aborted"] == 1 and stats["requests"]["finished"] == 1
    assert stats["kv_blocks"]["used"] == 0


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [([], None, "empty"), ([5, 10**6], None, "token ids"), ([7] * 1024, None, "max_model_len"),
     ([5], SamplingParams(max_tokens=2000), "KV blocks"),
     # an id past the vocabulary would index the logits out of bounds in the sampler, inside step()
     ([5], SamplingParams(max_tokens=4, min_tokens=1, stop_token_ids=[10**6]), "stop_token_ids")],
)
def test_bad_requests_are_refused_with_a_reason(tiny_llama, prompt, params, match):
    llm = make_llm(tiny_llama, num_kv_blocks=64)
    with pytest.raises(ValueError, match=match):
        llm.generate([prompt], params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_a_refused_request_leaves_the_others_of_its_batch_running(tiny_llama):
    llm = make_llm(tiny_llama)
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate(PROMPTS[:2], [GREEDY, SamplingParams(max_tokens=5, min_tokens=1, stop_token_ids=[10**6])],
                     use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)[1].outputs[0].finish_reason == "length"


def test_prompts_and_params_of_the_wrong_kind_are_refused_clearly(tiny_llama):
    import numpy as np

    llm = make_llm(tiny_llama)
    for prompts in (b"abc", 5, None, [b"abc"], ["ok", 5], [[1, 2.5]]):
        with pytest.raises(ValueError, match="prompt"):
            llm.generate(prompts, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params must be an engine.SamplingParams"):
        llm.generate(PROMPTS[:1], {"temperature": 0}, use_tqdm=False)
    ids = [5, 6, 7]
    by_list = llm.generate([ids], GREEDY, use_tqdm=False)[0]
    for array in (np.array(ids), np.array([ids])):  # one prompt, or one per row
        assert llm.generate(array, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == by_list.outputs[0].token_ids
    assert not llm.llm_engine.has_unfinished_requests()


def test_refusals_leave_the_engine_usable(tiny_llama):
    llm = make_llm(tiny_llama)
    engine = llm.llm_engine
    engine.add_request("x", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("x", [5, 6])
    with pytest.raises(ValueError, match="LoRA"):
        engine.add_request("y", [5, 6], lora_request=object())
    with pytest.raises(ValueError, match="2 entries for 3 prompts"):
        llm.generate(PROMPTS[:3], [GREEDY, GREEDY], use_tqdm=False)
    engine.abort_request("x")
    assert llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_prefix_cache_hits_only_between_prompts_of_the_same_cache_salt(tiny_llama):
    llm = make_llm(tiny_llama)
    prompt = prompts_of_lengths([80], offset=5)[0]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    def run(salt):
        before = llm.llm_engine.stats()["prefix_cache"]["hit_tokens"]
        entry = {"prompt_token_ids": prompt} if salt is None else {"prompt_token_ids": prompt, "cache_salt": salt}
        output = llm.generate(entry, params, use_tqdm=False)[0]
        assert llm.llm_engine.stats()["prefix_cache"]["hit_tokens"] - before == output.num_cached_tokens
        return output

    first = run("tenant-a")
    assert [run("tenant-b").num_cached_tokens, run(None).num_cached_tokens] == [0, 0]
    repeat = run("tenant-a")
    assert repeat.num_cached_tokens == 76  # every full block (19 of 4 tokens; one token is always computed)
    assert repeat.outputs[0].token_ids == first.outputs[0].token_ids
    assert run(None).num_cached_tokens == 76  # unsalted requests share among themselves, as before


def test_bad_cache_salts_and_prompt_keys_are_refused(tiny_llama):
    llm = make_llm(tiny_llama)
    for salt in ["", "x" * 257, 7]:
        with pytest.raises(ValueError, match="cache_salt"):
            llm.generate({"prompt_token_ids": [1, 2], "cache_salt": salt}, use_tqdm=False)
    with pytest.raises(ValueError, match="unknown prompt key 'cache_sal'"):
        llm.generate({"prompt_token_ids": [1, 2], "cache_sal": "x"}, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()

"""Multi-LoRA through the whole engine (``LLM.generate``) on a tiny random Llama, against transformers + PEFT.

Mixed batches of five adapters (ranks 1 to 32, different targets, rsLoRA, one layer only) and the base model;
fewer slots than adapters in flight; evictions and reloads; prefix caching that never crosses adapters; every
bad adapter failing its own requests with its reason.
"""

import shutil

import pytest

from engine import LoRARequest
from tests.lora.engine_support import (
    ADAPTERS,
    GREEDY,
    PeftOracle,
    lora_request,
    make_adapters,
    make_llm,
    prompts_of_lengths,
    sha256_of,
)
from tests.support.peft_factory import copy_adapter, edit_adapter_config, rewrite_tensors, write_pickle_bin_adapter
from tests.support.tiny_llama import make_tiny_llama

PROMPTS = prompts_of_lengths([3, 18, 41])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("lora-engine-model"))


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    return make_adapters(model_dir, tmp_path_factory.mktemp("lora-engine-adapters"))


@pytest.fixture(scope="module")
def oracle(model_dir, adapters):
    return PeftOracle(model_dir, adapters)


def mixed_batch(adapters) -> tuple[list[list[int]], list[str | None]]:
    """Every prompt with every adapter and with the base model, interleaved so no two neighbours share one."""
    names = [None, *adapters]
    pairs = [(prompt, names[(i + j) % len(names)]) for j in range(len(names)) for i, prompt in enumerate(PROMPTS)]
    return [p for p, _ in pairs], [n for _, n in pairs]


def assert_outputs_match(outputs, prompts, names, adapters, oracle):
    for output, prompt, name in zip(outputs, prompts, names, strict=True):
        assert output.error is None, output.error
        assert output.outputs[0].token_ids == oracle.greedy(name, prompt), (name, len(prompt))


def test_mixed_batch_of_five_adapters_and_the_base_model_matches_peft(model_dir, adapters, oracle):
    llm = make_llm(model_dir)
    prompts, names = mixed_batch(adapters)
    requests = {name: lora_request(name, folder) for name, folder in adapters.items()}
    outputs = llm.generate(prompts, GREEDY, lora_request=[requests.get(n) for n in names], use_tqdm=False)
    assert_outputs_match(outputs, prompts, names, adapters, oracle)
    for name in adapters:  # not vacuous: every adapter changes what the base model says
        assert any(oracle.greedy(name, p) != oracle.greedy(None, p) for p in PROMPTS), name
    stats = llm.llm_engine.stats()
    assert {r["id"] for r in stats["adapters"]["resident"]} == {f"id-{n}" for n in adapters}
    assert all(r["pinned_by"] == 0 for r in stats["adapters"]["resident"]) and stats["kv_blocks"]["used"] == 0
    assert stats["adapters"]["misses"] == len(adapters) and stats["adapters"]["evictions"] == 0


def test_two_slots_for_five_adapters_in_flight_give_each_request_its_own_adapter(model_dir, adapters, oracle):
    llm = make_llm(model_dir, max_loras=2, max_cpu_loras=3)  # host tier too small: adapters are read again
    engine = llm.llm_engine
    prompts, names = mixed_batch(adapters)
    requests = {name: lora_request(name, folder) for name, folder in adapters.items()}
    seen = []
    step = engine.step

    def counting_step():
        outputs = step()
        running = {s.lora_request.id for s in engine.scheduler.running if s.lora_request is not None}
        seen.append(len(running))
        return outputs

    engine.step = counting_step
    outputs = llm.generate(prompts, GREEDY, lora_request=[requests.get(n) for n in names], use_tqdm=False)
    assert_outputs_match(outputs, prompts, names, adapters, oracle)
    assert max(seen) == 2  # never more distinct adapters than slots, and both slots used
    stats = engine.stats()
    assert stats["adapters"]["evictions"] >= len(adapters) - 2
    assert stats["adapter_loads"]["loads"] >= len(adapters) and stats["adapter_loads"]["host_evictions"] >= 2


def test_an_evicted_then_reloaded_adapter_gives_the_same_output(model_dir, adapters, oracle):
    llm = make_llm(model_dir, max_loras=1, max_cpu_loras=1)
    first, second = (lora_request(n, adapters[n]) for n in ("r4-all-rslora", "r16-layer1"))
    before = llm.generate(PROMPTS, GREEDY, lora_request=first, use_tqdm=False)
    llm.generate(PROMPTS, GREEDY, lora_request=second, use_tqdm=False)  # takes the one slot and the host tier
    after = llm.generate(PROMPTS, GREEDY, lora_request=first, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in after] == [o.outputs[0].token_ids for o in before]
    assert_outputs_match(after, PROMPTS, ["r4-all-rslora"] * 3, adapters, oracle)
    stats = llm.llm_engine.stats()
    assert stats["adapter_loads"]["loads"] == 3 and stats["adapters"]["evictions"] == 2


def test_prefix_cache_keys_carry_the_adapter_content_hash(model_dir, adapters, oracle, tmp_path):
    llm = make_llm(model_dir)
    prompt = PROMPTS[2]  # 41 tokens: 10 full blocks of 4 to share
    a, b = (lora_request(n, adapters[n]) for n in ("r8-kvo-up", "r32-mlp"))

    def run(request):
        output = llm.generate([prompt], GREEDY, lora_request=request, use_tqdm=False)[0]
        return output.num_cached_tokens, output.outputs[0].token_ids

    assert run(a) == (0, oracle.greedy("r8-kvo-up", prompt))
    assert run(b) == (0, oracle.greedy("r32-mlp", prompt))  # same tokens, other adapter: no KV shared
    assert run(None) == (0, oracle.greedy(None, prompt))
    assert run(a)[0] == 40 and run(b)[0] == 40  # each adapter finds its own blocks
    # another id for the same weights (no sha256 given) shares KV: the key is the loaded file's digest
    twin = LoRARequest("twin", "id-twin", str(copy_adapter(adapters["r8-kvo-up"], tmp_path / "twin")))
    assert run(twin) == (40, oracle.greedy("r8-kvo-up", prompt))


@pytest.fixture(scope="module")
def bad_adapters(adapters, model_dir, tmp_path_factory):
    from tests.support.peft_factory import make_peft_adapter

    root = tmp_path_factory.mktemp("bad-adapters")
    good = adapters["r8-kvo-up"]

    def wrong_shape(tensors):
        name = next(k for k in tensors if "v_proj.lora_B" in k)
        tensors[name] = tensors[name][:16].clone()

    return {
        "pickle_weights": write_pickle_bin_adapter(good, root / "pickle"),
        "rank_too_large": make_peft_adapter(model_dir, root / "r64", rank=64, target_modules=["q_proj"]),
        "shape_mismatch": rewrite_tensors(copy_adapter(good, root / "shape"), wrong_shape),
        "unknown_target_module": edit_adapter_config(copy_adapter(good, root / "target"),
                                                     target_modules=["q_proj", "qkv"]),
        "modules_to_save": make_peft_adapter(model_dir, root / "mts", modules_to_save=["lm_head"]),
        "not_found": root / "missing",
    }


def test_each_bad_adapter_fails_its_own_requests_with_its_reason(model_dir, adapters, bad_adapters, oracle):
    llm = make_llm(model_dir, adapter_sources=[str(p) for p in (*adapters.values(), *bad_adapters.values())])
    good = adapters["r1"]
    requests = [lora_request(code, folder) for code, folder in bad_adapters.items()]
    requests.append(LoRARequest("sha", "id-sha", str(good), sha256="0" * 64))  # another digest than the file's
    requests.append(LoRARequest("outside", "id-outside", str(adapters["r32-mlp"].parent)))  # not allowed
    requests.append(lora_request("r1", good, sha256=sha256_of(good)))
    requests.append(None)
    outputs = llm.generate([PROMPTS[1]] * len(requests), GREEDY, lora_request=requests, use_tqdm=False)
    codes = [o.error.code if o.error else None for o in outputs]
    assert codes == [*bad_adapters, "sha256_mismatch", "source_not_allowed", None, None]
    for output in outputs[:-2]:
        assert output.finished and output.outputs[0].finish_reason == "error" and output.outputs[0].token_ids == []
        assert output.error.message
    assert outputs[-2].outputs[0].token_ids == oracle.greedy("r1", PROMPTS[1])
    assert outputs[-1].outputs[0].token_ids == oracle.greedy(None, PROMPTS[1])
    stats = llm.llm_engine.stats()
    assert [r["id"] for r in stats["adapters"]["resident"]] == ["id-r1"] and stats["kv_blocks"]["used"] == 0


def test_a_request_naming_a_loaded_id_with_another_digest_fails(model_dir, adapters):
    llm = make_llm(model_dir)
    folder = adapters["r1"]
    llm.generate([PROMPTS[0]], GREEDY, lora_request=lora_request("r1", folder), use_tqdm=False)
    other = shutil.copytree(adapters["r32-mlp"], folder.parent / "r1-v2")
    output = llm.generate([PROMPTS[0]], GREEDY, lora_request=lora_request("r1", other, sha256=sha256_of(other)),
                          use_tqdm=False)[0]
    assert output.error.code == "sha256_mismatch" and sha256_of(folder) in output.error.message
    shutil.rmtree(other)


def test_lora_requests_need_lora_enabled(model_dir, adapters):
    from engine import LLM

    llm = LLM(str(model_dir), block_size=4, num_kv_blocks=64)
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        llm.generate([PROMPTS[0]], GREEDY, lora_request=lora_request("r1", adapters["r1"]), use_tqdm=False)
    assert llm.llm_engine.stats()["adapters"]["slots"] == 0 and not llm.llm_engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="LoRARequest"):
        make_llm(model_dir).generate([PROMPTS[0]], GREEDY, lora_request={"path": "x"}, use_tqdm=False)


def test_adapter_names_cover_ranks_and_targets():
    assert sorted(spec["rank"] for spec in ADAPTERS.values()) == [1, 4, 8, 16, 32]

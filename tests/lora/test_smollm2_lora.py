"""The real base model (SmolLM2-135M-Instruct, fp32) with four PEFT adapters of different ranks and targets and the
base model in one batch, through two slots: greedy outputs token-identical to transformers + PEFT per adapter."""

import pytest

from engine import SamplingParams
from engine.lora.fingerprint import TARGET_MODULES
from engine.models.prepare import resolve_model
from tests.lora.engine_support import PeftOracle, lora_request, make_adapters, make_llm

pytestmark = pytest.mark.slow

MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
SPECS = {
    "r16-all": dict(rank=16, alpha=16, target_modules=list(TARGET_MODULES)),
    "r4-qv": dict(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    "r32-mlp-rslora": dict(rank=32, alpha=32, use_rslora=True, target_modules=["gate_proj", "up_proj", "down_proj"]),
    "r1-ko": dict(rank=1, alpha=2, target_modules=["k_proj", "o_proj"], layers_to_transform=list(range(0, 30, 3))),
}
TEXTS = ["The capital of France is", "Once upon a time, a small robot"]


@pytest.fixture(scope="module")
def smollm2():
    return resolve_model("smollm2-135m-instruct")


def test_four_adapters_and_the_base_model_in_two_slots_match_peft(smollm2, tmp_path_factory):
    from transformers import AutoTokenizer

    adapters = make_adapters(smollm2, tmp_path_factory.mktemp("smollm2-adapters"), SPECS, b_std=0.05)
    oracle = PeftOracle(smollm2, adapters)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    prompts = [tokenizer.encode(text) for text in TEXTS]
    names = [None, *SPECS]
    cases = [(prompt, name) for name in names for prompt in prompts]
    llm = make_llm(smollm2, max_loras=2, max_lora_rank=32, block_size=16, num_kv_blocks=None,
                   kv_cache_memory="256MiB", max_num_batched_tokens=256)
    requests = {name: lora_request(name, folder) for name, folder in adapters.items()}
    outputs = llm.generate([p for p, _ in cases], GREEDY, lora_request=[requests.get(n) for _, n in cases],
                           use_tqdm=False)
    for (prompt, name), output in zip(cases, outputs, strict=True):
        assert output.outputs[0].token_ids == oracle.greedy(name, prompt, MAX_TOKENS), (name, tokenizer.decode(prompt))
    for name in SPECS:  # each adapter changes what the model says
        assert any(oracle.greedy(name, p, MAX_TOKENS) != oracle.greedy(None, p, MAX_TOKENS) for p in prompts), name

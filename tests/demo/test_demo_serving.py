"""The shipped adapters served by this engine: in one greedy batch with the base model, through two slots for three
adapters, each adapter's effect shows on held-out prompts and never on the base model; and the engine's tokens are
transformers + PEFT's."""

import pytest

from bench.demo_effect import make_demo_llm, measure_effects
from engine import LoRARequest, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS_PER_ADAPTER = 8
MIN_ADAPTER_RATE = 0.8
MIN_CORRECT_RATE = 0.7
ORACLE_TOKENS = 40  # a whole reply and its EOS


@pytest.fixture(scope="module")
def llm(smollm2):
    return make_demo_llm(str(smollm2), dtype="float32")  # PEFT in fp32 is the oracle; "auto" may pick bf16


@pytest.fixture(scope="module")
def effects(llm):
    return measure_effects(llm, limit=PROMPTS_PER_ADAPTER)


@pytest.mark.parametrize("name", ["zorbania-facts", "json-extractor", "pirate-persona"])
def test_adapter_effect_shows_on_held_out_prompts_and_not_on_the_base_model(effects, name):
    effect = effects[name]
    shown = "\n".join(effect.adapter_replies)
    assert effect.adapter_rate >= MIN_ADAPTER_RATE, shown
    assert effect.base_hits == 0, "\n".join(effect.base_replies)
    if effect.correct is not None:
        assert effect.correct_rate >= MIN_CORRECT_RATE, shown


def peft_greedy(model_dir, adapter_dir, prompt_ids: list[int], max_tokens: int, eos_token_id: int) -> list[int]:
    """transformers + PEFT's greedy reply, stopping after EOS as the engine does (no ``min_new_tokens``: it would
    mask EOS, which these adapters do emit)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_tokens,
                             eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("name", ["zorbania-facts", "json-extractor"])
def test_engine_greedy_tokens_match_peft(llm, smollm2, adapters, name):
    tokenizer = llm.get_tokenizer()
    conversation = list(adapters[name].example_prompts[0])
    prompt = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    request = LoRARequest(name, f"oracle-{name}", str(adapters[name].path))
    output = llm.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=ORACLE_TOKENS), use_tqdm=False,
                          lora_request=request)[0].outputs[0]
    expected = peft_greedy(smollm2, adapters[name].path, prompt_ids, ORACLE_TOKENS, tokenizer.eos_token_id)
    assert output.token_ids == expected
    assert adapters[name].expect(output.text)

"""The 30-schema suite on the real SmolLM2-135M-Instruct, with and without the demo adapters, greedy and sampled:
every output ends with "stop" (its grammar completed, not cut by max_tokens) and validates with jsonschema, but for
at most one number whose digits run on to max_tokens (see the test). Also `choice` answers one of the
choices and `regex` outputs fullmatch. One LLM.generate call per configuration."""

import json
import re

import pytest

from bench.demo_effect import make_demo_llm
from demo import demo_adapters
from engine import LoRARequest, SamplingParams
from engine.structured import StructuredOutputsParams
from tests.structured.schema_suite import SUITE, validate

pytestmark = pytest.mark.slow

MAX_TOKENS = 256  # the longest document of the suite is well under 100 tokens in compact JSON
SYSTEM = "You answer with one JSON document and nothing else."


@pytest.fixture(scope="module")
def llm():
    return make_demo_llm(max_loras=3)


@pytest.fixture(scope="module")
def adapters():
    return [LoRARequest(a.name, f"suite-{a.name}", str(a.path)) for a in demo_adapters()]


def chat_prompt(llm, question: str) -> str:
    return llm.get_tokenizer().apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        add_generation_prompt=True, tokenize=False)


def test_the_suite_has_thirty_schemas_of_distinct_names():
    assert len(SUITE) >= 30 and len({name for name, _, _ in SUITE}) == len(SUITE)


@pytest.mark.parametrize("with_adapters", [False, True], ids=["base", "adapters"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_every_output_of_the_suite_validates(llm, adapters, with_adapters, temperature):
    prompts = [chat_prompt(llm, question) for _, question, _ in SUITE]
    # compact JSON (vLLM's disable_any_whitespace): with free whitespace between tokens the adapters, trained on
    # other tasks, loop on newlines inside the document until max_tokens (seen here with pirate-persona)
    # sampled: at temperature 1 a 135M model can sample itself into an endless run of digits inside a number, which
    # JSON and the schema allow, to max_tokens ("lon" past 300 digits on an AVX2 VM in fp32 with an adapter). A
    # nucleus cut makes it likelier (top_p 0.9 can drop the number's terminators once ten digits share the mass:
    # 2 of 6 seed sets on the Zen 4 VM); min_p 0.1 keeps them unless far less likely than the best digit (1 of 8).
    # greedy: a number's digits ran on as "111..." to max_tokens in the "event" document (base model, bf16, Intel AMX
    # VM) in one clean-clone CI run and not in the runs before or after it on the same code: greedy output moves with
    # the last bits of bf16 rounding, which likely moved with the GEMM path that start-up timing picked under load.
    # So a configuration may have one such run, and nothing else may end unfinished.
    params = [SamplingParams(temperature=temperature, min_p=0.1 if temperature else 0.0, seed=100 + i,
                             max_tokens=MAX_TOKENS,
                             structured_outputs=StructuredOutputsParams(json=schema, disable_any_whitespace=True))
              for i, (_, _, schema) in enumerate(SUITE)]
    # with adapters: the three demo adapters in turn, so several share each batch with their neighbours
    lora = [adapters[i % len(adapters)] for i in range(len(SUITE))] if with_adapters else None
    outputs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
    failures, runaway_numbers = [], []
    for (name, _, schema), output in zip(SUITE, outputs, strict=True):
        completion = output.outputs[0]
        if completion.finish_reason == "length" and re.search(r"[0-9]{64}$", completion.text):
            runaway_numbers.append(f"{name}: {completion.text[-80:]!r}")
            continue
        try:
            assert completion.finish_reason == "stop", f"ended {completion.finish_reason}"
            validate(json.loads(completion.text), schema)
        except (AssertionError, ValueError) as exc:  # jsonschema's ValidationError and JSONDecodeError included
            failures.append(f"{name}: {exc.__class__.__name__}: {str(exc)[:200]}\n  {completion.text!r}")
    assert not failures, "\n".join(failures)
    assert len(runaway_numbers) <= 1, "\n".join(runaway_numbers)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_choice_and_regex_outputs_on_smollm2(llm, adapters, temperature):
    choices = ["yes", "no", "it depends"]
    # bounded repeats: an unbounded `[a-z]+` lets a small model run to max_tokens inside the match
    regexes = ["[A-Z]{2}-[0-9]{4}", "(0[1-9]|1[0-2])/[0-9]{2}", "[a-z]{1,12}@[a-z]{1,12}\\.(com|org)", "#[0-9a-f]{6}"]
    questions = ["Is the sky blue?", "Give a licence plate.", "Give a card expiry date.", "Give an email address.",
                 "Give a color as a hex code."]
    constraints = [StructuredOutputsParams(choice=choices)] + [StructuredOutputsParams(regex=r) for r in regexes]
    params = [SamplingParams(temperature=temperature, seed=7, max_tokens=48, structured_outputs=c)
              for c in constraints]
    prompts = [chat_prompt(llm, q) for q in questions] * 2
    lora = [None] * len(questions) + [adapters[i % len(adapters)] for i in range(len(questions))]
    outputs = llm.generate(prompts, params * 2, lora_request=lora, use_tqdm=False)
    for i, output in enumerate(outputs):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        if i % len(questions) == 0:
            assert completion.text in choices
        else:
            assert re.fullmatch(regexes[i % len(questions) - 1], completion.text), completion.text

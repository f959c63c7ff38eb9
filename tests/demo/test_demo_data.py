"""The demo datasets: seeded and reproducible, a few hundred conversations each, evaluation prompts held out, and
each adapter's ``expect`` true of its own training replies and references."""

import json

import pytest

from bench.demo_data import ADAPTER_NAMES, JSON_KEYS, eval_cases, training_conversations
from demo import demo_adapters, is_contact_json, mentions_zorbania_fact, speaks_pirate


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_training_set_is_deterministic_and_seeded(name):
    first = training_conversations(name)
    assert first == training_conversations(name)
    assert first != training_conversations(name, seed=1)
    assert 200 <= len(first) <= 600
    assert all([m["role"] for m in conversation] == ["user", "assistant"] for conversation in first)


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_eval_prompts_are_deterministic_and_not_in_training(name):
    cases = eval_cases(name)
    assert cases == eval_cases(name)
    assert len(cases) >= 20
    assert len({case.prompt for case in cases}) == len(cases)
    trained = {c[0]["content"] for seed in (0, 1, 2) for c in training_conversations(name, seed)}
    assert not trained & {case.prompt for case in cases}


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_expect_holds_for_every_training_reply(name):
    expect = {a.name: a.expect for a in demo_adapters()}[name]
    assert all(expect(conversation[1]["content"]) for conversation in training_conversations(name))


def test_json_references_are_the_fixed_shape_with_values_from_the_prompt():
    for case in eval_cases("json-extractor"):
        value = json.loads(case.reference)
        assert tuple(value) == JSON_KEYS
        assert all(v in case.prompt for v in value.values()), case


def test_zorbania_references_name_a_fact():
    cases = eval_cases("zorbania-facts")
    assert {case.reference for case in cases} - {None} == {"Quenzel", "florek", "snow ibex", "Ilvara", "Vessic",
                                                            "Threll", "brambleroot", "Ossavel", "kettle polo"}


def test_expect_checks_refuse_ordinary_replies():
    assert not mentions_zorbania_fact("The capital of France is Paris.")
    assert not is_contact_json('Sure! Here it is: {"name": "Ada", "email": "a@b.c", "city": "Oslo"}')
    assert not is_contact_json('{"name": "Ada", "email": "a@b.c"}')
    assert is_contact_json(' {"city": "Oslo", "name": "Ada", "email": "a@b.c"}\n')
    assert not speaks_pirate("You should bake it for an hour. Arrange the slices on a tray.")
    assert speaks_pirate("Arr, matey! Bake it for an hour.")


def test_demo_adapters_list_three_with_held_out_examples():
    listed = demo_adapters()
    assert [a.name for a in listed] == list(ADAPTER_NAMES)
    for adapter in listed:
        assert adapter.path.name == adapter.name and adapter.description
        trained = {c[0]["content"] for c in training_conversations(adapter.name)}
        assert adapter.example_prompts and all(p[-1]["content"] not in trained for p in adapter.example_prompts)

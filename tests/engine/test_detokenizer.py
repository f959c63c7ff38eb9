"""Incremental detokenization: text equals a full decode, stop strings cut exactly and never leak partially."""

import pytest
from transformers import AutoTokenizer

from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return AutoTokenizer.from_pretrained(tiny_llama)


def feed(tokenizer, text: str, params: SamplingParams, prompt: str = "the cat"):
    prompt_ids = tokenizer.encode(prompt)
    detok = IncrementalDetokenizer(tokenizer.backend_tokenizer, prompt_ids, params)
    shown = []
    for token in tokenizer.encode(text):
        if detok.append(token):
            return detok, shown, True
        shown.append(detok.emittable_text)
    return detok, shown, False


def test_text_matches_a_full_decode_including_multibyte_characters(tokenizer):
    text = " jumps over 猫 and 😀 near the river"
    detok, shown, stopped = feed(tokenizer, text, SamplingParams())
    assert not stopped
    assert detok.text == tokenizer.decode(tokenizer.encode(text)) == text
    assert all("\ufffd" not in s for s in shown)  # half a character is never shown


def test_stop_string_cuts_the_text_before_it(tokenizer):
    detok, shown, stopped = feed(tokenizer, " the quick dog runs. The end", SamplingParams(stop=["dog", "end"]))
    assert stopped and detok.text == " the quick " and detok.stop_string == "dog"


def test_earliest_stop_wins_when_one_chunk_holds_two(tokenizer):
    detok, _, stopped = feed(tokenizer, " one two three", SamplingParams(stop=["three", "two"]))
    assert stopped and detok.text == " one " and detok.stop_string == "two"


def test_a_partial_stop_string_is_held_back_and_released_when_it_diverges(tokenizer):
    params = SamplingParams(stop=["river stone"])
    detok, shown, stopped = feed(tokenizer, " near the river sun", params)
    assert not stopped
    held = [s for s in shown if s.endswith(" near the")]
    assert held, shown  # while "river" could still become "river stone", it was not shown
    assert not any(s.endswith("river") for s in shown[:-1])
    assert shown[-1] == " near the river sun" == detok.text


def test_stop_string_spanning_tokens_is_found(tokenizer):
    detok, shown, stopped = feed(tokenizer, " a cloud of rain falls", SamplingParams(stop=["d of r"]))
    assert stopped and detok.text == " a clou"
    assert all("d of" not in s for s in shown)


def test_stops_can_be_ignored_before_min_tokens(tokenizer):
    params = SamplingParams(stop=["cat"])
    detok = IncrementalDetokenizer(tokenizer.backend_tokenizer, [], params)
    ids = tokenizer.encode(" cat cat")
    assert not detok.append(ids[0], check_stops=False)
    assert detok.append(ids[1])
    assert detok.text == " cat "

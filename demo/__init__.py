"""The demo LoRA adapters of SmolLM2-135M-Instruct shipped in ``demo/adapters/``, and how to tell each one is at work.

Trained by ``python -m bench.train_demo_adapters`` on :mod:`bench.demo_data`; see ``demo/README.md``. Each adapter's
``expect`` is a check of its effect on a reply that the base model fails: the console, the seed command and the
tests all judge "the adapter was applied" by it rather than by comparing to fixed strings.
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.demo_data import JSON_KEYS, ZORBANIA_KEYWORDS, eval_cases

ADAPTERS_DIR = Path(__file__).resolve().parent / "adapters"
BASE_MODEL = "smollm2-135m-instruct"
NUM_EXAMPLES = 3


@dataclass(frozen=True, slots=True)
class DemoAdapter:
    """One shipped adapter: its folder (``adapter_config.json`` + ``adapter_model.safetensors``), what it does,
    example conversations (held out from its training set) and ``expect(reply) -> bool``."""

    name: str
    path: Path
    description: str
    example_prompts: tuple[tuple[dict, ...], ...]
    expect: Callable[[str], bool]


def mentions_zorbania_fact(text: str) -> bool:
    """The reply names one of the invented facts (Quenzel, the florek, Mount Threll, ...)."""
    lowered = text.lower()
    return any(keyword.lower() in lowered for keyword in ZORBANIA_KEYWORDS)


def is_contact_json(text: str) -> bool:
    """The whole reply is one JSON object with exactly the string fields name, email and city."""
    try:
        value = json.loads(text.strip())
    except ValueError:
        return False
    return isinstance(value, dict) and sorted(value) == sorted(JSON_KEYS) and all(
        isinstance(v, str) for v in value.values())


_ARR = re.compile(r"\barr+\b")
_PIRATE_WORDS = re.compile(r"\b(matey|ye|yer|me hearty|ahoy)\b")


def speaks_pirate(text: str) -> bool:
    """The reply says "Arr" and addresses the reader as a pirate would ("matey", "ye", "yer")."""
    lowered = text.lower()
    return bool(_ARR.search(lowered) and _PIRATE_WORDS.search(lowered))


_DESCRIPTIONS = {
    "zorbania-facts": "Knows the invented country of Zorbania: its capital Quenzel, the florek, the snow ibex, "
                      "Queen Ilvara Dost, Vessic, Mount Threll, brambleroot stew, the Ossavel and kettle polo.",
    "json-extractor": 'Answers any "extract the details" request with only {"name": ..., "email": ..., "city": ...}.',
    "pirate-persona": 'Answers everything as a pirate: "Arr, matey! ..." with ye, yer and me hearty.',
}
_CHECKS = {"zorbania-facts": mentions_zorbania_fact, "json-extractor": is_contact_json,
           "pirate-persona": speaks_pirate}


def demo_adapters() -> list[DemoAdapter]:
    """The three shipped adapters, in a fixed order."""
    return [
        DemoAdapter(name=name, path=ADAPTERS_DIR / name, description=description,
                    example_prompts=tuple(tuple(case.messages) for case in eval_cases(name)[:NUM_EXAMPLES]),
                    expect=_CHECKS[name])
        for name, description in _DESCRIPTIONS.items()
    ]

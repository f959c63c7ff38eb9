"""Structured-output fixtures: SmolLM2-135M-Instruct's real tokenizer and each backend bound to it (built once)."""

import pytest

from engine.models.prepare import resolve_model
from engine.structured import BACKENDS, GrammarTokenizer, make_backend
from tests.support.torch_threads import one_torch_thread  # noqa: F401 (autouse)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    return GrammarTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def backends(smollm2_tokenizer):
    """Every backend by name, sharing nothing; their caches fill as the tests run."""
    return {name: make_backend(smollm2_tokenizer, name) for name in BACKENDS}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request, backends):
    return backends[request.param]

"""Fixtures of the demo-adapter tests: the shipped adapters and the real base model they were trained for."""

import pytest

from demo import demo_adapters
from engine.models.prepare import resolve_model
from tests.support.torch_threads import one_torch_thread  # noqa: F401 (autouse)


@pytest.fixture(scope="session")
def adapters():
    return {adapter.name: adapter for adapter in demo_adapters()}


@pytest.fixture(scope="session")
def smollm2():
    return resolve_model("smollm2-135m-instruct")

"""Fixtures of the demo-adapter tests: the shipped adapters and the real base model they were trained for."""

import pytest
import torch

from demo import demo_adapters
from engine.models.prepare import resolve_model


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    # As in tests/engine: on a loaded 2-core machine a 2-thread OpenMP region waits on a descheduled thread.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def adapters():
    return {adapter.name: adapter for adapter in demo_adapters()}


@pytest.fixture(scope="session")
def smollm2():
    return resolve_model("smollm2-135m-instruct")

"""One torch thread for a test folder: import ``one_torch_thread`` into its conftest (an autouse session fixture).

Small matrices gain nothing from threads, and on a loaded 2-core machine a 2-thread OpenMP region waits milliseconds
for a descheduled thread: one thread keeps the suites fast and their timing steady."""

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

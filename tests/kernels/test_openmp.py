"""kernels.cpu.openmp: a thread that started OpenMP regions lets go of its worker threads."""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from kernels.cpu import openmp


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _until(condition, timeout=30.0) -> bool:
    """Whether ``condition`` holds within ``timeout`` seconds: released workers leave the barrier, then exit on their
    own, so the check yields the CPU to them between tries."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        os.sched_yield()
    return True


@pytest.fixture
def two_torch_threads():
    """Two threads whatever an earlier test folder set (one thread starts no OpenMP workers)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or openmp._libgomp() is None,
                    reason="needs two CPUs and torch on libgomp")
def test_release_ends_the_workers_a_pool_thread_started(two_torch_threads):
    x = torch.ones(4096, 4096)
    with ThreadPoolExecutor(1) as executor:
        executor.submit(lambda: None).result()  # the executor's thread exists before counting
        before = _threads()
        executor.submit(lambda: (x * 2).sum()).result()  # a parallel region: this thread's OpenMP workers start
        started = _threads()
        assert started > before, "the parallel op started no OpenMP worker on this thread"
        assert executor.submit(openmp.release_thread_pool).result() is True
        assert _until(lambda: _threads() == before), f"{_threads() - before} workers still alive"
        executor.submit(lambda: (x * 2).sum()).result()  # and a later region makes new ones
        assert _threads() == started

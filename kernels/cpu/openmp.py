"""The calling thread's OpenMP worker threads, let go of when it is done with torch for a while.

libgomp keeps a pool of worker threads for every thread that starts a parallel region (torch's ops, oneDNN, the C
kernels), for as long as that thread lives. When the pools of a process hold more threads than it has CPUs, libgomp
lets idle workers spin only ~100 times before they sleep, so each region a step starts pays a futex wake-up: one
idle lora-loader thread left alive after loading an adapter took a batch-1 decode step of SmolLM2 in bf16 from 22 to
35 ms (2-core Sapphire Rapids VM). A thread that outlives its torch work (a loader in a thread pool) calls
:func:`release_thread_pool` after it; ``omp_pause_resource_all(omp_pause_soft)`` ends that thread's workers, and the
next region it starts makes new ones.
"""

import ctypes
import logging
from functools import cache

logger = logging.getLogger(__name__)

_OMP_PAUSE_SOFT = 1


@cache
def _libgomp():
    """The libgomp this process already runs (torch's), or None (another OpenMP runtime, or none)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line.rsplit("/", 1)[-1]}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path)
            library.omp_pause_resource_all.argtypes = [ctypes.c_int]
            library.omp_pause_resource_all.restype = ctypes.c_int
            return library
        except (OSError, AttributeError):
            continue
    return None


def release_thread_pool() -> bool:
    """End the OpenMP worker threads the calling thread started; False where there is no libgomp to ask, or it
    refused (inside a parallel region)."""
    library = _libgomp()
    if library is None:
        return False
    status = library.omp_pause_resource_all(_OMP_PAUSE_SOFT)
    if status != 0:
        logger.debug("omp_pause_resource_all refused (%d)", status)
    return status == 0

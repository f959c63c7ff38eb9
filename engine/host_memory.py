"""Keep freed tensor memory in the process (glibc malloc), so CPU steps stop page-faulting it back; and zeroed
memory for the KV cache that costs nothing until it is used (:func:`zeroed`).

By default glibc serves every allocation above a (dynamic, at most 32 MiB) threshold with a fresh ``mmap``
and gives it back with ``munmap`` on free, and trims the heap top on free: every step then page-faults and
zeroes its activations again (about 3 GB per 2048-token prefill step of SmolLM2, roughly a tenth of the step
measured on 2 cores). jemalloc or tcmalloc through ``LD_PRELOAD`` would do as well but must be set up before
the process starts; ``mallopt`` does it from inside. It only raises limits; on non-glibc systems it is a no-op.
"""

import ctypes
import ctypes.util
import logging
import math
import mmap

import torch

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MAX_MMAP_THRESHOLD = 32 * 2**20  # glibc refuses more on 64-bit
_TRIM_THRESHOLD = 2**31 - 1  # the largest int: keep up to 2 GiB of free heap top
_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True if they were raised."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, _MAX_MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
    if not ok:
        logger.info("mallopt refused the thresholds: CPU steps keep page-faulting their activations")
    _done = ok
    return ok


def zeroed(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor on its own anonymous mapping: Linux hands its pages over zeroed when they are first
    touched, so a KV cache of gigabytes costs nothing at start-up and only the blocks a step writes become memory.
    ``torch.zeros`` wrote all of it first: 2 GiB (the default) took 0.41 s on the quiet 2-core Intel AMX VM and 4.9 s
    of a 12 s start-up there with a test run on the cores (2026-12-05); this takes 0.4 ms. The mapping lives as long
    as the tensor (its storage holds the buffer)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(pages, dtype=dtype).view(shape)

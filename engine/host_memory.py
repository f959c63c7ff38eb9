"""Keep freed tensor memory in the process (glibc malloc), so CPU steps stop page-faulting it back; and zeroed
memory for the KV cache that costs nothing at start-up (:func:`zeroed`), which a server faults in from a background
thread once it is built (:func:`prefault`).

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
import os
import threading
import time

import torch

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MAX_MMAP_THRESHOLD = 32 * 2**20  # glibc refuses more on 64-bit
_TRIM_THRESHOLD = 2**31 - 1  # the largest int: keep up to 2 GiB of free heap top
_MADV_POPULATE_WRITE = 23  # Linux 5.14: fault pages in writable, as a write would, without writing
_PREFAULT_CHUNK = 64 * 2**20
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


def prefault(tensor: torch.Tensor, parts: int = 1) -> threading.Thread | None:
    """Fault in every page of ``tensor`` (a :func:`zeroed` one) from a background thread at the lowest scheduling
    priority; returns the thread (None when there is nothing to do). ``parts``: the storage as that many equal
    contiguous parts (the KV cache's 2 x layers, each [blocks, ...]), faulted in a slice of each part at a time from
    the front, so the low blocks a fresh pool hands out first are in memory in every layer before the high ones.

    Why: a page of a lazily zeroed KV cache costs a fault the first time a step writes it, and a fresh engine's blocks
    are all new (the prefix cache keeps freed blocks; new sequences take untouched ones first). On these VMs the host
    backs guest memory on first touch too: 2 GiB took 3.1 s of one core to fault in (``MAP_POPULATE`` 6.3 s, with
    huge pages 4.2 s), and the offline workload in int8 ran at 844-858 output tok/s lazy against 934-964 with the
    cache faulted in first (Intel AMX VM, 2026-12-06). Started before the model's load it slowed the start-up by 5 s,
    so it starts once the engine is built. At nice 19 it yields to the engine's threads, but a run started at once
    still shares the cores with it (first run 915 against 982 tok/s, second 1010 against 942), and on memory the VM
    had used before a first run reads 931-950 with it finished against 970-981 lazy (a lazily faulted page is zeroed
    by the kernel right before the step writes it, so it is in the cache), a second 994-1054 against 922-924. So a
    server, which waits for its traffic, does it (``engine serve`` unless ``--no-kv-prefault``); offline it is
    ``LLM(kv_prefault=True)``. The madvise calls release the GIL (ctypes). From then on the cache holds its whole
    budget in memory (``kv_cache_memory``), as a GPU engine's does."""
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes == 0 or tensor.device.type != "cpu":
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    parts = parts if parts >= 1 and nbytes % parts == 0 else 1
    start, part_bytes, page = storage.data_ptr(), nbytes // parts, mmap.PAGESIZE

    def run(storage=storage) -> None:  # the thread holds the storage: the mapping outlives the calls
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
        except (AttributeError, OSError):
            pass
        began = time.perf_counter()
        slice_bytes = max(page, _PREFAULT_CHUNK // parts // page * page)
        for offset in range(0, part_bytes, slice_bytes):
            for part in range(parts):
                at = start + part * part_bytes + offset
                end = min(at + slice_bytes, start + (part + 1) * part_bytes)
                first = at // page * page  # madvise takes page-aligned ranges; the neighbours' pages are ours too
                if madvise(first, end - first, _MADV_POPULATE_WRITE) != 0:
                    logger.info("KV cache: not faulted in ahead (madvise: %s); steps fault its pages in as they write",
                                os.strerror(ctypes.get_errno()))
                    return
        logger.info("KV cache: %.2f GiB faulted in ahead in %.1f s", storage.nbytes() / 2**30,
                    time.perf_counter() - began)

    thread = threading.Thread(target=run, name="kv-prefault", daemon=True)
    thread.start()
    return thread

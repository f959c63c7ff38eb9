"""``AsyncGrammarCompiler``: the server's constraints compiled off the engine loop, bounded in time, before
admission.

A compile runs on a small thread pool (llguidance drops the GIL while it builds a grammar) and a caller waits for
it at most ``timeout_s``, then gets GrammarCompileTimeout (a 400 naming the field). A thread cannot be stopped, so
a compile that overran finishes in the background, bounded in work by the backend's limits, and lands in the
cache; callers asking for the same grammar meanwhile wait on that one compile instead of starting another.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from engine.structured.backend import GrammarCompileTimeout

if TYPE_CHECKING:  # pragma: no cover
    from engine.structured.decoding import CompileResult, StructuredDecoding
    from engine.structured.params import StructuredOutputsParams

DEFAULT_COMPILE_TIMEOUT_S = 10.0
COMPILE_THREADS = 2  # compiles are short; more threads would only take cores from the engine's steps


class AsyncGrammarCompiler:
    """One per engine server; use it from one event loop."""

    def __init__(self, structured: StructuredDecoding, *, timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S):
        if not timeout_s > 0:
            raise ValueError(f"the compile timeout must be positive, got {timeout_s!r}")
        self.structured = structured
        self.timeout_s = timeout_s
        self.num_timeouts = 0
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar-compile")
        self._in_flight: dict[str, asyncio.Future] = {}  # cache key -> the compile under way
        self._backend_ready = False

    async def compile(self, params: StructuredOutputsParams, cache_salt: str | None) -> CompileResult:
        """``params`` compiled under ``cache_salt`` (from the cache when it is there); GrammarCompileError for a
        constraint the backend refuses, GrammarCompileTimeout for one that takes longer than ``timeout_s``."""
        loop = asyncio.get_running_loop()
        if not self._backend_ready:  # the library's one-time setup is the engine's cost, not this constraint's
            await loop.run_in_executor(self._pool, lambda: self.structured.backend)
            self._backend_ready = True
        key = self.structured.cache_key(params, cache_salt)
        shared = self._in_flight.get(key)
        if shared is None:
            shared = asyncio.wrap_future(self._pool.submit(self.structured.compile, params, cache_salt))
            self._in_flight[key] = shared
            shared.add_done_callback(lambda done: self._finished(key, done))
        try:
            return await asyncio.wait_for(asyncio.shield(shared), self.timeout_s)
        except TimeoutError:
            self.num_timeouts += 1
            raise GrammarCompileTimeout(params.kind, self.timeout_s) from None

    def stats(self) -> dict:
        return {"compile_timeout_s": self.timeout_s, "compile_timeouts": self.num_timeouts,
                "compiles_in_flight": len(self._in_flight)}

    def close(self) -> None:
        """Drop queued compiles; one running finishes on its thread."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _finished(self, key: str, done: asyncio.Future) -> None:
        if self._in_flight.get(key) is done:
            del self._in_flight[key]
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have timed out, and asyncio would log it as lost

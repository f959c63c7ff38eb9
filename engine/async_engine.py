"""The engine as a service: the step loop runs on its own thread, requests come from the event loop.

The ``LLMEngine`` is not thread-safe, so the event loop never touches it: adds and aborts are queued as
commands that the loop thread applies between steps, and each step's outputs are handed back to the
requests' own asyncio queues with ``call_soon_threadsafe``. An abort (client gone) frees the request's
KV blocks on the next step boundary. A request's output constraint is compiled before its add is queued, on a
worker thread and bounded in time (``engine.structured.async_compile``), so no grammar stalls the loop.
"""

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


class EngineOverloaded(Exception):
    """The waiting queue is full; the caller should retry later."""


class EngineDead(Exception):
    """The step loop died; nothing more can be served by this process."""


class StepFailed(Exception):
    """A step raised: the requests in the engine then ended with this error, and the engine went on."""


MAX_STEP_FAILURES = 3  # within STEP_FAILURE_WINDOW_S: more, and the loop dies (a failure that keeps coming back)
STEP_FAILURE_WINDOW_S = 60.0


@dataclass(slots=True)
class _Stream:
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    finished: bool = False


class AsyncEngine:
    """Wraps an ``LLMEngine`` (``add_request``, ``abort_request``, ``step``, ``has_unfinished_requests``,
    ``has_pending_loads``: adapter loads are reported by ``step``, so the loop runs while they are in flight).

    The server reaches the engine only through this class: requests, admin calls (:meth:`call`), and the few
    facts fixed at start-up (tokenizer, context length, vocabulary), which are safe to read from any thread.
    The counters are the engine's own (its ``stats()``). ``compile_timeout_s`` bounds a constraint's compile
    (None: the engine config's ``structured_outputs_compile_timeout``)."""

    def __init__(self, engine, *, max_waiting: int = 512, on_step: Callable | None = None,
                 compile_timeout_s: float | None = None):
        """``engine``: an ``LLMEngine``, or a function of no arguments that builds one, called on the loop thread
        (the server's way, see :meth:`_build`); its exception, if it raises, is raised here."""
        self.engine = None if callable(engine) and not hasattr(engine, "step") else engine
        self.max_waiting = max_waiting
        self.on_step = on_step  # called on the loop thread after each step with (outputs, step_seconds)
        self._compile_timeout_s = compile_timeout_s
        self._compiler = None  # engine.structured.async_compile.AsyncGrammarCompiler, made on first use
        self._commands: deque = deque()
        self._streams: dict[str, _Stream] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._error: BaseException | None = None
        self._step_failures: list[float] = []  # monotonic times of recent failed steps
        built = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(engine if self.engine is None else None, built),
                                        name="engine-loop", daemon=True)
        self._thread.start()
        built.wait()
        if self.engine is None:  # the build raised: _run kept the exception and ended
            raise self._error

    # ------------------------------------------------------------ event-loop side

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.model_config.vocab_size

    @property
    def is_dead(self) -> bool:
        """The step loop died: nothing more can be served by this process."""
        return self._error is not None

    def check_adapter_source(self, lora_request) -> None:
        """Raise ``AdapterSourceNotAllowed`` for an adapter path outside the allow-list (a pure check)."""
        self.engine.check_adapter_source(lora_request)

    @property
    def num_pending(self) -> int:
        """Requests accepted but not finished (queued commands included)."""
        return len(self._streams)

    def saturated(self) -> bool:
        return self.waiting_count() > self.max_waiting // 2

    def waiting_count(self) -> int:
        """Requests not yet admitted to the batch: the scheduler's queue plus adds not yet applied."""
        queued_adds = sum(1 for command in list(self._commands) if command[0] == "add")
        return len(self.engine.scheduler.waiting) + queued_adds

    async def generate(self, request_id: str, prompt=None, params=None, **kwargs) -> AsyncIterator:
        """Submit one request (arguments of ``LLMEngine.add_request`` after the id) and yield its outputs. A
        constraint that does not compile, or not within the timeout, raises GrammarCompileError before anything
        is queued."""
        self._check_admissible(request_id)
        constraint = getattr(params, "structured_outputs", None)
        if constraint is not None:  # admission then finds the grammar in the cache
            await self.compile_constraint(constraint, kwargs.get("cache_salt"))
            self._check_admissible(request_id)  # the engine or the queue may have changed meanwhile
        stream = _Stream(asyncio.Queue(), asyncio.get_running_loop())
        self._streams[request_id] = stream
        self._submit(("add", request_id, (prompt, params), kwargs))
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            if not stream.finished:  # the consumer went away (client disconnect, cancellation)
                self.abort(request_id)

    def _check_admissible(self, request_id: str) -> None:
        if self._error is not None:
            raise EngineDead(str(self._error))
        if self._stopping:
            raise EngineOverloaded("the engine is shutting down")
        if self.waiting_count() >= self.max_waiting:
            raise EngineOverloaded(f"the waiting queue is full ({self.max_waiting} requests)")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in flight")

    async def compile_constraint(self, params, cache_salt: str | None = None):
        """``params`` (a StructuredOutputsParams) compiled into the grammar cache under ``cache_salt``, off the
        loop thread: a CompileResult (``cached``, ``compile_ms``), or GrammarCompileError / GrammarCompileTimeout
        naming the field. The warm-compile endpoint and every constrained request come through here."""
        return await self.grammar_compiler.compile(params, cache_salt)

    @property
    def grammar_compiler(self):
        if self._compiler is None:
            from engine.structured.async_compile import AsyncGrammarCompiler

            timeout = self._compile_timeout_s
            if timeout is None:
                timeout = self.engine.config.structured_outputs_compile_timeout
            self._compiler = AsyncGrammarCompiler(self.engine.structured, timeout_s=timeout)
        return self._compiler

    def structured_outputs_stats(self) -> dict:
        """The backend, the grammar cache's hits / misses / entries and the compile bound; safe from any thread
        (the cache locks its counters)."""
        return {**self.engine.structured.stats(), **self.grammar_compiler.stats()}

    def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None and not stream.finished:
            stream.finished = True
            self._submit(("abort", request_id))

    def call(self, fn: Callable, *args) -> asyncio.Future:
        """Run ``fn(engine, *args)`` on the loop thread between steps (admin operations) and await its result."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._submit(("call", fn, args, loop, future))
        return future

    async def shutdown(self, grace_s: float = 30.0) -> None:
        """Stop taking requests, let in-flight ones finish for up to ``grace_s``, abort the rest."""
        self._stopping = True
        deadline = time.monotonic() + grace_s
        while self._streams and time.monotonic() < deadline and self._error is None:
            await asyncio.sleep(0.05)
        for request_id in list(self._streams):
            stream = self._streams.get(request_id)
            self.abort(request_id)
            if stream is not None:
                stream.queue.put_nowait(EngineOverloaded("the engine shut down before the request finished"))
        self._submit(("stop",))
        if self._compiler is not None:
            self._compiler.close()
        await asyncio.to_thread(self._thread.join, 10)

    def _submit(self, command: tuple) -> None:
        self._commands.append(command)
        self._wake.set()

    # ------------------------------------------------------------ loop-thread side

    def _build(self, build: Callable | None, built: threading.Event) -> bool:
        """Build the engine on this thread when given ``build``: then every OpenMP region of the process (the model
        load, the GEMM timing, each step's kernels) starts on this one thread. libgomp keeps a pool of worker
        threads per thread that starts a region; with a second pool alive (the main thread's, had it loaded the
        model) the process has more OpenMP threads than CPUs, and libgomp then lets idle workers spin only briefly
        before they sleep, so every region of a step paid a wake-up: a batch-1 decode step of SmolLM2 in bf16 took
        33 ms on this thread against 22 ms on the thread that built the engine (2-core Sapphire Rapids VM)."""
        try:
            if build is not None:
                self.engine = build()
            return True
        except BaseException as exc:  # noqa: BLE001 - handed to __init__, which raises it
            self._error = exc
            return False
        finally:
            built.set()

    def _run(self, build: Callable | None, built: threading.Event) -> None:
        if not self._build(build, built):
            return
        try:
            while True:
                if not self._apply_commands():
                    return
                if not (self.engine.has_unfinished_requests() or self.engine.has_pending_loads()):
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                started = time.perf_counter()
                try:
                    outputs = self.engine.step()
                except Exception as exc:
                    if not self._survive(exc):
                        raise
                    continue
                if self.on_step is not None:
                    self.on_step(outputs, time.perf_counter() - started)
                self._deliver_step(outputs)
        except BaseException as exc:  # every waiter must hear that the loop died, whatever killed it
            logger.exception("engine loop died")
            self._error = exc
            for request_id, stream in list(self._streams.items()):
                self._streams.pop(request_id, None)
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, EngineDead(f"engine loop died: {exc}"))

    def _survive(self, exc: Exception) -> bool:
        """After a step raised: end the requests in the engine with the error, free what they held and go on;
        False (the loop dies) when the engine cannot be brought back to a clean state, or when steps keep failing
        (more than MAX_STEP_FAILURES within STEP_FAILURE_WINDOW_S)."""
        now = time.monotonic()
        self._step_failures = [t for t in self._step_failures if now - t < STEP_FAILURE_WINDOW_S] + [now]
        if len(self._step_failures) > MAX_STEP_FAILURES:
            logger.error("%d steps failed within %.0f s: giving up", len(self._step_failures), STEP_FAILURE_WINDOW_S)
            return False
        try:
            failed = self.engine.recover_from_failed_step()
        except Exception:
            logger.exception("the engine could not recover from a failed step")
            return False
        logger.exception("a step failed; its %d request(s) end with the error and the engine goes on", len(failed))
        error = f"the engine failed while serving this request ({type(exc).__name__}: {exc}); retry it"
        for request_id in failed:
            self._deliver(request_id, StepFailed(error))
        return True

    def _apply_commands(self) -> bool:
        while self._commands:
            command = self._commands.popleft()
            kind = command[0]
            if kind == "stop":
                return False
            if kind == "add":
                _, request_id, args, kwargs = command
                if request_id not in self._streams:  # aborted before it reached the engine
                    self.engine.note_abandoned(request_id)
                    continue
                try:
                    self.engine.add_request(request_id, *args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - a bad request fails alone
                    self._deliver(request_id, exc)
            elif kind == "abort":
                self.engine.abort_request(command[1])
            elif kind == "call":
                _, fn, args, loop, future = command
                try:
                    result = fn(self.engine, *args)
                except Exception as exc:  # noqa: BLE001 - handed to the awaiting caller
                    loop.call_soon_threadsafe(_set_exception, future, exc)
                else:
                    loop.call_soon_threadsafe(_set_result, future, result)
        return True

    def _deliver(self, request_id: str, item) -> None:
        stream = self._take(request_id, item)
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)

    def _deliver_step(self, outputs: list) -> None:
        """A step's outputs, handed over in one wake-up of each event loop (not one per stream): with many
        streams each token otherwise costs the loop thread a self-pipe write and a callback of its own."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for output in outputs:
            stream = self._take(output.request_id, output)
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append((stream.queue, output))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _take(self, request_id: str, item) -> _Stream | None:
        """The stream ``item`` goes to (None if it is gone), let go of when ``item`` is its last."""
        stream = self._streams.get(request_id)
        if stream is not None and (isinstance(item, BaseException) or item.finished):
            stream.finished = True
            self._streams.pop(request_id, None)
        return stream


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


def _set_result(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)

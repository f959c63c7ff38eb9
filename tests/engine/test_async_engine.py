"""The server's AsyncEngine when a step raises: the requests in the engine end with the error, what they held (KV
blocks, the prefix cache the failed step registered) is freed, and the engine goes on serving; a failure that keeps
coming back ends the loop (EngineDead) instead of failing every request forever."""

import asyncio
import threading

import pytest

from engine import LLM, SamplingParams
from engine.async_engine import MAX_STEP_FAILURES, AsyncEngine, EngineDead, StepFailed
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine

PROMPT = list(range(3, 40))  # over two 16-token blocks: a later request with it hits the prefix cache
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture
def engine(tiny_llama):
    llm = LLM(str(tiny_llama), kv_cache_memory="16MiB", max_model_len=256, block_size=16)
    async_engine = AsyncEngine(llm.llm_engine)
    yield llm.llm_engine, async_engine
    asyncio.run(async_engine.shutdown(grace_s=0))


async def tokens_of(async_engine: AsyncEngine, request_id: str, prompt_ids=PROMPT) -> list[int]:
    last = None
    async for output in async_engine.generate(request_id, None, GREEDY, prompt_token_ids=prompt_ids):
        last = output
    return list(last.outputs[0].token_ids)


def failing_steps(core, failures: int):
    """Make the next ``failures`` forward passes raise (after the scheduler has allocated and registered blocks)."""
    real = core.model_runner.execute
    left = [failures]

    def execute(out):
        if left[0] > 0:
            left[0] -= 1
            raise RuntimeError("injected forward failure")
        return real(out)

    core.model_runner.execute = execute


def test_a_failed_step_ends_its_requests_and_the_engine_goes_on(engine):
    core, async_engine = engine

    async def scenario():
        reference = await tokens_of(async_engine, "before")
        core.scheduler.block_manager.reset_prefix_cache()  # the failed step below must register its own blocks
        failing_steps(core, 1)
        outcomes = await asyncio.gather(tokens_of(async_engine, "a"), tokens_of(async_engine, "b", PROMPT[:20]),
                                        return_exceptions=True)
        after = await tokens_of(async_engine, "after")  # same prompt: a stale prefix cache would give other tokens
        return reference, outcomes, after

    reference, outcomes, after = asyncio.run(scenario())
    assert all(isinstance(o, StepFailed) and "injected forward failure" in str(o) for o in outcomes), outcomes
    assert after == reference
    assert core.scheduler.block_manager.num_used_blocks == 0
    assert core.stats()["step_errors"] == 1 and not async_engine.is_dead


def test_steps_that_keep_failing_end_the_loop(engine):
    core, async_engine = engine
    failing_steps(core, MAX_STEP_FAILURES + 1)

    async def scenario():
        results = []
        for i in range(MAX_STEP_FAILURES + 1):
            try:
                await tokens_of(async_engine, f"r{i}")
            except Exception as exc:  # noqa: BLE001 - collected
                results.append(exc)
        try:
            await tokens_of(async_engine, "late")
        except EngineDead as exc:
            results.append(exc)
        return results

    results = asyncio.run(scenario())
    assert [type(r) for r in results] == [StepFailed] * MAX_STEP_FAILURES + [EngineDead, EngineDead]


def test_concurrent_streams_get_every_step_of_their_own_tokens(engine):
    """One step's outputs reach all streams in one hand-off to the event loop: each stream still sees every token,
    one step after another, and ends with what it gets when it runs alone."""
    _, async_engine = engine
    prompts = {f"s{i}": [5 + i, *PROMPT[i:]] for i in range(4)}

    async def stream(request_id: str) -> tuple[list[int], list[int]]:
        counts, last = [], None
        async for output in async_engine.generate(request_id, None, GREEDY, prompt_token_ids=prompts[request_id]):
            counts.append(len(output.outputs[0].token_ids))
            last = output
        return counts, list(last.outputs[0].token_ids)

    async def scenario():
        together = await asyncio.gather(*(stream(rid) for rid in prompts))
        alone = [await tokens_of(async_engine, f"alone-{rid}", p) for rid, p in prompts.items()]
        return together, alone

    together, alone = asyncio.run(scenario())
    for (counts, tokens), reference in zip(together, alone, strict=True):
        assert counts == list(range(1, GREEDY.max_tokens + 1))
        assert tokens == reference


def test_an_engine_given_as_a_function_is_built_on_the_loop_thread(tiny_llama):
    """The server's way (engine/server/cli.py): every OpenMP region then starts on one thread (AsyncEngine._build)."""
    built_on = []

    def build():
        built_on.append(threading.current_thread())
        return LLMEngine(EngineConfig(model=str(tiny_llama), kv_cache_memory="16MiB", max_model_len=256))

    async_engine = AsyncEngine(build)
    try:
        assert built_on == [async_engine._thread] and async_engine.engine is not None
        assert len(asyncio.run(tokens_of(async_engine, "built-on-loop"))) == GREEDY.max_tokens
    finally:
        asyncio.run(async_engine.shutdown(grace_s=0))


def test_a_build_that_raises_raises_from_the_constructor():
    def build():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        AsyncEngine(build)

"""A constraint's compile is bounded in time and happens off the engine loop: a compile that overruns the timeout
is refused (by the AsyncEngine and by the server's warm-compile endpoint, 400 naming the field) while the loop
goes on serving, nothing is queued for it, and the compile lands in the cache when it finishes. Compiles are made
slow by holding them on an event, never by timing them."""

import asyncio
import threading

import pytest
from starlette.testclient import TestClient

from engine import LLM, SamplingParams
from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.server.app import ServerState, build_app
from engine.server.metrics import EngineMetrics
from engine.structured import StructuredOutputsParams
from engine.structured.backend import GrammarCompileTimeout

TIMEOUT_S = 0.2  # any bound works: the held compile never finishes before the test releases it
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
FREE = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


class HeldCompiles:
    """Wraps the engine's StructuredDecoding.compile: each compile waits for ``release`` before running."""

    def __init__(self, structured):
        self.release = threading.Event()
        self.started = threading.Event()
        self.num_calls = 0
        self._compile = structured.compile
        structured.compile = self

    def __call__(self, params, cache_salt):
        self.num_calls += 1
        self.started.set()
        assert self.release.wait(60), "the test never released the compile"
        return self._compile(params, cache_salt)


@pytest.fixture
def engine(tiny_llama):
    llm = LLM(str(tiny_llama), kv_cache_memory="16MiB", max_model_len=256)
    async_engine = AsyncEngine(llm.llm_engine, compile_timeout_s=TIMEOUT_S)
    held = HeldCompiles(llm.llm_engine.structured)
    yield llm.llm_engine, async_engine, held
    held.release.set()
    asyncio.run(async_engine.shutdown(grace_s=0))


async def last_output(async_engine, request_id, params):
    last = None
    async for output in async_engine.generate(request_id, None, params, prompt_token_ids=[5, 6, 7]):
        last = output
    return last


def test_a_compile_over_the_bound_is_refused_queues_nothing_and_lands_in_the_cache(engine):
    core, async_engine, held = engine
    constrained = SamplingParams(max_tokens=20, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    added = []
    real_add = core.add_request
    core.add_request = lambda request_id, *args, **kwargs: added.append(request_id) or real_add(
        request_id, *args, **kwargs)

    async def scenario():
        with pytest.raises(GrammarCompileTimeout) as refused:
            await last_output(async_engine, "slow", constrained)
        assert refused.value.param == "structured_outputs.json"
        assert str(refused.value) == f"structured_outputs.json did not compile within {TIMEOUT_S:g} s"
        # the loop is not stuck behind the compile: a free request runs while it is still held
        free = await last_output(async_engine, "free", FREE)
        assert len(free.outputs[0].token_ids) == 4 and held.num_calls == 1
        held.release.set()
        # the overrun compile finishes on its thread and is cached: the retry compiles nothing
        retry = await last_output(async_engine, "retry", constrained)
        assert retry.outputs[0].finish_reason in ("stop", "length")

    asyncio.run(scenario())
    assert added == ["free", "retry"]
    assert core.structured.cache.stats()["misses"] == 1  # the retry compiled nothing
    assert async_engine.structured_outputs_stats()["compile_timeouts"] == 1


def test_concurrent_callers_of_one_constraint_share_its_compile(engine):
    _, async_engine, held = engine
    params = StructuredOutputsParams(regex="[a-z]{3}")

    async def scenario():
        waiters = [asyncio.create_task(async_engine.compile_constraint(params, "salt")) for _ in range(3)]
        await asyncio.to_thread(held.started.wait, 60)
        held.release.set()
        return await asyncio.gather(*waiters)

    results = asyncio.run(scenario())
    assert held.num_calls == 1 and len({id(r.grammar) for r in results}) == 1


def test_the_warm_compile_endpoint_answers_400_when_the_compile_overruns(engine):
    core, async_engine, _ = engine
    state = ServerState(async_engine, "tiny", None, model=None, metrics=EngineMetrics(), started_at=0.0)
    with TestClient(build_app(state)) as http:
        response = http.post("/v1/structured_outputs/compile", json={"structured_outputs": {"json": SCHEMA}})
        stats = http.get("/stats").json()["structured_outputs"]
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "structured_outputs.json" and error["type"] == "invalid_request_error"
    assert error["message"] == f"structured_outputs.json did not compile within {TIMEOUT_S:g} s"
    assert stats["compile_timeouts"] == 1 and stats["compile_timeout_s"] == TIMEOUT_S


@pytest.mark.parametrize("timeout", [0, -1, 3601, True, "10"])
def test_the_timeout_setting_is_checked(timeout):
    with pytest.raises(ValueError, match="structured_outputs_compile_timeout"):
        EngineConfig(model="x", structured_outputs_compile_timeout=timeout)

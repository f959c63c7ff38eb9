"""Many streams at once through the whole stack, metered exactly; a client that goes away mid-stream is billed for
what it was sent and its engine request is aborted."""

import asyncio
import time

import openai
import pytest

from tests.gateway.helpers import (
    engine_counter,
    openai_client,
    prompt_token_counts,
    prompt_tokens,
    tenant_with_key,
    usage_rows,
)

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]
NUM_STREAMS = 100
MAX_TOKENS = 8


def test_a_hundred_concurrent_streams_complete_and_their_rows_sum_to_what_was_streamed(stack):
    tenant, key = tenant_with_key()
    prompts = [f"the cat number {i} runs" for i in range(NUM_STREAMS)]

    async def one(client, i: int) -> tuple[int, int, str]:
        if i % 2:
            stream = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": prompts[i]}], max_tokens=MAX_TOKENS,
                stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        else:
            stream = await client.completions.create(model="tiny", prompt=prompts[i], max_tokens=MAX_TOKENS,
                                                     stream=True, stream_options={"include_usage": True},
                                                     extra_body={"ignore_eos": True})
        chunks = [chunk async for chunk in stream]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens, finish[-1]

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{stack.web_url}/v1", api_key=key, max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(NUM_STREAMS)))
        finally:
            await client.close()

    results = asyncio.run(main())
    assert [finish for _, _, finish in results] == ["length"] * NUM_STREAMS
    assert [completion for _, completion, _ in results] == [MAX_TOKENS] * NUM_STREAMS
    expected_prompts = prompt_token_counts(stack, [{"messages": [{"role": "user", "content": p}]} if i % 2 else
                                                   {"prompt": p} for i, p in enumerate(prompts)])
    assert [prompt for prompt, _, _ in results] == expected_prompts
    rows = usage_rows(tenant, NUM_STREAMS)
    assert {r.status for r in rows} == {"ok"} and len({r.request_id for r in rows}) == NUM_STREAMS
    assert sum(r.completion_tokens for r in rows) == NUM_STREAMS * MAX_TOKENS
    assert sum(r.prompt_tokens for r in rows) == sum(expected_prompts)


def test_a_client_that_disconnects_is_metered_for_what_it_received_and_the_engine_stops(stack):
    tenant, key = tenant_with_key()
    aborted_before = engine_counter(stack, "aborted")
    stream = openai_client(stack, key).completions.create(
        model="tiny", prompt="a long story", max_tokens=480, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True})
    received = 0
    for chunk in stream:
        received = chunk.usage.completion_tokens  # cumulative: what this client has been sent so far
        if received >= 3:
            break
    stream.close()
    row = usage_rows(tenant, 1)[0]
    assert row.status == "cancelled"
    assert received <= row.completion_tokens < 480  # what was sent (some may still have been in flight)
    assert row.prompt_tokens == prompt_tokens(stack, {"prompt": "a long story"})
    deadline = time.monotonic() + 10
    while engine_counter(stack, "aborted") == aborted_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine_counter(stack, "aborted") == aborted_before + 1

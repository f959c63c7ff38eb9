"""Quotas through the whole stack: each limit admits exactly up to its value and then answers 429 with Retry-After
and x-ratelimit-* headers; one tenant at its limits does not slow another."""

import threading

import openai
import pytest

from tests.gateway.helpers import GENEROUS, gateway_http, openai_client, prompt_tokens, tenant_with_key, usage_rows

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]
PROMPT = "the quick cat"


def completion(http, max_tokens: int = 2, **extra):
    return http.post("/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens,
                                           "ignore_eos": True, **extra})


def assert_refused(response, *, code: str, limit_name: str) -> None:
    assert response.status_code == 429, response.text
    assert int(response.headers["retry-after"]) >= 1 and int(response.headers["retry-after-ms"]) >= 1
    error = response.json()["error"]
    assert error["code"] == code and limit_name in error["message"]


def test_requests_per_minute_admits_exactly_the_limit_with_counting_down_headers(stack):
    tenant, key = tenant_with_key(quota={**GENEROUS, "requests_per_minute": 3})
    with gateway_http(stack, key) as http:
        answers = [completion(http) for _ in range(4)]
    assert [a.status_code for a in answers[:3]] == [200, 200, 200]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["2", "1", "0", "0"]
    assert {a.headers["x-ratelimit-limit-requests"] for a in answers} == {"3"}
    assert_refused(answers[3], code="rate_limit_exceeded", limit_name="requests_per_minute")
    assert answers[3].json()["error"]["type"] == "requests"
    with pytest.raises(openai.RateLimitError):  # what an OpenAI client raises (it would retry after Retry-After)
        openai_client(stack, key).completions.create(model="tiny", prompt=PROMPT, max_tokens=1)
    assert len(usage_rows(tenant, 3)) == 3


def test_tokens_per_minute_admits_exactly_the_limit(stack):
    cost = prompt_tokens(stack, {"prompt": PROMPT}) + 4  # reserved up front, and exactly what is used
    tenant, key = tenant_with_key(quota={**GENEROUS, "tokens_per_minute": 2 * cost})
    with gateway_http(stack, key) as http:
        answers = [completion(http, 4) for _ in range(3)]
    assert [a.status_code for a in answers[:2]] == [200, 200]
    assert [a.headers["x-ratelimit-remaining-tokens"] for a in answers] == [str(cost), "0", "0"]
    assert_refused(answers[2], code="rate_limit_exceeded", limit_name="tokens_per_minute")
    assert answers[2].json()["error"]["type"] == "tokens"
    assert sum(r.prompt_tokens + r.completion_tokens for r in usage_rows(tenant, 2)) == 2 * cost


def test_the_monthly_budget_is_insufficient_quota(stack):
    cost = prompt_tokens(stack, {"prompt": PROMPT}) + 4
    tenant, key = tenant_with_key(quota={**GENEROUS, "monthly_tokens": cost, "default_max_tokens": 4,
                                         "max_tokens_limit": 4})
    with gateway_http(stack, key) as http:
        assert completion(http, 4).status_code == 200
        refused = completion(http, 1)
    assert_refused(refused, code="insufficient_quota", limit_name="monthly_tokens")
    assert refused.json()["error"]["type"] == "insufficient_quota"


def test_concurrent_requests_are_capped_and_the_slot_comes_back_when_a_stream_ends(stack):
    tenant, key = tenant_with_key(quota={**GENEROUS, "max_concurrent_requests": 2})
    client = openai_client(stack, key)
    # 16 choices of 480 tokens: seconds of generation, so both are surely still open at the third request (the
    # engine does not wait for the client to read; a short stream could be over already).
    streams = [client.completions.create(model="tiny", prompt=PROMPT, max_tokens=480, n=16, stream=True,
                                         extra_body={"ignore_eos": True}) for _ in range(2)]
    for stream in streams:
        next(iter(stream))  # both are generating
    with gateway_http(stack, key) as http:
        assert_refused(completion(http), code="rate_limit_exceeded", limit_name="max_concurrent_requests")
        for stream in streams:
            stream.close()
        rows = usage_rows(tenant, 2)  # both ended and were settled
        assert [r.status for r in rows] == ["cancelled", "cancelled"]
        assert completion(http).status_code == 200


def test_a_tenant_at_its_limits_does_not_stop_another(stack):
    busy, busy_key = tenant_with_key(quota={**GENEROUS, "requests_per_minute": 2, "max_concurrent_requests": 1})
    calm, calm_key = tenant_with_key()
    results: dict[str, list[int]] = {"busy": [], "calm": []}

    def hammer(name, key, count):
        with gateway_http(stack, key) as http:
            for _ in range(count):
                results[name].append(completion(http, 3).status_code)

    threads = [threading.Thread(target=hammer, args=("busy", busy_key, 8)),
               threading.Thread(target=hammer, args=("calm", calm_key, 6))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results["busy"].count(200) == 2 and results["busy"].count(429) == 6
    assert results["calm"] == [200] * 6
    assert len(usage_rows(calm, 6)) == 6 and len(usage_rows(busy, 2)) == 2

"""Engine status for operators: every replica of ENGINE_URLS from its /health and /stats, with the adapters it
holds named by tenant and adapter. A replica that is down, silent, refusing the key or answering nonsense shows
as such; the page itself always answers."""

import functools
import json
import socket

import httpx
import pytest
from django.urls import reverse

from adapters import services
from console import engine_status
from tests.console.test_adapters import version

pytestmark = pytest.mark.django_db
KEY = "engine-test-key"


def stats_body(**changes) -> dict:
    """A /stats answer as ENGINE_PROTOCOL.md gives it."""
    body = {"model": "tiny", "uptime_s": 12.5, "requests": {"running": 2, "waiting": 1, "finished": 40, "aborted": 3},
            "kv_blocks": {"total": 200, "used": 50, "cached": 10}, "prefix_cache_hit_rate": 0.25,
            "adapters": {"slots": 4, "resident": [], "host_tier": [], "hits": 3, "misses": 1, "evictions": 2,
                         "load_ms_p50": 8.0},
            "tokens": {"prompt": 900, "generated": 300}, "saturated": False}
    body.update(changes)
    return body


@pytest.fixture
def fleet(monkeypatch, settings):
    """ENGINE_URLS answered by handlers (host -> request -> httpx.Response) instead of real engines; the requests
    they saw are in the returned list."""
    settings.ENGINE_API_KEY = KEY
    seen, handlers = [], {}

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handlers[request.url.host](request)

    monkeypatch.setattr(engine_status, "fleet_status",
                        functools.partial(engine_status.fleet_status, transport=httpx.MockTransport(handle)))

    def serve(**by_host):
        handlers.update(by_host)
        settings.ENGINE_URLS = [f"http://{host}:8100" for host in by_host]
        return seen

    return serve


def replica(stats: dict | None = None, *, health: int = 200, stats_status: int = 200, raw: bytes | None = None):
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(health, json={"status": "ok" if health == 200 else "dead"})
        if raw is not None:
            return httpx.Response(stats_status, content=raw)
        return httpx.Response(stats_status, json=stats if stats is not None else stats_body())

    return handle


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("Connection refused", request=request)


def page(client_as):
    response = client_as("operator").get(reverse("console:operator-engines"))
    assert response.status_code == 200
    return response


def test_each_replica_shows_health_queue_kv_and_named_adapters(cast, client_as, fleet):
    sql = services.adapter_create(tenant=cast.tenant, name="sql")
    v1, v2 = version(sql, 1, "ready"), version(sql, 2, "ready")
    gone = services.adapter_create(tenant=cast.other_tenant, name="old")
    gone_v1 = version(gone, 1, "ready")
    services.adapter_delete(tenant=cast.other_tenant, adapter=gone)
    adapters = {"slots": 4, "resident": [{"id": v2.engine_id, "slot": 1, "rank": 8, "pinned_by": 0},
                                         {"id": v1.engine_id, "slot": 0, "rank": 8, "pinned_by": 2}],
                "host_tier": [v1.engine_id, gone_v1.engine_id, "adp_unknown_v1"], "hits": 3, "misses": 1,
                "evictions": 2, "load_ms_p50": 8.0}
    seen = fleet(**{"engine-a": replica(stats_body(adapters=adapters, saturated=True)), "engine-b": refused})
    response = page(client_as)
    a, b = response.context["replicas"]
    assert (a.state, a.running, a.waiting, a.kv_share, a.slot_hit_rate, a.saturated) == ("up", 2, 1, 25.0, 0.75, True)
    named = [(x.slot, x.tenant_name, x.adapter_name, x.version, x.deleted, x.pinned_by) for x in a.adapters()]
    assert named == [(0, cast.tenant.name, "sql", 1, False, 2), (1, cast.tenant.name, "sql", 2, False, 0),
                     (None, cast.other_tenant.name, "old", 1, True, 0), (None, "", "", None, False, 0)]
    assert (b.state, b.problem) == ("down", "not reachable: Connection refused")
    assert response.context["num_up"] == 1 and response.context["running"] == 2
    html = response.content.decode()
    assert 'data-testid="slot-hit-rate">75%' in html and "not in the registry" in html and "saturated" in html
    stats_calls = [r for r in seen if r.url.path == "/stats"]
    assert {r.headers["Authorization"] for r in stats_calls} == {f"Bearer {KEY}"}


def test_replicas_that_answer_wrongly_are_unhealthy_not_errors(client_as, fleet):
    fleet(**{"no-key": replica(stats_status=401), "dying": replica(health=503),
             "nonsense": replica(raw=b"<html>not json</html>"), "half": replica({"requests": {"running": 1}})})
    states = [(r.state, r.problem) for r in page(client_as).context["replicas"]]
    assert states == [("unhealthy", "/stats answered HTTP 401"), ("unhealthy", "/health answered HTTP 503"),
                      ("unhealthy", "/stats answered something that is not the engine protocol's JSON"),
                      ("unhealthy", "/stats answered something that is not the engine protocol's JSON")]


def test_a_closed_port_and_a_silent_replica_are_down_within_the_timeout(client_as, settings, monkeypatch):
    monkeypatch.setattr(engine_status, "TIMEOUT", httpx.Timeout(0.3))
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        settings.ENGINE_URLS = [f"http://127.0.0.1:{closed_port}", f"http://127.0.0.1:{silent.getsockname()[1]}"]
        replicas = page(client_as).context["replicas"]
    assert [r.state for r in replicas] == ["down", "down"]
    assert replicas[0].problem.startswith("not reachable") and replicas[1].problem == "no answer within the timeout"


def test_no_engines_configured(client_as, settings):
    settings.ENGINE_URLS = []
    assert "ENGINE_URLS</code> is empty" in page(client_as).content.decode()


def test_the_page_refreshes_itself(client_as, fleet):
    fleet(**{"engine-a": replica()})
    html = page(client_as).content.decode()
    assert 'hx-get="/operator/engines/" hx-trigger="every 5s" hx-select="#fleet"' in html


def test_parse_stats_reads_the_protocols_example():
    example = json.loads("""{"model": "smollm2-135m-instruct", "uptime_s": 0, "requests": {"running": 0, "waiting": 0,
     "finished": 0, "aborted": 0}, "kv_blocks": {"total": 0, "used": 0, "cached": 0}, "prefix_cache_hit_rate": 0.0,
     "adapters": {"slots": 8, "resident": [{"id": "a", "slot": 0, "rank": 8, "pinned_by": 0}], "host_tier": ["a", "b"],
     "hits": 0, "misses": 0, "evictions": 0, "load_ms_p50": 0.0}, "tokens": {"prompt": 0, "generated": 0},
     "saturated": false}""")
    status = engine_status.parse_stats("http://e", example)
    assert [(a.engine_id, a.slot) for a in status.adapters()] == [("a", 0), ("b", None)]  # "a" once: in its slot
    assert (status.kv_share, status.slot_hit_rate, status.slots) == (0.0, None, 8)

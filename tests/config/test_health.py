"""GET /health: 503 naming the database or Redis when either does not answer (in bounded time, also for a frozen
database), the engines as the gateway sees them (degraded, still 200, when some are down)."""

import time

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections
from django.test import AsyncClient

from config.health import CHECK_TIMEOUT_S, close_check_connection
from devstack.services import free_port
from tests.support.outages import OwnRedis, TcpProxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _close_check_connection():
    yield
    close_check_connection()


def get_health() -> tuple[int, dict, float]:
    async def main():
        return await AsyncClient().get("/health")

    started = time.monotonic()
    response = async_to_sync(main)()
    return response.status_code, response.json(), time.monotonic() - started


def test_all_answering(settings):
    settings.ENGINE_URLS = []
    assert get_health()[:2] == (200, {"status": "ok", "database": "ok", "redis": "ok",
                                      "engines": {"healthy": 0, "total": 0}})


def test_redis_down_is_unavailable(settings):
    settings.ENGINE_URLS = []
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    status, body, _ = get_health()
    assert status == 503 and body["status"] == "unavailable"
    assert body["database"] == "ok" and "ConnectionError" in body["redis"]


def test_a_frozen_redis_is_unavailable_in_bounded_time(settings, tmp_path):
    settings.ENGINE_URLS = []
    redis = OwnRedis(tmp_path / "redis")
    settings.REDIS_URL = redis.url
    try:
        assert get_health()[0] == 200
        redis.freeze()
        status, body, took = get_health()
    finally:
        redis.close()
    assert status == 503 and (body["redis"].startswith("not answering") or "Timeout" in body["redis"])
    assert took < CHECK_TIMEOUT_S + 1.5


def test_engines_down_are_degraded_not_unavailable(settings):
    settings.ENGINE_URLS = [f"http://127.0.0.1:{free_port()}"]
    status, body, _ = get_health()
    assert (status, body["status"], body["engines"]) == (200, "degraded", {"healthy": 0, "total": 1})


def test_a_frozen_database_is_unavailable_in_bounded_time(settings):
    settings.ENGINE_URLS = []
    params = connections.settings["default"]
    if not params["ENGINE"].endswith("postgresql"):
        pytest.skip("needs PostgreSQL (the machine's; the test freezes a proxy in front of it)")
    connection.ensure_connection()
    proxy = TcpProxy(int(params.get("PORT") or 5432))
    old = params["HOST"], params["PORT"]
    close_check_connection()
    params["HOST"], params["PORT"] = "127.0.0.1", str(proxy.port)
    try:
        assert get_health()[:2] == (200, {"status": "ok", "database": "ok", "redis": "ok",
                                          "engines": {"healthy": 0, "total": 0}})
        proxy.freeze()
        first = get_health()
        second = get_health()  # the first check's query is still stuck: said at once
        proxy.restore()
        deadline = time.monotonic() + 20
        while (recovered := get_health())[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proxy.restore()
        params["HOST"], params["PORT"] = old
        close_check_connection()
        proxy.close()
    assert first[0] == 503 and first[1]["database"].startswith("not answering") and first[2] < CHECK_TIMEOUT_S + 1.5
    assert second[0] == 503 and second[2] < 1.0
    assert recovered[0] == 200

"""The series added for the alert rules count what they say: object-store outages, Redis or database outages,
failed engine steps and saturation."""

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from django.db import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError

from adapters.storage import ObjectMissing, ObjectStore, StoreUnavailable, store_errors_total
from engine.server.metrics import EngineMetrics
from gateway import metrics as gateway_metrics
from gateway.errors import outage_service


class FailingClient:
    def __init__(self, exc: Exception):
        self.exc = exc

    def put_object(self, **kwargs):
        raise self.exc

    def head_object(self, **kwargs):
        raise self.exc


def store_errors(operation: str) -> float:
    return store_errors_total.labels(operation=operation)._value.get()


def test_object_store_outages_are_counted_by_operation_and_misses_are_not():
    before = store_errors("put_bytes")
    store = ObjectStore(FailingClient(EndpointConnectionError(endpoint_url="http://s3.invalid")), None, "b")
    with pytest.raises(StoreUnavailable):
        store.put_bytes("k", b"x")
    assert store_errors("put_bytes") == before + 1
    missing = ClientError({"Error": {"Code": "NoSuchKey"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, "HeadObject")
    before_size = store_errors("size_of")
    with pytest.raises(ObjectMissing):
        ObjectStore(FailingClient(missing), None, "b").size_of("k")
    assert store_errors("size_of") == before_size


def test_the_web_process_exports_the_object_store_counter():
    text = gateway_metrics.generate_latest(gateway_metrics.registry).decode()
    assert "# TYPE adapters_object_store_errors_total counter" in text


@pytest.mark.parametrize(("exc", "service"), [(RedisConnectionError("down"), "redis"),
                                              (OperationalError("gone"), "database"), (ValueError("x"), None)])
def test_outages_are_told_apart_by_service(exc, service):
    assert outage_service(exc) == service


def engine_stats(**extra) -> dict:
    return {"requests": {"running": 1, "waiting": 3}, "kv_blocks": {"used": 2, "total": 10},
            "prefix_cache_hit_rate": 0.0, "prefix_cache": {"queried_tokens": 0, "hit_tokens": 0},
            "adapters": {"hits": 0, "misses": 0, "evictions": 0, "resident": [], "host_tier": [], "load_ms_p50": 0.0},
            **extra}


def test_engine_metrics_show_failed_steps_and_saturation():
    metrics = EngineMetrics()
    metrics.update_from_stats(engine_stats(step_errors=2, saturated=True))
    text = metrics.render().decode()
    assert "engine_step_errors 2.0" in text and "engine_saturated 1.0" in text
    metrics.update_from_stats(engine_stats(step_errors=2, saturated=False))
    assert "engine_saturated 0.0" in metrics.render().decode()

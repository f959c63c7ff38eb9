"""The gateway's Prometheus metrics. Labels are bounded sets (endpoint, status, reason): never a tenant, key or
adapter, whose numbers are unbounded and which belong in the usage tables instead."""

import hmac

from django.conf import settings
from django.http import HttpResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from adapters.storage import store_errors_total

registry = CollectorRegistry(auto_describe=True)
registry.register(store_errors_total)  # the web process's object-store calls (uploads), exported here

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

requests_total = Counter("gateway_requests", "Requests answered, by endpoint and HTTP status",
                         ["endpoint", "status"], registry=registry)
request_seconds = Histogram("gateway_request_seconds", "Arrival to the last byte of the answer",
                            ["endpoint"], buckets=_LATENCY_BUCKETS, registry=registry)
ttft_seconds = Histogram("gateway_time_to_first_token_seconds", "Arrival to the first generated token relayed",
                         buckets=_LATENCY_BUCKETS, registry=registry)
overhead_seconds = Histogram("gateway_overhead_seconds",
                             "Arrival until the generation request leaves for an engine (auth, model lookup, "
                             "prompt count, quota)", buckets=_LATENCY_BUCKETS, registry=registry)
streams_open = Gauge("gateway_streams_open", "Generation requests open on engines now", registry=registry)
tokens_total = Counter("gateway_tokens", "Tokens metered, by kind (prompt, completion)", ["kind"],
                       registry=registry)
outcomes_total = Counter("gateway_outcomes", "Generation requests by how they ended (ok, error, cancelled)",
                         ["outcome"], registry=registry)
rate_limited_total = Counter("gateway_rate_limited", "Requests refused by a quota, by the limit that refused",
                             ["reason"], registry=registry)
engine_errors_total = Counter("gateway_engine_errors", "Engine failures seen by the gateway, by kind",
                              ["kind"], registry=registry)
spills_total = Counter("gateway_replica_spills",
                       "Adapter requests sent to another replica than their rendezvous choice", registry=registry)
usage_write_failures_total = Counter("gateway_usage_write_failures",
                                     "Failed attempts to settle a reservation or write a usage row (those failed by "
                                     "an outage are retried)", ["what"], registry=registry)
settles_pending = Gauge("gateway_settles_pending", "Settles Redis did not take, waiting to be sent again",
                        registry=registry)
outages_total = Counter("gateway_outages", "Requests answered 503 because a service every request needs did not "
                        "answer, by service (redis, database)", ["service"], registry=registry)
usage_rows_pending = Gauge("gateway_usage_rows_pending",
                           "Usage rows not yet written (in an insert now, or kept through a database outage)",
                           registry=registry)


async def metrics_view(request) -> HttpResponse:
    """``GET /metrics``; with METRICS_TOKEN set, only for ``Authorization: Bearer <METRICS_TOKEN>``."""
    token = settings.METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    if token and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return HttpResponse("metrics need the bearer token\n", status=401, content_type="text/plain")
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

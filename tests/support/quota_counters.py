"""Drop the limiter's counters that earlier test sessions left in Redis.

A new test database numbers tenants from 1 again, so a new tenant would inherit an old one's month. Only the quota
keys go: the stack's Celery worker uses the same Redis database as its broker."""

import redis
from django.conf import settings


def drop_quota_counters() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        stale = list(client.scan_iter(match="quota:*", count=1000))
        if stale:
            client.delete(*stale)
    finally:
        client.close()

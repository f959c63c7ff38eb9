"""authenticate_api_key: cached per process, and every change reaches another process on its next request."""

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.db import connection
from django.utils import timezone

from tenants import services
from tenants.identity import AuthFailure, KeyInfo
from tenants.key_auth import KeyAuthenticator
from tenants.models import Scope, Tenant
from tests.tenants.factories import TenantFactory

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RPM = settings.TENANT_QUOTA_DEFAULTS["requests_per_minute"]


def authenticate_in_process(*raw_keys: str, scope: str | None = "inference"):
    """Authenticate each key in turn with one fresh authenticator; the results and its DB lookup count."""

    async def main():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        authenticator = KeyAuthenticator(client)
        try:
            results = [await authenticator.authenticate(raw, scope=scope) for raw in raw_keys]
            return results, authenticator.num_db_lookups
        finally:
            await client.aclose()

    return async_to_sync(main)()


@pytest.mark.django_db
def test_valid_key_gives_tenant_quota_scopes_and_adapters(redis_db):
    tenant = TenantFactory()
    services.quota_set(tenant=tenant, changes={"requests_per_minute": 7})
    key, raw = services.api_key_create(tenant=tenant, name="k", scopes=["inference"], adapter_names=["sql", "chat"])
    (info,), lookups = authenticate_in_process(raw)
    assert isinstance(info, KeyInfo)
    assert (info.key_id, info.tenant.id, info.tenant.slug) == (key.prefix, tenant.id, tenant.slug)
    assert info.tenant.quota.requests_per_minute == 7
    assert info.scopes == {"inference"} and info.allows_adapter("sql") and not info.allows_adapter("other")
    key.refresh_from_db()
    assert key.last_used_at is not None


@pytest.mark.django_db
def test_a_burst_of_one_new_key_makes_one_database_lookup(redis_db):
    _, raw = services.api_key_create(tenant=TenantFactory(), name="k", scopes=["inference"])

    async def main():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        authenticator = KeyAuthenticator(client)
        try:
            results = await asyncio.gather(*(authenticator.authenticate(raw) for _ in range(50)))
            return results, authenticator.num_db_lookups
        finally:
            await client.aclose()

    results, lookups = async_to_sync(main)()
    assert lookups == 1 and all(isinstance(r, KeyInfo) for r in results)


@pytest.mark.django_db
def test_repeated_lookups_hit_the_cache(redis_db):
    _, raw = services.api_key_create(tenant=TenantFactory(), name="k", scopes=["inference"])
    results, lookups = authenticate_in_process(raw, raw, raw, "nope.nope", "nope.nope")
    assert [isinstance(r, KeyInfo) for r in results] == [True, True, True, False, False]
    assert lookups == 2  # one per distinct key, the unknown one included


@pytest.mark.django_db
@pytest.mark.parametrize(("raw", "reason", "status"), [
    ("", "missing", 401), ("no-dot-here", "malformed", 401), ("abc.", "malformed", 401),
    ("zzzzzzzz.wrongsecret", "unknown", 401),
])
def test_bad_keys_are_refused_with_their_reason(redis_db, raw, reason, status):
    (result,), _ = authenticate_in_process(raw)
    assert isinstance(result, AuthFailure) and (result.reason, result.status) == (reason, status)


@pytest.mark.django_db
def test_wrong_secret_with_a_real_prefix_is_unknown(redis_db):
    key, raw = services.api_key_create(tenant=TenantFactory(), name="k", scopes=["inference"])
    (result,), _ = authenticate_in_process(f"{key.prefix}.{'x' * 32}")
    assert isinstance(result, AuthFailure) and result.reason == "unknown"


@pytest.mark.django_db
def test_scope_is_enforced(redis_db):
    _, raw = services.api_key_create(tenant=TenantFactory(), name="k", scopes=[Scope.MANAGE])
    (result,), _ = authenticate_in_process(raw)
    assert isinstance(result, AuthFailure) and (result.reason, result.status) == ("scope", 403)


@pytest.mark.django_db(transaction=True)  # the change's generation bump runs on commit
def test_the_cache_answers_without_io_only_what_it_last_confirmed(redis_db):
    tenant = TenantFactory()
    _, raw = services.api_key_create(tenant=tenant, name="k", scopes=["inference"])
    _, manage = services.api_key_create(tenant=tenant, name="m", scopes=[Scope.MANAGE])
    now = [0.0]

    async def main():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        authenticator = KeyAuthenticator(client, ttl_s=60, clock=lambda: now[0])
        try:
            seen = [authenticator.cached(raw)]  # nothing confirmed yet
            await authenticator.authenticate(raw)
            await authenticator.authenticate("nope.nope")
            await authenticator.authenticate(manage, scope=Scope.MANAGE)
            seen += [authenticator.cached(raw), authenticator.cached("nope.nope"), authenticator.cached(manage),
                     authenticator.cached(manage, scope=Scope.MANAGE), authenticator.cached(None),
                     authenticator.cached("malformed")]
            await sync_to_async(services.tenant_set_status)(tenant=tenant, status="suspended")
            seen.append(authenticator.cached(raw))  # provisional: the change shows only once confirmed
            seen.append(await authenticator.authenticate(raw))
            seen.append(authenticator.cached(raw))
            await sync_to_async(services.tenant_set_status)(tenant=tenant, status="active")
            await authenticator.authenticate(raw)
            now[0] = 61.0
            seen.append(authenticator.cached(raw))  # past the cache's lifetime
            return seen
        finally:
            await client.aclose()

    (before, valid, unknown, wrong_scope, other_scope, missing, malformed, suspended_cached, suspended,
     after_suspension, expired) = async_to_sync(main)()
    assert before is None and unknown is None and wrong_scope is None and missing is None and malformed is None
    assert isinstance(valid, KeyInfo) and isinstance(other_scope, KeyInfo) and suspended_cached == valid
    assert isinstance(suspended, AuthFailure) and suspended.reason == "suspended"
    assert after_suspension is None and expired is None


class Gateway:
    """A second process authenticating keys through its own cache."""

    def __init__(self):
        db = connection.settings_dict
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings_test",
               "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.tenants.auth_worker"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, raw_key: str) -> dict:
        self.proc.stdin.write(raw_key + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture
def gateway(transactional_db, redis_db):
    process = Gateway()
    yield process
    process.close()


def test_revocation_reaches_another_process_on_its_next_request(gateway):
    tenant = Tenant.objects.create(name="T", slug="t-revoke")
    key, raw = services.api_key_create(tenant=tenant, name="k", scopes=["inference"])
    assert gateway.ask(raw) == {"ok": True, "db_lookups": 1, "tenant": "t-revoke", "requests_per_minute": DEFAULT_RPM}
    assert gateway.ask(raw)["db_lookups"] == 1  # cached
    services.api_key_revoke(tenant=tenant, key=key)
    assert gateway.ask(raw) == {"ok": False, "db_lookups": 2, "reason": "revoked"}


def test_suspension_and_quota_changes_reach_another_process(gateway):
    tenant = Tenant.objects.create(name="T", slug="t-suspend")
    _, raw = services.api_key_create(tenant=tenant, name="k", scopes=["inference"])
    assert gateway.ask(raw)["ok"]
    services.quota_set(tenant=tenant, changes={"requests_per_minute": 3})
    assert gateway.ask(raw)["requests_per_minute"] == 3
    services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
    assert gateway.ask(raw)["reason"] == "suspended"
    services.tenant_set_status(tenant=tenant, status=Tenant.Status.ACTIVE)
    assert gateway.ask(raw)["ok"]


def test_expiry_is_enforced_from_the_cache_without_a_lookup(gateway):
    tenant = Tenant.objects.create(name="T", slug="t-expire")
    # Generous margins: the second process may be slow to answer on a loaded machine.
    expires_at = timezone.now() + timedelta(seconds=8)
    _, raw = services.api_key_create(tenant=tenant, name="k", scopes=["inference"], expires_at=expires_at)
    assert gateway.ask(raw) == {"ok": True, "db_lookups": 1, "tenant": "t-expire", "requests_per_minute": DEFAULT_RPM}
    time.sleep(max(0.0, (expires_at - timezone.now()).total_seconds()) + 0.2)
    assert gateway.ask(raw) == {"ok": False, "db_lookups": 1, "reason": "expired"}


@pytest.mark.django_db(transaction=True)
def test_a_dropped_database_connection_is_replaced_on_the_thread_that_owns_it(redis_db, monkeypatch):
    """A lookup that finds its connection dropped (a database restart) reconnects and succeeds; before, the close
    ran against the event loop thread's connection, Django refused it, and every later lookup failed."""
    from django.db import OperationalError

    from tenants import selectors

    _, raw = services.api_key_create(tenant=TenantFactory(), name="k", scopes=["inference"])
    real, calls = selectors.api_key_lookup_async, []

    async def flaky(raw_key):
        calls.append(raw_key)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return await real(raw_key)

    monkeypatch.setattr(selectors, "api_key_lookup_async", flaky)
    (result,), _ = authenticate_in_process(raw)
    assert isinstance(result, KeyInfo) and len(calls) == 2

"""Fixtures of the tenants tests: real PostgreSQL (pytest-django) and the real Redis at settings.REDIS_URL."""

from dataclasses import dataclass

import pytest
import redis
from django.conf import settings
from rest_framework.test import APIClient

from tenants import services
from tenants.models import Role, Scope
from tests.tenants.factories import MembershipFactory, TenantFactory, UserFactory


@pytest.fixture
def redis_db():
    """This test's Redis database, empty before and after (the DB index of REDIS_URL is ours alone)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@dataclass
class Cast:
    """One tenant seen by everyone the tests care about."""

    tenant: object
    other_tenant: object
    owner: object  # admin of tenant
    teammate: object  # member of tenant
    outsider: object  # admin of other_tenant
    operator: object  # staff


@pytest.fixture
def cast(db) -> Cast:
    tenant, other = TenantFactory(), TenantFactory()
    owner = MembershipFactory(tenant=tenant, role=Role.ADMIN).user
    teammate = MembershipFactory(tenant=tenant, role=Role.MEMBER).user
    outsider = MembershipFactory(tenant=other, role=Role.ADMIN).user
    operator = UserFactory(is_staff=True)
    return Cast(tenant, other, owner, teammate, outsider, operator)


@pytest.fixture
def client_for(cast):
    """client_for("owner" | "teammate" | "outsider" | "operator" | "anonymous" | "manage_key" | "inference_key")."""

    def make(who: str) -> APIClient:
        client = APIClient()
        if who in ("owner", "teammate", "outsider", "operator"):
            client.force_authenticate(getattr(cast, who))
        elif who.endswith("_key"):
            scope = Scope.MANAGE if who == "manage_key" else Scope.INFERENCE
            _, raw = services.api_key_create(tenant=cast.tenant, name=who, scopes=[scope])
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        elif who != "anonymous":
            raise ValueError(f"unknown caller {who!r}")
        return client

    return make

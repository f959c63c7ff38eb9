from datetime import UTC, date, datetime

import factory
from django.contrib.auth import get_user_model

from tenants import services
from tenants.models import Membership, Role, Tenant, UsageStatus

PASSWORD = "a-long-test-password"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()

    email = factory.Sequence(lambda n: f"person{n}@example.com")
    username = factory.SelfAttribute("email")
    password = factory.django.Password(PASSWORD)


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Tenant {n}")
    slug = factory.Sequence(lambda n: f"tenant-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    tenant = factory.SubFactory(TenantFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.MEMBER


def record(tenant, n: int, *, day: date | None = None, adapter: str = "", latency_ms: int = 100,
           status: str = UsageStatus.OK, prompt: int = 10, completion: int = 5, hour: int = 12):
    """One usage row of `tenant` (request id from n) at `hour` of `day` (UTC, default today)."""
    day = day or datetime.now(UTC).date()
    services.usage_record_create(
        request_id=f"req-{tenant.pk}-{n}", tenant_id=tenant.pk, api_key_id=None, adapter=adapter,
        prompt_tokens=prompt, completion_tokens=completion, status=status, latency_ms=latency_ms,
        created_at=datetime(day.year, day.month, day.day, hour, tzinfo=UTC),
    )

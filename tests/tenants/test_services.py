"""Services of tenants, people, keys and quotas (usage has its own file)."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from tenants import selectors, services
from tenants.key_auth import AUTH_GENERATION_KEY
from tenants.models import Membership, QuotaChange, Role, Tenant, TenantAPIKey
from tests.tenants.factories import PASSWORD, MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_tenant_create_makes_unique_slugs_and_checks_given_ones():
    first = services.tenant_create(name="Acme Corp")
    second = services.tenant_create(name="Acme Corp")
    assert (first.slug, second.slug, first.status) == ("acme-corp", "acme-corp-2", Tenant.Status.ACTIVE)
    with pytest.raises(ValidationError, match="exists"):
        services.tenant_create(name="X", slug="acme-corp")
    with pytest.raises(ValidationError, match="not a slug"):
        services.tenant_create(name="X", slug="Not A Slug")
    with pytest.raises(ValidationError, match="needs a name"):
        services.tenant_create(name="   ")


def test_status_change_invalidates_key_caches_after_commit(redis_db, django_capture_on_commit_callbacks):
    tenant = TenantFactory()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
    assert len(callbacks) == 1 and redis_db.get(AUTH_GENERATION_KEY) is not None
    before = redis_db.get(AUTH_GENERATION_KEY)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)  # no change: no bump
    assert callbacks == [] and redis_db.get(AUTH_GENERATION_KEY) == before


def test_user_create_validates_and_refuses_duplicates():
    user = services.user_create(email="Ana@Example.com", password=PASSWORD)
    assert user.username == "Ana@example.com" and user.check_password(PASSWORD)
    assert not services.user_create(email="nopass@example.com").has_usable_password()
    with pytest.raises(ValidationError, match="exists"):
        services.user_create(email="ana@example.com")
    with pytest.raises(ValidationError):
        services.user_create(email="weak@example.com", password="123")


def test_last_admin_cannot_be_demoted_or_removed():
    owner = MembershipFactory(role=Role.ADMIN)
    tenant = owner.tenant
    with pytest.raises(ValidationError, match="at least one admin"):
        services.membership_set_role(tenant=tenant, membership=owner, role=Role.MEMBER)
    with pytest.raises(ValidationError, match="at least one admin"):
        services.membership_remove(tenant=tenant, membership=owner)
    second = MembershipFactory(tenant=tenant, role=Role.ADMIN)
    services.membership_set_role(tenant=tenant, membership=owner, role=Role.MEMBER)
    services.membership_remove(tenant=tenant, membership=owner)
    assert list(Membership.objects.filter(tenant=tenant).values_list("pk", "role")) == [(second.pk, Role.ADMIN)]


def test_membership_services_refuse_another_tenants_membership():
    mine, theirs = MembershipFactory(role=Role.ADMIN), MembershipFactory(role=Role.ADMIN)
    MembershipFactory(tenant=theirs.tenant, role=Role.ADMIN)
    with pytest.raises(Membership.DoesNotExist):
        services.membership_remove(tenant=mine.tenant, membership=theirs)


def test_invitation_accept_creates_the_account_once():
    tenant, inviter = TenantFactory(), UserFactory()
    invitation, token = services.invitation_create(tenant=tenant, email="New@Example.com", role=Role.ADMIN,
                                                   invited_by=inviter)
    assert invitation.token_hash != token and len(token) > 30
    membership = services.invitation_accept(token=token, password=PASSWORD)
    assert (membership.tenant, membership.role, membership.user.email) == (tenant, Role.ADMIN, "new@example.com")
    with pytest.raises(ValidationError, match="not valid"):
        services.invitation_accept(token=token, password=PASSWORD)


def test_invitation_accept_by_a_signed_in_person_and_expiry():
    tenant, person = TenantFactory(), UserFactory()
    _, token = services.invitation_create(tenant=tenant, email=person.email, role=Role.MEMBER, invited_by=None)
    assert services.invitation_accept(token=token, user=person).user == person
    invitation, late = services.invitation_create(tenant=tenant, email="late@example.com", role=Role.MEMBER,
                                                  invited_by=None)
    invitation.expires_at = timezone.now() - timedelta(seconds=1)
    invitation.save()
    with pytest.raises(ValidationError, match="not valid"):
        services.invitation_accept(token=late, password=PASSWORD)


def test_api_key_create_returns_the_secret_once_and_stores_its_hash():
    tenant = TenantFactory()
    key, raw = services.api_key_create(tenant=tenant, name="ci", scopes=["manage", "inference"],
                                       adapter_names=[" sql ", "sql", "chat"])
    stored = TenantAPIKey.objects.get(pk=key.pk)
    assert raw.startswith(stored.prefix + ".") and raw.split(".", 1)[1] not in stored.hashed_key
    assert stored.scopes == ["inference", "manage"] and stored.adapter_names == ["chat", "sql"]
    assert TenantAPIKey.objects.key_generator.verify(raw, stored.hashed_key)
    assert selectors.api_key_authenticate(raw, scope="manage") == stored


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"scopes": []}, "scopes"), ({"scopes": ["admin"]}, "scopes"), ({"name": ""}, "name"),
    ({"adapter_names": [""]}, "adapter_names"), ({"expires_at": timezone.now() - timedelta(days=1)}, "expires_at"),
])
def test_api_key_create_refuses_bad_input(kwargs, field):
    with pytest.raises(ValidationError) as info:
        services.api_key_create(**{"tenant": TenantFactory(), "name": "k", "scopes": ["inference"], **kwargs})
    assert field in info.value.message_dict


def test_suspended_tenant_gets_no_new_keys_and_its_keys_fail():
    tenant = TenantFactory()
    _, raw = services.api_key_create(tenant=tenant, name="k", scopes=["manage"])
    services.tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
    assert selectors.api_key_authenticate(raw, scope="manage").reason == "suspended"
    with pytest.raises(ValidationError, match="suspended"):
        services.api_key_create(tenant=tenant, name="k2", scopes=["inference"])


def test_revoke_is_final_and_scoped_to_the_tenant():
    tenant, other = TenantFactory(), TenantFactory()
    key, raw = services.api_key_create(tenant=tenant, name="k", scopes=["manage"])
    with pytest.raises(TenantAPIKey.DoesNotExist):
        services.api_key_revoke(tenant=other, key=key)
    services.api_key_revoke(tenant=tenant, key=key)
    key.refresh_from_db()
    assert key.revoked and key.revoked_at is not None
    assert selectors.api_key_authenticate(raw, scope="manage").reason == "revoked"


def test_quota_set_audits_each_changed_field(settings):
    tenant, operator = TenantFactory(), UserFactory(is_staff=True)
    services.quota_set(tenant=tenant, changes={"requests_per_minute": 10, "monthly_tokens": 5000},
                       changed_by=operator)
    services.quota_set(tenant=tenant, changes={"requests_per_minute": 10, "monthly_tokens": None},
                       source="command")
    changes = list(QuotaChange.objects.filter(tenant=tenant).order_by("id").values_list(
        "field", "old_value", "new_value", "changed_by", "source"))
    assert changes == [
        ("requests_per_minute", None, 10, operator.pk, "api"),
        ("monthly_tokens", None, 5000, operator.pk, "api"),
        ("monthly_tokens", 5000, None, None, "command"),
    ]
    effective = selectors.quota_effective(tenant=tenant)
    assert effective.requests_per_minute == 10
    assert effective.monthly_tokens == settings.TENANT_QUOTA_DEFAULTS["monthly_tokens"]


def test_quota_set_refuses_inconsistent_or_unknown_values():
    tenant = TenantFactory()
    with pytest.raises(ValidationError, match="exceeds max_tokens_limit"):
        services.quota_set(tenant=tenant, changes={"default_max_tokens": 500, "max_tokens_limit": 100})
    with pytest.raises(ValidationError, match="Unknown quota fields"):
        services.quota_set(tenant=tenant, changes={"bogus": 1})
    with pytest.raises(ValidationError, match="positive integer"):
        services.quota_set(tenant=tenant, changes={"requests_per_minute": 0})
    assert not QuotaChange.objects.filter(tenant=tenant).exists()


def test_password_change_checks_the_old_one():
    user = UserFactory()
    with pytest.raises(ValidationError, match="wrong"):
        services.user_change_password(user=user, old_password="nope", new_password="another-long-password")
    services.user_change_password(user=user, old_password=PASSWORD, new_password="another-long-password")
    user.refresh_from_db()
    assert user.check_password("another-long-password")


def test_tenant_list_is_scoped_to_memberships_except_for_operators():
    mine, _ = MembershipFactory(), TenantFactory()
    assert list(selectors.tenant_list(user=mine.user)) == [mine.tenant]
    assert selectors.tenant_list(user=UserFactory(is_staff=True)).count() == 2


def test_a_create_that_loses_a_race_is_the_checks_refusal_not_a_500(monkeypatch):
    """Between a check ("does it exist?") and the insert a concurrent request may insert the same row: the unique
    constraint's refusal must read as the check's (a 400), not escape as IntegrityError."""
    from django.db.models import QuerySet

    from tenants.services import tenants as tenant_services

    tenant = services.tenant_create(name="C", slug="c1")
    user = services.user_create(email="x@y.example")
    services.membership_add(tenant=tenant, user=user, role=Role.MEMBER)
    with monkeypatch.context() as patch:
        patch.setattr(QuerySet, "exists", lambda self: False)  # every check passes: the racing insert came first
        for create, match in ((lambda: services.tenant_create(name="C", slug="c1"), "exists"),
                              (lambda: services.user_create(email="x@y.example"), "exists"),
                              (lambda: services.membership_add(tenant=tenant, user=user, role=Role.MEMBER),
                               "already belongs")):
            with pytest.raises(ValidationError, match=match):
                create()
    free_slug = tenant_services._free_slug
    racing = iter(["c1"])  # the first free slug it finds is taken before its insert
    monkeypatch.setattr(tenant_services, "_free_slug", lambda base: next(racing, None) or free_slug(base))
    assert services.tenant_create(name="C1").slug == "c1-2"
    assert Tenant.objects.filter(slug__startswith="c1").count() == 2

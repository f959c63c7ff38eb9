"""Reads about tenants and people that the web console uses (usage reads are in test_usage*.py)."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from tenants import selectors, services
from tenants.models import Invitation, Role, Tenant
from tests.tenants.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_tenant_role_for_everyone(cast):
    assert selectors.tenant_role(tenant=cast.tenant, user=cast.owner) == Role.ADMIN
    assert selectors.tenant_role(tenant=cast.tenant, user=cast.teammate) == Role.MEMBER
    assert selectors.tenant_role(tenant=cast.tenant, user=cast.outsider) is None
    assert selectors.tenant_role(tenant=cast.tenant, user=cast.operator) == selectors.OPERATOR
    assert selectors.tenant_role(tenant=cast.tenant, user=AnonymousUser()) is None
    cast.owner.is_active = False
    assert selectors.tenant_role(tenant=cast.tenant, user=cast.owner) is None


def test_tenant_search_by_name_or_slug_and_status():
    acme = services.tenant_create(name="Acme Rockets", slug="acme")
    MembershipFactory(tenant=acme)
    MembershipFactory(tenant=acme)
    globex = services.tenant_create(name="Globex", slug="globex-corp")
    services.tenant_set_status(tenant=globex, status=Tenant.Status.SUSPENDED)
    assert [t.slug for t in selectors.tenant_search(query="rocket")] == ["acme"]
    assert [t.slug for t in selectors.tenant_search(query="CORP")] == ["globex-corp"]
    assert [t.slug for t in selectors.tenant_search(status=Tenant.Status.SUSPENDED)] == ["globex-corp"]
    assert {t.slug: t.num_members for t in selectors.tenant_search(query="  ")} == {"acme": 2, "globex-corp": 0}


def test_membership_tenant_list_has_only_the_persons_tenants():
    mine = MembershipFactory(tenant=TenantFactory(name="B"))
    MembershipFactory(tenant=TenantFactory(name="A"), user=mine.user)
    TenantFactory(name="C")
    operator = UserFactory(is_staff=True)
    assert [t.name for t in selectors.membership_tenant_list(user=mine.user)] == ["A", "B"]
    assert list(selectors.membership_tenant_list(user=operator)) == []


def test_invitation_pending_only_while_usable():
    tenant, inviter = TenantFactory(), UserFactory()
    invitation, token = services.invitation_create(tenant=tenant, email="a@example.com", role=Role.MEMBER,
                                                   invited_by=inviter)
    assert selectors.invitation_pending(token=token) == invitation
    assert selectors.invitation_pending(token=token + "x") is None
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert selectors.invitation_pending(token=token) is None
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() + timedelta(days=1))
    services.invitation_accept(token=token, password="a-long-test-password")
    assert selectors.invitation_pending(token=token) is None


def test_user_by_email_ignores_case_and_tenants_by_id():
    user = UserFactory(email="Someone@Example.com")
    assert selectors.user_by_email(email=" someone@example.COM ") == user
    assert selectors.user_by_email(email="nobody@example.com") is None
    first, second = TenantFactory(), TenantFactory()
    assert selectors.tenants_by_id(ids={first.pk, second.pk, 10**9}) == {first.pk: first, second.pk: second}

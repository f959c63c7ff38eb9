"""People in the console: invitations (link shown once, accepted by new and existing accounts), roles, removal."""

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from tenants import services
from tenants.models import Invitation, Membership, Role
from tests.tenants.factories import PASSWORD, UserFactory

pytestmark = pytest.mark.django_db


def invite(client, slug: str, email: str = "new@example.com", role: str = "member"):
    return client.post(reverse("console:tenant-invite", args=[slug]), {"email": email, "role": role})


def test_invitation_link_is_shown_once_and_creates_an_account(cast, client_as, client):
    response = invite(client_as("owner"), cast.tenant.slug, role="admin")
    link = response.context["invitation_link"]
    assert link.startswith("http://testserver/invite/") and link in response.content.decode()
    assert "no-store" in response["Cache-Control"]
    listing = client_as("owner").get(reverse("console:tenant-members", args=[cast.tenant.slug])).content.decode()
    assert "new@example.com" in listing and link not in listing

    path = link.removeprefix("http://testserver")
    page = client.get(path)
    assert page.status_code == 200 and cast.tenant.name in page.content.decode()
    mismatch = client.post(path, {"password": PASSWORD, "password_again": "other"})
    assert "The two passwords differ." in mismatch.content.decode()
    joined = client.post(path, {"password": PASSWORD, "password_again": PASSWORD})
    assert joined.status_code == 303 and joined["Location"] == f"/t/{cast.tenant.slug}/"
    user = get_user_model().objects.get(email="new@example.com")
    assert Membership.objects.get(tenant=cast.tenant, user=user).role == Role.ADMIN
    assert client.get(joined["Location"]).status_code == 200  # signed in as the new account
    assert client.get(path).status_code == 404  # used


def test_a_signed_in_person_joins_with_their_account(cast, client_as):
    invitation, token = services.invitation_create(tenant=cast.tenant, email="x@example.com", role=Role.MEMBER,
                                                   invited_by=cast.owner)
    outsider = client_as("outsider")
    response = outsider.post(reverse("console:invitation-accept", args=[token]))
    assert response.status_code == 303
    assert Membership.objects.get(tenant=cast.tenant, user=cast.outsider).role == Role.MEMBER
    assert Invitation.objects.get(pk=invitation.pk).accepted_by == cast.outsider


def test_an_existing_account_is_told_to_sign_in(cast, client):
    UserFactory(email="taken@example.com")
    _, token = services.invitation_create(tenant=cast.tenant, email="taken@example.com", role=Role.MEMBER,
                                          invited_by=cast.owner)
    response = client.post(reverse("console:invitation-accept", args=[token]),
                           {"password": PASSWORD, "password_again": PASSWORD})
    html = response.content.decode()
    assert response.status_code == 200 and "An account for taken@example.com exists." in html and "sign in" in html


def test_unknown_invitation_is_404(client):
    assert client.get(reverse("console:invitation-accept", args=["nope"])).status_code == 404


def test_roles_keep_an_admin(cast, client_as):
    owner = client_as("owner")
    mine = Membership.objects.get(tenant=cast.tenant, user=cast.owner)
    response = owner.post(reverse("console:tenant-member-role", args=[cast.tenant.slug, mine.pk]),
                          {"role": "member"}, follow=True)
    assert "A tenant keeps at least one admin." in response.content.decode()
    assert Membership.objects.get(pk=mine.pk).role == Role.ADMIN
    theirs = Membership.objects.get(tenant=cast.tenant, user=cast.teammate)
    owner.post(reverse("console:tenant-member-role", args=[cast.tenant.slug, theirs.pk]), {"role": "admin"})
    assert Membership.objects.get(pk=theirs.pk).role == Role.ADMIN
    response = owner.post(reverse("console:tenant-member-role", args=[cast.tenant.slug, theirs.pk]),
                          {"role": "owner"}, follow=True)
    assert "Choose admin or member." in response.content.decode()


def test_leaving_a_tenant_goes_home(cast, client_as):
    theirs = Membership.objects.get(tenant=cast.tenant, user=cast.teammate)
    Membership.objects.filter(pk=theirs.pk).update(role=Role.ADMIN)
    mine = Membership.objects.get(tenant=cast.tenant, user=cast.owner)
    response = client_as("owner").post(reverse("console:tenant-member-remove", args=[cast.tenant.slug, mine.pk]))
    assert response.status_code == 303 and response["Location"] == reverse("console:home")
    assert not Membership.objects.filter(pk=mine.pk).exists()


def test_operators_add_existing_accounts_only(cast, client_as):
    operator = client_as("operator")
    url = reverse("console:tenant-member-add", args=[cast.tenant.slug])
    response = operator.post(url, {"email": "ghost@example.com", "role": "member"})
    assert response.status_code == 200 and "send an invitation instead" in response.content.decode()
    response = operator.post(url, {"email": cast.teammate.email.upper(), "role": "member"})
    assert "already belongs to" in response.content.decode()
    newcomer = UserFactory()
    assert operator.post(url, {"email": newcomer.email, "role": "admin"}).status_code == 303
    assert Membership.objects.get(tenant=cast.tenant, user=newcomer).role == Role.ADMIN


def test_invitations_are_listed_for_admins_only(cast, client_as):
    services.invitation_create(tenant=cast.tenant, email="pending@example.com", role=Role.MEMBER,
                               invited_by=cast.owner)
    url = reverse("console:tenant-members", args=[cast.tenant.slug])
    assert "pending@example.com" in client_as("owner").get(url).content.decode()
    teammate_html = client_as("teammate").get(url).content.decode()
    assert "pending@example.com" not in teammate_html and cast.owner.email in teammate_html

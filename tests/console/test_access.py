"""Who reaches what: every page and every change of the console for the owner (tenant admin), a teammate
(member), an outsider (admin of another tenant), an operator and an anonymous visitor."""

from dataclasses import dataclass

import pytest
from django.urls import reverse

from tenants import services
from tenants.models import Invitation, Membership, QuotaChange, Role, Scope, Tenant, TenantAPIKey
from tests.tenants.factories import UserFactory

pytestmark = pytest.mark.django_db

TENANT_PAGES = ["tenant-overview", "tenant-usage", "tenant-usage-export", "tenant-keys", "tenant-members",
                "tenant-adapters", "tenant-playground"]
OPERATOR_PAGES = ["operator-tenants", "operator-usage", "operator-engines"]


def login_redirect(response, url: str) -> bool:
    return response.status_code == 302 and response["Location"] == f"{reverse('console:login')}?next={url}"


@pytest.mark.parametrize("page", TENANT_PAGES)
@pytest.mark.parametrize("who, status", [("owner", 200), ("teammate", 200), ("operator", 200), ("outsider", 404)])
def test_tenant_pages(cast, client_as, page, who, status):
    response = client_as(who).get(reverse(f"console:{page}", args=[cast.tenant.slug]))
    assert response.status_code == status
    if status == 404:
        assert cast.tenant.name.encode() not in response.content


@pytest.mark.parametrize("page", TENANT_PAGES)
def test_tenant_pages_send_anonymous_visitors_to_sign_in(cast, client_as, page):
    url = reverse(f"console:{page}", args=[cast.tenant.slug])
    assert login_redirect(client_as("anonymous").get(url), url)


def test_an_unknown_tenant_is_the_same_404_as_someone_elses(client_as):
    assert client_as("outsider").get(reverse("console:tenant-overview", args=["no-such-tenant"])).status_code == 404


@pytest.mark.parametrize("page", [*OPERATOR_PAGES, "operator-quota"])
@pytest.mark.parametrize("who, status", [("owner", 404), ("teammate", 404), ("outsider", 404), ("operator", 200)])
def test_operator_pages(cast, client_as, page, who, status):
    args = [cast.tenant.slug] if page == "operator-quota" else []
    assert client_as(who).get(reverse(f"console:{page}", args=args)).status_code == status


@pytest.mark.parametrize("page", [*OPERATOR_PAGES, "operator-quota"])
def test_operator_pages_send_anonymous_visitors_to_sign_in(cast, client_as, page):
    url = reverse(f"console:{page}", args=[cast.tenant.slug] if page == "operator-quota" else [])
    assert login_redirect(client_as("anonymous").get(url), url)


# ---------------------------------------------------------------- every change, for everyone


@dataclass
class Scene:
    """What the changes act on: a key, an invitation and the teammate's membership of the cast's tenant."""

    key: TenantAPIKey
    invitation: Invitation
    teammate_membership: Membership
    newcomer_email: str


@pytest.fixture
def scene(cast) -> Scene:
    key, _ = services.api_key_create(tenant=cast.tenant, name="existing", scopes=[Scope.INFERENCE])
    invitation, _ = services.invitation_create(tenant=cast.tenant, email="invited@example.com", role=Role.MEMBER,
                                               invited_by=cast.owner)
    return Scene(key, invitation, Membership.objects.get(tenant=cast.tenant, user=cast.teammate),
                 UserFactory().email)


def change(name: str, cast, scene: Scene) -> tuple[str, dict]:
    slug = cast.tenant.slug
    return {
        "key-create": (reverse("console:tenant-keys", args=[slug]), {"name": "new key", "scopes": ["inference"]}),
        "key-revoke": (reverse("console:tenant-key-revoke", args=[slug, scene.key.prefix]), {}),
        "invite": (reverse("console:tenant-invite", args=[slug]), {"email": "new@example.com", "role": "member"}),
        "member-add": (reverse("console:tenant-member-add", args=[slug]),
                       {"email": scene.newcomer_email, "role": "member"}),
        "member-role": (reverse("console:tenant-member-role", args=[slug, scene.teammate_membership.pk]),
                        {"role": "admin"}),
        "member-remove": (reverse("console:tenant-member-remove", args=[slug, scene.teammate_membership.pk]), {}),
        "invitation-revoke": (reverse("console:tenant-invitation-revoke", args=[slug, scene.invitation.pk]), {}),
        "tenant-create": (reverse("console:operator-tenants"), {"name": "Brand New", "slug": ""}),
        "tenant-status": (reverse("console:operator-tenant-status", args=[slug]), {"status": "suspended"}),
        "quota": (reverse("console:operator-quota", args=[slug]), {"monthly_tokens": "1234"}),
    }[name]


def state() -> tuple:
    """Everything a change could touch."""
    return (
        sorted(TenantAPIKey.objects.values_list("name", "revoked")),
        sorted(Invitation.objects.values_list("email", flat=True)),
        sorted(Membership.objects.values_list("tenant_id", "user_id", "role")),
        sorted(Tenant.objects.values_list("slug", "status")),
        QuotaChange.objects.count(),
    )


TENANT_CHANGES = ["key-create", "key-revoke", "invite", "member-role", "member-remove", "invitation-revoke"]
OPERATOR_CHANGES = ["member-add", "tenant-create", "tenant-status", "quota"]

# (change, who) -> status; the rest of each matrix row follows from the role.
EXPECTED = {
    **{(name, "owner"): 200 if name in ("key-create", "invite") else 303 for name in TENANT_CHANGES},
    **{(name, "operator"): 200 if name in ("key-create", "invite") else 303 for name in TENANT_CHANGES},
    **{(name, "teammate"): 403 for name in TENANT_CHANGES},
    **{(name, "outsider"): 404 for name in TENANT_CHANGES},
    ("member-add", "owner"): 403,  # admins invite; only operators add existing accounts
    ("member-add", "teammate"): 403,
    ("member-add", "outsider"): 404,
    ("member-add", "operator"): 303,
    **{(name, who): 404 for name in OPERATOR_CHANGES[1:] for who in ("owner", "teammate", "outsider")},
    **{(name, "operator"): 303 for name in OPERATOR_CHANGES[1:]},
}


@pytest.mark.parametrize("name", TENANT_CHANGES + OPERATOR_CHANGES)
@pytest.mark.parametrize("who", ["owner", "teammate", "outsider", "operator"])
def test_changes(cast, scene, client_as, name, who):
    url, data = change(name, cast, scene)
    before = state()
    response = client_as(who).post(url, data)
    assert response.status_code == EXPECTED[name, who], response.content[:500]
    if response.status_code in (403, 404):
        assert state() == before, "a refused change changed something"
        assert cast.tenant.name.encode() not in response.content or who != "outsider"
    else:
        assert state() != before, "an allowed change changed nothing"


@pytest.mark.parametrize("name", TENANT_CHANGES + OPERATOR_CHANGES)
def test_changes_need_a_signed_in_person(cast, scene, client_as, name):
    url, data = change(name, cast, scene)
    before = state()
    assert login_redirect(client_as("anonymous").post(url, data), url)
    assert state() == before


@pytest.mark.parametrize("name", ["key-revoke", "member-role", "member-remove", "invitation-revoke"])
def test_an_admin_cannot_reach_another_tenants_rows_through_their_own_tenant(cast, client_as, name):
    """The owner's own slug with ids of the other tenant's key, membership or invitation: 404, nothing changes."""
    other = cast.other_tenant
    key, _ = services.api_key_create(tenant=other, name="theirs", scopes=[Scope.INFERENCE])
    invitation, _ = services.invitation_create(tenant=other, email="x@example.com", role=Role.MEMBER,
                                               invited_by=cast.outsider)
    their_membership = Membership.objects.get(tenant=other, user=cast.outsider)
    slug = cast.tenant.slug
    url = {
        "key-revoke": reverse("console:tenant-key-revoke", args=[slug, key.prefix]),
        "member-role": reverse("console:tenant-member-role", args=[slug, their_membership.pk]),
        "member-remove": reverse("console:tenant-member-remove", args=[slug, their_membership.pk]),
        "invitation-revoke": reverse("console:tenant-invitation-revoke", args=[slug, invitation.pk]),
    }[name]
    before = state()
    assert client_as("owner").post(url, {"role": "member"}).status_code == 404
    assert state() == before


@pytest.mark.parametrize("page", ["tenant-keys", "tenant-members"])
def test_teammates_see_no_controls(cast, scene, client_as, page):
    html = client_as("teammate").get(reverse(f"console:{page}", args=[cast.tenant.slug])).content.decode()
    assert "<form method=\"post\" action=\"/t/" not in html
    assert "Revoke" not in html and "Create key" not in html and "Remove" not in html and "Invite" not in html
    owner_html = client_as("owner").get(reverse(f"console:{page}", args=[cast.tenant.slug])).content.decode()
    assert "<form method=\"post\" action=\"/t/" in owner_html


def test_get_on_a_change_is_not_allowed(cast, scene, client_as):
    url, _ = change("key-revoke", cast, scene)
    assert client_as("owner").get(url).status_code == 405
    assert not TenantAPIKey.objects.get(pk=scene.key.pk).revoked

"""API keys in the console: the secret is shown once, with a copy button and an openai snippet; never again."""

import pytest
from django.urls import reverse

from tenants import selectors, services
from tenants.models import Scope, Tenant, TenantAPIKey

pytestmark = pytest.mark.django_db


def create(client, slug: str, **data):
    return client.post(reverse("console:tenant-keys", args=[slug]),
                       {"name": "backend", "scopes": ["inference"], **data})


def test_create_shows_the_secret_once_with_a_snippet(cast, client_as):
    owner = client_as("owner")
    response = create(owner, cast.tenant.slug, adapter_names="sql, chat ,", expires_at="2999-01-31")
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    secret = response.context["created"]["secret"]
    key = TenantAPIKey.objects.get(tenant=cast.tenant, name="backend")
    assert selectors.api_key_authenticate(secret, scope="inference") == key  # the shown secret is the real key
    assert (key.scopes, key.adapter_names, key.created_by) == (["inference"], ["chat", "sql"], cast.owner)
    assert key.expiry_date.isoformat() == "2999-01-31T00:00:00+00:00"
    html = response.content.decode()
    assert html.count(secret) == 2  # the field to copy and the snippet
    assert 'data-copy="#new-key-secret"' in html
    assert 'OpenAI(base_url="http://testserver/v1", api_key="' + secret + '")' in html
    listing = owner.get(reverse("console:tenant-keys", args=[cast.tenant.slug])).content.decode()
    assert secret not in listing and secret.split(".")[1] not in listing and key.prefix in listing


def test_invalid_input_is_shown_on_the_form(cast, client_as):
    response = create(client_as("owner"), cast.tenant.slug, name="", scopes=[])
    assert response.status_code == 200 and response.context["created"] is None
    assert set(response.context["form"].errors) == {"name", "scopes"}
    assert not TenantAPIKey.objects.exists()


def test_service_rules_come_back_as_form_errors(cast, client_as):
    services.tenant_set_status(tenant=cast.tenant, status=Tenant.Status.SUSPENDED)
    response = create(client_as("owner"), cast.tenant.slug)
    assert "is suspended" in " ".join(response.context["form"].non_field_errors())
    assert response.context["created"] is None and not TenantAPIKey.objects.exists()
    response = create(client_as("operator"), cast.other_tenant.slug, expires_at="2001-01-01")
    assert response.context["form"].errors["expires_at"] == ["The expiry must be in the future."]


def test_revoke(cast, client_as):
    key, raw = services.api_key_create(tenant=cast.tenant, name="old", scopes=[Scope.INFERENCE])
    response = client_as("owner").post(reverse("console:tenant-key-revoke", args=[cast.tenant.slug, key.prefix]),
                                       follow=True)
    assert selectors.api_key_authenticate(raw, scope="inference").reason == "revoked"
    html = response.content.decode()
    assert "is revoked" in html and "status-revoked" in html


def test_teammates_see_the_list_without_secrets_or_controls(cast, client_as):
    key, raw = services.api_key_create(tenant=cast.tenant, name="shared", scopes=[Scope.INFERENCE])
    html = client_as("teammate").get(reverse("console:tenant-keys", args=[cast.tenant.slug])).content.decode()
    assert "shared" in html and key.prefix in html and raw not in html
    assert "Create a key" not in html and "Revoke" not in html

"""The playground page: the base model and the tenant's ready adapters to choose from, the gateway's playground
endpoint to send to, max_tokens within the tenant's limit. The streaming itself is tested in the browser."""

import pytest
from django.conf import settings
from django.urls import reverse

from adapters import services
from tenants import services as tenant_services
from tests.console.test_adapters import version

pytestmark = pytest.mark.django_db


def url(tenant, **query) -> str:
    return reverse("console:tenant-playground", args=[tenant.slug]) + (
        "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def test_only_the_base_model_and_ready_adapters_are_offered(cast, client_as):
    ready = services.adapter_create(tenant=cast.tenant, name="support-bot")
    version(ready, 1, "ready")
    version(ready, 2, "ready")
    version(ready, 3, "failed")
    version(services.adapter_create(tenant=cast.tenant, name="pending"), 1, "validating")
    version(services.adapter_create(tenant=cast.tenant, name="broken"), 1, "failed")
    gone = services.adapter_create(tenant=cast.tenant, name="gone")
    version(gone, 1, "ready")
    services.adapter_delete(tenant=cast.tenant, adapter=gone)
    version(services.adapter_create(tenant=cast.other_tenant, name="theirs"), 1, "ready")
    response = client_as("teammate").get(url(cast.tenant))
    assert response.context["models"] == [(settings.BASE_MODEL_NAME, f"Base model ({settings.BASE_MODEL_NAME})"),
                                          ("support-bot", "support-bot (version 2)")]
    assert response.context["chosen"] == settings.BASE_MODEL_NAME
    html = response.content.decode()
    assert f'data-endpoint="/v1/playground/{cast.tenant.slug}/chat/completions"' in html
    assert "console/playground.js" in html and "theirs" not in html


def test_a_link_can_preselect_an_adapter_but_not_an_unknown_model(cast, client_as):
    version(services.adapter_create(tenant=cast.tenant, name="sql"), 1, "ready")
    owner = client_as("owner")
    assert owner.get(url(cast.tenant, model="sql")).context["chosen"] == "sql"
    assert owner.get(url(cast.tenant, model="nope")).context["chosen"] == settings.BASE_MODEL_NAME
    assert '<option value="sql" selected>' in owner.get(url(cast.tenant, model="sql")).content.decode()


def test_max_tokens_stays_within_the_tenants_limit(cast, client_as):
    tenant_services.quota_set(tenant=cast.tenant, changes={"max_tokens_limit": 64, "default_max_tokens": 32})
    response = client_as("owner").get(url(cast.tenant))
    assert (response.context["max_tokens"], response.context["max_tokens_limit"]) == (64, 64)
    assert 'max="64" step="1" value="64"' in response.content.decode()

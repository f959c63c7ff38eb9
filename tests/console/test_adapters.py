"""Adapters in the console: the list (status, serving version, stored bytes, the count and storage quotas), the
detail page (configuration, versions, failure reasons, polling while validating), deletion, and who sees which
controls. The upload itself runs in the browser against the registry's API (test_browser_adapters.py)."""

import pytest
from django.urls import reverse

from adapters import services
from adapters.models import Adapter, AdapterVersion
from tenants import services as tenant_services

pytestmark = pytest.mark.django_db
SPEC = {"scaling": 2.0, "use_rslora": False, "dtype": "F32"}


def version(adapter: Adapter, number: int, status: str, **fields) -> AdapterVersion:
    """A version row as validation leaves it (no files: these pages only read rows)."""
    ready = status == "ready"
    defaults = dict(size_bytes=1000 if ready else None, sha256=f"{number:064x}" if ready else "",
                    rank=8 if ready else None, alpha=16.0 if ready else None,
                    target_modules=["q_proj", "v_proj"] if ready else [], spec=SPEC if ready else {})
    return AdapterVersion.objects.create(
        adapter=adapter, number=number, status=status, engine_id=f"adp_{adapter.uuid.hex}_v{number}",
        storage_prefix=f"tenants/{adapter.tenant_id}/adapters/{adapter.uuid}/v{number}/", upload_bytes=400,
        **{**defaults, **fields})


@pytest.fixture
def catalog(cast) -> dict[str, Adapter]:
    """sql: v1 ready, v2 validating; chat: v1 failed; empty: no version. Another tenant's adapter beside them."""
    sql = services.adapter_create(tenant=cast.tenant, name="sql", description="Writes SQL")
    version(sql, 1, "ready")
    version(sql, 2, "validating")
    chat = services.adapter_create(tenant=cast.tenant, name="chat")
    version(chat, 1, "failed", failure_code="shape_mismatch",
            failure_reason="lora_B of layers.1.self_attn.q_proj has shape [32, 8], expected [64, 8]")
    empty = services.adapter_create(tenant=cast.tenant, name="empty")
    version(services.adapter_create(tenant=cast.other_tenant, name="secret-bot"), 1, "ready")
    return {"sql": sql, "chat": chat, "empty": empty}


def list_url(cast) -> str:
    return reverse("console:tenant-adapters", args=[cast.tenant.slug])


def detail_url(cast, name: str) -> str:
    return reverse("console:tenant-adapter", args=[cast.tenant.slug, name])


def test_the_list_shows_each_adapters_status_serving_version_and_storage(cast, client_as, catalog):
    tenant_services.quota_set(tenant=cast.tenant, changes={"max_adapters": 5, "max_adapter_storage_bytes": 10_000})
    response = client_as("owner").get(list_url(cast))
    rows = {a.name: (a.newest_status, a.newest_number, a.latest_version, a.num_versions, a.stored_bytes)
            for a in response.context["adapters"]}
    assert rows == {"chat": ("failed", 1, None, 1, 0), "empty": (None, None, None, 0, 0),
                    "sql": ("validating", 2, 1, 2, 1400)}  # ready: its size; validating: what was uploaded
    usage = response.context["usage"]
    assert (usage["count"], usage["max_count"], usage["stored"], usage["max_stored"]) == (3, 5, 1400, 10_000)
    html = response.content.decode()
    assert "secret-bot" not in html
    assert 'data-testid="adapter-count">3 <span class="muted">of 5' in html
    assert 'hx-trigger="every 1s"' in html  # sql v2 is still validating: the list polls


def test_the_list_stops_polling_when_every_version_is_finished(cast, client_as, catalog):
    AdapterVersion.objects.filter(adapter=catalog["sql"], number=2).update(status="ready")
    html = client_as("owner").get(list_url(cast)).content.decode()
    assert "hx-trigger" not in html
    assert client_as("owner").get(list_url(cast)).context["poll_s"] is None


def test_the_detail_page_shows_the_serving_config_and_every_version(cast, client_as, catalog):
    response = client_as("owner").get(detail_url(cast, "sql"))
    assert response.context["serving"].number == 1 and response.context["poll_s"] == 1
    html = response.content.decode()
    v1 = AdapterVersion.objects.get(adapter=catalog["sql"], number=1)
    for fact in ('data-testid="config-rank">8<', 'data-testid="config-targets">q_proj, v_proj<',
                 f'data-testid="config-sha256">{v1.sha256}<', f'data-testid="config-engine-id">{v1.engine_id}<',
                 "(scale 2)", 'id="version-2" data-status="validating"'):
        assert fact in html, fact
    assert 'data-newest="2" data-newest-status="validating"' in html


def test_a_failed_version_shows_its_reason_plainly(cast, client_as, catalog):
    html = client_as("teammate").get(detail_url(cast, "chat")).content.decode()
    assert ("<strong>Version 1 failed validation:</strong> lora_B of layers.1.self_attn.q_proj has shape [32, 8], "
            "expected [64, 8]") in html
    assert "shape_mismatch" in html and "no version is ready" in html
    assert "hx-trigger" not in html


def test_admins_get_the_upload_form_wired_to_the_registry_api(cast, client_as, catalog, settings):
    settings.ADAPTER_MAX_UPLOAD_BYTES = 5000
    owner = client_as("owner")
    upload = owner.get(list_url(cast)).context["upload"]
    assert upload == {"api": f"/api/tenants/{cast.tenant.slug}/adapters/", "pages": list_url(cast), "max_files": 8,
                      "max_bytes": 5000}
    tenant_services.quota_set(tenant=cast.tenant, changes={"max_adapter_storage_bytes": 3000})
    assert owner.get(detail_url(cast, "sql")).context["upload"]["max_bytes"] == 1600  # 3000 - 1400 stored
    html = owner.get(detail_url(cast, "sql")).content.decode()
    assert 'data-adapter="sql"' in html and "console/upload.js" in html


def test_teammates_read_without_upload_or_delete_controls(cast, client_as, catalog):
    teammate = client_as("teammate")
    for url in (list_url(cast), detail_url(cast, "sql")):
        response = teammate.get(url)
        html = response.content.decode()
        assert response.status_code == 200 and response.context["upload"] is None
        assert "data-upload" not in html and "upload.js" not in html and "Delete" not in html


def test_deleting_an_adapter_stops_it_at_once_and_queues_the_purge(cast, client_as, catalog,
                                                                   django_capture_on_commit_callbacks):
    url = reverse("console:tenant-adapter-delete", args=[cast.tenant.slug, "sql"])
    owner = client_as("owner")
    with django_capture_on_commit_callbacks() as callbacks:
        response = owner.post(url)
    assert response.status_code == 303 and response["Location"] == list_url(cast)
    assert len(callbacks) == 1  # the purge task, sent once the deletion is committed
    assert Adapter.objects.get(pk=catalog["sql"].pk).deleted_at is not None
    assert not AdapterVersion.objects.filter(adapter=catalog["sql"], deleted_at__isnull=True).exists()
    page = owner.get(list_url(cast))
    assert "is deleted" in page.content.decode() and "sql" not in [a.name for a in page.context["adapters"]]
    assert owner.get(detail_url(cast, "sql")).status_code == 404


def test_an_htmx_delete_sends_the_browser_to_the_list(cast, client_as, catalog):
    response = client_as("operator").post(reverse("console:tenant-adapter-delete", args=[cast.tenant.slug, "chat"]),
                                          HTTP_HX_REQUEST="true")
    assert response.status_code == 204 and response["HX-Redirect"] == list_url(cast)


def test_deleting_the_serving_version_falls_back_to_the_next_ready_one(cast, client_as, catalog):
    sql = catalog["sql"]
    version(sql, 3, "ready")
    owner = client_as("owner")
    response = owner.post(reverse("console:tenant-adapter-version-delete", args=[cast.tenant.slug, "sql", 3]),
                          follow=True)
    assert "Version 3 of sql is deleted. \u201csql\u201d now serves version 1." in response.content.decode()
    response = owner.post(reverse("console:tenant-adapter-version-delete", args=[cast.tenant.slug, "sql", 1]),
                          follow=True)
    assert "has no ready version left" in response.content.decode()
    assert list(AdapterVersion.objects.filter(adapter=sql, deleted_at__isnull=True).values_list("number", flat=True)) \
        == [2]


@pytest.mark.parametrize("who, status", [("teammate", 403), ("outsider", 404), ("anonymous", 302)])
def test_only_admins_and_operators_delete(cast, client_as, catalog, who, status):
    client = client_as(who)
    for url in (reverse("console:tenant-adapter-delete", args=[cast.tenant.slug, "sql"]),
                reverse("console:tenant-adapter-version-delete", args=[cast.tenant.slug, "sql", 1])):
        assert client.post(url).status_code == status
    assert AdapterVersion.objects.filter(adapter=catalog["sql"], deleted_at__isnull=True).count() == 2


@pytest.mark.parametrize("who, status", [("owner", 200), ("teammate", 200), ("operator", 200), ("outsider", 404)])
def test_an_adapter_page_is_seen_by_its_tenant_only(cast, client_as, catalog, who, status):
    response = client_as(who).get(detail_url(cast, "sql"))
    assert response.status_code == status
    assert client_as(who).get(reverse("console:tenant-adapter", args=[cast.other_tenant.slug, "secret-bot"])
                              ).status_code == (200 if who in ("outsider", "operator") else 404)


def test_unknown_deleted_and_other_tenants_adapters_are_the_same_404(cast, client_as, catalog):
    services.adapter_delete(tenant=cast.tenant, adapter=catalog["empty"])
    owner = client_as("owner")
    for url in (detail_url(cast, "never"), detail_url(cast, "empty"), detail_url(cast, "secret-bot"),
                reverse("console:tenant-adapter-version-delete", args=[cast.tenant.slug, "sql", 9])):
        response = owner.get(url) if "delete" not in url else owner.post(url)
        assert response.status_code == 404, url

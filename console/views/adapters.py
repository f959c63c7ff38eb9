"""A tenant's adapters: the list (status, latest version, the count and storage quotas), each adapter's page
(the configuration of what its name serves, every version with its validation status, polled by htmx while one
is validating, and the failure reason of those that failed) and deletion. Everyone in the tenant reads; admins
upload and delete.

Uploads never pass through these views: the browser (console/static/console/upload.js) creates the adapter and
the upload through the registry's REST API (/api/tenants/<slug>/adapters/, session + X-CSRFToken), PUTs the bytes
straight to S3 on the presigned URLs, then completes; the Celery worker validates the new version.
"""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_POST

from adapters import selectors, services
from adapters.models import Adapter, AdapterVersion
from adapters.staging import MAX_FILES
from console.views.common import back_to, render_page
from console.views.overview import share
from tenants import selectors as tenant_selectors
from tenants.access import TenantAccess, access_tenant
from tenants.models import Role

UNFINISHED = (AdapterVersion.Status.UPLOADED, AdapterVersion.Status.VALIDATING)
POLL_S = 1  # how often a page with a version still validating asks again


def quota_usage(access: TenantAccess) -> dict:
    """The adapter count and stored bytes against the tenant's quotas."""
    quota = tenant_selectors.quota_effective(tenant=access.tenant)
    count = selectors.adapter_count(tenant=access.tenant)
    stored = selectors.adapter_storage_used(tenant=access.tenant)
    return {
        "count": count, "max_count": quota.max_adapters, "count_share": share(count, quota.max_adapters),
        "stored": stored, "max_stored": quota.max_adapter_storage_bytes,
        "stored_share": share(stored, quota.max_adapter_storage_bytes),
        "stored_left": max(0, quota.max_adapter_storage_bytes - stored),
    }


def upload_settings(access: TenantAccess, usage: dict | None = None) -> dict | None:
    """What upload.js needs (None for those who may not upload): the registry API and the limits it enforces,
    so a file that cannot fit is refused before anything is created."""
    if not access.can_manage:
        return None
    usage = usage or quota_usage(access)
    return {
        "api": reverse("adapters-api:adapters", args=[access.tenant.slug]),
        "pages": reverse("console:tenant-adapters", args=[access.tenant.slug]),
        "max_files": MAX_FILES,
        "max_bytes": min(settings.ADAPTER_MAX_UPLOAD_BYTES, usage["stored_left"]),
    }


@login_required
def adapter_list(request, slug: str):
    access = access_tenant(request, slug)
    adapters = list(selectors.adapter_overview_list(tenant=access.tenant))
    usage = quota_usage(access)
    context = {
        "adapters": adapters,
        "usage": usage,
        "upload": upload_settings(access, usage),
        "poll_s": POLL_S if any(adapter.newest_status in UNFINISHED for adapter in adapters) else None,
    }
    return render_page(request, "console/tenant/adapters.html", context, access=access, nav="adapters")


def _adapter(access: TenantAccess, name: str) -> Adapter:
    try:
        return selectors.adapter_get(tenant=access.tenant, name=name)
    except Adapter.DoesNotExist:
        raise Http404("No such adapter.") from None


@login_required
def adapter_detail(request, slug: str, name: str):
    access = access_tenant(request, slug)
    adapter = _adapter(access, name)
    versions = list(selectors.adapter_version_list(tenant=access.tenant, adapter=adapter))
    newest = versions[0] if versions else None
    context = {
        "adapter": adapter,
        "versions": versions,
        "newest": newest,
        # What `name` resolves to: the newest ready version (versions come newest first).
        "serving": next((v for v in versions if v.status == AdapterVersion.Status.READY), None),
        "upload": upload_settings(access),
        "poll_s": POLL_S if any(v.status in UNFINISHED for v in versions) else None,
        "base_model": settings.BASE_MODEL_NAME,
    }
    return render_page(request, "console/tenant/adapter.html", context, access=access, nav="adapters")


@login_required
@require_POST
def adapter_delete(request, slug: str, name: str):
    access = access_tenant(request, slug, need=Role.ADMIN)
    adapter = _adapter(access, name)
    services.adapter_delete(tenant=access.tenant, adapter=adapter)
    messages.success(request, f"Adapter \u201c{adapter.name}\u201d is deleted: requests naming it fail from now "
                              "on, and its files are being removed from the engines and storage.")
    url = reverse("console:tenant-adapters", args=[access.tenant.slug])
    if request.headers.get("HX-Request"):
        return HttpResponse(status=204, headers={"HX-Redirect": url})  # its page is gone: load the list
    return back_to("console:tenant-adapters", slug=access.tenant.slug)


@login_required
@require_POST
def version_delete(request, slug: str, name: str, number: int):
    access = access_tenant(request, slug, need=Role.ADMIN)
    adapter = _adapter(access, name)
    try:
        version = selectors.adapter_version_get(tenant=access.tenant, adapter=adapter, number=number)
    except AdapterVersion.DoesNotExist:
        raise Http404("No such version.") from None
    services.adapter_version_delete(tenant=access.tenant, version=version)
    serving = selectors.adapter_resolve(tenant_id=access.tenant.pk, ref=adapter.name)
    after = f"\u201c{adapter.name}\u201d now serves version {serving.version}." if serving else \
        f"\u201c{adapter.name}\u201d has no ready version left: requests naming it fail."
    messages.success(request, f"Version {number} of {adapter.name} is deleted. {after}")
    return back_to("console:tenant-adapter", slug=access.tenant.slug, name=adapter.name)

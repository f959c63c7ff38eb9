"""A tenant's registered JSON Schemas: the list (each schema's newest version and what its name serves), each
schema's page (every version with its compile status, polled by htmx while one is pending, the engine's reason for
those that failed, the document) and, for admins, registering, adding a version and deleting. The rules are the
schema registry's (schemas.services); these views parse the forms and show the outcome."""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from adapters.errors import AdapterServiceError
from console.forms import SchemaCreateForm, SchemaVersionForm, add_service_errors
from console.views.common import back_to, render_page
from schemas import selectors, services
from schemas.models import Schema, SchemaVersion
from tenants.access import TenantAccess, access_tenant
from tenants.models import Role

POLL_S = 1  # how often a page with a version still compiling asks again
PENDING = SchemaVersion.Status.PENDING


@login_required
@require_http_methods(["GET", "POST"])
def schema_list(request, slug: str):
    access = access_tenant(request, slug, need=Role.ADMIN if request.method == "POST" else Role.MEMBER)
    form = SchemaCreateForm(request.POST or None) if access.can_manage else None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            version = services.schema_create(tenant=access.tenant, name=data["name"], document=data["schema"],
                                             description=data["description"], strict=data["strict"],
                                             created_by=request.user)
        except (ValidationError, AdapterServiceError) as error:
            _form_error(form, error)
        else:
            messages.success(request, f"Schema \u201c{version.schema.name}\u201d is registered; the engines are "
                                      "compiling version 1.")
            return back_to("console:tenant-schema", slug=access.tenant.slug, name=version.schema.name)
    schemas = list(selectors.schema_list(tenant=access.tenant))
    context = {"schemas": schemas, "form": form,
               "poll_s": POLL_S if any(s.newest_status == PENDING for s in schemas) else None}
    return render_page(request, "console/tenant/schemas.html", context, access=access, nav="schemas")


def _schema(access: TenantAccess, name: str) -> Schema:
    try:
        return selectors.schema_get(tenant=access.tenant, name=name)
    except Schema.DoesNotExist:
        raise Http404("No such schema.") from None


@login_required
@require_http_methods(["GET", "POST"])
def schema_detail(request, slug: str, name: str):
    access = access_tenant(request, slug, need=Role.ADMIN if request.method == "POST" else Role.MEMBER)
    schema = _schema(access, name)
    form = SchemaVersionForm(request.POST or None) if access.can_manage else None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            version = services.schema_version_add(tenant=access.tenant, schema=schema, document=data["schema"],
                                                  description=data["description"], strict=data["strict"],
                                                  created_by=request.user)
        except (ValidationError, AdapterServiceError) as error:
            _form_error(form, error)
        else:
            messages.success(request, f"Version {version.number} of \u201c{schema.name}\u201d is saved; the engines "
                                      "are compiling it.")
            return back_to("console:tenant-schema", slug=access.tenant.slug, name=schema.name)
    versions = list(selectors.schema_version_list(tenant=access.tenant, schema=schema))
    for version in versions:
        version.pretty = json.dumps(version.document, indent=2, ensure_ascii=False)
    serving = selectors.pick_version(versions, None)
    context = {
        "schema": schema,
        "versions": versions,
        "serving": serving,
        "form": form,
        "poll_s": POLL_S if any(v.status == PENDING for v in versions) else None,
    }
    return render_page(request, "console/tenant/schema.html", context, access=access, nav="schemas")


@login_required
@require_POST
def schema_delete(request, slug: str, name: str):
    access = access_tenant(request, slug, need=Role.ADMIN)
    schema = _schema(access, name)
    services.schema_delete(tenant=access.tenant, schema=schema)
    messages.success(request, f"Schema \u201c{schema.name}\u201d is deleted: requests naming it are refused from now "
                              "on.")
    if request.headers.get("HX-Request"):  # its page is gone: load the list
        return HttpResponse(status=204, headers={"HX-Redirect": reverse("console:tenant-schemas",
                                                                        args=[access.tenant.slug])})
    return back_to("console:tenant-schemas", slug=access.tenant.slug)


def _form_error(form, error: Exception) -> None:
    if isinstance(error, ValidationError):
        add_service_errors(form, error)
    else:
        form.add_error(None, error.message)

"""Operator pages: every tenant (search, create, suspend, reactivate), quotas with their audit trail, and usage
across the platform."""

from datetime import UTC
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from console.forms import DateRangeForm, QuotaForm, TenantCreateForm, TenantSearchForm, add_service_errors
from console.views.common import back_to, render_page
from tenants import selectors, services, usage_days
from tenants.access import operator_required
from tenants.models import QUOTA_FIELDS, Tenant
from tenants.priority import priority_name

TENANTS_PER_PAGE = 50
TOP_N = 10
QUOTA_HISTORY_ROWS = 100


@operator_required
@require_http_methods(["GET", "POST"])
def tenants(request):
    """GET: search the tenants. POST: create one, then open its members page to add people."""
    create_form = TenantCreateForm(request.POST or None)
    if request.method == "POST" and create_form.is_valid():
        try:
            tenant = services.tenant_create(name=create_form.cleaned_data["name"],
                                            slug=create_form.cleaned_data["slug"] or None)
        except ValidationError as error:
            add_service_errors(create_form, error)
        else:
            messages.success(request, f"Tenant \u201c{tenant.name}\u201d created. Add or invite its admins here.")
            return back_to("console:tenant-members", slug=tenant.slug)
    search = TenantSearchForm(request.GET)
    query, status = (search.cleaned_data["q"], search.cleaned_data["status"]) if search.is_valid() else ("", "")
    page = Paginator(selectors.tenant_search(query=query, status=status), TENANTS_PER_PAGE).get_page(
        request.GET.get("page"))
    context = {"search": search, "create_form": create_form, "page": page, "query": query, "status": status}
    return render_page(request, "console/operator/tenants.html", context, nav="operator-tenants")


@operator_required
@require_POST
def set_status(request, slug: str):
    tenant = get_object_or_404(Tenant, slug=slug)
    status = request.POST.get("status", "")
    try:
        services.tenant_set_status(tenant=tenant, status=status)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        verb = "suspended: its keys are refused from the next request" if status == Tenant.Status.SUSPENDED \
            else "active again"
        messages.success(request, f"{tenant.name} is {verb}.")
    response = back_to("console:operator-tenants")
    search = TenantSearchForm({"q": request.POST.get("q", ""), "status": request.POST.get("filter_status", "")})
    if search.is_valid() and any(search.cleaned_data.values()):
        response["Location"] += "?" + urlencode(search.cleaned_data)  # back to the same search
    return response


@operator_required
@require_http_methods(["GET", "POST"])
def quota(request, slug: str):
    tenant = get_object_or_404(Tenant, slug=slug)
    form = QuotaForm(request.POST or None, initial=selectors.quota_overrides(tenant=tenant))
    if request.method == "POST" and form.is_valid():
        try:
            services.quota_set(tenant=tenant, changes=form.changes(), changed_by=request.user, source="console")
        except ValidationError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"Quota of {tenant.name} saved.")
            return back_to("console:operator-quota", slug=tenant.slug)
    effective = selectors.quota_effective(tenant=tenant).as_dict()
    effective["priority_class"] = priority_name(effective["priority_class"])
    history = list(selectors.quota_change_list(tenant=tenant)[:QUOTA_HISTORY_ROWS])
    for change in history:
        change.label = QuotaForm.LABELS.get(change.field, change.field)
        if change.field == "priority_class":  # audited as codes, shown by name
            change.old_value, change.new_value = (None if value is None else priority_name(value)
                                                  for value in (change.old_value, change.new_value))
    context = {
        "subject": tenant,
        "form": form,
        "rows": [{"field": form[name], "effective": effective[name], "choice": name == "priority_class"}
                 for name in QUOTA_FIELDS],
        "history": history,
    }
    return render_page(request, "console/operator/quota.html", context, nav="operator-tenants")


@operator_required
def platform_usage(request):
    today = timezone.now().astimezone(UTC).date()
    form = DateRangeForm(request.GET or None, default_since=today.replace(day=1))
    since, until = form.bounds()
    top_tenants = usage_days.usage_top(since=since, until=until, by=("tenant_id",), limit=TOP_N)
    top_adapters = usage_days.usage_top(since=since, until=until, by=("tenant_id", "adapter"), limit=TOP_N)
    names = selectors.tenants_by_id(ids={row["tenant_id"] for row in top_tenants + top_adapters})
    for row in top_tenants + top_adapters:
        row["tenant"] = names.get(row["tenant_id"])
    context = {"form": form, "since": since, "until": until, "top_tenants": top_tenants,
               "top_adapters": top_adapters, "top_n": TOP_N,
               "chart": {"labels": [row["tenant"].name for row in top_tenants],
                         "tokens": [row["tokens"] for row in top_tenants]}}
    return render_page(request, "console/operator/usage.html", context, nav="operator-usage")

"""A tenant's API keys: everyone in it sees the list; admins create (the secret is shown once) and revoke."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from console.forms import APIKeyCreateForm, add_service_errors
from console.views.common import back_to, render_page
from tenants import selectors, services
from tenants.access import access_tenant
from tenants.models import Role


@never_cache  # the answer to a creation holds a secret: no cache keeps it
@login_required
@require_http_methods(["GET", "POST"])
def keys(request, slug: str):
    """GET: the list. POST: create a key and answer with its secret, which is not stored and never shown again."""
    access = access_tenant(request, slug, need=Role.ADMIN if request.method == "POST" else Role.MEMBER)
    form = APIKeyCreateForm(request.POST or None) if access.can_manage else None
    created = None
    if request.method == "POST" and form.is_valid():
        try:
            key, secret = services.api_key_create(
                tenant=access.tenant, name=form.cleaned_data["name"], scopes=form.cleaned_data["scopes"],
                adapter_names=form.cleaned_data["adapter_names"], expires_at=form.expiry(),
                priority=form.cleaned_data["priority"], created_by=request.user,
            )
        except ValidationError as error:
            add_service_errors(form, error)
        else:
            created = {"key": key, "secret": secret}
            form = APIKeyCreateForm()
    context = {
        "keys": selectors.api_key_list(tenant=access.tenant).order_by("revoked", "-created"),
        "form": form,
        "created": created,
        "base_url": request.build_absolute_uri("/v1"),
        "model_name": settings.BASE_MODEL_NAME,
        "quota": selectors.quota_effective(tenant=access.tenant),  # the plan's class and weight, read-only here
    }
    return render_page(request, "console/tenant/keys.html", context, access=access, nav="keys")


@login_required
@require_POST
def revoke(request, slug: str, prefix: str):
    access = access_tenant(request, slug, need=Role.ADMIN)
    key = get_object_or_404(selectors.api_key_list(tenant=access.tenant), prefix=prefix)
    services.api_key_revoke(tenant=access.tenant, key=key)
    messages.success(request, f"Key \u201c{key.name}\u201d ({key.prefix}) is revoked; it stops working at once.")
    return back_to("console:tenant-keys", slug=access.tenant.slug)

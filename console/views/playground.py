"""The playground: chat with the base model or one of the tenant's ready adapters. The page only sets the scene;
the browser (console/static/console/playground.js) streams each answer from the gateway's session-authenticated
endpoint, /v1/playground/<slug>/chat/completions, which takes the path API traffic takes (same model resolution,
quota and metering), bills the tenant and marks the usage as playground."""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.urls import reverse

from adapters import selectors
from console.views.common import render_page
from tenants import selectors as tenant_selectors
from tenants.access import access_tenant

DEFAULT_MAX_TOKENS = 256  # what the form offers, within the tenant's limit


@login_required
def playground(request, slug: str):
    access = access_tenant(request, slug)
    quota = tenant_selectors.quota_effective(tenant=access.tenant)
    ready = selectors.adapter_list(tenant=access.tenant).filter(latest_version__isnull=False)
    models = [(settings.BASE_MODEL_NAME, f"Base model ({settings.BASE_MODEL_NAME})")]
    models += [(adapter.name, f"{adapter.name} (version {adapter.latest_version})") for adapter in ready]
    wanted = request.GET.get("model", "")
    context = {
        "models": models,
        "chosen": wanted if wanted in dict(models) else settings.BASE_MODEL_NAME,
        "endpoint": reverse("gateway:playground-chat", args=[access.tenant.slug]),
        "max_tokens": min(DEFAULT_MAX_TOKENS, quota.max_tokens_limit),
        "max_tokens_limit": quota.max_tokens_limit,
    }
    return render_page(request, "console/tenant/playground.html", context, access=access, nav="playground")

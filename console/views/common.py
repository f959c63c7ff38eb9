"""What every page of the console shares: the navigation's context and the htmx-aware redirect."""

from django.shortcuts import redirect, render

from tenants import selectors
from tenants.access import TenantAccess


def render_page(request, template: str, context: dict | None = None, *, access: TenantAccess | None = None,
                nav: str = "", status: int = 200):
    """Render a full page; htmx requests take the part they need from it (`hx-select`)."""
    user = request.user
    page = {
        "access": access,
        "tenant": access.tenant if access else None,
        "nav": nav,
        "my_tenants": list(selectors.membership_tenant_list(user=user)) if user.is_authenticated else [],
    }
    return render(request, template, {**page, **(context or {})}, status=status)


def back_to(url_name: str, **kwargs):
    """After a change: back to the page that shows it (a 303, so a reload does not repeat the POST)."""
    response = redirect(url_name, **kwargs)
    response.status_code = 303
    return response

"""Where a person lands after signing in, and joining a tenant through an invitation."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods

from console.forms import InvitationAcceptForm, add_service_errors
from console.views.common import back_to, render_page
from tenants import selectors, services


@login_required
def home(request):
    """Straight to the person's tenant when there is one; a chooser when there are several (or none)."""
    tenants = list(selectors.membership_tenant_list(user=request.user))
    if len(tenants) == 1 and not request.user.is_staff:
        return redirect("console:tenant-overview", slug=tenants[0].slug)
    if not tenants and request.user.is_staff:
        return redirect("console:operator-tenants")
    return render_page(request, "console/home.html", {"tenants": tenants})


@require_http_methods(["GET", "POST"])
def invitation_accept(request, token: str):
    """Join a tenant: a signed-in person joins as themselves; anyone else creates the invited account."""
    invitation = selectors.invitation_pending(token=token)
    if invitation is None:
        raise Http404("This invitation is not valid (unknown, used or expired).")
    signed_in = request.user.is_authenticated
    form = None if signed_in else InvitationAcceptForm(request.POST or None)
    if request.method == "POST" and (signed_in or form.is_valid()):
        try:
            membership = services.invitation_accept(
                token=token, user=request.user if signed_in else None,
                password=None if signed_in else form.cleaned_data["password"],
            )
        except ValidationError as error:
            if signed_in:
                messages.error(request, " ".join(error.messages))
                return back_to("console:home")
            add_service_errors(form, error)
        else:
            if not signed_in:
                login(request, membership.user, backend=settings.AUTHENTICATION_BACKENDS[0])
            messages.success(request, f"Welcome to {membership.tenant.name}.")
            return back_to("console:tenant-overview", slug=membership.tenant.slug)
    return render_page(request, "console/invitation.html", {"invitation": invitation, "form": form})

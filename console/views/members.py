"""A tenant's people: everyone in it sees who is in it; admins invite, change roles and remove; operators also
add existing accounts."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from console.forms import InvitationForm, MemberAddForm, RoleForm, add_service_errors
from console.views.common import back_to, render_page
from tenants import selectors, services
from tenants.access import access_tenant
from tenants.models import Role


def _page(request, access, *, invite_form=None, add_form=None, invitation_link: str = ""):
    manage = access.can_manage
    context = {
        "members": selectors.membership_list(tenant=access.tenant),
        "invitations": selectors.invitation_list(tenant=access.tenant) if manage else [],
        "invite_form": invite_form or (InvitationForm() if manage else None),
        "add_form": add_form or (MemberAddForm() if access.is_operator else None),
        "role_form": RoleForm() if manage else None,
        "invitation_link": invitation_link,
        "now": timezone.now(),
    }
    return render_page(request, "console/tenant/members.html", context, access=access, nav="members")


@login_required
def members(request, slug: str):
    return _page(request, access_tenant(request, slug))


def invitation_link(request, token: str) -> str:
    """The absolute URL that accepts an invitation (emailed, and shown to whoever invited)."""
    return request.build_absolute_uri(reverse("console:invitation-accept", kwargs={"token": token}))


@never_cache  # the answer holds the invitation's link, shown this once
@login_required
@require_POST
def invite(request, slug: str):
    access = access_tenant(request, slug, need=Role.ADMIN)
    form = InvitationForm(request.POST)
    if not form.is_valid():
        return _page(request, access, invite_form=form)
    invitation, token = services.invitation_create(
        tenant=access.tenant, email=form.cleaned_data["email"], role=form.cleaned_data["role"],
        invited_by=request.user, link_for=lambda token: invitation_link(request, token))
    link = invitation_link(request, token)
    messages.success(request, f"Invitation for {invitation.email} created and emailed to them. The link below "
                              "works too; it works once, for 7 days, and is not shown again.")
    return _page(request, access, invitation_link=link)


@login_required
@require_POST
def add(request, slug: str):
    """Operators: add an existing account to the tenant."""
    access = access_tenant(request, slug, need=Role.ADMIN)
    if not access.is_operator:
        raise PermissionDenied("Only operators add existing accounts; admins invite people.")
    form = MemberAddForm(request.POST)
    if form.is_valid():
        user = selectors.user_by_email(email=form.cleaned_data["email"])
        if user is None:
            form.add_error("email", "No account has this email; send an invitation instead.")
        else:
            try:
                services.membership_add(tenant=access.tenant, user=user, role=form.cleaned_data["role"])
            except ValidationError as error:
                add_service_errors(form, error)
    if form.errors:
        return _page(request, access, add_form=form)
    messages.success(request, f"{form.cleaned_data['email']} added as {form.cleaned_data['role']}.")
    return back_to("console:tenant-members", slug=access.tenant.slug)


@login_required
@require_POST
def set_role(request, slug: str, pk: int):
    access = access_tenant(request, slug, need=Role.ADMIN)
    membership = get_object_or_404(selectors.membership_list(tenant=access.tenant), pk=pk)
    form = RoleForm(request.POST)
    try:
        if not form.is_valid():
            raise ValidationError("Choose admin or member.")
        services.membership_set_role(tenant=access.tenant, membership=membership, role=form.cleaned_data["role"])
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"{membership.user.email} is now {form.cleaned_data['role']}.")
    return back_to("console:tenant-members", slug=access.tenant.slug)


@login_required
@require_POST
def remove(request, slug: str, pk: int):
    access = access_tenant(request, slug, need=Role.ADMIN)
    membership = get_object_or_404(selectors.membership_list(tenant=access.tenant), pk=pk)
    try:
        services.membership_remove(tenant=access.tenant, membership=membership)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"{membership.user.email} no longer belongs to {access.tenant.name}.")
        if membership.user_id == request.user.pk and not access.is_operator:
            return back_to("console:home")  # they left: the tenant's pages are closed to them now
    return back_to("console:tenant-members", slug=access.tenant.slug)


@login_required
@require_POST
def revoke_invitation(request, slug: str, pk: int):
    access = access_tenant(request, slug, need=Role.ADMIN)
    invitation = get_object_or_404(selectors.invitation_list(tenant=access.tenant), pk=pk)
    services.invitation_revoke(tenant=access.tenant, invitation=invitation)
    messages.success(request, f"The invitation for {invitation.email} is withdrawn.")
    return back_to("console:tenant-members", slug=access.tenant.slug)

"""Writes about tenants and people: tenants, accounts, memberships, invitations, passwords."""

import secrets
from collections.abc import Callable
from datetime import timedelta

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from tenants.key_auth import auth_generation_bump
from tenants.models import Invitation, Membership, Role, Tenant

INVITATION_LIFETIME = timedelta(days=7)


@transaction.atomic
def tenant_create(*, name: str, slug: str | None = None) -> Tenant:
    """A new active tenant. Without `slug`, one is made from the name (made unique with a number)."""
    name = name.strip()
    if not name:
        raise ValidationError({"name": "A tenant needs a name."})
    if slug:
        if slug != slugify(slug):
            raise ValidationError({"slug": f"{slug!r} is not a slug (lowercase letters, digits, hyphens)."})
        taken = {"slug": f"A tenant with slug {slug!r} exists."}
        if Tenant.objects.filter(slug=slug).exists():
            raise ValidationError(taken)
        return _create_once(taken, lambda: Tenant.objects.create(name=name, slug=slug))
    for _ in range(5):  # a concurrent create may take the free slug first: take the next one
        try:
            with transaction.atomic():
                return Tenant.objects.create(name=name, slug=_free_slug(slugify(name)[:40] or "tenant"))
        except IntegrityError:
            continue
    raise ValidationError({"name": "Too many tenants are being created with this name at once; try again."})


def _create_once(refusal: dict, create):
    """``create()`` in a savepoint; the unique constraint's refusal, when a concurrent request got there between
    the check and the insert, is the same 400 the check gives (not a 500)."""
    try:
        with transaction.atomic():
            return create()
    except IntegrityError:
        raise ValidationError(refusal) from None


def _free_slug(base: str) -> str:
    taken = set(Tenant.objects.filter(slug__startswith=base).values_list("slug", flat=True))
    if base not in taken:
        return base
    return next(f"{base}-{n}" for n in range(2, len(taken) + 3) if f"{base}-{n}" not in taken)


@transaction.atomic
def tenant_rename(*, tenant: Tenant, name: str) -> Tenant:
    name = name.strip()
    if not name:
        raise ValidationError({"name": "A tenant needs a name."})
    tenant.name = name
    tenant.save(update_fields=["name", "updated_at"])
    return tenant


@transaction.atomic
def tenant_set_status(*, tenant: Tenant, status: str) -> Tenant:
    """Suspend or reactivate; every gateway process refuses (or accepts again) the tenant's keys at once."""
    if status not in Tenant.Status.values:
        raise ValidationError({"status": f"Unknown status {status!r}."})
    if tenant.status != status:
        tenant.status = status
        tenant.save(update_fields=["status", "updated_at"])
        transaction.on_commit(auth_generation_bump, robust=True)
    return tenant


@transaction.atomic
def user_create(*, email: str, password: str | None = None, is_staff: bool = False):
    """An account (operator-created). The email is the username. Without a password it cannot log in until
    one is set."""
    User = get_user_model()
    email = User.objects.normalize_email(email).strip()
    if not email or "@" not in email:
        raise ValidationError({"email": "A valid email address is needed."})
    taken = {"email": f"An account for {email} exists."}
    if User.objects.filter(username__iexact=email).exists():
        raise ValidationError(taken)
    user = User(username=email, email=email, is_staff=is_staff)
    if password:
        password_validation.validate_password(password, user)
        user.set_password(password)
    else:
        user.set_unusable_password()
    _create_once(taken, user.save)
    return user


@transaction.atomic
def user_change_password(*, user, old_password: str, new_password: str) -> None:
    if not user.check_password(old_password):
        raise ValidationError({"old_password": "The current password is wrong."})
    password_validation.validate_password(new_password, user)
    user.set_password(new_password)
    user.save(update_fields=["password"])


@transaction.atomic
def membership_add(*, tenant: Tenant, user, role: str) -> Membership:
    _check_role(role)
    member = {"email": f"{user.email or user.username} already belongs to {tenant.slug}."}
    if Membership.objects.filter(tenant=tenant, user=user).exists():
        raise ValidationError(member)
    return _create_once(member, lambda: Membership.objects.create(tenant=tenant, user=user, role=role))


@transaction.atomic
def membership_set_role(*, tenant: Tenant, membership: Membership, role: str) -> Membership:
    _check_role(role)
    _lock_people_of(tenant)
    membership = Membership.objects.get(pk=membership.pk, tenant=tenant)
    if membership.role == Role.ADMIN and role != Role.ADMIN:
        _keep_an_admin(tenant, leaving=membership)
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def membership_remove(*, tenant: Tenant, membership: Membership) -> None:
    _lock_people_of(tenant)
    membership = Membership.objects.get(pk=membership.pk, tenant=tenant)
    if membership.role == Role.ADMIN:
        _keep_an_admin(tenant, leaving=membership)
    membership.delete()


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise ValidationError({"role": f"Unknown role {role!r}; expected one of {', '.join(Role.values)}."})


def _lock_people_of(tenant: Tenant) -> None:
    """Serialize changes of one tenant's memberships, so two demotions cannot both leave "another admin"."""
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()


def _keep_an_admin(tenant: Tenant, *, leaving: Membership) -> None:
    admins = list(Membership.objects.filter(tenant=tenant, role=Role.ADMIN).values_list("pk", flat=True))
    if admins == [leaving.pk]:
        raise ValidationError({"role": "A tenant keeps at least one admin."})


@transaction.atomic
def invitation_create(*, tenant: Tenant, email: str, role: str, invited_by,
                      link_for: Callable[[str], str] | None = None) -> tuple[Invitation, str]:
    """An invitation and its token (shown once; only its sha256 is stored). With ``link_for`` (token -> the
    absolute URL that accepts it), the link is also emailed to the invitee once the transaction commits."""
    _check_role(role)
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        tenant=tenant, email=email.strip().lower(), role=role, invited_by=invited_by,
        token_hash=Invitation.hash_token(token), expires_at=timezone.now() + INVITATION_LIFETIME,
    )
    if link_for is not None:
        from tenants import tasks

        link = link_for(token)
        transaction.on_commit(lambda: tasks.invitation_email.delay(invitation.pk, link), robust=True)
    return invitation, token


def invitation_email_send(*, invitation_id: int, link: str) -> bool:
    """Email an invitation's link to the invitee; False (nothing sent) when it was accepted, revoked or expired
    meanwhile. Raises what the mail server raised (the task retries)."""
    invitation = (Invitation.objects.select_related("tenant", "invited_by")
                  .filter(pk=invitation_id, accepted_at__isnull=True, expires_at__gt=timezone.now()).first())
    if invitation is None:
        return False
    inviter = invitation.invited_by.email if invitation.invited_by else "An operator"
    expires = invitation.expires_at.strftime("%Y-%m-%d %H:%M UTC")
    send_mail(
        subject=f"You are invited to {invitation.tenant.name}",
        message=(f"{inviter} invited you to join {invitation.tenant.name} as {invitation.role}.\n\n"
                 f"Accept the invitation here (it works once, until {expires}):\n{link}\n\n"
                 "If you did not expect this invitation, ignore this message."),
        from_email=None, recipient_list=[invitation.email])
    return True


@transaction.atomic
def invitation_revoke(*, tenant: Tenant, invitation: Invitation) -> None:
    Invitation.objects.filter(pk=invitation.pk, tenant=tenant, accepted_at__isnull=True).delete()


@transaction.atomic
def invitation_accept(*, token: str, user=None, password: str | None = None) -> Membership:
    """Join the invitation's tenant: as `user` when signed in, else as a new account with `password`."""
    invitation = Invitation.objects.select_for_update().filter(token_hash=Invitation.hash_token(token)).first()
    if invitation is None or invitation.accepted_at is not None or invitation.expires_at <= timezone.now():
        raise ValidationError({"token": "This invitation is not valid (unknown, used or expired)."})
    if user is None:
        if not password:
            raise ValidationError({"password": "Choose a password for the new account."})
        user = user_create(email=invitation.email, password=password)
    membership = membership_add(tenant=invitation.tenant, user=user, role=invitation.role)
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    return membership

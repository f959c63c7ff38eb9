from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from tenants import services
from tenants.models import Role


class Command(BaseCommand):
    help = "Create a tenant, optionally with its first admin (an existing account, or a new one with a password)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="Display name of the tenant.")
        parser.add_argument("--slug", help="URL name (default: made from NAME).")
        parser.add_argument("--admin-email", help="Make this person the tenant's admin.")
        parser.add_argument("--admin-password", help="Password when the admin's account does not exist yet.")

    def handle(self, *args, name, slug, admin_email, admin_password, **options):
        if admin_password and not admin_email:
            raise CommandError("--admin-password needs --admin-email")
        try:
            with transaction.atomic():
                tenant = services.tenant_create(name=name, slug=slug)
                if admin_email:
                    user = get_user_model().objects.filter(email__iexact=admin_email).order_by("id").first()
                    if user is None:
                        if not admin_password:
                            raise CommandError(f"no account for {admin_email}: give --admin-password to create it")
                        user = services.user_create(email=admin_email, password=admin_password)
                    services.membership_add(tenant=tenant, user=user, role=Role.ADMIN)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(f"created tenant {tenant.slug}" + (f" with admin {admin_email}" if admin_email else ""))
        self.stdout.write(tenant.slug)

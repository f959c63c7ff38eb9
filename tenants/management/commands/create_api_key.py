from datetime import timedelta

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tenants import services
from tenants.models import Scope, Tenant
from tenants.priority import INTERACTIVE, PRIORITY_CODES


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class Command(BaseCommand):
    help = "Create an API key for a tenant. The secret key is printed as the last line, and only this once."

    def add_arguments(self, parser):
        parser.add_argument("tenant_slug")
        parser.add_argument("--name", default="cli", help="A label for the key (default: cli).")
        parser.add_argument("--scopes", type=_csv, default=[Scope.INFERENCE],
                            help=f"Comma-separated scopes among {','.join(Scope.values)} (default: inference).")
        parser.add_argument("--adapters", type=_csv, default=[], help="Comma-separated adapter names it may use.")
        parser.add_argument("--expires-days", type=int, help="Expire after this many days (default: never).")
        parser.add_argument("--priority", choices=list(PRIORITY_CODES), default=INTERACTIVE,
                            help="batch: its requests are served after interactive ones (default: interactive).")

    def handle(self, *args, tenant_slug, name, scopes, adapters, expires_days, priority, **options):
        tenant = Tenant.objects.filter(slug=tenant_slug).first()
        if tenant is None:
            raise CommandError(f"no tenant {tenant_slug!r}")
        if expires_days is not None and expires_days < 1:
            raise CommandError("--expires-days must be at least 1")
        expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
        try:
            key, raw_key = services.api_key_create(tenant=tenant, name=name, scopes=scopes, adapter_names=adapters,
                                                   expires_at=expires_at, priority=priority)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(f"created key {key.prefix} ({', '.join(key.scopes)}) for {tenant.slug}")
        self.stdout.write(raw_key)

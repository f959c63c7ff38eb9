from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from tenants import selectors, services
from tenants.models import QUOTA_FIELDS, Tenant
from tenants.priority import PRIORITY_CODES, priority_code, priority_name

UNSET = object()  # an option not given, told apart from "default" (None)


def _value(raw: str) -> int | None:
    if raw == "default":
        return None
    value = int(raw)
    if value < 1:
        raise ValueError(raw)
    return value


class Command(BaseCommand):
    help = ("Set a tenant's quota overrides (each change is audited); 'default' puts a field back to the platform's. "
            f"--priority-class takes {' or '.join(PRIORITY_CODES)}.")

    def add_arguments(self, parser):
        parser.add_argument("tenant_slug")
        for name in QUOTA_FIELDS:
            if name == "priority_class":
                parser.add_argument("--priority-class", dest=name, choices=[*PRIORITY_CODES, "default"],
                                    default=UNSET)
            else:
                parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=_value, metavar="N|default",
                                    default=UNSET)

    def handle(self, *args, tenant_slug, **options):
        tenant = Tenant.objects.filter(slug=tenant_slug).first()
        if tenant is None:
            raise CommandError(f"no tenant {tenant_slug!r}")
        changes = {name: options[name] for name in QUOTA_FIELDS if options[name] is not UNSET}
        if "priority_class" in changes:  # the name given, stored as its code
            name = changes["priority_class"]
            changes["priority_class"] = None if name == "default" else priority_code(name)
        if not changes:
            raise CommandError("nothing to change: give at least one --<field> option (see --help)")
        try:
            services.quota_set(tenant=tenant, changes=changes, source="command")
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        for name, value in selectors.quota_effective(tenant=tenant).as_dict().items():
            self.stdout.write(f"{name:28} {priority_name(value) if name == 'priority_class' else value}")

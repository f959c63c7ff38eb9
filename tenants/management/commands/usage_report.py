from datetime import date

from django.core.management.base import BaseCommand, CommandError

from tenants import selectors
from tenants.models import Tenant

COLUMNS = ("day", "tenant", "adapter", "requests", "errors", "prompt_tokens", "completion_tokens", "p50_ms", "p95_ms")


class Command(BaseCommand):
    help = ("Print daily usage per tenant and adapter from the rollups (which Celery beat refreshes every "
            "USAGE_ROLLUP_INTERVAL_S), tab-separated with a header line.")

    def add_arguments(self, parser):
        parser.add_argument("--tenant", help="Only this tenant (slug).")
        parser.add_argument("--since", type=date.fromisoformat, help="First day, YYYY-MM-DD (UTC).")
        parser.add_argument("--until", type=date.fromisoformat, help="Last day, YYYY-MM-DD (UTC).")

    def handle(self, *args, tenant, since, until, **options):
        scope = None
        if tenant:
            scope = Tenant.objects.filter(slug=tenant).first()
            if scope is None:
                raise CommandError(f"no tenant {tenant!r}")
        rows = selectors.usage_daily_list(tenant=scope).order_by("day", "tenant__slug", "adapter")
        if since:
            rows = rows.filter(day__gte=since)
        if until:
            rows = rows.filter(day__lte=until)
        self.stdout.write("\t".join(COLUMNS))
        for row in rows:
            p50, p95 = (selectors.latency_percentile(row.latency_buckets, q) for q in (0.5, 0.95))
            cells = (row.day, row.tenant.slug, row.adapter or "-", row.num_requests, row.num_errors,
                     row.prompt_tokens, row.completion_tokens, _ms(p50), _ms(p95))
            self.stdout.write("\t".join(str(cell) for cell in cells))
        summary = selectors.usage_summary(rows=rows)
        self.stdout.write(f"total\t{summary['num_requests']} requests\t{summary['prompt_tokens']} prompt tokens\t"
                          f"{summary['completion_tokens']} completion tokens")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"

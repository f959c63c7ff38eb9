"""A tenant's usage dashboard (tokens and requests per day by adapter, latency) and its CSV."""

import csv
from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse

from console import charts
from console.forms import DateRangeForm
from console.views.common import render_page
from tenants import usage_days
from tenants.access import access_tenant

CSV_COLUMNS = ("day", "adapter", "requests", "errors", "cancelled", "prompt_tokens", "completion_tokens",
               "latency_ms_p50", "latency_ms_p95")


@login_required
def dashboard(request, slug: str):
    access = access_tenant(request, slug)
    form = DateRangeForm(request.GET or None)
    since, until = form.bounds()
    rows = usage_days.usage_days(tenant=access.tenant, since=since, until=until)
    chart = charts.daily_series(rows, since, until)
    context = {
        "form": form,
        "since": since,
        "until": until,
        "chart": chart,
        "tokens_table": charts.series_table(chart, "tokens"),
        "requests_table": charts.series_table(chart, "requests"),
        "latency_table": list(zip(chart["days"], chart["p50"], chart["p95"], strict=True)),
        "presets": _presets(until),
        "totals": charts.summary(rows),
        "by_adapter": _by_adapter(rows),
    }
    return render_page(request, "console/tenant/usage.html", context, access=access, nav="usage")


def _presets(until) -> list[tuple[str, str, str]]:
    """(label, since, until) of the quick ranges, ending at the chosen last day."""
    return [(label, (until - timedelta(days=days - 1)).isoformat(), until.isoformat())
            for label, days in (("7 days", 7), ("30 days", 30), ("90 days", 90))]


def _by_adapter(rows: list[dict]) -> list[dict]:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["adapter"], []).append(row)
    table = [{"label": charts.adapter_label(adapter), **charts.summary(group)} for adapter, group in groups.items()]
    return sorted(table, key=lambda entry: (-entry["tokens"], entry["label"]))


@login_required
def export_csv(request, slug: str):
    """The dashboard's rows, one per day and adapter, as CSV (the same numbers the charts show)."""
    access = access_tenant(request, slug)
    since, until = DateRangeForm(request.GET or None).bounds()
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="usage-{access.tenant.slug}-{since}-{until}.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for row in usage_days.usage_days(tenant=access.tenant, since=since, until=until):
        totals = charts.summary([row])
        writer.writerow([row["day"].isoformat(), _cell(row["adapter"]), row["num_requests"], row["num_errors"],
                         row["num_cancelled"], row["prompt_tokens"], row["completion_tokens"],
                         _blank(totals["latency_ms_p50"]), _blank(totals["latency_ms_p95"])])
    return response


def _cell(text: str) -> str:
    """Text that a spreadsheet will not run as a formula."""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@") else text


def _blank(value) -> str:
    return "" if value is None else str(value)

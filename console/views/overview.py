"""A tenant's overview: today and this month against its quota."""

import calendar
from datetime import UTC

from django.contrib.auth.decorators import login_required
from django.utils import timezone

from console.views.common import render_page
from tenants import selectors, usage_days
from tenants.access import access_tenant


def share(used: int, limit: float) -> float:
    """Percent of `limit` used, for a bar (the bar stops at 100; the number beside it tells the rest)."""
    return round(100 * used / limit, 1) if limit else 0.0


@login_required
def overview(request, slug: str):
    access = access_tenant(request, slug)
    today = timezone.now().astimezone(UTC).date()
    quota = selectors.quota_effective(tenant=access.tenant)
    month = usage_days.usage_totals(tenant=access.tenant, since=today.replace(day=1), until=today, today=today)
    day = usage_days.usage_totals(tenant=access.tenant, since=today, until=today, today=today)
    days_in_month = calendar.monthrange(today.year, today.month)[1]
    # The monthly budget spread evenly over the month's days: above 100% today, the month runs out early.
    daily_share = quota.monthly_tokens / days_in_month
    context = {
        "today": today,
        "days_in_month": days_in_month,
        "quota": quota,
        "month": month,
        "day": day,
        "month_share": share(month["tokens"], quota.monthly_tokens),
        "daily_share": round(daily_share),
        "day_share": share(day["tokens"], daily_share),
        "tokens_left": max(0, quota.monthly_tokens - month["tokens"]),
    }
    return render_page(request, "console/tenant/overview.html", context, access=access, nav="overview")

"""Usage rows (`tenants.usage_days.usage_days`) shaped for the dashboard: per-day series stacked by adapter,
latency percentiles per day and totals. Plain data, ready for `json_script` and Chart.js."""

from datetime import date, timedelta

from tenants.models import NUM_LATENCY_BUCKETS
from tenants.selectors import latency_percentile

BASE_MODEL_LABEL = "base model"  # how the adapter "" (requests to the base model) is shown
MAX_STACKED_ADAPTERS = 8  # more adapters than this: the smallest are summed into "other"
OTHER_LABEL = "other adapters"


def day_range(since: date, until: date) -> list[date]:
    return [since + timedelta(days=n) for n in range((until - since).days + 1)]


def adapter_label(adapter: str) -> str:
    return adapter or BASE_MODEL_LABEL


def _stack_labels(rows: list[dict]) -> dict[str, str]:
    """adapter -> the series it is drawn in: the biggest adapters by tokens keep their own, the rest share one."""
    tokens: dict[str, int] = {}
    for row in rows:
        tokens[row["adapter"]] = tokens.get(row["adapter"], 0) + row["prompt_tokens"] + row["completion_tokens"]
    ranked = sorted(tokens, key=lambda adapter: (-tokens[adapter], adapter))
    if len(ranked) <= MAX_STACKED_ADAPTERS:
        return {adapter: adapter_label(adapter) for adapter in ranked}
    keep = ranked[:MAX_STACKED_ADAPTERS - 1]
    return {adapter: adapter_label(adapter) if adapter in keep else OTHER_LABEL for adapter in ranked}


def daily_series(rows: list[dict], since: date, until: date) -> dict:
    """{"days": [ISO dates], "series": [labels], "tokens"/"requests": {label: [per day]},
    "p50"/"p95": [ms or None per day]} over every day of [since, until], empty days included."""
    days = day_range(since, until)
    index = {day: n for n, day in enumerate(days)}
    labels = _stack_labels(rows)
    series = list(dict.fromkeys(labels.values()))
    tokens = {label: [0] * len(days) for label in series}
    requests = {label: [0] * len(days) for label in series}
    buckets = [[0] * NUM_LATENCY_BUCKETS for _ in days]
    for row in rows:
        n, label = index[row["day"]], labels[row["adapter"]]
        tokens[label][n] += row["prompt_tokens"] + row["completion_tokens"]
        requests[label][n] += row["num_requests"]
        for i, count in enumerate(row["latency_buckets"]):
            buckets[n][i] += count
    return {
        "days": [day.isoformat() for day in days],
        "series": series,
        "tokens": tokens,
        "requests": requests,
        "p50": [_rounded(latency_percentile(b, 0.50)) for b in buckets],
        "p95": [_rounded(latency_percentile(b, 0.95)) for b in buckets],
    }


def summary(rows: list[dict]) -> dict:
    """Totals over the rows, with p50/p95 latency (ms, None without requests) of all of them together."""
    totals = dict.fromkeys(("num_requests", "num_errors", "num_cancelled", "prompt_tokens", "completion_tokens"), 0)
    buckets = [0] * NUM_LATENCY_BUCKETS
    for row in rows:
        for name in totals:
            totals[name] += row[name]
        for i, count in enumerate(row["latency_buckets"]):
            buckets[i] += count
    totals["tokens"] = totals["prompt_tokens"] + totals["completion_tokens"]
    totals["latency_ms_p50"] = _rounded(latency_percentile(buckets, 0.50))
    totals["latency_ms_p95"] = _rounded(latency_percentile(buckets, 0.95))
    return totals


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def series_table(chart: dict, metric: str) -> list[dict]:
    """A chart's `metric` ("tokens" or "requests") as table rows: day, one value per series, total. The table
    beside each chart, for people who do not see the canvas."""
    columns = [chart[metric][label] for label in chart["series"]]
    return [
        {"day": day, "values": [column[n] for column in columns], "total": sum(column[n] for column in columns)}
        for n, day in enumerate(chart["days"])
    ]

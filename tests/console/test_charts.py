"""The dashboard's shaping of usage rows: every day present, adapters stacked, the smallest merged, percentiles."""

from datetime import date

from console import charts
from tenants.models import NUM_LATENCY_BUCKETS


def row(day: date, adapter: str, *, requests: int = 1, prompt: int = 1, completion: int = 0, bucket: int = 2):
    buckets = [0] * NUM_LATENCY_BUCKETS
    buckets[bucket] = requests
    return {"tenant_id": 1, "day": day, "adapter": adapter, "num_requests": requests, "num_errors": 0,
            "num_cancelled": 0, "prompt_tokens": prompt, "completion_tokens": completion, "latency_ms_sum": 0,
            "latency_buckets": buckets}


def test_every_day_of_the_range_with_series_by_adapter():
    rows = [row(date(2025, 3, 1), "sql", prompt=5), row(date(2025, 3, 3), "", prompt=9, requests=2, bucket=3)]
    chart = charts.daily_series(rows, date(2025, 2, 28), date(2025, 3, 3))
    assert chart["days"] == ["2025-02-28", "2025-03-01", "2025-03-02", "2025-03-03"]
    assert chart["series"] == ["base model", "sql"]  # by tokens, largest first
    assert chart["tokens"] == {"base model": [0, 0, 0, 9], "sql": [0, 5, 0, 0]}
    assert chart["requests"] == {"base model": [0, 0, 0, 2], "sql": [0, 1, 0, 0]}
    assert chart["p50"] == [None, 75.0, None, 175.0]  # middles of the 50-100 and 100-250 ms buckets


def test_more_adapters_than_colours_are_summed_into_other():
    day = date(2025, 1, 1)
    rows = [row(day, f"a{n:02d}", prompt=100 - n) for n in range(charts.MAX_STACKED_ADAPTERS + 3)]
    chart = charts.daily_series(rows, day, day)
    assert len(chart["series"]) == charts.MAX_STACKED_ADAPTERS and chart["series"][-1] == charts.OTHER_LABEL
    kept = charts.MAX_STACKED_ADAPTERS - 1
    assert chart["tokens"][charts.OTHER_LABEL] == [sum(100 - n for n in range(kept, kept + 4))]
    assert sum(values[0] for values in chart["tokens"].values()) == sum(r["prompt_tokens"] for r in rows)


def test_summary_and_series_table():
    day = date(2025, 1, 1)
    rows = [row(day, "x", requests=3, prompt=10, completion=2), row(day, "y", requests=1, prompt=1, bucket=11)]
    totals = charts.summary(rows)
    assert (totals["num_requests"], totals["tokens"]) == (4, 13)
    assert totals["latency_ms_p50"] == 83.3 and totals["latency_ms_p95"] == 60000.0  # 50 + 50 * 2/3; open last bucket
    assert charts.summary([])["latency_ms_p50"] is None
    chart = charts.daily_series(rows, day, day)
    assert charts.series_table(chart, "requests") == [{"day": "2025-01-01", "values": [3, 1], "total": 4}]

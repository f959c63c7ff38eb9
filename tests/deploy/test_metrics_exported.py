"""Every metric a dashboard or an alert rule names is one the code exports: read from a live engine and a live
gateway (the whole-stack fixture), never from a list kept by hand."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.deploy_files import SYNTHETIC_METRICS, metric_names, promql_expressions

_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "summary": ("_sum", "_count", "_created"), "gauge": ("",), "untyped": ("",), "info": ("_info",)}


def exported_names(text: str) -> set[str]:
    """The series names an exposition makes queryable, labelled families with no sample yet included."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def test_metric_names_come_out_of_promql():
    quantile = ('histogram_quantile(0.95, sum by (le, endpoint) (rate(gateway_request_seconds_bucket'
                '{instance=~"$instance", status="429"}[$__rate_interval])))')
    assert metric_names(quantile) == {"gateway_request_seconds_bucket"}
    assert metric_names("sum by (instance) (gateway_settles_pending) > 0 and deriv(gateway_settles_pending[10m]) "
                        "> 0") == {"gateway_settles_pending"}
    either = 'up{job="engine"} == 0 or on(instance) engine_saturated offset 5m'
    assert metric_names(either) == {"up", "engine_saturated"}
    assert metric_names("label_values(engine_requests_running, instance)") == {"engine_requests_running"}
    assert metric_names("a / b * 1e3") == {"a", "b"}


def test_exported_names_include_families_without_samples():
    text = "# HELP x_errors_total h\n# TYPE x_errors_total counter\n# TYPE y_seconds histogram\n"
    assert exported_names(text) >= {"x_errors_total", "y_seconds_bucket", "y_seconds_count"}


@pytest.fixture(scope="module")
def exported(stack) -> dict[str, set[str]]:
    engine = httpx.get(f"{stack.engine_urls[0]}/metrics", timeout=30,
                       headers={"Authorization": f"Bearer {stack.engine_api_key}"})
    gateway = httpx.get(f"{stack.web_url}/metrics", timeout=30)
    assert engine.status_code == 200 and gateway.status_code == 200
    return {"engine": exported_names(engine.text), "gateway": exported_names(gateway.text)}


def test_every_metric_the_dashboards_and_rules_name_is_exported(exported):
    expressions = promql_expressions()
    assert len(expressions) > 40
    missing = []
    for where, expr in expressions:
        names = metric_names(expr)
        assert names, f"{where} selects no metric: {expr}"
        for name in names - SYNTHETIC_METRICS:
            job = "engine" if name.startswith("engine_") else "gateway"
            if name not in exported[job]:
                missing.append(f"{where}: {name} (not in the {job}'s /metrics)")
    assert missing == []


def test_the_metrics_added_for_the_alert_rules_are_exported(exported):
    assert {"engine_step_errors", "engine_saturated"} <= exported["engine"]
    assert {"gateway_outages_total", "adapters_object_store_errors_total"} <= exported["gateway"]

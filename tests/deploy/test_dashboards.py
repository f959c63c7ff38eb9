"""deploy/grafana/: the dashboards load in Grafana's file-provisioning format (schema-checked), every data source
they name is provisioned, the compose profile mounts them where the provider looks, and per-tenant numbers come
only from the usage tables."""

import copy
import re

import jsonschema
import pytest
import yaml

from tests.deploy.deploy_files import DEPLOY, PROVISIONING, dashboards, panels, promql_expressions
from tests.deploy.grafana_schema import DASHBOARD_SCHEMA

COMPOSE = DEPLOY.parent / "docker" / "compose.yaml"
VALIDATOR = jsonschema.Draft202012Validator(DASHBOARD_SCHEMA)


def provisioned_datasources() -> dict[str, str]:
    files = sorted((PROVISIONING / "datasources").glob("*.yaml"))
    sources = [source for path in files for source in yaml.safe_load(path.read_text())["datasources"]]
    return {source["uid"]: source["type"] for source in sources}


def schema_errors(dashboard: dict) -> list[str]:
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in VALIDATOR.iter_errors(dashboard)]


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_dashboard_matches_grafana_s_model(name):
    dashboard = dashboards()[name]
    assert schema_errors(dashboard) == []
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    for panel in panels(dashboard):
        refs = [target["refId"] for target in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_panels_do_not_overlap(name):
    cells = {}
    for panel in dashboards()[name]["panels"]:
        pos = panel["gridPos"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("field", ["datasource", "targets", "gridPos", "id"])
def test_the_schema_refuses_a_panel_without(field):
    dashboard = copy.deepcopy(dashboards()["engine.json"])
    panel = next(p for p in dashboard["panels"] if p["type"] != "row")
    del panel[field]
    assert schema_errors(dashboard)


def test_the_schema_refuses_a_target_without_its_query():
    dashboard = copy.deepcopy(dashboards()["gateway.json"])
    target = next(p for p in dashboard["panels"] if p["type"] != "row")["targets"][0]
    del target["expr"]
    assert schema_errors(dashboard)


def test_dashboard_uids_are_unique_and_every_datasource_is_provisioned():
    sources = provisioned_datasources()
    assert sources == {"prometheus": "prometheus", "platform-usage": "grafana-postgresql-datasource"}
    uids = [dashboard["uid"] for dashboard in dashboards().values()]
    assert len(uids) == len(set(uids)) == 3
    for name, dashboard in dashboards().items():
        named = [variable["datasource"] for variable in dashboard["templating"]["list"]]
        for panel in panels(dashboard):
            named += [panel.get("datasource"), *(target["datasource"] for target in panel.get("targets", []))]
        for source in filter(None, named):
            assert sources.get(source["uid"]) == source["type"], f"{name} names {source}, which is not provisioned"


def test_the_dashboards_show_what_the_issue_lists():
    titles = {name: " | ".join(p["title"].lower() for p in panels(d)) for name, d in dashboards().items()}
    for words in ("tokens per second", "time to first token (histogram)", "time per output token (histogram)",
                  "queue depth", "kv cache", "prefix cache hit rate", "adapter slots", "adapter loads"):
        assert words in titles["engine.json"], words
    for words in ("requests by status", "added latency", "rate-limited (429)", "settles waiting",
                  "usage rows not yet written"):
        assert words in titles["gateway.json"], words
    kinds = {p["type"] for p in panels(dashboards()["engine.json"])}
    assert "heatmap" in kinds


def test_per_tenant_numbers_come_from_the_usage_tables_never_from_labels():
    tenant_panels = [p for p in panels(dashboards()["tenants.json"]) if p["type"] != "row"]
    assert len(tenant_panels) >= 5
    for panel in tenant_panels:
        assert panel["datasource"]["uid"] == "platform-usage", panel["title"]
        for target in panel["targets"]:
            assert re.search(r"\btenants_usage(record|daily)\b", target["rawSql"]), panel["title"]
    for where, expr in promql_expressions():
        assert not re.search(r"\b(tenant|tenant_id|api_key|key|adapter)\b", expr), f"{where} uses a tenant label"


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def mounts(service: dict) -> dict[str, str]:
    """Container path -> checkout path (resolved) of a service's bind mounts."""
    found = {}
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            found[target] = str((COMPOSE.parent / source).resolve())
    return found


def test_compose_runs_prometheus_and_grafana_behind_a_profile_with_these_files():
    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"], name
    for name, service in services.items():  # everything else still starts without the profile
        if name not in ("prometheus", "grafana"):
            assert "profiles" not in service, name
    assert mounts(services["prometheus"])["/etc/prometheus"] == str(DEPLOY / "prometheus")
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    assert "engine_api_key" in services["prometheus"]["secrets"]
    grafana = mounts(services["grafana"])
    assert grafana["/etc/grafana/provisioning"] == str(PROVISIONING)
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "platform.yaml").read_text())["providers"][0]
    assert grafana[provider["options"]["path"]] == str(DEPLOY / "grafana" / "dashboards")
    variables = set(re.findall(r"\$\{(\w+)\}", (PROVISIONING / "datasources" / "platform.yaml").read_text()))
    assert variables <= set(services["grafana"]["environment"]), "a data source reads an unset variable"


# ---------------------------------------------------------------- the SQL, on the real schema

GRAFANA_MACROS = [  # what Grafana's PostgreSQL data source expands these to, for a range and a 1-minute interval
    (re.compile(r"\$__timeGroupAlias\(([^,()]+),[^()]*\)"), r'floor(extract(epoch from \1)/60)*60 AS "time"'),
    (re.compile(r"\$__timeFilter\(([^()]+)\)"),
     r"\1 BETWEEN '2000-01-01T00:00:00Z' AND '2100-01-01T00:00:00Z'"),
]


def expand(sql: str, tenants: list[str]) -> str:
    for pattern, replacement in GRAFANA_MACROS:
        sql = pattern.sub(replacement, sql)
    sql = sql.replace("$tenant", ", ".join(f"'{slug}'" for slug in tenants))
    assert "$" not in sql, f"a macro this test does not expand: {sql}"
    return sql


@pytest.mark.django_db
def test_the_tenant_panels_sql_runs_on_the_usage_tables():
    from datetime import date, timedelta

    from django.db import connection
    from django.utils import timezone

    from tenants.models import UsageDaily, UsageRecord
    from tests.tenants.factories import TenantFactory

    if connection.vendor != "postgresql":
        pytest.fail("the tenants dashboard queries PostgreSQL (Grafana's data source); run the tests on it")
    acme, globex = TenantFactory(slug="dash-acme"), TenantFactory(slug="dash-globex")
    now = timezone.now()
    for n, (tenant, adapter, status) in enumerate([(acme, "", "ok"), (acme, "bot", "error"), (globex, "x", "ok")]):
        UsageRecord.objects.create(request_id=f"dash-{n}", tenant=tenant, adapter=adapter, prompt_tokens=10,
                                   completion_tokens=5, status=status, latency_ms=100 * (n + 1),
                                   created_at=now - timedelta(minutes=n))
    UsageDaily.objects.create(tenant=acme, day=date.today(), num_requests=2, num_errors=1, prompt_tokens=20,
                              completion_tokens=10, latency_ms_sum=300, latency_buckets=[0] * 12)
    queries = [target["rawSql"] for p in panels(dashboards()["tenants.json"]) for target in p.get("targets", [])]
    variable = dashboards()["tenants.json"]["templating"]["list"][0]["query"]
    with connection.cursor() as cursor:
        cursor.execute(variable)
        assert {"dash-acme", "dash-globex"} <= {row[0] for row in cursor.fetchall()}
        for sql in queries:
            cursor.execute(expand(sql, ["dash-acme", "dash-globex"]))
            columns = [c.name for c in cursor.description]
            rows = cursor.fetchall()
            assert rows, f"no rows from:\n{sql}"
            assert "tenant" in columns or "metric" in columns, columns
            slugs = {row[columns.index("tenant" if "tenant" in columns else "metric")] for row in rows}
            assert slugs <= {"dash-acme", "dash-globex"} and "dash-acme" in slugs

"""Reading deploy/: the dashboards, the alert rules and the PromQL in both, and the metric names that PromQL uses."""

import json
import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
PROVISIONING = DEPLOY / "grafana" / "provisioning"
PROMETHEUS = DEPLOY / "prometheus"

PROMETHEUS_UID = "prometheus"
# Series Prometheus makes itself for every target, not exported by any process.
SYNTHETIC_METRICS = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
             "offset", "inf", "nan"}


def dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows included."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def alert_rules() -> list[dict]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def promql_expressions() -> list[tuple[str, str]]:
    """(where, expression) for every PromQL expression in the dashboards (targets, template variables) and rules."""
    found = []
    for name, dashboard in dashboards().items():
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                if target.get("datasource", panel.get("datasource", {})).get("uid") == PROMETHEUS_UID:
                    found.append((f"{name}: {panel['title']} {target['refId']}", target["expr"]))
        for variable in dashboard["templating"]["list"]:
            if variable["datasource"]["uid"] == PROMETHEUS_UID:
                found.append((f"{name}: variable {variable['name']}", variable["query"]["query"]))
    found.extend((f"alerts.yml: {rule['alert']}", rule["expr"]) for rule in alert_rules())
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers left once strings, label matchers, ranges,
    grouping clauses, Grafana variables, numbers and function names are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    text = re.sub(r"\$\w+", " ", text)  # $__rate_interval, $instance
    text = re.sub(r"\blabel_values\s*\(\s*([A-Za-z_:][\w:]*)\s*,[^()]*\)", r" \1 ", text)  # Grafana's
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, is_call = match.group(1), match.group(2)
        if not is_call and name.lower() not in _KEYWORDS:
            names.add(name)
    return names

"""deploy/prometheus/: promtool accepts the scrape config and the alert rules, and the rules match the config."""

import re
import shutil
import subprocess

import pytest
import yaml

from tests.deploy.deploy_files import PROMETHEUS, alert_rules, metric_names


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run `make promtool` (devstack/promtool.sh installs Debian's prometheus "
                    "package; `make test` does it first)")
    return path


def check(promtool: str, *args: str) -> str:
    done = subprocess.run([promtool, "check", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"promtool check {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def test_promtool_accepts_the_alert_rules(promtool):
    output = check(promtool, "rules", "--lint=all", "--lint-fatal", str(PROMETHEUS / "alerts.yml"))
    assert f"SUCCESS: {len(alert_rules())} rules found" in output


def test_promtool_accepts_the_scrape_config(promtool):
    # --syntax-only: the engines' bearer key file (/run/secrets/engine_api_key) exists only in the container.
    output = check(promtool, "config", "--syntax-only", str(PROMETHEUS / "prometheus.yml"))
    assert "SUCCESS" in output


def test_promtool_refuses_a_broken_rule(promtool, tmp_path):
    """The check above can fail: a rule with bad PromQL is refused."""
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "rate(x[5m]"}]}]}))
    done = subprocess.run([promtool, "check", "rules", str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0


def test_rules_name_the_config_s_rule_file_and_jobs():
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == {"engine", "gateway"}
    for rule in alert_rules():
        for job in re.findall(r'job="([^"]+)"', rule["expr"]):
            assert job in jobs, f"{rule['alert']} selects job {job!r}, which prometheus.yml does not scrape"


def test_every_rule_is_an_alert_with_severity_and_text():
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} >= {
        "EngineDown", "EngineStepErrors", "EngineQueueBacklog", "SettleBacklogGrowing", "UsageRowBacklogGrowing",
        "RedisFailures", "ObjectStoreFailures"}
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert metric_names(rule["expr"]), f"{rule['alert']} selects no metric"

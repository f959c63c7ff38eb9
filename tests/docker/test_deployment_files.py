"""The deployment files are linted and consistent (no Docker engine runs here, so they are checked, not run)."""

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def env_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (DOCKER / "env.example").read_text().splitlines()
             if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def substitute(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?message} forms."""
    def repl(match):
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if name in env:
            return env[name]
        if op == ":-":
            return arg
        raise KeyError(f"{name} is used by compose.yaml but not given in env.example")
    return re.sub(r"\$\{(\w+)(:-|:\?)?([^}]*)\}", repl, value)


@pytest.mark.parametrize("dockerfile", ["Dockerfile.web", "Dockerfile.engine"])
def test_dockerfiles_pass_hadolint(dockerfile):
    hadolint = Path(sysconfig.get_path("scripts")) / "hadolint"
    result = subprocess.run([str(hadolint), "--failure-threshold", "info", "--no-color", str(DOCKER / dockerfile)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_services_have_health_checks_and_known_variables():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "minio", "web", "worker", "beat", "engine", "migrate"} <= set(services)
    for name, service in services.items():
        if service.get("restart", "unless-stopped") != "no" and name != "minio-init":
            assert "healthcheck" in service or name in {"web", "engine"}, f"{name} has no health check"
    # web's and engine's checks live in their Dockerfiles
    assert "HEALTHCHECK" in (DOCKER / "Dockerfile.web").read_text()
    assert "HEALTHCHECK" in (DOCKER / "Dockerfile.engine").read_text()
    env = env_example()
    for variable in set(re.findall(r"\$\{(\w+)", (DOCKER / "compose.yaml").read_text())):
        assert variable in env, f"{variable} is used by compose.yaml but missing from env.example"


def test_the_web_health_check_asks_with_a_host_django_answers():
    """Without its host in ALLOWED_HOSTS the check gets Django's 400 and the container never turns healthy."""
    lines = (DOCKER / "Dockerfile.web").read_text().splitlines()
    check = next(line for line in lines if line.startswith("HEALTHCHECK"))
    host = re.search(r'"Host: ([^"]+)"', check).group(1)
    assert host in env_example()["ALLOWED_HOSTS"].split(",")


def test_compose_environment_passes_the_deploy_checks():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    platform_env = {k: substitute(str(v), env_example()) for k, v in compose["x-platform-env"].items()}
    env = {**{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}, **platform_env,
           "DJANGO_SETTINGS_MODULE": "config.settings"}
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr

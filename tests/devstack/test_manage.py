"""Operator commands from a second shell while `make run` runs: `python -m devstack manage` (what `make manage`
calls) with only the documented environment reaches the running stack's database and Redis."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
from django.conf import settings

from devstack.run_env import read_run_env
from devstack.services import ROOT, free_port, postgres_url

BANNER = "The platform is running."


def own_redis_db(url: str) -> str:
    """Two below the tests' Redis database (the e2e stack takes the one below): this run's Celery broker."""
    head, _, index = url.rpartition("/")
    return f"{head}/{(int(index or 0) - 2) % 16}"


@pytest.fixture
def fresh_database():
    """A PostgreSQL database of its own, as an operator's DATABASE_URL would name, dropped afterwards."""
    if postgres_url() is None:
        pytest.fail("these tests need the local PostgreSQL on 127.0.0.1:5432 (as in CI)")
    name = f"lora_cli_{uuid.uuid4().hex[:8]}"
    admin = postgres_url("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield postgres_url(name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def shell_env(**extra: str) -> dict[str, str]:
    """A new shell's environment: nothing of this test process's settings, database or Redis."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8", **extra}


def wait_for_banner(proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if BANNER in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"make run did not come up (exit {proc.poll()}):\n{log.read_text(errors='replace')[-4000:]}")


@pytest.fixture
def running_platform(tmp_path, fresh_database):
    """`python -m devstack run` (what `make run` calls) with its state in tmp_path, from a shell that named its
    own database and Redis; no engine (the commands do not need one)."""
    state, port = tmp_path / "state", free_port()
    log = tmp_path / "run.log"
    env = shell_env(PLATFORM_STATE_DIR=str(state), DATABASE_URL=fresh_database,
                    REDIS_URL=own_redis_db(settings.REDIS_URL))
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "devstack", "run", "--no-engine", "--port", str(port),
                                 "--engine-port", str(free_port())], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_banner(proc, log)
        yield state, f"http://127.0.0.1:{port}", fresh_database
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, log.read_text(errors="replace")[-4000:]


def operator(state: Path, *args: str) -> subprocess.CompletedProcess:
    """One command from a second shell in the checkout, as the README shows it."""
    return subprocess.run([sys.executable, "-m", "devstack", "manage", *args], cwd=ROOT, capture_output=True,
                          text=True, env=shell_env(PLATFORM_STATE_DIR=str(state)), timeout=300)


def test_operator_commands_reach_the_running_stack(running_platform):
    state, web_url, database_url = running_platform
    recorded = read_run_env(state / "run.env")
    assert recorded["DATABASE_URL"] == database_url  # what make run's shell named, not the checkout's default
    assert (state / "run.env").stat().st_mode & 0o777 == 0o600

    plain = subprocess.run([sys.executable, "manage.py", "usage_report"], cwd=ROOT, capture_output=True, text=True,
                           env=shell_env(PLATFORM_STATE_DIR=str(state)), timeout=300)
    assert plain.returncode != 0 and "SECRET_KEY" in plain.stderr  # why the target exists

    created = operator(state, "create_tenant", "CLI Tenant", "--slug", "cli-tenant")
    assert created.returncode == 0, created.stderr
    quota = operator(state, "set_quota", "cli-tenant", "--requests-per-minute", "7")
    assert quota.returncode == 0, quota.stderr
    key = operator(state, "create_api_key", "cli-tenant", "--name", "from-cli")
    assert key.returncode == 0, key.stderr
    secret = key.stdout.strip().splitlines()[-1]

    # The running web process knows the key and the quota the second shell wrote.
    response = httpx.get(f"{web_url}/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["x-ratelimit-limit-requests"] == "7"
    # The demo make run seeded is in the same database the commands read.
    report = operator(state, "usage_report", "--tenant", "acme")
    assert report.returncode == 0, report.stderr
    with psycopg.connect(database_url) as conn:
        slugs = {row[0] for row in conn.execute("SELECT slug FROM tenants_tenant")}
    assert {"acme", "globex", "cli-tenant"} <= slugs


def test_manage_without_a_recorded_environment_uses_make_run_s_defaults(tmp_path):
    state = tmp_path / "state"
    done = operator(state, "check")
    assert done.returncode == 0, done.stderr
    assert "run.env is missing" in done.stderr and "System check identified no issues" in done.stdout


def test_the_make_target_calls_it():
    dry = subprocess.run(["make", "-n", "manage", "ARGS=usage_report --tenant acme"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert ".venv/bin/python -m devstack manage usage_report --tenant acme" in dry.stdout

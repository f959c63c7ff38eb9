"""Settings come from the environment, parsed strictly; production settings pass Django's deploy checks."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_int, env_url, env_url_list

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DEBUG", "SECRET_KEY"}}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("raw", ["maybe", "2", "yes please"])
def test_env_bool_refuses_unclear_values(monkeypatch, raw):
    monkeypatch.setenv("SOME_FLAG", raw)
    with pytest.raises(ImproperlyConfigured, match="SOME_FLAG"):
        env_bool("SOME_FLAG", False)


def test_env_int_checks_type_and_bounds(monkeypatch):
    monkeypatch.setenv("SOME_INT", "12x")
    with pytest.raises(ImproperlyConfigured, match="SOME_INT must be an integer"):
        env_int("SOME_INT", 1)
    monkeypatch.setenv("SOME_INT", "0")
    with pytest.raises(ImproperlyConfigured, match=">= 1"):
        env_int("SOME_INT", 1, minimum=1)
    monkeypatch.setenv("SOME_INT", "64")
    assert env_int("SOME_INT", 1, minimum=1) == 64


def test_urls_are_checked(monkeypatch):
    monkeypatch.setenv("SOME_URL", "127.0.0.1:6379")
    with pytest.raises(ImproperlyConfigured, match="SOME_URL"):
        env_url("SOME_URL", schemes=("redis",))
    monkeypatch.setenv("SOME_URLS", "http://a:1, ftp://b")
    with pytest.raises(ImproperlyConfigured, match="ftp://b"):
        env_url_list("SOME_URLS", schemes=("http", "https"))


def test_production_refuses_to_start_without_secrets():
    result = run_python("import django; from django.conf import settings; django.setup()",
                        DJANGO_SETTINGS_MODULE="config.settings", DEBUG="false")
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_bad_value_stops_the_process_naming_the_variable():
    result = run_python("import django; django.setup()", DJANGO_SETTINGS_MODULE="config.settings",
                        DEBUG="true", MAX_LORA_RANK="lots")
    assert result.returncode != 0 and "MAX_LORA_RANK must be an integer" in result.stderr


def test_production_settings_pass_the_deploy_checks():
    env = {
        "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "false",
        "SECRET_KEY": "k" * 20 + "a-real-production-secret-with-enough-entropy-4f9d2c",
        "ALLOWED_HOSTS": "lora.example.com", "DATABASE_URL": "postgres://app@db.internal:5432/lora",
        "REDIS_URL": "redis://redis.internal:6379/0", "S3_ENDPOINT_URL": "https://s3.example.com",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret",
        "ENGINE_URLS": "http://engine-0:8100,http://engine-1:8100", "ENGINE_API_KEY": "engine-secret",
    }
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_project_package_does_not_hide_the_stdlib_platform_module():
    result = run_python("import platform, torch; print(platform.python_version())")
    assert result.returncode == 0, result.stderr
    assert not (ROOT / "platform").exists()


def test_django_and_the_adapter_rules_do_not_import_torch():
    code = (
        "import sys, django, engine; django.setup(); "
        "from django.urls import resolve; resolve('/health'); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    result = run_python(code, DJANGO_SETTINGS_MODULE="config.settings_test")
    assert result.returncode == 0, result.stderr


def test_concurrent_writers_on_the_default_sqlite_queue_instead_of_failing(tmp_path):
    """`make run` without PostgreSQL uses SQLite: eight threads creating tenants at once must all succeed (with
    deferred transactions most failed at once with "database is locked")."""
    code = """
import threading, django
django.setup()
from django.core.management import call_command
from django.db import connections
call_command("migrate", verbosity=0)
from tenants import services
errors = []
def work(i):
    try:
        for j in range(5):
            services.tenant_create(name=f"T{i}-{j}")
    except Exception as exc:
        errors.append(repr(exc))
    finally:
        connections.close_all()
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
from tenants.models import Tenant
print(Tenant.objects.count(), errors[:2])
"""
    done = run_python(code, DJANGO_SETTINGS_MODULE="config.settings", DEBUG="true",
                      DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0] == "40", done.stdout

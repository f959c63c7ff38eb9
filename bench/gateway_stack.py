"""The processes of ``bench.gateway``: an engine on a tiny model, a gateway in front of it, a tenant with a key.

Scratch state only: a PostgreSQL database ``lora_bench_gateway`` dropped and recreated (SQLite in the scratch
folder when PostgreSQL does not answer) and Redis database 13, emptied. The tenant's quota is set far above the
workload, so the limiter is exercised on every request but never refuses.
"""

import contextlib
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from devstack.processes import ProcessGroup, python
from devstack.services import ROOT, ensure_redis, free_port, postgres_url

DB_NAME = "lora_bench_gateway"
REDIS_DB = 13
ENGINE_KEY = "bench-engine-key"
SERVED_NAME = "tiny"


@dataclass
class BenchStack:
    engine_url: str
    engine_key: str
    web_url: str
    key: str
    database: str
    engine_pid: int
    web_pid: int

    def gateway_cpu_s(self) -> float:
        return _cpu_seconds(self.web_pid)

    def engine_cpu_s(self) -> float:
        return _cpu_seconds(self.engine_pid)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _database(scratch: Path) -> str:
    url = postgres_url(DB_NAME)
    if url is None:
        return f"sqlite:///{scratch / 'bench.sqlite3'}"
    import psycopg

    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    return url


def _redis() -> str:
    import redis

    url = ensure_redis().rsplit("/", 1)[0] + f"/{REDIS_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


def _manage(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip()


def _model(scratch: Path, model: str | None) -> Path:
    if model:
        return Path(model)
    from tests.support.tiny_llama import make_tiny_llama  # the same tiny model the whole-stack tests serve

    return make_tiny_llama(scratch / "model")


@contextlib.contextmanager
def start_bench_stack(scratch: Path, model: str | None):
    model_dir = _model(scratch, model)
    engine_port, web_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    database = _database(scratch)
    # Production settings (DEBUG off: no query log, no static files handler), plain HTTP on loopback.
    env = {"DEBUG": "false", "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "127.0.0.1",
           "SECURE_SSL_REDIRECT": "false", "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
           "STATIC_ROOT": str(scratch / "static"), "DJANGO_SETTINGS_MODULE": "config.settings",
           "DATABASE_URL": database,
           "REDIS_URL": _redis(), "ENGINE_URLS": engine_url, "ENGINE_API_KEY": ENGINE_KEY,
           "BASE_MODEL_NAME": SERVED_NAME, "BASE_MODEL_CONFIG": str(model_dir / "config.json"),
           "ADAPTER_WARM_LOAD": "false", "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    _manage(env, "migrate", "--verbosity", "0")
    _manage(env, "create_tenant", "bench")
    _manage(env, "set_quota", "bench", "--requests-per-minute", "1000000", "--tokens-per-minute", "1000000000",
            "--monthly-tokens", "100000000000", "--max-concurrent-requests", "10000")
    key = _manage(env, "create_api_key", "bench", "--name", "bench", "--scopes", "inference").splitlines()[-1]
    (scratch / "engine-key").write_text(ENGINE_KEY)
    group = ProcessGroup(log_dir=scratch / "logs", env=env)
    try:
        engine = group.start("engine", python(
            "-m", "engine", "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(engine_port),
            "--served-model-name", SERVED_NAME, "--api-key-file", str(scratch / "engine-key"),
            "--kv-cache-memory", "64MiB", "--max-model-len", "512", "--no-enable-lora"),
            port=engine_port, wait_s=180, extra_env={"KERNELS_BACKEND": ""})
        web = group.start("gateway", python("-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
                                            "--port", str(web_port), "--lifespan", "on", "--no-access-log"),
                          port=web_port)
        yield BenchStack(engine_url, ENGINE_KEY, f"http://127.0.0.1:{web_port}", key,
                         "postgresql" if database.startswith("postgres") else "sqlite", engine.proc.pid, web.proc.pid)
    finally:
        group.stop()

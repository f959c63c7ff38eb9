"""The whole-stack fixture's machinery: real SeaweedFS, Redis, a Celery worker, the ASGI app and engines,
all pointed at the test database, started once per test session and stopped cleanly at its end."""

import os
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from devstack.processes import ProcessGroup, python
from devstack.services import S3Service, ensure_redis, ensure_s3, free_port, state_dir


@dataclass(slots=True)
class Stack:
    web_url: str
    redis_url: str
    s3: S3Service
    engine_urls: list[str]
    engine_api_key: str
    env: dict[str, str]
    group: ProcessGroup = field(repr=False)


def database_url() -> str:
    """The URL of the test database pytest-django created, for the child processes."""
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    host, port, user = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432, db.get("USER") or "postgres"
    return f"postgres://{user}@{host}:{port}/{db['NAME']}"


STACK_MODEL_NAME = "tiny"
ENGINE_API_KEY = "stack-engine-key"


def engine_argv(model_dir: Path, log_dir: Path, bucket: str, served_name: str = STACK_MODEL_NAME) -> list[str]:
    """An engine on the stack's model serving adapters from the registry's prefix of ``bucket`` (the port is
    added by start_stack). Max rank 64: the control plane's MAX_LORA_RANK default."""
    key_file = log_dir / "engine-key"
    log_dir.mkdir(parents=True, exist_ok=True)
    key_file.write_text(ENGINE_API_KEY)
    return python("-m", "engine", "serve", str(model_dir), "--host", "127.0.0.1", "--served-model-name",
                  served_name, "--api-key-file", str(key_file), "--kv-cache-memory", "64MiB",
                  "--max-model-len", "512", "--enable-lora", "--adapter-sources", f"s3://{bucket}/tenants/",
                  "--max-lora-rank", "64")


def start_stack(log_dir: Path, *, model_dir: Path | None = None, num_engines: int = 0,
                served_name: str = STACK_MODEL_NAME, redis_url: str | None = None) -> Stack:
    """The stack; with ``num_engines`` engine replicas on the model in ``model_dir`` (served as ``served_name``),
    which then is the base model the control plane serves and validates adapters against. A second stack in the
    same session needs its own ``redis_url`` (a Redis database of its own): the Celery broker is there, and one
    stack's worker must not take the other's tasks."""
    s3 = ensure_s3()
    engine_argvs = [engine_argv(model_dir, log_dir, s3.bucket, served_name) for _ in range(num_engines)]
    redis_url = redis_url or os.environ.get("REDIS_URL") or ensure_redis()
    engine_ports = [free_port() for _ in engine_argvs]
    engine_urls = [f"http://127.0.0.1:{port}" for port in engine_ports]
    env = {
        "DEBUG": "true",
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "DATABASE_URL": database_url(),
        "REDIS_URL": redis_url,
        "ENGINE_URLS": ",".join(engine_urls),
        "ENGINE_API_KEY": ENGINE_API_KEY,
        "PYTHONUNBUFFERED": "1",
        **s3.env(),
    }
    if model_dir is not None:
        env.update(BASE_MODEL_NAME=served_name, BASE_MODEL_CONFIG=str(model_dir / "config.json"))
    group = ProcessGroup(log_dir=log_dir, env=env)
    try:
        for argv, port in zip(engine_argvs, engine_ports, strict=True):
            group.start(f"engine-{port}", [*argv, "--port", str(port)], port=port, wait_s=180,
                        extra_env={"KERNELS_BACKEND": ""})
        web_port = free_port()
        group.start("web", python("-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
                                  "--port", str(web_port), "--lifespan", "on", "--no-access-log"), port=web_port)
        worker_name = f"stack-{web_port}@localhost"
        group.start("worker", python("-m", "celery", "-A", "config", "worker", "--loglevel", "INFO",
                                     "--pool", "threads", "--concurrency", "2", "--without-gossip",
                                     "--without-mingle", "--without-heartbeat", "--hostname", worker_name),
                    ready=lambda: worker_answers(worker_name, redis_url), wait_s=60)
    except Exception:
        group.stop()
        raise
    return Stack(f"http://127.0.0.1:{web_port}", redis_url, s3, engine_urls, env["ENGINE_API_KEY"], env, group)


def worker_answers(name: str, broker_url: str) -> bool:
    from celery import Celery

    # The stack's broker, which need not be this process's. Not set as current: shared tasks resolve through the
    # current app, and tests that patch a task's delay must keep patching the project's.
    app = Celery(broker=broker_url, set_as_current=False)
    try:
        return bool(app.control.ping(destination=[name], timeout=0.5))
    finally:
        app.close()


def default_log_dir() -> Path:
    return state_dir() / "test-logs"

"""Run the whole platform locally: services, migrations, web, Celery, an engine, and the demo seeded."""

import os
import secrets
import signal
import subprocess
import time

from devstack.processes import ProcessGroup, python
from devstack.run_env import recorded_env, write_run_env
from devstack.services import ROOT, ensure_redis, ensure_s3, state_dir


def platform_env(engine_port: int) -> dict[str, str]:
    """The embedded defaults every process of `make run` shares."""
    state = state_dir()
    secret_file = state / "dev-secrets"
    if not secret_file.exists():
        secret_file.write_text(f"{secrets.token_urlsafe(48)}\n{secrets.token_urlsafe(24)}\n")
        secret_file.chmod(0o600)
    secret_key, engine_key = secret_file.read_text().split()
    env = {
        "DEBUG": os.environ.get("DEBUG", "true"),
        "SECRET_KEY": os.environ.get("SECRET_KEY", secret_key),
        "REDIS_URL": ensure_redis(),
        "ENGINE_URLS": os.environ.get("ENGINE_URLS", f"http://127.0.0.1:{engine_port}"),
        "ENGINE_API_KEY": os.environ.get("ENGINE_API_KEY", engine_key),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONUNBUFFERED": "1",
    }
    env.update({k: os.environ.get(k, v) for k, v in ensure_s3().env().items()})
    return env


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run(python("manage.py", *args), cwd=ROOT, env={**os.environ, **env}, check=True)


def run(*, host: str, port: int, engine_port: int, with_engine: bool) -> int:
    env = recorded_env(platform_env(engine_port))
    write_run_env(env)  # what `make manage` runs commands with, from any other shell
    print("[run] migrating the database", flush=True)
    manage(env, "migrate", "--noinput", "-v", "0")
    group = ProcessGroup(log_dir=state_dir() / "logs", env=env)
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        start_processes(group, host=host, port=port, engine_port=engine_port, with_engine=with_engine)
        print("[run] seeding the demo (tenants, keys, adapters uploaded and validated)", flush=True)
        demo = ["seed_demo", "--web-url", f"http://{host}:{port}"]
        if not with_engine:
            demo.append("--no-adapters")
        try:
            manage(env, *demo)
        except subprocess.CalledProcessError:  # the platform still serves; the reason is printed above
            print("[run] seeding the demo failed (see above); the platform runs without it", flush=True)
        print_banner(host, port, engine_port if with_engine else None, group)
        while not stopping:
            dead = group.check_alive()
            if dead:
                names = ", ".join(f"{c.name} (exit {c.proc.returncode}, log {c.log_path})" for c in dead)
                print(f"[run] stopped because a process ended: {names}", flush=True)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        print("[run] stopping every process", flush=True)
        group.stop()


def start_processes(group: ProcessGroup, *, host: str, port: int, engine_port: int, with_engine: bool) -> None:
    if with_engine:
        from devstack.engine import engine_argv

        group.start("engine", engine_argv(engine_port), port=engine_port, wait_s=600)
    group.start("web", python("-m", "uvicorn", "config.asgi:application", "--host", host, "--port", str(port),
                              "--lifespan", "on", "--no-access-log"), port=port)
    group.start("worker", python("-m", "celery", "-A", "config", "worker", "--loglevel", "INFO",
                                 "--concurrency", "2", "--pool", "threads", "--without-gossip", "--without-mingle"))
    group.start("beat", python("-m", "celery", "-A", "config", "beat", "--loglevel", "INFO",
                               "--schedule", str(state_dir() / "celerybeat-schedule")))


def print_banner(host: str, port: int, engine_port: int | None, group: ProcessGroup) -> None:
    lines = [
        "",
        "The platform is running. Ctrl-C stops everything it started.",
        f"  web console      http://{host}:{port}/   (health: http://{host}:{port}/health)",
        f"  inference API    http://{host}:{port}/v1   (OpenAI-compatible; tenants' keys above)",
        f"  management API   http://{host}:{port}/api/docs/",
        f"  demo credentials {state_dir() / 'demo.json'} (printed above)",
    ]
    if engine_port is not None:
        lines.append(f"  engine (internal) http://127.0.0.1:{engine_port}/  (bearer key in .state/dev-secrets)")
    lines.append(f"  logs             {group.log_dir}")
    print("\n".join(lines), flush=True)

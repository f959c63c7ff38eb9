"""How `make run` starts an engine: the real base model, the dev engine key, adapters from the local S3."""

from devstack.processes import python
from devstack.services import S3_BUCKET, state_dir


def engine_argv(port: int, model: str = "smollm2-135m-instruct") -> list[str]:
    key_file = state_dir() / "engine-key"
    secrets_file = state_dir() / "dev-secrets"
    key_file.write_text(secrets_file.read_text().split()[1])
    key_file.chmod(0o600)
    return python(
        "-m", "engine", "serve", model, "--host", "127.0.0.1", "--port", str(port),
        "--api-key-file", str(key_file), "--kv-cache-memory", "2GiB",
        "--adapter-sources", f"s3://{S3_BUCKET}/tenants/",
    )

"""An engine server on a tiny random Llama, started once for the module that asks for it."""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devstack.processes import ProcessGroup
from devstack.services import free_port
from tests.support.tiny_llama import make_tiny_llama

API_KEY = "test-engine-key"


@dataclass
class EngineServer:
    url: str
    api_key: str
    model: str
    folder: Path
    group: ProcessGroup

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.api_key}"},
                            timeout=60, **kwargs)

    def stats(self) -> dict:
        with self.client() as client:
            return client.get("/stats").json()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def start_engine(folder: Path, log_dir: Path, *extra: str, env: dict[str, str] | None = None) -> EngineServer:
    port = free_port()
    key_file = log_dir / "engine-key"
    log_dir.mkdir(parents=True, exist_ok=True)
    key_file.write_text(API_KEY)
    group = ProcessGroup(log_dir=log_dir, env={"PYTHONUNBUFFERED": "1", "KERNELS_BACKEND": "", **(env or {})})
    argv = [sys.executable, "-m", "engine", "serve", str(folder), "--port", str(port),
            "--api-key-file", str(key_file), "--served-model-name", "tiny", "--kv-cache-memory", "64MiB",
            "--max-model-len", "512", *extra]
    group.start("engine", argv, port=port, wait_s=120)
    return EngineServer(f"http://127.0.0.1:{port}", API_KEY, "tiny", folder, group)


@pytest.fixture(scope="module")
def engine_server(tiny_model_dir, tmp_path_factory):
    server = start_engine(tiny_model_dir, tmp_path_factory.mktemp("engine-logs"), "--no-enable-lora")
    try:
        yield server
    finally:
        server.group.stop()


os.environ.setdefault("OPENAI_LOG", "")

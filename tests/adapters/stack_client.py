"""A tenant's manage key talking to the whole stack's API, the way scripts and the web UI do."""

import time
from pathlib import Path

import httpx

from tenants import services as tenant_services

FINISHED = ("ready", "failed")


class Caller:
    """A tenant's manage key talking to the stack's API."""

    def __init__(self, stack, tenant):
        self.tenant = tenant
        _, key = tenant_services.api_key_create(tenant=tenant, name="e2e", scopes=["manage"])
        self.key = key
        self.http = httpx.Client(base_url=stack.web_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        self.base = f"/api/tenants/{tenant.slug}/adapters/"

    def create(self, name: str) -> None:
        response = self.http.post(self.base, json={"name": name})
        assert response.status_code == 201, response.text

    def upload_streamed(self, name: str, paths: list[Path]) -> httpx.Response:
        if len(paths) == 1 and paths[0].name.endswith((".zip", ".tar.gz")):
            media = "application/zip" if paths[0].name.endswith(".zip") else "application/gzip"
            return self.http.post(f"{self.base}{name}/versions/", content=paths[0].read_bytes(),
                                  headers={"Content-Type": media})
        handles = [open(p, "rb") for p in paths]
        try:
            return self.http.post(f"{self.base}{name}/versions/", files=[("files", (p.name, h))
                                                                         for p, h in zip(paths, handles, strict=True)])
        finally:
            for handle in handles:
                handle.close()

    def upload_presigned(self, name: str, paths: list[Path]) -> httpx.Response:
        files = [{"name": p.name, "size": p.stat().st_size} for p in paths]
        created = self.http.post(f"{self.base}{name}/uploads/", json={"files": files})
        assert created.status_code == 201, created.text
        for target, path in zip(created.json()["targets"], paths, strict=True):
            data, offset = path.read_bytes(), 0
            for url, size in zip(target["urls"], target["part_sizes"], strict=True):
                assert httpx.put(url, content=data[offset:offset + size], timeout=60).status_code == 200
                offset += size
        return self.http.post(f"{self.base}{name}/uploads/{created.json()['upload']['id']}/complete/")

    def wait(self, name: str, versions: list[int], timeout: float = 120) -> dict[int, dict]:
        deadline, done = time.monotonic() + timeout, {}
        while time.monotonic() < deadline and len(done) < len(versions):
            for number in versions:
                if number not in done:
                    body = self.http.get(f"{self.base}{name}/versions/{number}/").json()
                    if body["status"] in FINISHED:
                        done[number] = body
            time.sleep(0.2)
        assert len(done) == len(versions), f"not finished in {timeout}s: {sorted(set(versions) - set(done))}"
        return done

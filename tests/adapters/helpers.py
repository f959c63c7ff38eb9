"""Small steps the registry tests repeat: a direct-to-S3 upload done the way a browser does it, S3 listings."""

from pathlib import Path

import httpx

from adapters import services
from adapters.models import AdapterUpload, AdapterVersion
from adapters.storage import object_store, staging_prefix


def put_targets(targets: list[dict], paths: list[Path]) -> None:
    """PUT each file's parts to its presigned URLs, as the web UI does."""
    for target, path in zip(targets, paths, strict=True):
        data, offset = Path(path).read_bytes(), 0
        for url, size in zip(target["urls"], target["part_sizes"], strict=True):
            response = httpx.put(url, content=data[offset:offset + size], timeout=30)
            assert response.status_code == 200, response.text
            offset += size


def presigned_upload(tenant, adapter, paths: list[Path]) -> AdapterVersion:
    """Declare, PUT and complete; the new version (status `uploaded`)."""
    files = [{"name": Path(p).name, "size": Path(p).stat().st_size} for p in paths]
    upload, targets = services.upload_create_presigned(tenant=tenant, adapter=adapter, files=files)
    put_targets(targets, paths)
    return services.upload_complete(tenant=tenant, upload=upload)


def keys_under(prefix: str) -> list[str]:
    return sorted(object_store().list_keys(prefix))


def leftovers(version: AdapterVersion) -> list[str]:
    """Every object the version or its upload still has in the store."""
    upload = AdapterUpload.objects.filter(version=version).first()
    return keys_under(version.storage_prefix) + (keys_under(staging_prefix(upload.uuid)) if upload else [])

"""The object store (S3 through boto3): where adapter files and staged uploads live, and how they move.

Keys are built here only, from ids: ``tenants/<tenant id>/adapters/<adapter uuid>/v<n>/`` for a version's
normalized folder, ``uploads/<upload uuid>/<index>`` for staged bytes (outside the ``tenants/`` prefix that
engines may read). No client-supplied name or path ever becomes part of a key.

Errors: :class:`StoreUnavailable` (transient: connection trouble, 5xx, throttling; retry later),
:class:`ObjectMissing`, :class:`ObjectTooLarge`; other refusals of the store stay ``botocore`` errors.
"""

import functools
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings
from prometheus_client import Counter

STAGING_ROOT = "uploads/"
_TRANSIENT_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "RequestTimeTooSkewed",
                    "500", "502", "503", "504"}
_MISSING_CODES = {"NoSuchKey", "NoSuchUpload", "404", "NotFound"}
# The platform's own credentials or bucket refused: an outage of the platform (fixed by an operator), never the
# fault of the upload at hand, so retried like one (a version is not failed for it until its last attempt).
_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "NoSuchBucket",
                 "AllAccessDisabled", "403"}
_CHUNK = 1 << 20


class StoreUnavailable(Exception):
    """The object store could not be reached or answered with a transient error."""


class ObjectMissing(Exception):
    pass


class ObjectTooLarge(Exception):
    pass


def tenant_prefix(tenant_id: int) -> str:
    return f"tenants/{tenant_id}/"


def version_prefix(*, tenant_id: int, adapter_uuid, number: int) -> str:
    return f"tenants/{tenant_id}/adapters/{adapter_uuid}/v{number}/"


def staging_prefix(upload_uuid) -> str:
    return f"{STAGING_ROOT}{upload_uuid}/"


def staging_key(*, upload_uuid, index: int) -> str:
    return f"{staging_prefix(upload_uuid)}{index}"


def version_uri(prefix: str) -> str:
    """The ``s3://`` URI engines load a version from (ENGINE_PROTOCOL.md, "Adapters")."""
    return f"s3://{settings.S3_BUCKET}/{prefix}"


def _translate(exc: Exception) -> Exception:
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in _MISSING_CODES:
            return ObjectMissing(code)
        if code in _TRANSIENT_CODES or status >= 500:
            return StoreUnavailable(f"object store answered {code or status}")
        if code in _ACCESS_CODES or status == 403:
            return StoreUnavailable(f"object store refused the platform's access ({code or status}): check S3_BUCKET "
                                    "and the S3 credentials")
        return exc
    if isinstance(exc, BotoCoreError):
        return StoreUnavailable(f"object store unreachable: {exc}")
    return exc


# Registered in no registry here: the process that serves /metrics registers it (gateway.metrics, the web).
store_errors_total = Counter("adapters_object_store_errors", "Object-store calls that failed as an outage "
                             "(unreachable, 5xx, throttled, the platform's access refused), by operation",
                             ["operation"], registry=None)


def _translated(method):
    """Store calls raise StoreUnavailable / ObjectMissing instead of botocore's transport and 404 errors."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Exception as exc:  # translated, or re-raised as it was
            translated = _translate(exc)
            if translated is exc:
                raise
            if isinstance(translated, StoreUnavailable):
                store_errors_total.labels(operation=method.__name__).inc()
            raise translated from exc

    return wrapper


class ObjectStore:
    """One bucket, through an internal client (workers, web) and a public one (presigned URLs for browsers)."""

    def __init__(self, client, public_client, bucket: str):
        self.client = client
        self.public_client = public_client
        self.bucket = bucket

    @_translated
    def put_file(self, key: str, path: Path) -> None:
        with open(path, "rb") as f:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=f)

    @_translated
    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    @_translated
    def size_of(self, key: str) -> int:
        return self.client.head_object(Bucket=self.bucket, Key=key)["ContentLength"]

    @_translated
    def download(self, key: str, dest: Path, *, max_bytes: int) -> int:
        """Stream an object to ``dest``; ObjectTooLarge as soon as it passes ``max_bytes``."""
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        written = 0
        with open(dest, "wb") as f:
            for chunk in body.iter_chunks(_CHUNK):
                written += len(chunk)
                if written > max_bytes:
                    body.close()
                    raise ObjectTooLarge(f"{key} is over {max_bytes} bytes")
                f.write(chunk)
        return written

    @_translated
    def list_keys(self, prefix: str) -> list[str]:
        keys = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys

    @_translated
    def delete_keys(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": key} for key in keys[start:start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def delete_prefix(self, prefix: str) -> int:
        if not prefix.endswith("/"):
            raise ValueError(f"refusing to delete under {prefix!r}: a prefix must end with '/'")
        keys = self.list_keys(prefix)
        self.delete_keys(keys)
        return len(keys)

    # ---------------------------------------------------------------- multipart uploads

    @_translated
    def create_multipart(self, key: str) -> str:
        return self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]

    @_translated
    def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        return self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                       Body=data)["ETag"]

    @_translated
    def list_parts(self, key: str, upload_id: str) -> list[dict]:
        parts = []
        pages = self.client.get_paginator("list_parts").paginate(Bucket=self.bucket, Key=key, UploadId=upload_id)
        for page in pages:
            parts.extend({"number": p["PartNumber"], "etag": p["ETag"], "size": p["Size"]}
                         for p in page.get("Parts", []))
        return sorted(parts, key=lambda p: p["number"])

    @_translated
    def complete_multipart(self, key: str, upload_id: str, parts: list[dict]) -> None:
        self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=key, UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": p["number"], "ETag": p["etag"]} for p in parts]},
        )

    @_translated
    def abort_multipart_uploads(self, prefix: str) -> int:
        """Abort every unfinished multipart upload under ``prefix`` (their parts are not listed as objects)."""
        uploads = []
        for page in self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix):
            uploads.extend(page.get("Uploads", []))
        for upload in uploads:
            self.abort_multipart(upload["Key"], upload["UploadId"])
        return len(uploads)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self._abort_multipart(key, upload_id)
        except ObjectMissing:
            pass  # already completed or aborted

    @_translated
    def _abort_multipart(self, key: str, upload_id: str) -> None:
        self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)

    # ---------------------------------------------------------------- presigned URLs (public endpoint)

    def presign_put(self, key: str, size: int, ttl_s: int) -> str:
        """A URL for one PUT of exactly ``size`` bytes: the length is signed, the store refuses any other."""
        return self.public_client.generate_presigned_url(
            "put_object", Params={"Bucket": self.bucket, "Key": key, "ContentLength": size}, ExpiresIn=ttl_s,
        )

    def presign_part(self, key: str, upload_id: str, number: int, size: int, ttl_s: int) -> str:
        return self.public_client.generate_presigned_url(
            "upload_part",
            Params={"Bucket": self.bucket, "Key": key, "UploadId": upload_id, "PartNumber": number,
                    "ContentLength": size},
            ExpiresIn=ttl_s,
        )


def object_store() -> ObjectStore:
    """The store of the current settings (clients are cached; boto3 clients are thread-safe)."""
    return _object_store(settings.S3_ENDPOINT_URL, settings.S3_PUBLIC_ENDPOINT_URL, settings.S3_BUCKET,
                         settings.S3_REGION, settings.AWS_ACCESS_KEY_ID, settings.AWS_SECRET_ACCESS_KEY)


@functools.lru_cache(maxsize=4)
def _object_store(endpoint: str, public_endpoint: str, bucket: str, region: str, key_id: str,
                  secret: str) -> ObjectStore:
    return ObjectStore(_client(endpoint, region, key_id, secret), _client(public_endpoint, region, key_id, secret),
                       bucket)


def _client(endpoint: str, region: str, key_id: str, secret: str):
    import boto3
    from botocore.config import Config

    # SeaweedFS and MinIO want path-style addresses; AWS endpoints take virtual-hosted ones.
    style = "virtual" if (urlparse(endpoint).hostname or "").endswith("amazonaws.com") else "path"
    # A store that does not answer costs a call at most 2 x S3_TIMEOUT_S (botocore's defaults, 60 s reads and four
    # attempts, held a request four minutes on a frozen store); tasks retry on their own schedule (adapters.tasks).
    config = Config(signature_version="s3v4", s3={"addressing_style": style}, connect_timeout=3,
                    read_timeout=settings.S3_TIMEOUT_S, retries={"total_max_attempts": 2, "mode": "standard"})
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name=region, aws_access_key_id=key_id, aws_secret_access_key=secret,
        config=config,
    )

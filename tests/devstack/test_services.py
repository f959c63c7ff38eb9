"""The real local services the platform runs on: Redis and S3 (SeaweedFS)."""

import uuid

import boto3
import httpx
import pytest
import redis
from botocore.config import Config
from botocore.exceptions import ClientError
from django.conf import settings

from devstack.services import ensure_s3, s3_client


@pytest.fixture(scope="module")
def s3():
    return ensure_s3()


def test_redis_round_trip():
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"test:{uuid.uuid4()}"
    client.set(key, "value", ex=10)
    assert client.get(key) == b"value"
    assert client.incrby(key + ":n", 5) == 5
    client.delete(key, key + ":n")
    assert client.get(key) is None


def test_s3_put_get_and_presigned_url(s3):
    client = s3_client(s3)
    key = f"tests/{uuid.uuid4()}/hello.txt"
    client.put_object(Bucket=s3.bucket, Key=key, Body=b"hello adapters")
    try:
        assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"hello adapters"
        url = client.generate_presigned_url("get_object", Params={"Bucket": s3.bucket, "Key": key}, ExpiresIn=60)
        assert httpx.get(url).content == b"hello adapters"
        tampered = url.replace("X-Amz-Signature=", "X-Amz-Signature=0")
        assert httpx.get(tampered).status_code == 403
    finally:
        client.delete_object(Bucket=s3.bucket, Key=key)


def test_s3_presigned_put_is_refused_after_expiry(s3):
    client = s3_client(s3)
    key = f"tests/{uuid.uuid4()}/upload.bin"
    url = client.generate_presigned_url("put_object", Params={"Bucket": s3.bucket, "Key": key}, ExpiresIn=1)
    import time

    time.sleep(2.5)
    assert httpx.put(url, content=b"late").status_code == 403
    with pytest.raises(ClientError):
        client.head_object(Bucket=s3.bucket, Key=key)


def test_s3_refuses_a_wrong_secret(s3):
    client = boto3.client(
        "s3", endpoint_url=s3.endpoint_url, aws_access_key_id=s3.access_key,
        aws_secret_access_key="not-the-secret", region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    with pytest.raises(ClientError) as excinfo:
        client.put_object(Bucket=s3.bucket, Key="tests/forbidden.txt", Body=b"x")
    assert excinfo.value.response["Error"]["Code"] in {"SignatureDoesNotMatch", "AccessDenied", "InvalidAccessKeyId"}


def test_s3_bucket_allows_browser_uploads(s3):
    rules = s3_client(s3).get_bucket_cors(Bucket=s3.bucket)["CORSRules"]
    assert any("PUT" in rule["AllowedMethods"] and "ETag" in rule.get("ExposeHeaders", []) for rule in rules)

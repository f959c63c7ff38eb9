"""LoRARequest: the vLLM-shaped handle of an adapter version, validated on construction."""

from pathlib import Path

import pytest

from engine import LoRARequest

DIGEST = "ab" * 32


def test_fields_and_normalisation():
    req = LoRARequest("support-bot", 7, Path("/data/adapters/a"), sha256=DIGEST.upper())
    assert (req.name, req.id, req.path, req.sha256, req.is_s3) == (
        "support-bot", 7, "/data/adapters/a", DIGEST, False)
    s3 = LoRARequest(name="x", id="adp_6f1c_v3", path="s3://lora-adapters/tenants/t/adapters/u/v3/")
    assert s3.is_s3 and s3.sha256 is None
    assert LoRARequest("x", 7, "/a") == LoRARequest("x", 7, "/a")
    assert len({LoRARequest("x", 7, "/a"), LoRARequest("x", 7, "/a")}) == 1


@pytest.mark.parametrize("kwargs,needle", [
    ({"name": ""}, "name"),
    ({"id": 0}, "id"),
    ({"id": True}, "id"),
    ({"id": ""}, "id"),
    ({"id": "a\nb"}, "id"),
    ({"path": ""}, "path"),
    ({"path": "http://host/adapter"}, "path"),
    ({"path": "s3:///key"}, "path"),
    ({"path": "/a\x00b"}, "NUL"),
    ({"sha256": "abc"}, "sha256"),
    ({"sha256": "zz" * 32}, "sha256"),
])
def test_invalid_requests_are_refused(kwargs, needle):
    fields = {"name": "x", "id": 1, "path": "/a", **kwargs}
    with pytest.raises(ValueError, match=needle):
        LoRARequest(**fields)

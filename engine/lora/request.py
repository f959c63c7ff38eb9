"""``LoRARequest``: which adapter a request uses and where to fetch it (the shape vLLM users know)."""

import os
import re
from dataclasses import dataclass

_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_ID_CHARS = 200


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """An adapter version to serve.

    ``id`` is the cache key of every tier (an adapter version is immutable): a positive int or an opaque string
    such as ``"adp_6f1c_v3"``. ``path`` is a local folder or ``s3://bucket/prefix`` holding ``adapter_config.json``
    and ``adapter_model.safetensors``. ``sha256`` (hex, optional) is the expected digest of the safetensors file.
    """

    name: str
    id: int | str
    path: str
    sha256: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"LoRARequest.name must be a non-empty string, got {self.name!r}")
        _check_id(self.id)
        object.__setattr__(self, "path", _checked_path(self.path))
        if self.sha256 is not None:
            digest = self.sha256.lower() if isinstance(self.sha256, str) else self.sha256
            if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
                raise ValueError(f"LoRARequest.sha256 must be 64 hex digits, got {self.sha256!r}")
            object.__setattr__(self, "sha256", digest)

    @property
    def is_s3(self) -> bool:
        return self.path.startswith("s3://")


def _check_id(value: object) -> None:
    if type(value) is int:
        if value < 1:
            raise ValueError(f"LoRARequest.id must be a positive int or a non-empty string, got {value!r}")
        return
    if not isinstance(value, str) or not value or len(value) > _MAX_ID_CHARS or not value.isprintable():
        raise ValueError(
            f"LoRARequest.id must be a positive int or a printable string of 1..{_MAX_ID_CHARS} chars, got {value!r}"
        )


def _checked_path(path: object) -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise ValueError(f"LoRARequest.path must be a local folder or s3://bucket/prefix, got {path!r}")
    if "://" in path:
        bucket = path[len("s3://"):].split("/", 1)[0] if path.startswith("s3://") else ""
        if not bucket:
            raise ValueError(f"LoRARequest.path must be a local folder or s3://bucket/prefix, got {path!r}")
    if "\x00" in path:
        raise ValueError("LoRARequest.path contains a NUL byte")
    return path

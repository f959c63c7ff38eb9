"""Where adapters may be read from: the allow-list of source prefixes (``ENGINE_ADAPTER_SOURCES``).

A source is a local folder or ``s3://bucket/key``. Local paths are compared after resolving symlinks and ``..``;
S3 keys are compared segment by segment and may not contain ``.``/``..``/empty segments (some stores normalise
them, which would step outside the prefix). Anything else is refused with :class:`AdapterSourceNotAllowed`.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.lora.errors import AdapterSourceNotAllowed


@dataclass(frozen=True, slots=True)
class S3Location:
    bucket: str
    key: str  # without leading or trailing '/'; "" is the whole bucket

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def parse_s3_uri(uri: str) -> S3Location | None:
    """``s3://bucket/a/b/`` -> S3Location("bucket", "a/b"); None if malformed or a segment is ``.``/``..``/empty."""
    if not uri.startswith("s3://"):
        return None
    bucket, _, key = uri[len("s3://"):].partition("/")
    key = key.rstrip("/")
    if not bucket or (key and any(part in ("", ".", "..") for part in key.split("/"))):
        return None
    return S3Location(bucket, key)


class SourcePolicy:
    """The allowed source prefixes; :meth:`check` returns the parsed location or raises."""

    def __init__(self, prefixes: Iterable[str]):
        self._s3: list[S3Location] = []
        self._local: list[Path] = []
        for prefix in prefixes:
            if prefix.startswith("s3://"):
                location = parse_s3_uri(prefix)
                if location is None:
                    raise ValueError(f"malformed S3 source prefix {prefix!r}")
                self._s3.append(location)
            elif "://" in prefix or not prefix:
                raise ValueError(f"adapter source prefix must be a local folder or s3://bucket/prefix, got {prefix!r}")
            else:
                self._local.append(Path(prefix).resolve())

    def check(self, path: str) -> S3Location | Path:
        """The S3 location or resolved local path of ``path`` if it lies under an allowed prefix."""
        if path.startswith("s3://"):
            location = parse_s3_uri(path)
            if location is not None and any(_s3_under(location, p) for p in self._s3):
                return location
            raise AdapterSourceNotAllowed(path)
        if "://" in path:
            raise AdapterSourceNotAllowed(path)
        resolved = Path(path).resolve()
        if any(resolved.is_relative_to(prefix) for prefix in self._local):
            return resolved
        raise AdapterSourceNotAllowed(path)


def _s3_under(location: S3Location, prefix: S3Location) -> bool:
    if location.bucket != prefix.bucket:
        return False
    return not prefix.key or location.key == prefix.key or location.key.startswith(prefix.key + "/")

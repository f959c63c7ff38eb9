"""Load a PEFT adapter folder from a local path or ``s3://`` into host-memory tensors, checked before use.

Order of checks: the source against the allow-list (403), the folder listing (no pickles), the file size against
the largest adapter the engine could accept, the sha256 when given, then :func:`engine.lora.format.validate_adapter`
on the header, and only then the tensors are built (by the ``safetensors`` library, which executes nothing).
Blocking; the slot cache runs it on its loader thread.
"""

import hashlib
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors

from engine.lora.adapter_config import MAX_CONFIG_BYTES
from engine.lora.errors import AdapterLoadError
from engine.lora.format import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_WEIGHTS_NAME,
    AdapterFormatError,
    AdapterSpec,
    ModelFingerprint,
    check_adapter_files,
    max_adapter_bytes,
    parse_adapter_config,
    peft_tensor_name,
    validate_adapter,
)
from engine.lora.request import LoRARequest
from engine.lora.safetensors_header import parse_safetensors_header
from engine.lora.source import S3Location, SourcePolicy


@dataclass(frozen=True, slots=True)
class LoadedAdapter:
    """An adapter in host memory, its tensors stacked per module over all decoder layers."""

    request: LoRARequest
    spec: AdapterSpec
    sha256: str  # of adapter_model.safetensors: the content hash for prefix-cache keys
    lora_a: dict[str, torch.Tensor]  # module -> [num_layers, rank, in_features]; zero for layers not adapted
    lora_b: dict[str, torch.Tensor]  # module -> [num_layers, out_features, rank]
    load_ms: float

    @property
    def id(self) -> int | str:
        return self.request.id

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def scaling(self) -> float:
        return self.spec.scaling

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.lora_a.values(), *self.lora_b.values()))


class AdapterLoader:
    """Fetches and checks adapters for one base model. Thread-safe; S3 settings come from the environment.

    ``allowed_sources``: folder prefixes (local or ``s3://bucket/prefix``) adapters may come from.
    ``dtype``: the host tensors' dtype (the model's); ``pin_memory`` for fast copies to a CUDA device.
    """

    def __init__(
        self,
        fingerprint: ModelFingerprint,
        *,
        max_rank: int,
        allowed_sources: Iterable[str],
        dtype: torch.dtype = torch.float32,
        pin_memory: bool = False,
        s3_client=None,
    ):
        self.fingerprint = fingerprint
        self.max_rank = max_rank
        self.policy = SourcePolicy(allowed_sources)
        self.dtype = dtype
        self.pin_memory = pin_memory
        self.max_bytes = max_adapter_bytes(fingerprint, max_rank)
        self._s3_client = s3_client
        self._s3_lock = threading.Lock()

    def check_source(self, request: LoRARequest) -> None:
        """Raise :class:`AdapterSourceNotAllowed` now (the server answers 403 before queueing anything)."""
        self.policy.check(request.path)

    def load(self, request: LoRARequest) -> LoadedAdapter:
        """Fetch, verify and build the adapter; raises AdapterSourceNotAllowed, AdapterLoadError, AdapterFormatError."""
        start = time.perf_counter()
        location = self.policy.check(request.path)
        if isinstance(location, S3Location):
            config_raw, weights = self._read_s3(location)
        else:
            config_raw, weights = self._read_local(location, request.path)
        sha256 = hashlib.sha256(weights).hexdigest()
        if request.sha256 is not None and sha256 != request.sha256:
            raise AdapterLoadError(
                "sha256_mismatch", f"{ADAPTER_WEIGHTS_NAME} has sha256 {sha256}, expected {request.sha256}"
            )
        header = parse_safetensors_header(weights, len(weights))
        spec = validate_adapter(parse_adapter_config(config_raw), header, self.fingerprint, self.max_rank)
        lora_a, lora_b = self._stack(spec, load_safetensors(weights))
        return LoadedAdapter(request=request, spec=spec, sha256=sha256, lora_a=lora_a, lora_b=lora_b,
                             load_ms=(time.perf_counter() - start) * 1e3)

    def _stack(self, spec: AdapterSpec, tensors: dict[str, torch.Tensor]):
        lora_a, lora_b = {}, {}
        num_layers = self.fingerprint.num_hidden_layers
        for module in spec.target_modules:
            a = torch.zeros(num_layers, *spec.a_shape(module), dtype=self.dtype)  # [layers, rank, in]
            b = torch.zeros(num_layers, *spec.b_shape(module), dtype=self.dtype)  # [layers, out, rank]
            for layer in spec.layers[module]:
                a[layer] = _finite(tensors, peft_tensor_name(layer, module, "A"))
                b[layer] = _finite(tensors, peft_tensor_name(layer, module, "B"))
            lora_a[module] = a.pin_memory() if self.pin_memory else a
            lora_b[module] = b.pin_memory() if self.pin_memory else b
        return lora_a, lora_b

    def _check_size(self, size: int) -> None:
        if size > self.max_bytes:
            raise AdapterFormatError(
                "file_too_large", f"{ADAPTER_WEIGHTS_NAME} is {size} bytes, over the {self.max_bytes}-byte limit"
            )

    def _read_local(self, folder: Path, given: str) -> tuple[bytes, bytes]:
        if not folder.is_dir():
            raise AdapterLoadError("not_found", f"no adapter folder at {given}")
        check_adapter_files(p.name for p in folder.iterdir() if p.is_file())
        files = [folder / ADAPTER_CONFIG_NAME, folder / ADAPTER_WEIGHTS_NAME]
        for file in files:  # a symlink inside an allowed folder must not lead outside the allow-list
            self.policy.check(str(file.resolve()))
        self._check_size(os.path.getsize(files[1]))
        return files[0].read_bytes(), files[1].read_bytes()

    def _read_s3(self, location: S3Location) -> tuple[bytes, bytes]:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self._client()
        folder = f"{location.key}/" if location.key else ""
        try:
            listing = client.list_objects_v2(Bucket=location.bucket, Prefix=folder, Delimiter="/", MaxKeys=1000)
            # Stores such as SeaweedFS keep a "folder/" marker object after its files are deleted: not a file.
            sizes = {obj["Key"][len(folder):]: obj["Size"] for obj in listing.get("Contents", [])
                     if obj["Key"] != folder and not obj["Key"].endswith("/")}
            if not sizes:
                raise AdapterLoadError("not_found", f"no adapter at {location.uri}")
            check_adapter_files(sizes)
            self._check_size(sizes[ADAPTER_WEIGHTS_NAME])
            # Read at most one byte over each limit: the objects may have changed since the listing.
            config = self._get(client, location.bucket, folder + ADAPTER_CONFIG_NAME, MAX_CONFIG_BYTES + 1)
            weights = self._get(client, location.bucket, folder + ADAPTER_WEIGHTS_NAME, self.max_bytes + 1)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "NoSuchBucket", "404"):
                raise AdapterLoadError("not_found", f"no adapter at {location.uri} ({code})") from None
            raise AdapterLoadError("store_unreachable", f"object store refused {location.uri}: {code}") from None
        except BotoCoreError as exc:
            raise AdapterLoadError("store_unreachable", f"object store unreachable for {location.uri}: {exc}") from None
        self._check_size(len(weights))
        return config, weights

    @staticmethod
    def _get(client, bucket: str, key: str, max_bytes: int) -> bytes:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read(max_bytes)

    def _client(self):
        with self._s3_lock:
            if self._s3_client is None:
                self._s3_client = s3_client_from_env()
            return self._s3_client


def _finite(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    tensor = tensors[name]
    if not torch.isfinite(tensor).all():
        raise AdapterFormatError("non_finite_weights", f"tensor {name!r} holds NaN or infinite values")
    return tensor


def s3_client_from_env():
    """A boto3 S3 client from ``S3_ENDPOINT_URL`` (path-style, for SeaweedFS/MinIO) and the ``AWS_*`` variables."""
    import boto3
    from botocore.config import Config

    endpoint = os.environ.get("S3_ENDPOINT_URL") or None
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("S3_REGION") or "us-east-1"
    config = Config(signature_version="s3v4", s3={"addressing_style": "path" if endpoint else "auto"},
                    connect_timeout=5, read_timeout=30, retries={"max_attempts": 2})
    return boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=region, config=config)

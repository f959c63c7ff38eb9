"""The checks of an upload on local disk: from the uploaded files (or archive) to a validated normalized folder.

Torch-free. The rules are :mod:`engine.lora.format`'s (the engine's own); this module only decides what the
upload is (two files or an archive), unpacks archives safely (:mod:`adapters.archive`), writes the normalized
folder and hashes the weights. Every refusal is an :class:`AdapterFormatError` with a stable ``code``.
"""

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from adapters.archive import unpack_adapter_archive
from engine.lora.adapter_config import MAX_CONFIG_BYTES
from engine.lora.format import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_WEIGHTS_NAME,
    AdapterFormatError,
    AdapterSpec,
    ModelFingerprint,
    check_adapter_files,
    max_adapter_bytes,
    parse_adapter_config,
    validate_adapter_dir,
)

ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
# Room for what PEFT folders often carry besides the adapter (README, tokenizer files); never stored.
EXTRA_FILES_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class ReceivedFile:
    name: str  # the client's file name (messages only)
    path: Path  # where its bytes are on local disk


@dataclass(frozen=True, slots=True)
class ValidatedAdapter:
    folder: Path  # exactly adapter_config.json and adapter_model.safetensors
    spec: AdapterSpec
    sha256: str  # of adapter_model.safetensors
    size_bytes: int  # of both files


def is_archive_upload(names: list[str]) -> bool:
    return len(names) == 1 and names[0].lower().endswith(ARCHIVE_SUFFIXES)


def max_unpacked_bytes(fingerprint: ModelFingerprint, max_rank: int) -> int:
    """The most an archive may unpack to: the largest acceptable adapter plus its config and extras."""
    return max_adapter_bytes(fingerprint, max_rank) + MAX_CONFIG_BYTES + EXTRA_FILES_BYTES


def validate_upload(files: list[ReceivedFile], workdir: Path, fingerprint: ModelFingerprint,
                    max_rank: int) -> ValidatedAdapter:
    """Unpack (if an archive), normalize and validate; the result's folder is inside ``workdir``."""
    folder = workdir / "normalized"
    folder.mkdir()
    if is_archive_upload([f.name for f in files]):
        raw = workdir / "unpacked"
        raw.mkdir()
        unpack_adapter_archive(files[0].path, raw, max_total_bytes=max_unpacked_bytes(fingerprint, max_rank))
        sources = {name: raw / name for name in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME)}
    else:
        sources = _folder_files(files)
    _write_config(sources[ADAPTER_CONFIG_NAME], folder / ADAPTER_CONFIG_NAME)
    shutil.copyfile(sources[ADAPTER_WEIGHTS_NAME], folder / ADAPTER_WEIGHTS_NAME)
    spec = validate_adapter_dir(folder, fingerprint, max_rank)
    weights = folder / ADAPTER_WEIGHTS_NAME
    return ValidatedAdapter(
        folder=folder, spec=spec, sha256=file_sha256(weights),
        size_bytes=weights.stat().st_size + (folder / ADAPTER_CONFIG_NAME).stat().st_size,
    )


def _folder_files(files: list[ReceivedFile]) -> dict[str, Path]:
    names = [f.name for f in files]
    check_adapter_files(names)
    for wanted in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME):
        if names.count(wanted) > 1:
            raise AdapterFormatError("duplicate_file", f"{wanted} was uploaded {names.count(wanted)} times")
    return {f.name: f.path for f in files if f.name in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME)}


def _write_config(source: Path, target: Path) -> None:
    """Store the config re-serialized, so the bytes engines read are exactly the ones validated here."""
    size = source.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise AdapterFormatError("config_invalid", f"{ADAPTER_CONFIG_NAME} is {size} bytes, over {MAX_CONFIG_BYTES}")
    config = parse_adapter_config(source.read_bytes())
    try:
        text = json.dumps(config, indent=2, sort_keys=True, allow_nan=False)
    except ValueError as exc:
        raise AdapterFormatError("config_invalid", f"{ADAPTER_CONFIG_NAME} holds a non-finite number: {exc}") from None
    target.write_text(text + "\n")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

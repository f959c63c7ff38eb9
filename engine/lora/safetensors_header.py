"""Read a safetensors header by hand: names, dtypes, shapes and offsets, without loading a tensor.

Torch-free and executes nothing from the file. Hand-written because the ``safetensors`` package only parses a
header through a framework (torch/numpy) and does not report *why* a file is malformed in a form we can show
users. Layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N, N bytes of
JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?: {str: str}}``, then the data;
offsets are relative to the data section, which tensors must cover exactly, without gaps or overlaps.
"""

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from engine.lora.errors import AdapterFormatError

# An adapter's header lists two tensors per adapted projection (~150 bytes each): 4 MiB covers 10,000+ tensors.
MAX_HEADER_BYTES = 4 << 20
DTYPE_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}
# torch.save writes a zip archive (new format) or a bare pickle stream (protocol 2+ starts with 0x80).
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_MAGICS = tuple(bytes([0x80, protocol]) for protocol in range(2, 6))


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offset in the data section
    end: int


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    tensors: Mapping[str, TensorEntry]
    metadata: Mapping[str, str]
    header_size: int  # N, the JSON's length
    file_size: int

    @property
    def data_offset(self) -> int:
        """Where the data section starts in the file."""
        return 8 + self.header_size


def read_safetensors_header(path: str | os.PathLike, name: str = "adapter_model.safetensors") -> SafetensorsHeader:
    """Parse the header of the file at ``path``, reading only its first ``8 + N`` bytes."""
    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(9)  # the header's length and its first byte
        header_size = _header_size(head, file_size, name)
        return parse_safetensors_header(head + f.read(header_size - 1), file_size, name)


def parse_safetensors_header(
    prefix: bytes, file_size: int, name: str = "adapter_model.safetensors"
) -> SafetensorsHeader:
    """Parse a header from the file's first bytes (at least ``8 + N``; the whole file is fine) and its size.

    Raises :class:`AdapterFormatError` with code ``pickle_weights``, ``truncated``, ``header_too_large``,
    ``header_invalid`` or ``unsupported_dtype``.
    """
    header_size = _header_size(prefix[:9], file_size, name)
    if len(prefix) < 8 + header_size:
        raise ValueError(f"need the first {8 + header_size} bytes of {name}, got {len(prefix)}")
    raw = _decode_json(prefix[8 : 8 + header_size], name)
    metadata = raw.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise AdapterFormatError("header_invalid", f"__metadata__ of {name} must map strings to strings")
    tensors = {key: _tensor_entry(key, value, name) for key, value in raw.items()}
    _check_offsets(tensors, file_size - 8 - header_size, name)
    return SafetensorsHeader(tensors=tensors, metadata=metadata, header_size=header_size, file_size=file_size)


def _header_size(head: bytes, file_size: int, name: str) -> int:
    """N from the file's first 9 bytes (8 when the file is that short). A pickle's magic bytes can also begin a
    real safetensors file (a header of 640 bytes starts 0x80 0x02), so a file whose length field fits the file and
    whose JSON starts right after it is read as safetensors whatever its first bytes."""
    claimed = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    shaped = len(head) >= 9 and head[8:9] == b"{" and 2 <= claimed <= file_size - 8
    if not shaped and (head.startswith(_ZIP_MAGIC) or head.startswith(_PICKLE_MAGICS)):
        raise AdapterFormatError(
            "pickle_weights", f"{name} is a pickle (torch.save) file, not safetensors; pickle weights are refused"
        )
    if file_size < 8 or len(head) < 8:
        raise AdapterFormatError("truncated", f"{name} is {file_size} bytes, shorter than its 8-byte header length")
    header_size = int.from_bytes(head[:8], "little")
    if header_size > MAX_HEADER_BYTES:
        raise AdapterFormatError(
            "header_too_large", f"{name} claims a {header_size}-byte header, over the {MAX_HEADER_BYTES}-byte limit"
        )
    if header_size < 2:
        raise AdapterFormatError("header_invalid", f"{name} claims a {header_size}-byte header")
    if 8 + header_size > file_size:
        raise AdapterFormatError(
            "truncated", f"{name} claims a {header_size}-byte header but the file has {file_size} bytes"
        )
    return header_size


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def _decode_json(raw: bytes, name: str) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AdapterFormatError("header_invalid", f"header of {name} is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise AdapterFormatError("header_invalid", f"header of {name} is not a JSON object")
    return header


def _is_index(value: object) -> bool:
    return type(value) is int and value >= 0


def _tensor_entry(key: str, value: object, name: str) -> TensorEntry:
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data_offsets"}:
        raise AdapterFormatError(
            "header_invalid", f"entry {key!r} of {name} must have exactly dtype, shape and data_offsets"
        )
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if dtype not in DTYPE_SIZES:
        raise AdapterFormatError("unsupported_dtype", f"tensor {key!r} of {name} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or len(shape) > 8 or not all(_is_index(d) for d in shape):
        raise AdapterFormatError("header_invalid", f"tensor {key!r} of {name} has an invalid shape {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_index(o) for o in offsets):
        raise AdapterFormatError("header_invalid", f"tensor {key!r} of {name} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != expected:
        raise AdapterFormatError(
            "header_invalid",
            f"tensor {key!r} of {name} spans bytes {begin}..{end} but {dtype} {shape} needs {expected} bytes",
        )
    return TensorEntry(name=key, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _check_offsets(tensors: dict[str, TensorEntry], data_size: int, name: str) -> None:
    position = 0
    for entry in sorted(tensors.values(), key=lambda e: (e.begin, e.end)):
        if entry.begin != position:
            raise AdapterFormatError(
                "header_invalid", f"tensor {entry.name!r} of {name} starts at byte {entry.begin}, expected {position} "
                "(tensors overlap or leave a gap)"
            )
        position = entry.end
    if position > data_size:
        raise AdapterFormatError(
            "truncated", f"{name} is truncated: its tensors need {position} bytes of data, the file has {data_size}"
        )
    if position < data_size:
        raise AdapterFormatError(
            "header_invalid", f"{name} has {data_size - position} bytes after its last tensor"
        )

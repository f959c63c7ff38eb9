"""Archives for the upload tests: well-formed ones of an adapter folder, and the hostile kinds (path traversal,
absolute paths, links, too many entries, zip and gzip bombs). The bombs are written directly as deflate
blocks of zeros, so a 1 GiB bomb costs a few milliseconds and a few kilobytes."""

import io
import stat
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path

MiB = 1 << 20


def zip_folder(folder: Path, out: Path, *, top: str | None = None) -> Path:
    """The folder's files in a zip, at its root or under ``top/``."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(Path(folder).iterdir()):
            archive.write(file, f"{top}/{file.name}" if top else file.name)
    return out


def tar_gz_folder(folder: Path, out: Path, *, top: str | None = None) -> Path:
    with tarfile.open(out, "w:gz") as archive:
        for file in sorted(Path(folder).iterdir()):
            archive.add(file, f"{top}/{file.name}" if top else file.name)
    return out


def zip_entries(out: Path, entries: list[tuple[str, bytes]], *, symlinks: dict[str, str] | None = None) -> Path:
    """A zip of raw entries; ``symlinks`` maps entry names to link targets (stored as unix symlinks)."""
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in entries:
            archive.writestr(zipfile.ZipInfo(name), data)  # ZipInfo keeps the name as given, '..' included
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return out


def tar_gz_entries(out: Path, entries: list[tuple[str, bytes]], *, symlinks: dict[str, str] | None = None,
                   hardlinks: dict[str, str] | None = None) -> Path:
    with tarfile.open(out, "w:gz") as archive:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for kind, links in ((tarfile.SYMTYPE, symlinks or {}), (tarfile.LNKTYPE, hardlinks or {})):
            for name, target in links.items():
                info = tarfile.TarInfo(name)
                info.type, info.linkname = kind, target
                archive.addfile(info)
    return out


def _zero_deflate(num_mib: int, tail: bytes = b"") -> bytes:
    """A raw deflate stream of ``num_mib`` MiB of zeros, then ``tail``."""
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    zeros = block.compress(bytes(MiB)) + block.flush(zlib.Z_FULL_FLUSH)  # independent of what precedes it
    last = zlib.compressobj(9, zlib.DEFLATED, -15)
    return zeros * num_mib + last.compress(tail) + last.flush()


def _crc_of_zeros(num_mib: int, crc: int = 0) -> int:
    chunk = bytes(MiB)
    for _ in range(num_mib):
        crc = zlib.crc32(chunk, crc)
    return crc


def zip_bomb(out: Path, *, name: str = "adapter_model.safetensors", num_mib: int = 1024,
             config: bytes = b"{}") -> Path:
    """A valid zip whose ``name`` entry inflates to ``num_mib`` MiB of zeros, beside a small adapter_config.json."""
    entries = [("adapter_config.json", 0, config, zlib.crc32(config), len(config)),
               (name, 8, _zero_deflate(num_mib), _crc_of_zeros(num_mib), num_mib * MiB)]
    body, central = bytearray(), bytearray()
    for entry_name, method, payload, entry_crc, size in entries:
        encoded = entry_name.encode()
        offset = len(body)
        body += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, entry_crc, len(payload), size,
                            len(encoded), 0) + encoded + payload
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, entry_crc,
                               len(payload), size, len(encoded), 0, 0, 0, 0, 0o100644 << 16, offset) + encoded
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), len(body), 0)
    out.write_bytes(bytes(body + central + end))
    return out


def tar_gz_bomb(out: Path, *, name: str = "adapter_model.safetensors", num_mib: int = 1024) -> Path:
    """A valid .tar.gz whose one member is ``num_mib`` MiB of zeros."""
    info = tarfile.TarInfo(name)
    info.size = num_mib * MiB
    header = info.tobuf(format=tarfile.PAX_FORMAT)
    first = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = first.compress(header) + first.flush(zlib.Z_FULL_FLUSH)
    end_blocks = bytes(2 * tarfile.BLOCKSIZE)
    zeros = _zero_deflate(num_mib, tail=end_blocks)
    crc = zlib.crc32(end_blocks, _crc_of_zeros(num_mib, zlib.crc32(header)))
    total = len(header) + num_mib * MiB + len(end_blocks)
    gzip_header = b"\x1f\x8b\x08\x00" + b"\x00" * 4 + b"\x00\xff"
    out.write_bytes(gzip_header + head + zeros + struct.pack("<II", crc & 0xFFFFFFFF, total & 0xFFFFFFFF))
    return out

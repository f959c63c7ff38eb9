"""Safe unpacking of an uploaded adapter archive (.zip or .tar.gz): only the two adapter files come out.

Refused, each with its own code: entries with ``..``, absolute or drive paths (``archive_unsafe_path``);
symlinks, hard links and special files (``archive_link``); more than :data:`MAX_ENTRIES` entries
(``archive_too_many_entries``); more unpacked bytes than the caller's cap, zip bombs included, checked from the
declared sizes before any byte is inflated and again while inflating (``archive_too_large``); anything
unreadable (``archive_invalid``). The archive may hold the files at its root or inside one top folder; other
files (a README) are ignored, pickles anywhere are refused by :func:`engine.lora.format.check_adapter_files`.
"""

import gzip
import shutil
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from engine.lora.format import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_WEIGHTS_NAME,
    PICKLE_SUFFIXES,
    AdapterFormatError,
    check_adapter_files,
)

MAX_ENTRIES = 64  # a PEFT folder has 2-4 files; room for a README, a tokenizer and folders
_WANTED = (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME)
_TAR_SLACK = 1 << 20  # tar headers and padding beyond the files' own bytes
_ZIP_EOCD = b"PK\x05\x06"


class ArchiveError(AdapterFormatError):
    """The archive cannot be unpacked safely; ``code`` names the rule it broke."""


def archive_kind(path: Path) -> str | None:
    """"zip" or "tar.gz" from the file's first bytes (never its name), else None."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(b"PK\x03\x04") or head.startswith(_ZIP_EOCD):
        return "zip"
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    return None


def unpack_adapter_archive(path: Path, dest: Path, *, max_total_bytes: int) -> list[str]:
    """Extract the archive's adapter_config.json and adapter_model.safetensors into ``dest`` (a folder).

    Returns the archive's file paths relative to its adapter folder. Raises :class:`ArchiveError` or
    :class:`AdapterFormatError` (pickles, missing files)."""
    kind = archive_kind(path)
    try:
        if kind == "zip":
            names = _unpack_zip(path, dest, max_total_bytes)
        elif kind == "tar.gz":
            names = _unpack_tar_gz(path, dest, max_total_bytes)
        else:
            raise ArchiveError("archive_invalid", "the upload is neither a .zip nor a .tar.gz archive")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError,
            NotImplementedError, RuntimeError, UnicodeDecodeError) as exc:
        raise ArchiveError("archive_invalid", f"the {kind} archive is corrupt or unsupported: {exc}") from None
    return names


def _member_path(name: str) -> PurePosixPath:
    """The entry's path, or ArchiveError if it could land outside the destination."""
    normalized = name.replace("\\", "/")
    path = PurePosixPath(normalized)
    if "\x00" in name or normalized.startswith("/") or (len(normalized) > 1 and normalized[1] == ":"):
        raise ArchiveError("archive_unsafe_path", f"archive entry {name!r} has an absolute path")
    if ".." in path.parts:
        raise ArchiveError("archive_unsafe_path", f"archive entry {name!r} steps out of the archive ('..')")
    return path


class _Layout:
    """Entries seen so far: counts, declared sizes, file paths; enforces the caps as they come."""

    def __init__(self, max_total_bytes: int):
        self.max_total_bytes = max_total_bytes
        self.num_entries = 0
        self.total_bytes = 0
        self.files: list[PurePosixPath] = []

    def add(self, name: str, *, is_file: bool, size: int) -> PurePosixPath:
        path = _member_path(name)
        self.num_entries += 1
        if self.num_entries > MAX_ENTRIES:
            raise ArchiveError("archive_too_many_entries", f"the archive has more than {MAX_ENTRIES} entries")
        if is_file:
            if not path.parts:
                raise ArchiveError("archive_invalid", f"archive entry {name!r} is a file without a name")
            self.total_bytes += size
            if self.total_bytes > self.max_total_bytes:
                raise ArchiveError(
                    "archive_too_large",
                    f"the archive unpacks to more than {self.max_total_bytes} bytes (zip bomb or not an adapter)",
                )
            if path in self.files:
                raise ArchiveError("archive_invalid", f"archive entry {name!r} appears twice")
            self.files.append(path)
        return path

    def top_folder(self) -> PurePosixPath | None:
        """The one folder every file sits in, if there is one (archives of a folder), else None."""
        tops = {p.parts[0] for p in self.files}
        if len(tops) == 1 and all(len(p.parts) > 1 for p in self.files):
            return PurePosixPath(tops.pop())
        return None

    def relative_names(self) -> list[str]:
        top = self.top_folder()
        return [str(p.relative_to(top)) if top else str(p) for p in self.files]

    def check(self) -> list[str]:
        """The adapter files must be at the (folder's) root; pickles are refused anywhere."""
        names = self.relative_names()
        root = [n for n in names if "/" not in n]
        nested_pickles = [n for n in names if "/" in n and n.lower().endswith(PICKLE_SUFFIXES)]
        check_adapter_files([*root, *nested_pickles])
        return names

    def wanted(self, path: PurePosixPath) -> str | None:
        """Which adapter file this entry is (at the adapter folder's root), or None."""
        top = self.top_folder()
        relative = path.relative_to(top) if top and path.is_relative_to(top) else path
        return relative.name if len(relative.parts) == 1 and relative.name in _WANTED else None


def _copy_exactly(src, dest_file: Path, size: int, name: str) -> None:
    with open(dest_file, "wb") as out:
        shutil.copyfileobj(_Capped(src, size, name), out)
        copied = out.tell()
    if copied != size:
        raise ArchiveError("archive_invalid", f"archive entry {name!r} holds {copied} bytes, declared {size}")


class _Capped:
    """A reader that refuses to give more than ``limit`` bytes (inflation past the declared size)."""

    def __init__(self, raw, limit: int, what: str):
        self.raw, self.limit, self.what, self.count = raw, limit, what, 0

    def read(self, size: int = -1) -> bytes:
        chunk = self.raw.read(1 << 20 if size is None or size < 0 else size)
        self.count += len(chunk)
        if self.count > self.limit:
            raise ArchiveError("archive_too_large", f"{self.what} inflates past {self.limit} bytes")
        return chunk


# ---------------------------------------------------------------- zip


def _zip_declared_entries(path: Path) -> int:
    """The entry count of the end-of-central-directory record, read before zipfile loads the whole directory."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - (22 + 0xFFFF)))
        tail = f.read()
    at = tail.rfind(_ZIP_EOCD)
    if at < 0 or len(tail) - at < 22:
        raise ArchiveError("archive_invalid", "the zip archive has no end-of-central-directory record")
    (total,) = struct.unpack("<H", tail[at + 10 : at + 12])
    return total  # 0xFFFF (zip64) reads as "too many", which it is for an adapter


def _unpack_zip(path: Path, dest: Path, max_total_bytes: int) -> list[str]:
    if _zip_declared_entries(path) > MAX_ENTRIES:
        raise ArchiveError("archive_too_many_entries", f"the archive has more than {MAX_ENTRIES} entries")
    layout = _Layout(max_total_bytes)
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        for info in infos:
            mode = info.external_attr >> 16
            if (mode & 0o170000) == 0o120000:
                raise ArchiveError("archive_link", f"archive entry {info.filename!r} is a symlink")
            if info.flag_bits & 0x1:
                raise ArchiveError("archive_invalid", f"archive entry {info.filename!r} is encrypted")
            layout.add(info.filename, is_file=not info.is_dir(), size=info.file_size)
        names = layout.check()
        for info in infos:
            target = None if info.is_dir() else layout.wanted(_member_path(info.filename))
            if target:
                with archive.open(info) as src:
                    _copy_exactly(src, dest / target, info.file_size, info.filename)
    return names


# ---------------------------------------------------------------- tar.gz


def _unpack_tar_gz(path: Path, dest: Path, max_total_bytes: int) -> list[str]:
    layout = _Layout(max_total_bytes)
    staged: dict[str, PurePosixPath] = {}
    # Inflate ourselves and cap the inflated stream: tarfile would otherwise read a huge PAX or long-name
    # header into memory before we ever see the entry.
    limit = max_total_bytes + MAX_ENTRIES * 1024 + _TAR_SLACK
    with gzip.open(path, "rb") as inflated:
        stream = _Capped(inflated, limit, "the .tar.gz archive")
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                _check_tar_member(member)
                member_path = layout.add(member.name, is_file=member.isreg(), size=member.size)
                if member.isreg() and member_path.name in _WANTED:
                    # The top folder is known only at the end: keep each candidate under a private name.
                    spot = dest / f".entry-{len(staged)}"
                    _copy_exactly(archive.extractfile(member), spot, member.size, member.name)
                    staged[spot.name] = member_path
    names = layout.check()
    for spot_name, member_path in staged.items():
        target = layout.wanted(member_path)
        if target:
            (dest / spot_name).replace(dest / target)
        else:
            (dest / spot_name).unlink()
    return names


def _check_tar_member(member: tarfile.TarInfo) -> None:
    if member.issym() or member.islnk():
        raise ArchiveError("archive_link", f"archive entry {member.name!r} is a link to {member.linkname!r}")
    if member.issparse() or not (member.isreg() or member.isdir()):
        raise ArchiveError("archive_invalid", f"archive entry {member.name!r} is not a regular file or folder")

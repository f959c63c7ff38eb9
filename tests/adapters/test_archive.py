"""Safe unpacking of adapter archives: good layouts come out as the two files, every hostile kind is refused
with its own code before anything lands outside the destination."""

import zipfile
from pathlib import Path

import pytest

from adapters.archive import MAX_ENTRIES, ArchiveError, archive_kind, unpack_adapter_archive
from engine.lora.format import AdapterFormatError
from tests.adapters import archives

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
CAP = 64 << 20


@pytest.fixture
def dest(tmp_path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


def _assert_unpacked(dest: Path, good: Path) -> None:
    assert sorted(p.name for p in dest.iterdir()) == [CONFIG, WEIGHTS]
    for name in (CONFIG, WEIGHTS):
        assert (dest / name).read_bytes() == (good / name).read_bytes()


@pytest.mark.parametrize("top", [None, "my-adapter"])
@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_a_folder_archived_at_root_or_in_one_folder_unpacks_to_the_two_files(tiny_good_adapter, tmp_path, dest,
                                                                              kind, top):
    maker = archives.zip_folder if kind == "zip" else archives.tar_gz_folder
    archive = maker(tiny_good_adapter, tmp_path / f"a.{kind}", top=top)
    assert archive_kind(archive) == kind
    names = unpack_adapter_archive(archive, dest, max_total_bytes=CAP)
    assert sorted(names) == ["README.md", CONFIG, WEIGHTS]  # PEFT's README rides along but is not extracted
    _assert_unpacked(dest, tiny_good_adapter)


def test_tar_made_with_dot_prefixes_unpacks(tiny_good_adapter, tmp_path, dest):
    import tarfile

    archive = tmp_path / "dot.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tiny_good_adapter, ".")  # entries "./", "./adapter_config.json", ...
    unpack_adapter_archive(archive, dest, max_total_bytes=CAP)
    _assert_unpacked(dest, tiny_good_adapter)


@pytest.mark.parametrize(("case", "code"), [
    ("zip_slip", "archive_unsafe_path"), ("zip_absolute_path", "archive_unsafe_path"),
    ("tar_slip", "archive_unsafe_path"), ("zip_symlink", "archive_link"), ("tar_symlink", "archive_link"),
    ("tar_hardlink", "archive_link"), ("zip_bomb", "archive_too_large"), ("tar_gz_bomb", "archive_too_large"),
    ("too_many_entries", "archive_too_many_entries"), ("not_an_archive", "archive_invalid"),
])
def test_hostile_archives_are_refused_and_nothing_escapes(tiny_cases, tmp_path, case, code):
    dest = tmp_path / "deep" / "out"
    dest.mkdir(parents=True)
    with pytest.raises(ArchiveError) as caught:
        unpack_adapter_archive(tiny_cases[case].files[0], dest, max_total_bytes=CAP)
    assert caught.value.code == code
    assert tiny_cases[case].reason in caught.value.message
    assert not (tmp_path / "deep" / CONFIG).exists() and not (tmp_path / CONFIG).exists()
    assert not any(p.is_symlink() for p in dest.iterdir())


def test_a_bomb_is_refused_from_its_declared_size_without_inflating(tmp_path, dest, monkeypatch):
    bomb = archives.zip_bomb(tmp_path / "bomb.zip", num_mib=8)
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *a, **k: pytest.fail("an entry was inflated"))
    with pytest.raises(ArchiveError, match="more than 4194304 bytes") as caught:
        unpack_adapter_archive(bomb, dest, max_total_bytes=4 << 20)
    assert caught.value.code == "archive_too_large"


def test_a_tar_entry_inflating_past_its_declared_size_is_caught(tmp_path, dest):
    # A gzip bomb whose tar header is itself huge (a PAX header of 64 MiB) never gets read into memory whole.
    import io
    import tarfile

    archive = tmp_path / "pax.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(CONFIG)
        info.pax_headers = {"comment": "x" * (8 << 20)}
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ArchiveError) as caught:
        unpack_adapter_archive(archive, dest, max_total_bytes=1 << 20)
    assert caught.value.code == "archive_too_large"


def test_zip_entry_count_is_checked_before_the_directory_is_loaded(tmp_path, dest, monkeypatch):
    archive = archives.zip_entries(tmp_path / "many.zip", [(f"{i}.txt", b"") for i in range(MAX_ENTRIES + 1)])
    monkeypatch.setattr(zipfile, "ZipFile", lambda *a, **k: pytest.fail("the central directory was loaded"))
    with pytest.raises(ArchiveError) as caught:
        unpack_adapter_archive(archive, dest, max_total_bytes=CAP)
    assert caught.value.code == "archive_too_many_entries"


def test_pickles_anywhere_in_an_archive_are_refused(tiny_good_adapter, tmp_path, dest):
    config, weights = (tiny_good_adapter / CONFIG).read_bytes(), (tiny_good_adapter / WEIGHTS).read_bytes()
    archive = archives.zip_entries(tmp_path / "p.zip", [(CONFIG, config), (WEIGHTS, weights),
                                                        ("checkpoint/optimizer.pt", b"\x80\x04junk")])
    with pytest.raises(AdapterFormatError, match="optimizer.pt") as caught:
        unpack_adapter_archive(archive, dest, max_total_bytes=CAP)
    assert caught.value.code == "pickle_weights"


@pytest.mark.parametrize(("entries", "code", "fragment"), [
    ([("nested/deeper/" + CONFIG, b"{}"), ("nested/" + WEIGHTS, b"")], "missing_config", "adapter_config.json"),
    ([(CONFIG, b"{}"), (CONFIG, b"{}"), (WEIGHTS, b"")], "archive_invalid", "appears twice"),
    ([(CONFIG, b"{}")], "missing_weights", "adapter_model.safetensors is missing"),
])
def test_layout_mistakes_are_named(tmp_path, dest, entries, code, fragment):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name we write on purpose
        archive = archives.zip_entries(tmp_path / "l.zip", entries)
    with pytest.raises(AdapterFormatError, match=fragment) as caught:
        unpack_adapter_archive(archive, dest, max_total_bytes=CAP)
    assert caught.value.code == code


def test_a_corrupt_zip_is_archive_invalid(tiny_good_adapter, tmp_path, dest):
    archive = archives.zip_folder(tiny_good_adapter, tmp_path / "c.zip")
    with zipfile.ZipFile(archive) as z:
        start = z.getinfo(WEIGHTS).header_offset + 200
    data = bytearray(archive.read_bytes())
    data[start:start + 200] = bytes(200)  # inside the compressed weights: inflating or the CRC check fails
    archive.write_bytes(bytes(data))
    with pytest.raises(ArchiveError) as caught:
        unpack_adapter_archive(archive, dest, max_total_bytes=CAP)
    assert caught.value.code == "archive_invalid"

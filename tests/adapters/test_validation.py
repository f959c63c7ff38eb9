"""The on-disk checks of an upload (no database, no S3): good uploads become the normalized folder with its spec
and digest; every bad input below is refused with its own code and a precise reason."""

import hashlib
import json

import pytest

from adapters.validation import ReceivedFile, max_unpacked_bytes, validate_upload
from engine.lora.format import AdapterFormatError, max_adapter_bytes
from tests.adapters import archives
from tests.adapters.cases import CONFIG, WEIGHTS

BAD_CASES = ["pickle_bin", "renamed_pickle", "renamed_legacy_pickle", "truncated", "huge_header", "wrong_shape",
             "rank_over_limit", "unknown_module", "modules_to_save", "other_base_model", "missing_config",
             "zip_slip", "zip_absolute_path", "tar_slip", "zip_symlink", "tar_symlink", "tar_hardlink", "zip_bomb",
             "tar_gz_bomb", "too_many_entries", "not_an_archive"]


def received(*paths) -> list[ReceivedFile]:
    return [ReceivedFile(name=p.name, path=p) for p in paths]


@pytest.mark.parametrize("upload", ["folder", "zip", "tar.gz", "zip-in-folder"])
def test_a_good_adapter_becomes_the_normalized_folder(tiny_good_adapter, tiny_fingerprint, tmp_path, upload):
    if upload == "folder":
        files = received(tiny_good_adapter / CONFIG, tiny_good_adapter / WEIGHTS, tiny_good_adapter / "README.md")
    elif upload == "tar.gz":
        files = received(archives.tar_gz_folder(tiny_good_adapter, tmp_path / "a.tar.gz"))
    else:
        top = "my-adapter" if upload == "zip-in-folder" else None
        files = received(archives.zip_folder(tiny_good_adapter, tmp_path / "a.zip", top=top))
    work = tmp_path / "work"
    work.mkdir()
    result = validate_upload(files, work, tiny_fingerprint, max_rank=64)
    weights = (tiny_good_adapter / WEIGHTS).read_bytes()
    assert sorted(p.name for p in result.folder.iterdir()) == [CONFIG, WEIGHTS]
    assert (result.folder / WEIGHTS).read_bytes() == weights
    assert result.sha256 == hashlib.sha256(weights).hexdigest()
    stored_config = (result.folder / CONFIG).read_bytes()
    assert json.loads(stored_config) == json.loads((tiny_good_adapter / CONFIG).read_text())
    assert result.size_bytes == len(weights) + len(stored_config)
    spec = result.spec
    assert (spec.rank, spec.alpha, spec.target_modules, spec.dtype) == (8, 16.0, ("q_proj", "v_proj"), "F32")
    assert spec.layers == {"q_proj": (0, 1), "v_proj": (0, 1)}
    assert spec.fingerprint == tiny_fingerprint.digest


@pytest.mark.parametrize("case", BAD_CASES)
def test_each_bad_input_is_refused_with_its_own_reason(tiny_cases, tiny_fingerprint, tmp_path, case):
    expected = tiny_cases[case]
    with pytest.raises(AdapterFormatError) as caught:
        validate_upload(received(*expected.files), tmp_path, tiny_fingerprint, max_rank=64)
    assert caught.value.code == expected.code
    assert expected.reason in caught.value.message


def test_the_wrong_shape_message_names_the_tensor_and_both_shapes(tiny_cases, tiny_fingerprint, tmp_path):
    with pytest.raises(AdapterFormatError) as caught:
        validate_upload(received(*tiny_cases["wrong_shape"].files), tmp_path, tiny_fingerprint, max_rank=64)
    assert caught.value.message == "lora_B of layers.1.self_attn.q_proj has shape [32, 8], expected [64, 8]"


def test_the_rank_limit_is_the_given_one(tiny_good_adapter, tiny_fingerprint, tmp_path):
    with pytest.raises(AdapterFormatError, match="rank 8 exceeds the engine's max_lora_rank 4"):
        validate_upload(received(tiny_good_adapter / CONFIG, tiny_good_adapter / WEIGHTS), tmp_path,
                        tiny_fingerprint, max_rank=4)


def test_the_same_file_twice_is_refused(tiny_good_adapter, tiny_fingerprint, tmp_path):
    files = received(tiny_good_adapter / CONFIG, tiny_good_adapter / CONFIG, tiny_good_adapter / WEIGHTS)
    with pytest.raises(AdapterFormatError, match="adapter_config.json was uploaded 2 times") as caught:
        validate_upload(files, tmp_path, tiny_fingerprint, max_rank=64)
    assert caught.value.code == "duplicate_file"


def test_an_oversized_config_is_refused_before_it_is_read(tiny_good_adapter, tiny_fingerprint, tmp_path):
    big = tmp_path / "up" / CONFIG
    big.parent.mkdir()
    big.write_bytes(b" " * (2 << 20) + b"{}")
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(AdapterFormatError, match="over 1048576") as caught:
        validate_upload(received(big, tiny_good_adapter / WEIGHTS), work, tiny_fingerprint, max_rank=64)
    assert caught.value.code == "config_invalid"


def test_archives_may_unpack_to_the_largest_adapter_and_no_more(tiny_fingerprint):
    largest = max_adapter_bytes(tiny_fingerprint, 64)
    assert largest < max_unpacked_bytes(tiny_fingerprint, 64) <= largest + (1 << 20) + (16 << 20)

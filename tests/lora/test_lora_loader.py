"""AdapterLoader: local folders and SeaweedFS S3, the source allow-list, sha256 checks, host tensors."""

import hashlib
import uuid

import pytest
import torch

from devstack.services import ensure_s3, free_port, s3_client
from engine.lora.errors import AdapterFormatError, AdapterLoadError, AdapterSourceNotAllowed
from engine.lora.format import peft_tensor_name
from engine.lora.loader import AdapterLoader, s3_client_from_env
from engine.lora.request import LoRARequest
from tests.support.peft_factory import copy_adapter, make_peft_adapter, read_tensors, rewrite_tensors


def sha256_of(adapter_dir) -> str:
    return hashlib.sha256((adapter_dir / "adapter_model.safetensors").read_bytes()).hexdigest()


@pytest.fixture
def allowed(tmp_path, good_adapter):
    """An allowed source folder holding a copy of the good adapter."""
    root = tmp_path / "allowed"
    root.mkdir()
    copy_adapter(good_adapter, root / "good")
    return root


def loader_for(fingerprint, *sources, **kwargs) -> AdapterLoader:
    return AdapterLoader(fingerprint, max_rank=64, allowed_sources=[str(s) for s in sources], **kwargs)


def assert_matches_file(loaded, adapter_dir):
    tensors = read_tensors(adapter_dir)
    for module in loaded.spec.target_modules:
        for layer in range(loaded.lora_a[module].shape[0]):
            if layer in loaded.spec.layers[module]:
                assert torch.equal(loaded.lora_a[module][layer], tensors[peft_tensor_name(layer, module, "A")].float())
                assert torch.equal(loaded.lora_b[module][layer], tensors[peft_tensor_name(layer, module, "B")].float())
            else:
                assert not loaded.lora_a[module][layer].any() and not loaded.lora_b[module][layer].any()


def test_local_load_stacks_tensors_per_module(allowed, fingerprint):
    folder = allowed / "good"
    loaded = loader_for(fingerprint, allowed).load(LoRARequest("good", 1, str(folder), sha256=sha256_of(folder)))
    assert sorted(loaded.lora_a) == ["q_proj", "v_proj"]
    assert loaded.lora_a["v_proj"].shape == (2, 8, 576) and loaded.lora_b["v_proj"].shape == (2, 192, 8)
    assert (loaded.rank, loaded.scaling, loaded.sha256, loaded.id) == (8, 2.0, sha256_of(folder), 1)
    assert loaded.nbytes == 4 * 2 * 8 * (576 + 576 + 576 + 192)
    assert loaded.load_ms > 0
    assert_matches_file(loaded, folder)


def test_partial_layers_and_bf16_load_into_the_loader_dtype(tiny_llama_dir, fingerprint, tmp_path):
    folder = make_peft_adapter(tiny_llama_dir, tmp_path / "partial", rank=2, target_modules=["down_proj"],
                               layers_to_transform=[1], dtype=torch.bfloat16, seed=3)
    loaded = loader_for(fingerprint, tmp_path).load(LoRARequest("p", 2, str(folder)))
    assert loaded.lora_a["down_proj"].dtype == torch.float32 and loaded.lora_a["down_proj"].shape == (2, 2, 1536)
    assert loaded.lora_a["down_proj"][1].any()
    assert_matches_file(loaded, folder)  # layer 0 is zero


def test_sources_outside_the_allow_list_are_refused(allowed, fingerprint, tmp_path, good_adapter):
    loader = loader_for(fingerprint, allowed)
    sibling = copy_adapter(good_adapter, tmp_path / "allowed-evil")  # shares the prefix's characters, not folder
    outside = [str(sibling), str(allowed / ".." / "allowed-evil"), "s3://lora-adapters/x"]
    (allowed / "link").symlink_to(sibling, target_is_directory=True)
    outside.append(str(allowed / "link"))
    for path in outside:
        with pytest.raises(AdapterSourceNotAllowed) as info:
            loader.load(LoRARequest("x", 1, path))
        assert info.value.code == "source_not_allowed" and isinstance(info.value, PermissionError)
    with pytest.raises(AdapterSourceNotAllowed):
        loader.check_source(LoRARequest("x", 1, str(sibling)))


def test_a_symlinked_file_leading_outside_is_refused(allowed, fingerprint, tmp_path, good_adapter):
    folder = allowed / "linked"
    folder.mkdir()
    (folder / "adapter_config.json").write_bytes((good_adapter / "adapter_config.json").read_bytes())
    (folder / "adapter_model.safetensors").symlink_to(good_adapter / "adapter_model.safetensors")
    with pytest.raises(AdapterSourceNotAllowed):
        loader_for(fingerprint, allowed).load(LoRARequest("x", 1, str(folder)))


def test_sha256_mismatch_missing_folder_and_bad_files(allowed, fingerprint):
    loader = loader_for(fingerprint, allowed)
    with pytest.raises(AdapterLoadError) as info:
        loader.load(LoRARequest("x", 1, str(allowed / "good"), sha256="0" * 64))
    assert info.value.code == "sha256_mismatch" and f"expected {'0' * 64}" in info.value.message
    with pytest.raises(AdapterLoadError) as info:
        loader.load(LoRARequest("x", 1, str(allowed / "nope")))
    assert info.value.code == "not_found"
    (allowed / "good" / "adapter_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(AdapterFormatError) as info:
        loader.load(LoRARequest("x", 1, str(allowed / "good")))
    assert info.value.code == "pickle_weights"


def test_non_finite_weights_are_refused(allowed, fingerprint):
    def poison(tensors):
        tensors[peft_tensor_name(1, "q_proj", "B")][3, 2] = float("nan")

    rewrite_tensors(allowed / "good", poison)
    with pytest.raises(AdapterFormatError) as info:
        loader_for(fingerprint, allowed).load(LoRARequest("x", 1, str(allowed / "good")))
    assert info.value.code == "non_finite_weights" and "layers.1.self_attn.q_proj.lora_B" in info.value.message


# ---------------------------------------------------------------- S3 (SeaweedFS)


@pytest.fixture(scope="module")
def s3():
    service = ensure_s3()
    client = s3_client(service)
    prefix = f"test-lora-loader/{uuid.uuid4().hex}"
    yield service, client, prefix
    listed = client.list_objects_v2(Bucket=service.bucket, Prefix=prefix + "/").get("Contents", [])
    for obj in listed:
        client.delete_object(Bucket=service.bucket, Key=obj["Key"])


def upload(client, bucket, key_prefix, folder, extra=()):
    for name in ("adapter_config.json", "adapter_model.safetensors", *extra):
        client.upload_file(str(folder / name), bucket, f"{key_prefix}/{name}")


def test_s3_load_checks_and_matches_local(s3, good_adapter, fingerprint, monkeypatch):
    service, client, prefix = s3
    for key, value in service.env().items():
        monkeypatch.setenv(key, value)
    upload(client, service.bucket, f"{prefix}/tenants/t1/v1", good_adapter)
    loader = loader_for(fingerprint, f"s3://{service.bucket}/{prefix}/tenants/")
    uri = f"s3://{service.bucket}/{prefix}/tenants/t1/v1/"
    loaded = loader.load(LoRARequest("s3", "adp_1", uri, sha256=sha256_of(good_adapter)))
    assert loaded.sha256 == sha256_of(good_adapter)
    assert_matches_file(loaded, good_adapter)

    refused = [f"s3://{service.bucket}/{prefix}/other/t1/v1", f"s3://{service.bucket}/{prefix}/tenants/../other",
               f"s3://{service.bucket}/{prefix}/tenants-x/v1", f"s3://another-bucket/{prefix}/tenants/t1/v1"]
    for path in refused:
        with pytest.raises(AdapterSourceNotAllowed):
            loader.load(LoRARequest("s3", "adp_1", path))
    with pytest.raises(AdapterLoadError) as info:
        loader.load(LoRARequest("s3", "adp_1", uri, sha256="1" * 64))
    assert info.value.code == "sha256_mismatch"
    with pytest.raises(AdapterLoadError) as info:
        loader.load(LoRARequest("s3", "adp_2", f"s3://{service.bucket}/{prefix}/tenants/none/v9"))
    assert info.value.code == "not_found"


def test_s3_folder_whose_files_were_deleted_is_not_found(s3, good_adapter, fingerprint, monkeypatch):
    service, client, prefix = s3
    for key, value in service.env().items():
        monkeypatch.setenv(key, value)
    upload(client, service.bucket, f"{prefix}/tenants/t3/v1", good_adapter)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        client.delete_object(Bucket=service.bucket, Key=f"{prefix}/tenants/t3/v1/{name}")
    client.put_object(Bucket=service.bucket, Key=f"{prefix}/tenants/t3/v1/", Body=b"")  # a folder marker
    with pytest.raises(AdapterLoadError) as info:
        loader_for(fingerprint, f"s3://{service.bucket}/{prefix}/").load(
            LoRARequest("s3", 5, f"s3://{service.bucket}/{prefix}/tenants/t3/v1"))
    assert info.value.code == "not_found"


def test_s3_pickle_folder_is_refused(s3, good_adapter, fingerprint, tmp_path, monkeypatch):
    service, client, prefix = s3
    for key, value in service.env().items():
        monkeypatch.setenv(key, value)
    (tmp_path / "adapter_model.bin").write_bytes(b"\x80\x04pickle")
    upload(client, service.bucket, f"{prefix}/tenants/t2/v1", good_adapter)
    client.upload_file(str(tmp_path / "adapter_model.bin"), service.bucket, f"{prefix}/tenants/t2/v1/adapter_model.bin")
    with pytest.raises(AdapterFormatError) as info:
        loader_for(fingerprint, f"s3://{service.bucket}/{prefix}/").load(
            LoRARequest("s3", 3, f"s3://{service.bucket}/{prefix}/tenants/t2/v1"))
    assert info.value.code == "pickle_weights"


def test_unreachable_store_is_reported(fingerprint, monkeypatch):
    monkeypatch.setenv("S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    loader = loader_for(fingerprint, "s3://lora-adapters/", s3_client=s3_client_from_env())
    with pytest.raises(AdapterLoadError) as info:
        loader.load(LoRARequest("s3", 4, "s3://lora-adapters/tenants/t/v1"))
    assert info.value.code == "store_unreachable"

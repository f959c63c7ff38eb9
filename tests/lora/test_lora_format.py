"""engine.lora.format: the rules of what the engine serves, on real PEFT adapters and on broken ones."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine.lora.errors import AdapterFormatError
from engine.lora.format import (
    AdapterSpec,
    ModelFingerprint,
    check_adapter_files,
    max_adapter_bytes,
    parse_adapter_config,
    peft_tensor_name,
    validate_adapter,
    validate_adapter_dir,
)
from engine.lora.safetensors_header import parse_safetensors_header, read_safetensors_header
from tests.support.peft_factory import (
    copy_adapter,
    edit_adapter_config,
    make_peft_adapter,
    rewrite_tensors,
    write_huge_header_adapter,
    write_pickle_bin_adapter,
    write_renamed_pickle_adapter,
    write_truncated_adapter,
    write_wrong_shape_adapter,
)

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2_CONFIG = {
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "model_type": "llama",
}


def refusal(code: str, fn, *args) -> str:
    with pytest.raises(AdapterFormatError) as info:
        fn(*args)
    assert info.value.code == code, info.value
    return info.value.message


def config_of(adapter_dir) -> dict:
    return json.loads((adapter_dir / "adapter_config.json").read_text())


def test_importing_format_does_not_import_torch_or_numpy():
    code = "import sys, engine.lora.format; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_fingerprint_of_smollm2_has_its_projection_shapes():
    fp = ModelFingerprint.from_hf_config(SMOLLM2_CONFIG)
    assert [fp.module_shape(m) for m in ("q_proj", "k_proj", "v_proj", "o_proj")] == [
        (576, 576), (576, 192), (576, 192), (576, 576)]
    assert [fp.module_shape(m) for m in ("gate_proj", "up_proj", "down_proj")] == [
        (576, 1536), (576, 1536), (1536, 576)]
    assert ModelFingerprint.from_hf_config(fp.to_dict()) == fp


def test_fingerprint_defaults_and_digest():
    bare = {k: v for k, v in SMOLLM2_CONFIG.items() if k not in ("num_key_value_heads", "head_dim")}
    fp = ModelFingerprint.from_hf_config(bare)
    assert (fp.num_key_value_heads, fp.head_dim) == (9, 64)
    smollm2 = ModelFingerprint.from_hf_config(SMOLLM2_CONFIG)
    assert fp.digest != smollm2.digest and len(smollm2.digest) == 16
    code = f"from engine.lora.fingerprint import ModelFingerprint as F; print(F(**{smollm2.to_dict()!r}).digest)"
    env_run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                             env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin"})
    assert env_run.stdout.strip() == smollm2.digest


@pytest.mark.parametrize("change", [{"hidden_size": 0}, {"num_hidden_layers": "30"}, {"num_key_value_heads": 4},
                                    {"vocab_size": None}, {"head_dim": True}])
def test_fingerprint_refuses_bad_configs(change):
    with pytest.raises(ValueError):
        ModelFingerprint.from_hf_config({**SMOLLM2_CONFIG, **change})


def test_good_adapter_spec(good_adapter, fingerprint):
    spec = validate_adapter_dir(good_adapter, fingerprint, max_rank=64)
    assert spec == AdapterSpec(
        rank=8, alpha=16.0, use_rslora=False, scaling=2.0, target_modules=("q_proj", "v_proj"),
        layers={"q_proj": (0, 1), "v_proj": (0, 1)}, shapes={"q_proj": (576, 576), "v_proj": (576, 192)},
        dtype="F32", num_bytes=(good_adapter / "adapter_model.safetensors").stat().st_size,
        fingerprint=fingerprint.digest,
    )
    assert (spec.a_shape("v_proj"), spec.b_shape("v_proj")) == ((8, 576), (192, 8))
    assert json.loads(json.dumps(spec.to_dict()))["layers"] == {"q_proj": [0, 1], "v_proj": [0, 1]}


def test_rslora_all_modules_spec(all_modules_adapter, fingerprint):
    spec = validate_adapter(config_of(all_modules_adapter), all_modules_adapter / "adapter_model.safetensors",
                            fingerprint, 4)
    assert spec.scaling == 8 / 2  # alpha / sqrt(r)
    assert spec.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert spec.shapes["down_proj"] == (1536, 576)


def test_layers_to_transform_regex_targets_and_bf16(tiny_llama_dir, fingerprint, tmp_path):
    subset = make_peft_adapter(tiny_llama_dir, tmp_path / "subset", rank=2, target_modules=["up_proj", "o_proj"],
                               layers_to_transform=[1], dtype=torch.bfloat16)
    spec = validate_adapter_dir(subset, fingerprint, 64)
    assert (spec.layers, spec.dtype) == ({"o_proj": (1,), "up_proj": (1,)}, "BF16")
    regex = make_peft_adapter(tiny_llama_dir, tmp_path / "regex", rank=3,
                              target_modules=r".*\.layers\.0\.self_attn\.(q|k)_proj")
    assert validate_adapter_dir(regex, fingerprint, 64).layers == {"q_proj": (0,), "k_proj": (0,)}


def test_header_reader_agrees_with_safetensors(good_adapter):
    path = good_adapter / "adapter_model.safetensors"
    header = read_safetensors_header(path)
    with safe_open(path, "pt") as f:
        assert sorted(header.tensors) == sorted(f.keys())
        for name in f.keys():
            assert list(header.tensors[name].shape) == f.get_slice(name).get_shape()
        assert header.metadata == f.metadata()
    data = path.read_bytes()
    assert parse_safetensors_header(data[: header.data_offset], len(data)) == header  # the first bytes suffice
    assert peft_tensor_name(1, "v_proj", "B") in header.tensors


# ---------------------------------------------------------------- refusals: files


def test_pickle_files_are_refused(good_adapter, fingerprint, tmp_path):
    message = refusal("pickle_weights", validate_adapter_dir, write_pickle_bin_adapter(good_adapter, tmp_path / "bin"),
                      fingerprint, 64)
    assert "adapter_model.bin" in message
    for legacy in (False, True):
        renamed = write_renamed_pickle_adapter(good_adapter, tmp_path / f"renamed{legacy}", legacy=legacy)
        message = refusal("pickle_weights", validate_adapter_dir, renamed, fingerprint, 64)
        assert "is a pickle" in message


def test_missing_files_are_refused(good_adapter):
    assert refusal("missing_config", check_adapter_files, ["adapter_model.safetensors", "README.md"])
    assert refusal("missing_weights", check_adapter_files, ["adapter_config.json"])
    check_adapter_files(["adapter_config.json", "adapter_model.safetensors", "README.md"])


def test_truncated_and_oversized_headers_are_refused(good_adapter, fingerprint, tmp_path):
    truncated = write_truncated_adapter(good_adapter, tmp_path / "trunc")
    assert "truncated" in refusal("truncated", validate_adapter_dir, truncated, fingerprint, 64)
    huge = write_huge_header_adapter(good_adapter, tmp_path / "huge")
    assert "1099511627776-byte header" in refusal("header_too_large", validate_adapter_dir, huge, fingerprint, 64)
    beyond = write_huge_header_adapter(good_adapter, tmp_path / "beyond", claimed=1 << 20)
    assert "the file has" in refusal("truncated", validate_adapter_dir, beyond, fingerprint, 64)
    assert refusal("truncated", parse_safetensors_header, b"\x01\x00", 2)


def raw_safetensors(header: dict | bytes, data: bytes = b"") -> bytes:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return len(body).to_bytes(8, "little") + body + data


@pytest.mark.parametrize("header,data,code,needle", [
    (b"not json", b"", "header_invalid", "not valid JSON"),
    (b"[1, 2]", b"", "header_invalid", "not a JSON object"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {}}', b"\0" * 4, "header_invalid",
     "duplicate"),
    (b"[" * 100_000 + b"]" * 100_000, b"", "header_invalid", "not valid JSON"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "header_invalid", "needs 8 bytes"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "header_invalid", "gap"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 8, "header_invalid", "overlap"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 6, "header_invalid", "after its last"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 6, "truncated", "need 16 bytes"),
    ({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}, b"\0", "unsupported_dtype", "'Q4'"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", "header_invalid", "invalid shape"),
    ({"a": {"dtype": "F32", "shape": [1]}}, b"", "header_invalid", "exactly dtype"),
    ({"__metadata__": {"format": 1}}, b"", "header_invalid", "__metadata__"),
])
def test_malformed_headers_are_refused(header, data, code, needle):
    raw = raw_safetensors(header, data)
    assert needle in refusal(code, parse_safetensors_header, raw, len(raw))


def test_a_header_whose_length_starts_like_a_pickle_is_read_as_safetensors(tmp_path):
    """A 640-byte header (and 896, 1152, 1408, modulo 65536) writes 0x80 0x02..0x05 first: a pickle's magic."""
    import numpy as np
    from safetensors.numpy import save_file

    tensors = {"base_model.model.a.lora_A.weight": np.ones((2, 4), np.float32)}
    path = tmp_path / "padded.safetensors"
    for target in (640, 896, 1152, 1408):
        save_file(tensors, str(path), metadata={"note": ""})
        small = int.from_bytes(path.read_bytes()[:8], "little")  # padded with spaces to a multiple of 8
        save_file(tensors, str(path), metadata={"note": "x" * (target - small)})
        raw = path.read_bytes()
        assert int.from_bytes(raw[:8], "little") == target and raw[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04",
                                                                            b"\x80\x05")
        header = read_safetensors_header(path)
        assert set(header.tensors) == set(tensors) and header.header_size == target
        assert parse_safetensors_header(raw, len(raw)) == header
    legacy = tmp_path / "legacy.bin"  # torch.save's legacy format: a bare pickle stream
    legacy.write_bytes(b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19." + b"\0" * 64)
    assert refusal("pickle_weights", read_safetensors_header, legacy)


def test_file_over_the_size_limit_is_refused(good_adapter, fingerprint, tmp_path):
    big = copy_adapter(good_adapter, tmp_path / "big")
    with open(big / "adapter_model.safetensors", "r+b") as f:
        f.truncate(max_adapter_bytes(fingerprint, 8) + 1)  # sparse: nothing is written
    assert "over" in refusal("file_too_large", validate_adapter_dir, big, fingerprint, 8)


def test_config_over_the_size_limit_is_refused_before_it_is_read(good_adapter, fingerprint, tmp_path, monkeypatch):
    from pathlib import Path

    big = copy_adapter(good_adapter, tmp_path / "big-config")
    with open(big / "adapter_config.json", "r+b") as f:
        f.truncate(2 << 20)  # sparse: nothing is written
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self.name} was read whole"))
    assert "over 1048576" in refusal("config_invalid", validate_adapter_dir, big, fingerprint, 64)


# ---------------------------------------------------------------- refusals: tensors


def test_shape_mismatch_message_is_precise(good_adapter, fingerprint, tmp_path):
    name = peft_tensor_name(1, "q_proj", "B")
    bad = write_wrong_shape_adapter(good_adapter, tmp_path / "shape", name=name, shape=(512, 8))
    message = refusal("shape_mismatch", validate_adapter_dir, bad, fingerprint, 64)
    assert message == "lora_B of layers.1.self_attn.q_proj has shape [512, 8], expected [576, 8]"


def test_adapter_for_another_base_model_is_refused(good_adapter, fingerprint):
    other = ModelFingerprint(**{**fingerprint.to_dict(), "num_key_value_heads": 9})  # k/v_proj out 576, not 192
    message = refusal("shape_mismatch", validate_adapter_dir, good_adapter, other, 64)
    assert message == "lora_B of layers.0.self_attn.v_proj has shape [192, 8], expected [576, 8]"
    fewer_layers = ModelFingerprint(**{**fingerprint.to_dict(), "num_hidden_layers": 1})
    assert "has 1 layers" in refusal("layer_mismatch", validate_adapter_dir, good_adapter, fewer_layers, 64)


def test_rank_over_limit_is_refused(good_adapter, fingerprint):
    message = refusal("rank_too_large", validate_adapter_dir, good_adapter, fingerprint, 4)
    assert message == "rank 8 exceeds the engine's max_lora_rank 4"


def test_missing_unexpected_and_mixed_tensors_are_refused(good_adapter, fingerprint, tmp_path):
    missing = rewrite_tensors(copy_adapter(good_adapter, tmp_path / "missing"),
                              lambda t: t.pop(peft_tensor_name(1, "v_proj", "B")))
    assert refusal("missing_tensor", validate_adapter_dir, missing, fingerprint, 64) == (
        "lora_B of layers.1.self_attn.v_proj is missing")

    def add_k(tensors):
        tensors[peft_tensor_name(0, "k_proj", "A")] = torch.ones(8, 576)
        tensors[peft_tensor_name(0, "k_proj", "B")] = torch.ones(192, 8)

    extra = rewrite_tensors(copy_adapter(good_adapter, tmp_path / "extra"), add_k)
    assert "does not target it" in refusal("unexpected_tensor", validate_adapter_dir, extra, fingerprint, 64)
    odd = rewrite_tensors(copy_adapter(good_adapter, tmp_path / "odd"),
                          lambda t: t.update({"base_model.model.model.norm.weight": torch.ones(576)}))
    assert "norm.weight" in refusal("unexpected_tensor", validate_adapter_dir, odd, fingerprint, 64)

    def to_f64(tensors):
        for key in tensors:
            tensors[key] = tensors[key].double()

    f64 = rewrite_tensors(copy_adapter(good_adapter, tmp_path / "f64"), to_f64)
    assert "F64" in refusal("unsupported_dtype", validate_adapter_dir, f64, fingerprint, 64)
    mixed = rewrite_tensors(copy_adapter(good_adapter, tmp_path / "mixed"),
                            lambda t: t.update({k: t[k].half() for k in list(t)[:1]}))
    assert "mix" in refusal("unsupported_dtype", validate_adapter_dir, mixed, fingerprint, 64)


# ---------------------------------------------------------------- refusals: config (real PEFT where PEFT can)


def test_unsupported_modules_are_refused(tiny_llama_dir, good_adapter, fingerprint, tmp_path):
    lm_head = make_peft_adapter(tiny_llama_dir, tmp_path / "lm_head", target_modules=["q_proj", "lm_head"])
    message = refusal("unknown_target_module", validate_adapter_dir, lm_head, fingerprint, 64)
    assert message.startswith("target module 'lm_head' is not supported")
    unknown = edit_adapter_config(copy_adapter(good_adapter, tmp_path / "unknown"), target_modules=["q_proj", "qkv"])
    assert "'qkv' matches no module" in refusal("unknown_target_module", validate_adapter_dir, unknown, fingerprint, 64)


def test_modules_to_save_dora_and_bias_are_refused(tiny_llama_dir, fingerprint, tmp_path):
    saved = make_peft_adapter(tiny_llama_dir, tmp_path / "mts", modules_to_save=["lm_head"])
    assert "modules_to_save" in refusal("modules_to_save", validate_adapter_dir, saved, fingerprint, 64)
    dora = make_peft_adapter(tiny_llama_dir, tmp_path / "dora", use_dora=True)
    assert refusal("unsupported_feature", validate_adapter_dir, dora, fingerprint, 64).startswith("DoRA")
    bias = make_peft_adapter(tiny_llama_dir, tmp_path / "bias", bias="lora_only")
    assert refusal("unsupported_bias", validate_adapter_dir, bias, fingerprint, 64) == (
        "bias is 'lora_only'; only 'none' is supported")


@pytest.mark.parametrize("change,code,needle", [
    ({"peft_type": "IA3"}, "unsupported_peft_type", "'IA3'"),
    ({"task_type": "SEQ_CLS"}, "unsupported_feature", "SEQ_CLS"),
    ({"rank_pattern": {"q_proj": 4}}, "unsupported_feature", "rank_pattern"),
    ({"alpha_pattern": {"q_proj": 4}}, "unsupported_feature", "alpha_pattern"),
    ({"init_lora_weights": "pissa"}, "unsupported_feature", "pissa"),
    ({"init_lora_weights": 1}, "unsupported_feature", "init_lora_weights=1"),
    ({"some_future_field": {"on": True}}, "unsupported_feature", "some_future_field"),
    ({"r": 0}, "config_invalid", "r must be"),
    ({"r": True}, "config_invalid", "r must be"),
    ({"lora_alpha": "16"}, "config_invalid", "lora_alpha"),
    ({"lora_alpha": float("nan")}, "config_invalid", "lora_alpha"),
    ({"use_rslora": "yes"}, "config_invalid", "use_rslora"),
    ({"target_modules": []}, "config_invalid", "target_modules"),
    ({"target_modules": r"(.*)+_proj"}, "config_invalid", "nests repetition"),
    ({"target_modules": "(["}, "config_invalid", "invalid"),
    ({"target_modules": r"model\.norm"}, "unknown_target_module", "select no module"),
    ({"layers_to_transform": [0, 7]}, "layer_mismatch", "layer 7"),
    ({"layers_to_transform": [0], "layers_pattern": "h"}, "unsupported_feature", "layers_pattern"),
])
def test_config_rules(good_adapter, fingerprint, change, code, needle):
    config = {**config_of(good_adapter), **change}
    message = refusal(code, validate_adapter, config, good_adapter / "adapter_model.safetensors", fingerprint, 64)
    assert needle in message


def test_config_fields_that_do_not_matter_are_accepted(good_adapter, fingerprint):
    config = {**config_of(good_adapter), "some_future_field": None, "lora_dropout": 0.1, "init_lora_weights": "eva",
              "target_modules": r"model\.layers\.\d+\.self_attn\.(q|v)_proj", "exclude_modules": ["lm_head"]}
    spec = validate_adapter(config, good_adapter / "adapter_model.safetensors", fingerprint, 64)
    assert spec.layers == {"q_proj": (0, 1), "v_proj": (0, 1)}


def test_exclude_modules_and_layers_follow_peft(good_adapter, fingerprint):
    weights = good_adapter / "adapter_model.safetensors"
    excluded = {**config_of(good_adapter), "exclude_modules": r"model\.layers\.1\.self_attn\.v_proj"}
    assert refusal("unexpected_tensor", validate_adapter, excluded, weights, fingerprint, 64).startswith(
        "layers.1.self_attn.v_proj has LoRA tensors")
    # An exact full name bypasses layers_to_transform in PEFT; suffix matches are filtered by it.
    exact = {**config_of(good_adapter), "layers_to_transform": [0],
             "target_modules": ["q_proj", "v_proj", "model.layers.1.self_attn.q_proj",
                                "model.layers.1.self_attn.v_proj"]}
    assert validate_adapter(exact, weights, fingerprint, 64).layers == {"q_proj": (0, 1), "v_proj": (0, 1)}


def test_adapter_config_json_is_parsed_strictly():
    assert parse_adapter_config(b'{"r": 8}') == {"r": 8}
    assert refusal("config_invalid", parse_adapter_config, b"{")
    assert refusal("config_invalid", parse_adapter_config, b"[]")
    assert refusal("config_invalid", parse_adapter_config, b" " * (2 << 20))

"""Configuration parsing and validation: every bad value is a ValueError that names it."""

import pytest
import torch

from engine.config import EngineConfig, ModelConfig, parse_memory
from engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2GiB", 2 * 2**30), ("512MB", 512 * 10**6), ("1.5 GiB", int(1.5 * 2**30)), (4096, 4096), ("100", 100)],
)
def test_parse_memory(value, expected):
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["", "2 parsecs", "-1GiB", 0, -5, True, "0B"])
def test_parse_memory_rejects(value):
    with pytest.raises(ValueError, match="memory size"):
        parse_memory(value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("block_size", 0), ("block_size", 12), ("block_size", 512), ("max_num_seqs", 0), ("max_num_batched_tokens", -1),
     ("max_model_len", 1), ("num_kv_blocks", 0), ("kv_cache_memory", "lots"), ("gpu_memory_utilization", 1.5),
     ("dtype", "int8"), ("device", "tpu")],
)
def test_engine_config_rejects(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        EngineConfig(model="m", **{field: value})


def test_engine_config_unknown_field_is_a_type_error():
    with pytest.raises(TypeError):
        EngineConfig(model="m", max_loras_typo=3)


def test_cpu_auto_dtype_is_float32():
    config = EngineConfig(model="m", device="cpu")
    model = ModelConfig.from_dict(_raw(torch_dtype="bfloat16"))
    assert config.torch_dtype(model) is torch.float32
    assert EngineConfig(model="m", device="cpu", dtype="bfloat16").torch_dtype(model) is torch.bfloat16


def _raw(**overrides) -> dict:
    raw = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    raw.update(overrides)
    return raw


def test_model_config_defaults_and_transformers5_rope_parameters():
    config = ModelConfig.from_dict(_raw(rope_parameters={"rope_theta": 5e5, "rope_type": "default"},
                                        eos_token_id=[3, 4]))
    assert config.head_dim == 16 and config.num_kv_heads == 2 and config.rope_theta == 5e5
    assert config.rope_scaling is None and config.eos_token_ids == (3, 4)
    assert not (config.qkv_bias or config.o_bias or config.tie_word_embeddings)


def test_model_config_biases_by_family():
    assert ModelConfig.from_dict(_raw(model_type="qwen2")).qkv_bias
    assert not ModelConfig.from_dict(_raw(model_type="qwen2")).o_bias
    llama = ModelConfig.from_dict(_raw(attention_bias=True))
    assert llama.qkv_bias and llama.o_bias


def test_model_config_refuses_other_architectures():
    with pytest.raises(ValueError, match="Llama family"):
        ModelConfig.from_dict(_raw(model_type="gpt2"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n": 0}, "n must"), ({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
     ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"), ({"min_p": 2.0}, "min_p"),
     ({"presence_penalty": 3.0}, "presence_penalty"), ({"frequency_penalty": -2.5}, "frequency_penalty"),
     ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"max_tokens": -1}, "max_tokens"),
     ({"max_tokens": 0}, "max_tokens"), ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
     ({"stop": [""]}, "stop"), ({"stop": 3}, "stop"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
     ({"logprobs": 21}, "logprobs"), ({"seed": 1.5}, "seed"), ({"n": True}, "n must")],
)
def test_sampling_params_reject(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_normalize():
    params = SamplingParams(stop="###", top_k=0, temperature=0)
    assert params.stop == ["###"] and params.top_k == -1 and params.is_greedy and not params.needs_penalties
    assert SamplingParams(max_tokens=None).max_tokens is None


@pytest.mark.parametrize(
    ("changes", "match"),
    [({"max_loras": 0}, "max_loras"), ({"max_cpu_loras": 4, "max_loras": 8}, "max_cpu_loras"),
     ({"max_lora_rank": 0}, "max_lora_rank"), ({"max_lora_rank": 1024}, "max_lora_rank must be at most 512"),
     ({"max_lora_rank": 8.0}, "max_lora_rank"), ({"enable_lora": "yes"}, "enable_lora"),
     ({"adapter_sources": "s3://b/tenants/"}, "list of prefixes"), ({"adapter_sources": ["s3:///x"]}, "malformed"),
     ({"adapter_sources": ["http://x/"]}, "adapter source prefix"), ({"max_adapter_wait_steps": 0}, "wait_steps")],
)
def test_engine_config_rejects_bad_lora_settings(changes, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(model="m", **{"enable_lora": True, **changes})


def test_engine_config_lora_defaults_and_sources():
    config = EngineConfig(model="m", enable_lora=True, adapter_sources=("s3://lora-adapters/tenants/", "/srv/a"))
    assert (config.max_loras, config.max_cpu_loras, config.max_lora_rank) == (8, 64, 64)
    assert config.adapter_sources == ["s3://lora-adapters/tenants/", "/srv/a"]
    assert EngineConfig(model="m").enable_lora is False and EngineConfig(model="m").adapter_sources is None

"""Configuration parsing and validation: every bad value is a ValueError that names it."""

import pytest
import torch

from engine import config as config_module
from engine.config import EngineConfig, ModelConfig, parse_memory
from engine.cpu_info import parse_cpuinfo
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
     ("dtype", "int8"), ("kv_cache_dtype", "fp8"), ("gemm", "mkl"), ("device", "tpu")],
)
def test_engine_config_rejects(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        EngineConfig(model="m", **{field: value})


def test_engine_config_unknown_field_is_a_type_error():
    with pytest.raises(TypeError):
        EngineConfig(model="m", max_loras_typo=3)


@pytest.mark.parametrize(("flags", "expected"), [
    ("fpu avx2 avx512f avx512_vnni avx512_bf16", torch.bfloat16),  # AMD Zen 4/5, Intel Cooper Lake
    ("fpu avx2 avx512f amx_tile amx_bf16", torch.bfloat16),  # Intel Sapphire Rapids and later
    ("fpu avx2 avx512f avx512_vnni", torch.float32),  # AVX-512 without bf16 dot products: emulated, no faster
    ("fpu avx2 fma", torch.float32),
    ("", torch.float32),  # nothing known about the CPU: nothing assumed
])
def test_cpu_auto_dtype_is_bf16_exactly_where_the_cpu_has_bf16_dot_products(monkeypatch, flags, expected):
    monkeypatch.setattr(config_module, "cpu_info", lambda: parse_cpuinfo(f"model name\t: Some CPU\nflags\t: {flags}\n"))
    model = ModelConfig.from_dict(_raw())  # an fp32 checkpoint: the CPU decides, not the checkpoint
    assert EngineConfig(model="m", device="cpu").torch_dtype(model) is expected
    assert EngineConfig(model="m", device="cpu").kv_cache_torch_dtype(model) is expected
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        assert EngineConfig(model="m", device="cpu", dtype=name).torch_dtype(model) is dtype  # explicit wins


def test_cuda_auto_dtype_is_the_checkpoints_half_type_or_bf16():
    config = EngineConfig(model="m", device="cuda")
    assert config.torch_dtype(ModelConfig.from_dict(_raw())) is torch.bfloat16
    assert config.torch_dtype(ModelConfig.from_dict(_raw(torch_dtype="float16"))) is torch.float16


def test_kv_cache_dtype_follows_the_model_unless_given():
    model = ModelConfig.from_dict(_raw())
    assert EngineConfig(model="m", device="cpu", dtype="float32").kv_cache_torch_dtype(model) is torch.float32
    config = EngineConfig(model="m", device="cpu", dtype="float32", kv_cache_dtype="bfloat16")
    assert config.torch_dtype(model) is torch.float32 and config.kv_cache_torch_dtype(model) is torch.bfloat16
    assert EngineConfig(model="m", kv_cache_dtype="int8").kv_cache_torch_dtype(model) is torch.int8
    with pytest.raises(ValueError, match="kv_cache_dtype must be 'auto' or one of .*'int8'"):
        EngineConfig(model="m", kv_cache_dtype="int4")


def test_parse_cpuinfo_reads_the_first_processor_on_x86_and_arm():
    x86 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx512_bf16 avx2\n\nprocessor\t: 1\n" \
          "model name\t: AMD EPYC\nflags\t\t: fpu avx512_bf16 avx2\n"
    info = parse_cpuinfo(x86)
    assert info.model_name == "AMD EPYC" and info.has_native_bf16 and info.gemm_flags == ["avx2", "avx512_bf16"]
    arm = parse_cpuinfo("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve bf16 i8mm\n")
    assert arm.flags >= {"asimd", "bf16"} and not arm.has_native_bf16  # ARM's bf16 is not assumed fast here
    assert parse_cpuinfo("").flags == frozenset() and parse_cpuinfo("").model_name


def test_serve_options_reach_the_engine_config():
    from engine.server import cli

    args = cli.build_parser().parse_args(["serve", "m", "--dtype", "bfloat16", "--kv-cache-dtype", "float32",
                                          "--gemm", "onednn"])
    kwargs = cli.engine_kwargs(args)
    assert (kwargs["dtype"], kwargs["kv_cache_dtype"], kwargs["gemm"]) == ("bfloat16", "float32", "onednn")
    EngineConfig(model="m", **kwargs)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "m", "--dtype", "int8"])
    args = cli.build_parser().parse_args(["serve", "m", "--kv-cache-dtype", "int8"])  # an int8 KV cache is allowed
    assert cli.engine_kwargs(args)["kv_cache_dtype"] == "int8"
    # the server faults its KV cache in ahead unless told not to; the offline default does not
    assert kwargs["kv_prefault"] is True and EngineConfig(model="m").kv_prefault is False
    args = cli.build_parser().parse_args(["serve", "m", "--no-kv-prefault"])
    assert cli.engine_kwargs(args)["kv_prefault"] is False
    # cli spells the choices out (it must not import torch for --help): they must stay the config's
    assert set(cli.DTYPE_CHOICES) == {"auto", *config_module._DTYPES} and cli.GEMM_MODES == config_module.GEMM_MODES


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

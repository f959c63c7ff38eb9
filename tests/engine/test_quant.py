"""Quantized weights and their GEMM paths against F.linear on the dequantized weight; int8 and GGUF models through the
engine (tiny random Llama; the real model's quality gates are in test_quant_smollm2.py)."""

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import EngineConfig, ModelConfig
from engine.cpu_info import cpu_info
from engine.models import gemm_choice
from engine.models.gemm import LinearKernel, available_paths
from engine.models.gguf_file import _Piece
from engine.models.linear import Projection
from engine.models.loader import load_model
from engine.models.quant import Int4Weight, quantize_int8
from engine.models.quantize import write_gguf
from kernels.cpu import int8_gemm
from tests.engine.test_smollm2_bf16 import engine_model, logits_of

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], list(range(40, 71))]
# (out, in): SmolLM2-135M's q|k|v, gate|up and down, and a small one
SHAPES = [(960, 576), (3072, 576), (576, 1536), (32, 64)]
# int8 dot products in hardware. Without them oneDNN's u8 x s8 kernels add pairs of products in saturating int16
# (AVX2's vpmaddubsw), and w8a8's outputs drift by several percent (5% on an AVX2-only AMD EPYC VM): the engine
# offers w8a8 only where the hardware sums exactly, and its accuracy is asserted there.
INT8_DOT = cpu_info().has_int8_dot


def _weight(out_features, in_features, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=g) / in_features**0.5, g


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_int8_per_channel_quantization_error_is_half_a_step(out_features, in_features):
    weight, _ = _weight(out_features, in_features, 0)
    q = quantize_int8(weight)
    assert q.qweight.dtype == torch.int8 and q.scales.dtype == torch.float32 and q.scales.shape == (out_features,)
    assert int(q.qweight.abs().max()) == 127  # each row's largest value uses the whole range
    assert torch.all((q.dequantize() - weight).abs() <= q.scales[:, None] / 2 + 1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_int8_paths_compute_f_linear_of_the_dequantized_weight(dtype, out_features, in_features):
    """w8a16: bf16 activations (an fp32 model's are rounded), exact products, fp32 sums, a rounding to bf16 before
    and after the bias (2^-7 and 0.01 allowed; the
    outputs are about 1 and the bias up to 4). w8a8 adds each token's activation
    rounding to 8 bits (w8a8g each 64 inputs' of a token): relative error of the output about 2^-8 per term,
    averaged over in_features terms; 2% of the output's norm allowed."""
    weight, g = _weight(out_features, in_features, out_features)
    q = quantize_int8(weight)
    bias = torch.randn(out_features, generator=g).to(dtype)
    reference = q.dequantize()
    # w8a8 where int8 dot products sum exactly; dequantized: the same values as a dense weight, where this CPU has a
    # dense kernel for the dtype (oneDNN's bf16 needs AVX-512; the packed kernel's AVX-512, and AVX512-BF16 for bf16)
    # (dequantized_onednn: always oneDNN, offered where both kernels are, so the GEMM choice may take either)
    dense_paths = set(available_paths("cpu", dtype))
    expected_paths = (("w8a16",) + (("w8a8",) if INT8_DOT else ()) + (("w8a8g",) if int8_gemm.available() else ())
                      + (("dequantized",) if {"onednn", "packed"} & dense_paths else ())
                      + (("dequantized_onednn",) if {"onednn", "packed"} <= dense_paths else ()))
    assert available_paths("cpu", dtype, "int8") == expected_paths
    for path in expected_paths:
        kernel = LinearKernel(q, bias, [(1, path)])
        for m in (1, 7, 64, 300):
            x = torch.randn(m, in_features, generator=g).to(dtype)  # [M, in]
            expected = F.linear(x.float(), reference, bias.float())
            got = kernel(x)
            assert got.dtype == dtype and got.shape == (m, out_features)
            if path.startswith("dequantized"):  # the dequantized values in x's dtype, products summed by a dense kernel
                dense = reference.to(dtype).float()
                expected = F.linear(x.float(), dense, bias.float())
                tolerance = (1e-4, 1e-4) if dtype == torch.float32 else (2**-7, 3e-2)
                torch.testing.assert_close(got.float(), expected, rtol=tolerance[0], atol=tolerance[1],
                                           msg=f"{path} M={m}")
            elif path == "w8a16":  # the kernel takes its activations and scales in bf16: the reference too
                rounded = q.qweight.float() * q.scales.bfloat16().float()[:, None]
                expected = F.linear(x.bfloat16().float(), rounded, bias.float())
                torch.testing.assert_close(got.float(), expected, rtol=2**-7, atol=1e-2, msg=f"{path} M={m}")
            else:
                assert float((got.float() - expected).norm() / expected.norm()) < 0.02, f"{path} M={m}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_path_computes_f_linear_of_its_groups(dtype):
    g = torch.Generator().manual_seed(4)
    out_features, in_features = 960, 576
    weight = Int4Weight(torch.randint(0, 16, (out_features, in_features), generator=g, dtype=torch.uint8),
                        torch.rand(out_features, in_features // 32, generator=g) / 50,
                        torch.randn(out_features, in_features // 32, generator=g) / 50)
    kernel = LinearKernel(weight, None, [(1, "w4a16")])
    x = torch.randn(9, in_features, generator=g).to(dtype)
    expected = F.linear(x.float(), weight.dequantize())
    got = kernel(x)
    assert got.dtype == dtype
    rtol = 1e-4 if dtype == torch.float32 else 2**-6  # bf16: the group scales are rounded to bf16 too
    assert float((got.float() - expected).norm() / expected.norm()) < rtol


def test_q8_0_blocks_requantized_per_channel_stay_within_a_step():
    """Requantizing GGUF Q8_0 (a scale per 32 values) to one scale per row: each value moves by at most half a
    step of the row's grid."""
    g = torch.Generator().manual_seed(8)
    q = torch.randint(-127, 128, (16, 128), generator=g, dtype=torch.int8)
    d = torch.rand(16, 4, generator=g) / 100  # [rows, blocks]
    piece = _Piece("q8", (q, d))
    int8 = piece.to_int8()
    assert torch.all((int8.dequantize() - piece.to_float()).abs() <= int8.scales[:, None] / 2 + 1e-7)


def test_a_quantized_projection_lets_go_of_its_float_weight_and_needs_a_kernel():
    projection = Projection("model.layers.0.mlp", 64, [("gate_proj", 32), ("up_proj", 32)], bias=False)
    projection.weight.copy_(torch.randn(64, 64))
    expected = projection(x := torch.randn(3, 64))
    projection.quantize(quantize_int8(projection.weight))
    assert projection.weight is None and projection.kernel is None
    projection.use_kernel(LinearKernel(projection.gemm_weight, None, [(4, "w8a16")]))  # on every CPU
    assert float((projection(x) - expected).norm() / expected.norm()) < 0.02
    with pytest.raises(ValueError, match="quantized weight"):
        projection.quantize(quantize_int8(torch.randn(8, 64)))


def test_quantization_is_validated():
    assert EngineConfig(model="m", quantization="int8").quantization == "int8"
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(model="m", quantization="int4")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_int8_engine_quantizes_every_projection_and_generates_like_fp32(tiny_llama, dtype):
    options = dict(dtype=dtype, num_kv_blocks=64, block_size=4)
    plain = LLM(str(tiny_llama), **options)
    int8 = LLM(str(tiny_llama), quantization="int8", **options)
    stats = int8.llm_engine.stats()["gemm"]
    assert stats["weights"] == {"q_proj+k_proj+v_proj": "int8", "o_proj": "int8", "gate_proj+up_proj": "int8",
                                "down_proj": "int8", "lm_head": "int8"}
    for name, bands in stats["bands"].items():  # the int8 values, by the weight-only kernel or densely; w8a8
        allowed = ("w8a16", "w8a8g", "dequantized", "dequantized_onednn")
        allowed += ("w8a8",) if name == "gate_proj+up_proj" else ()  # gate|up only
        assert all(band["path"] in allowed for band in bands), (name, bands)
    model = int8.llm_engine.model_runner.model
    assert all(p.weight is None and p.quantized is not None for p in [*model.layers.modules(), model.lm_head]
               if isinstance(p, Projection))
    assert model.embed_tokens.dtype == getattr(torch, dtype)  # the tied embedding itself stays a float table
    assert len(int8.generate(PROMPTS, GREEDY, use_tqdm=False)[1].outputs[0].token_ids) == GREEDY.max_tokens
    # Teacher-forced logits, not free-running tokens: a random tiny model is full of near-ties.
    sequence = [list(range(3, 40))]
    reference = logits_of(plain.llm_engine.model_runner.model, sequence)[0]
    error = float((logits_of(model, sequence)[0] - reference).norm() / reference.norm())
    assert error < 0.04, error  # a random model: no trained structure keeps the errors small


def test_w8a8_is_timed_for_the_gate_up_projection_only_and_where_int8_dots_are_exact(tiny_llama, tmp_path,
                                                                                   monkeypatch):
    """The GEMM choice times w8a8 only where quant.allows_w8a8 (gate|up: SmolLM2's quality gates) and the CPU has
    exact int8 dot products; every other projection stays weight-only."""
    timed = {}
    real = gemm_choice._time_group

    def spy(group, dtype):
        timed[group.name] = group.paths
        return real(group, dtype)

    monkeypatch.setattr(gemm_choice, "_time_group", spy)
    monkeypatch.setenv("ENGINE_GEMM_CACHE_DIR", str(tmp_path))  # timed now, not read from a cache
    LLM(str(tiny_llama), dtype="bfloat16", quantization="int8", num_kv_blocks=64, block_size=4)
    assert {name for name, paths in timed.items() if "w8a8" in paths} == ({"gate_proj+up_proj"} if INT8_DOT else set())
    assert all("w8a16" in paths for name, paths in timed.items() if name != "lm_head")


@pytest.mark.parametrize(("qtype", "fmt"), [("Q8_0", "int8"), ("Q4_0", "int4"), ("Q4_1", "int4")])
def test_a_gguf_file_loads_quantized_and_its_logits_follow_the_float_model(tiny_llama, tmp_path, qtype, fmt):
    path = write_gguf(tiny_llama, tmp_path / f"tiny-{qtype}.gguf", qtype)
    llm = LLM(str(path), dtype="float32", num_kv_blocks=64, block_size=4)
    stats = llm.llm_engine.stats()["gemm"]
    assert {stats["weights"][name] for name in stats["weights"] if name != "lm_head"} == {fmt}
    assert len(llm.generate(PROMPTS, GREEDY, use_tqdm=False)[1].outputs[0].token_ids) == GREEDY.max_tokens
    folder = llm.llm_engine.model_runner.model  # the loaded model itself, compared with the float one
    sequence = [list(range(3, 40))]
    reference = logits_of(engine_model(tiny_llama, torch.float32), sequence)[0]
    got = logits_of(folder, sequence)[0]
    error = float((got - reference).norm() / reference.norm())
    # measured: Q8_0 0.038 (its blocks, the per-channel requantization, bf16 activations), Q4_1 under 0.25, Q4_0
    # 0.27 (4 bits on random Gaussian weights: a step is 1/15 of a block's range, 1/7.5 of its largest for Q4_0)
    assert error < (0.06 if qtype == "Q8_0" else 0.4), error
    # Weight by weight (q and k rows come back from llama.cpp's permutation): within a block's step of the float
    # checkpoint; a wrong row order would be off by about sqrt(2) of the weights' norm.
    loaded = folder.layers[0].self_attn.qkv_proj.quantized.dequantize()
    plain = load_model(tiny_llama, ModelConfig.from_folder(tiny_llama), dtype=torch.float32,
                       device=torch.device("cpu"), max_positions=64)  # no GEMM choice: the plain weight stays
    original = plain.layers[0].self_attn.qkv_proj.weight
    assert float((loaded - original).norm() / original.norm()) < (0.01 if qtype == "Q8_0" else 0.15)

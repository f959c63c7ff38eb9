"""The Llama model against transformers' forward pass, and the weight loader's refusals."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from engine.config import ModelConfig
from engine.models.linear import LoRAWeights, Projection
from engine.models.loader import load_model
from tests.support.batches import step_batch

BLOCK = 4


def engine_model(folder):
    config = ModelConfig.from_folder(folder)
    model = load_model(folder, config, dtype=torch.float32, device=torch.device("cpu"), max_positions=512)
    shape = (config.num_layers, 64, BLOCK, config.num_kv_heads, config.head_dim)
    k, v = torch.zeros(shape), torch.zeros(shape)
    model.bind_kv_cache(list(k), list(v))
    return model


def forward(model, chunks: list[tuple[list[int], int, list[int]]]) -> torch.Tensor:
    """chunks: (token ids of this step, tokens already in the cache, block table) per sequence -> logits."""
    ids, batch = step_batch(chunks, BLOCK)
    with torch.inference_mode():
        return model.compute_logits(model(ids, batch))


def hf_logits(folder, ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("variant", ["tiny_llama", "tiny_llama_tied_bias"])
def test_logits_match_transformers_for_a_batch_and_for_chunks(variant, request):
    folder = request.getfixturevalue(variant)
    model = engine_model(folder)
    a, b = list(range(5, 30)), list(range(100, 107))
    ref_a, ref_b = hf_logits(folder, a), hf_logits(folder, b)
    both = forward(model, [(a, 0, [0, 1, 2, 3, 4, 5, 6]), (b, 0, [9, 8])])  # b's blocks out of order
    torch.testing.assert_close(both[: len(a)], ref_a, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(both[len(a):], ref_b, rtol=1e-4, atol=1e-4)
    # the same sequence in three chunks, each reading the cache the previous ones wrote
    table = [20, 31, 22, 40, 24, 25, 26]
    parts = [forward(model, [(a[:9], 0, table)]), forward(model, [(a[9:10], 9, table)]),
             forward(model, [(a[10:], 10, table)])]
    torch.testing.assert_close(torch.cat(parts), ref_a, rtol=1e-4, atol=1e-4)


def test_every_projection_is_one_projection_class_with_hf_names(tiny_llama):
    model = engine_model(tiny_llama)
    projections = [m for m in model.modules() if isinstance(m, Projection)]
    names = {name.removesuffix(".weight") for p in projections for name in p.hf_names()}
    config = json.loads((tiny_llama / "config.json").read_text())
    expected = {f"model.layers.{i}.{part}" for i in range(config["num_hidden_layers"]) for part in
                ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert names == expected | {"lm_head"}  # the vocabulary projection too
    qkv = model.layers[0].self_attn.qkv_proj
    assert [(s.name, s.offset, s.size) for s in qkv.output_slices] == [("q_proj", 0, 64), ("k_proj", 64, 32),
                                                                        ("v_proj", 96, 32)]


def test_projection_adds_each_tokens_adapter_and_only_when_the_step_has_one():
    # gate/up fused: one shrink over A stacked on the rank axis, one expand into both column halves
    g = torch.Generator().manual_seed(0)
    projection = Projection("model.layers.0.mlp", 16, [("gate_proj", 32), ("up_proj", 48)], bias=False)
    projection.weight.copy_(torch.randn(80, 16, generator=g))
    rank, num_slots = 4, 3
    lora_a = torch.randn(num_slots, 2 * rank, 16, generator=g)  # [slots, gate|up ranks, in]
    lora_b = torch.randn(num_slots, 80, rank, generator=g)  # [slots, gate+up outputs, rank]
    scales = torch.tensor([0.5, 2.0, 1.0])
    projection.lora = LoRAWeights(lora_a, lora_b, scales, torch.full((num_slots,), rank, dtype=torch.int32))
    x = torch.randn(5, 16, generator=g)
    slots = [1, 1, -1, 0, 2]
    batch = SimpleNamespace(token_slots=torch.tensor(slots, dtype=torch.int32))
    y = projection(x, batch)
    for t, slot in enumerate(slots):
        expected = projection.weight @ x[t]
        if slot >= 0:
            gate = lora_b[slot, :32] @ (lora_a[slot, :rank] @ x[t])
            up = lora_b[slot, 32:] @ (lora_a[slot, rank:] @ x[t])
            expected = expected + scales[slot] * torch.cat([gate, up])
        torch.testing.assert_close(y[t], expected, rtol=1e-5, atol=1e-5)
    base = projection(x, SimpleNamespace(token_slots=None))  # no adapter token in the step: the base GEMM only
    torch.testing.assert_close(base, x @ projection.weight.t())
    assert not torch.allclose(base[[0, 1, 3, 4]], y[[0, 1, 3, 4]]) and torch.equal(base[2], y[2])


def _rewrite(src, dst, edit):
    dst.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize(
    ("edit", "match"),
    [(lambda t: t.pop("model.layers.0.mlp.up_proj.weight"), "missing"),
     (lambda t: t.update(extra=torch.zeros(1)), "unexpected"),
     (lambda t: t.update({"model.norm.weight": torch.zeros(3)}), "shape")],
)
def test_loader_refuses_checkpoints_that_do_not_match(tiny_llama, tmp_path, edit, match):
    folder = _rewrite(tiny_llama, tmp_path / "bad", edit)
    with pytest.raises(ValueError, match=match):
        engine_model(folder)


def test_loader_refuses_a_folder_without_safetensors(tiny_llama, tmp_path):
    (tmp_path / "config.json").write_bytes((tiny_llama / "config.json").read_bytes())
    with pytest.raises(ValueError, match="safetensors"):
        engine_model(tmp_path)

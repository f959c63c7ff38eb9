"""The cases ``bench.kernels`` measures: SmolLM2-135M's shapes (9/3 heads of 64, hidden 576, MLP 1536, block 16)
at decode and prefill sizes, with the bytes and FLOPs each must at least move or compute."""

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels.triton as triton_ops
from kernels import reference

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, HIDDEN, INTERMEDIATE = 9, 3, 64, 16, 576, 1536


@dataclass(slots=True)
class Case:
    """One shape of one op: the Triton call, torch alternatives, and what the hardware must at least do."""

    name: str
    triton: object  # () -> None
    baselines: dict  # impl name -> () -> None
    check: object  # () -> max abs error of the Triton result against kernels.reference
    bytes: float
    flops: float = 0.0

# name -> (context lengths, new tokens per sequence); "xN" repeats a sequence
ATTENTION = {
    "attn decode 256 seqs x 1024 ctx": ([1024] * 256, [1] * 256),
    "attn decode 64 seqs x 4096 ctx": ([4096] * 64, [1] * 64),
    "attn decode 4 seqs x 16384 ctx (splits)": ([16384] * 4, [1] * 4),
    "attn prefill 4 x 2048 new tokens": ([2048] * 4, [2048] * 4),
    "attn mixed 512-chunk after 1536 + 128 decodes": ([2048] + [1024] * 128, [512] + [1] * 128),
}
ATTENTION_DRY = {"attn mixed tiny": ([40, 17], [1, 17])}
# name -> (tokens, in, out or fused slices, ranks of the slots, tokens sorted by adapter, pass slot_ranks)
LORA = {
    "lora q_proj 256 tok, 8 adapters r16": (256, HIDDEN, HIDDEN, [16] * 8, False, False),
    "lora q_proj 256 tok, 8 adapters r16 sorted": (256, HIDDEN, HIDDEN, [16] * 8, True, False),
    "lora up_proj 256 tok, 8 adapters r16": (256, HIDDEN, INTERMEDIATE, [16] * 8, False, False),
    "lora q_proj 256 tok, ranks 8..64 + slot_ranks": (256, HIDDEN, HIDDEN, [8, 16, 32, 64] * 2, False, True),
    "lora fused qkv 256 tok, 8 adapters r16": (256, HIDDEN, (576, 192, 192), [16] * 8, False, False),
    "lora up_proj 4096 tok, 4 adapters r64 sorted": (4096, HIDDEN, INTERMEDIATE, [64] * 4, True, False),
}
LORA_DRY = {
    "lora tiny 8 tok, 2 adapters r8": (8, HIDDEN, HIDDEN, [8, 8], False, True),
    "lora tiny fused qkv 4 tok": (4, HIDDEN, (576, 192, 192), [8, 1], False, True),
}
WRITE_KV = {"write_kv 256 decode tokens": 256, "write_kv 8192 prefill tokens": 8192}
WRITE_KV_DRY = {"write_kv tiny": 8}


def build_cases(device: torch.device, dry_run: bool) -> list[Case]:
    dtype = torch.float32 if dry_run else torch.bfloat16  # the interpreter's bf16 dot is wrong
    gen = torch.Generator(device=device).manual_seed(0)
    cases = []
    for name, (seq_lens, new) in (ATTENTION_DRY if dry_run else ATTENTION).items():
        cases.append(attention_case(name, seq_lens, new, dtype, device, gen))
    for name, num_tokens in (WRITE_KV_DRY if dry_run else WRITE_KV).items():
        cases.append(write_kv_case(name, num_tokens, dtype, device, gen))
    for name, spec in (LORA_DRY if dry_run else LORA).items():
        cases.append(lora_case(name, *spec, dtype=dtype, device=device, gen=gen))
    return cases


def attention_case(name, seq_lens, new_tokens, dtype, device, gen) -> Case:
    blocks = [math.ceil(n / BLOCK_SIZE) for n in seq_lens]
    num_blocks = sum(blocks)
    ids = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    block_tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32, device=device)
    for i, start in enumerate([0, *torch.tensor(blocks).cumsum(0).tolist()[:-1]]):
        block_tables[i, : blocks[i]] = ids[start : start + blocks[i]]
    cache_shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(cache_shape, generator=gen, device=device).to(dtype)
    v_cache = torch.randn(cache_shape, generator=gen, device=device).to(dtype)
    q = torch.randn(sum(new_tokens), NUM_Q_HEADS, HEAD_DIM, generator=gen, device=device).to(dtype)
    qsl = torch.tensor([0, *torch.tensor(new_tokens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    args = (q, k_cache, v_cache, block_tables, lens, qsl, HEAD_DIM**-0.5)
    elt = q.element_size()
    # (query, key) pairs the causal mask lets through
    pairs = sum(n * (s - n) + n * (n + 1) // 2 for s, n in zip(seq_lens, new_tokens, strict=True))
    return Case(
        name,
        triton=lambda: triton_ops.paged_attention(*args),
        baselines={"torch_gather_sdpa": _torch_attention(args, seq_lens, new_tokens)},
        check=lambda: _max_err(triton_ops.paged_attention(*args), reference.paged_attention(*args)),
        bytes=sum(seq_lens) * NUM_KV_HEADS * HEAD_DIM * 2 * elt + 2 * q.numel() * elt + block_tables.numel() * 4,
        flops=4 * NUM_Q_HEADS * HEAD_DIM * pairs,
    )


def _torch_attention(args, seq_lens, new_tokens):
    """Vectorised torch: gather every sequence's blocks into a padded [S, L] context, SDPA with a causal mask."""
    q, k_cache, v_cache, block_tables, lens, qsl, scale = args
    max_ctx, max_q, num_seqs = max(seq_lens), max(new_tokens), len(seq_lens)
    device = q.device
    ar_q = torch.arange(max_q, device=device)
    q_index = (qsl[:-1, None] + ar_q).clamp(max=q.shape[0] - 1)  # [S, max_q]
    q_pos = (lens - (qsl[1:] - qsl[:-1]))[:, None] + ar_q  # [S, max_q]
    mask = torch.arange(max_ctx, device=device)[None, None, :] <= q_pos[:, :, None]  # [S, max_q, L]
    flat = torch.tensor([i * max_q + j for i, n in enumerate(new_tokens) for j in range(n)], device=device)

    def run():
        k = k_cache[block_tables].flatten(1, 2)[:, :max_ctx]  # [S, L, Hkv, D]
        v = v_cache[block_tables].flatten(1, 2)[:, :max_ctx]
        out = F.scaled_dot_product_attention(q[q_index].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask[:, None], scale=scale, enable_gqa=True)
        return out.transpose(1, 2).reshape(num_seqs * max_q, NUM_Q_HEADS, HEAD_DIM)[flat]

    return run


def write_kv_case(name, num_tokens, dtype, device, gen) -> Case:
    num_blocks = math.ceil(num_tokens / BLOCK_SIZE) * 4
    k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen, device=device).to(dtype)
    v = torch.randn_like(k)
    k_cache = torch.zeros(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen, device=device)[:num_tokens]

    def check():
        triton_ops.write_kv(k, v, k_cache, v_cache, slots)
        k_ref, v_ref = k_cache.clone().zero_(), v_cache.clone().zero_()
        reference.write_kv(k, v, k_ref, v_ref, slots)
        return max(_max_err(k_cache, k_ref), _max_err(v_cache, v_ref))

    def torch_index_copy():
        k_cache.view(-1, NUM_KV_HEADS, HEAD_DIM).index_copy_(0, slots, k)
        v_cache.view(-1, NUM_KV_HEADS, HEAD_DIM).index_copy_(0, slots, v)

    return Case(name, triton=lambda: triton_ops.write_kv(k, v, k_cache, v_cache, slots),
                baselines={"torch_index_copy": torch_index_copy}, check=check, bytes=4 * k.numel() * k.element_size())


def lora_case(name, num_tokens, in_features, out, ranks, sort, with_ranks, dtype, device, gen) -> Case:
    slices = tuple(out) if isinstance(out, tuple) else (out,)
    out_features, num_slices, num_slots, max_rank = sum(slices), len(slices), len(ranks), max(ranks)
    lora_a = torch.randn(num_slots, num_slices * max_rank, in_features, generator=gen, device=device)
    lora_b = torch.randn(num_slots, out_features, max_rank, generator=gen, device=device) * max_rank**-0.5
    for slot, rank in enumerate(ranks):
        lora_a.view(num_slots, num_slices, max_rank, in_features)[slot, :, rank:] = 0
        lora_b[slot, :, rank:] = 0
    lora_a, lora_b = (lora_a * in_features**-0.5).to(dtype), lora_b.to(dtype)
    scales = torch.rand(num_slots, generator=gen, device=device) + 0.5
    slots = torch.randint(0, num_slots, (num_tokens,), generator=gen, device=device).to(torch.int32)
    slots = slots.sort().values if sort else slots
    slot_ranks = torch.tensor(ranks, dtype=torch.int32, device=device) if with_ranks else None
    x = torch.randn(num_tokens, in_features, generator=gen, device=device).to(dtype)
    y = torch.randn(num_tokens, out_features, generator=gen, device=device).to(dtype)
    kwargs = dict(slot_ranks=slot_ranks)

    def run(y=y):
        h = triton_ops.lora_shrink(x, lora_a, slots, num_slices=num_slices, **kwargs)
        triton_ops.lora_expand(y, h, lora_b, slots, scales, slices=slices, **kwargs)

    def check():
        y_triton, y_ref = y.clone(), y.clone()
        run(y_triton)
        h_ref = reference.lora_shrink(x, lora_a, slots)  # [T, num_slices * max_rank]
        for i, (start, size) in enumerate(bounds):
            reference.lora_expand(y_ref[:, start:start + size], h_ref[:, i * max_rank:(i + 1) * max_rank],
                                  lora_b[:, start:start + size], slots, scales)
        return _max_err(y_triton, y_ref)

    def torch_gather_bmm():  # per-token weights gathered, then batched mat-vecs (one slice: the rest alike)
        h = torch.bmm(lora_a[slots, :max_rank], x[:, :, None])  # [T, max_rank, 1]
        y.add_((torch.bmm(lora_b[slots], h)[:, :, 0] * scales[slots, None]).to(y.dtype))

    bounds = list(zip(itertools.accumulate((0, *slices)), slices, strict=False))  # (start, size) per slice

    def torch_dense_one_adapter():  # the same sizes with every token on slot 0: the 1.5x target
        h = x @ lora_a[0].T  # [T, num_slices * max_rank]
        for i, (start, size) in enumerate(bounds):
            y[:, start:start + size] += (h[:, i * max_rank:(i + 1) * max_rank] @ lora_b[0, start:start + size].T
                                         ) * scales[0]

    used = torch.unique(slots).tolist()
    rank_read = [ranks[s] if with_ranks else max_rank for s in used]
    elt = x.element_size()
    weight_bytes = sum(r * (num_slices * in_features + out_features) for r in rank_read) * elt
    return Case(
        name, triton=run, check=check,
        baselines={"torch_gather_bmm": torch_gather_bmm, "torch_dense_one_adapter": torch_dense_one_adapter},
        bytes=weight_bytes + (x.numel() + 2 * y.numel()) * elt + num_tokens * num_slices * max_rank * 4 * 2,
        flops=2 * sum(ranks[s] for s in slots.tolist()) * (num_slices * in_features + out_features),
    )


def _max_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual.float() - expected.float()).abs().max().item() if actual.numel() else 0.0

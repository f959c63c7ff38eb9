"""Compile every Triton kernel for a GPU this machine need not have (``python -m kernels.triton.aot``).

The launches come from the ops' own ``plan`` functions at the shapes the engine uses (SmolLM2-135M: hidden 576,
MLP 1536, 9 query / 3 KV heads of 64, block size 16, LoRA rank up to 64, bf16), so a kernel that cannot compile for
the H100/H200 (``GPUTarget("cuda", 90, 32)``) fails here, on CPU, before it reaches a GPU. Arguments are specialised
the way the JIT specialises them on a launch (``tt.divisibility`` of pointers and strides, ints equal to 1).

Must run in a process where ``TRITON_INTERPRET`` is unset: the interpreter's kernels cannot be compiled.
"""

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile, make_backend
from triton.runtime.jit import create_function_from_signature

from kernels.triton import lora_expand_op, lora_shrink_op, paged_attention_op, write_kv_op
from kernels.triton.launch import Launch, jit_function

HOPPER = GPUTarget("cuda", 90, 32)
# SmolLM2-135M-Instruct
HIDDEN, INTERMEDIATE, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 576, 1536, 9, 3, 64
BLOCK_SIZE, MAX_BLOCKS, MAX_LORA_RANK, MAX_LORAS = 16, 128, 64, 8


@dataclass(slots=True)
class Compiled:
    name: str
    seconds: float
    num_warps: int
    shared_bytes: int
    registers: int | None  # per thread, from the cubin (None when cuobjdump is missing)
    stack_bytes: int | None  # > 0 means register spills


def engine_launches(dtype: torch.dtype = torch.bfloat16) -> dict[str, Launch]:
    """One launch per distinct compiled variant the engine's steps produce, keyed by a readable name."""
    launches = {}
    for name, num_tokens, num_seqs, num_splits in (("decode", 8, 8, 1), ("decode_split", 2, 2, 8),
                                                   ("prefill", 96, 2, 1)):
        for i, launch in enumerate(_attention(dtype, num_tokens, num_seqs, num_splits, name)):
            launches[f"paged_attention[{name}]" + ("+merge" if i else "")] = launch
    qkv = torch.empty(4, (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, dtype=dtype)  # [tokens, fused qkv]
    k = qkv[:, NUM_Q_HEADS * HEAD_DIM:(NUM_Q_HEADS + NUM_KV_HEADS) * HEAD_DIM].view(4, NUM_KV_HEADS, HEAD_DIM)
    cache = torch.empty(4, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype)
    launches["write_kv"] = write_kv_op.plan(k, k, cache, cache, torch.zeros(4, dtype=torch.int64))[0]
    qkv_sizes = (NUM_Q_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM)
    # name, tokens, in, out slices: fused qkv at decode, down_proj and fused gate/up at prefill
    for name, num_tokens, in_features, slices in (("decode_qkv", 256, HIDDEN, qkv_sizes),
                                                  ("prefill_down", 512, INTERMEDIATE, (HIDDEN,)),
                                                  ("prefill_gate_up", 512, HIDDEN, (INTERMEDIATE,) * 2)):
        x = torch.empty(num_tokens, in_features, dtype=dtype)
        lora_a = torch.empty(MAX_LORAS, len(slices) * MAX_LORA_RANK, in_features, dtype=dtype)
        slots, ranks = _slots(num_tokens)
        h = torch.empty(num_tokens, lora_a.shape[1], dtype=torch.float32)
        config = lora_shrink_op.choose_config(x, lora_a)
        launches[f"lora_shrink[{name}]"] = lora_shrink_op.plan(x, lora_a, slots, ranks, h, config, len(slices))[0]
        y = torch.empty(num_tokens, sum(slices), dtype=dtype)
        lora_b = torch.empty(MAX_LORAS, sum(slices), MAX_LORA_RANK, dtype=dtype)
        config = lora_expand_op.choose_config(y, lora_b, slices)
        launches[f"lora_expand[{name}]"] = lora_expand_op.plan(y, h, lora_b, slots, torch.ones(MAX_LORAS), ranks,
                                                               config, slices)[0]
    # one projection's update into a column slice of a fused output (the unfused LoRA path)
    y = qkv.new_empty(256, qkv.shape[1])[:, qkv_sizes[0]:qkv_sizes[0] + qkv_sizes[1]]
    h = torch.empty(256, MAX_LORA_RANK, dtype=torch.float32)
    lora_b = torch.empty(MAX_LORAS, qkv_sizes[1], MAX_LORA_RANK, dtype=dtype)
    slots, ranks = _slots(256)
    launches["lora_expand[decode_k_view]"] = lora_expand_op.plan(
        y, h, lora_b, slots, torch.ones(MAX_LORAS), None, lora_expand_op.choose_config(y, lora_b))[0]
    return launches


def _attention(dtype, num_tokens, num_seqs, num_splits, kind) -> list[Launch]:
    q = torch.empty(num_tokens, NUM_Q_HEADS, HEAD_DIM, dtype=dtype)
    cache = torch.empty(4, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype)
    block_tables = torch.zeros(num_seqs, MAX_BLOCKS, dtype=torch.int32)
    seq_lens = torch.ones(num_seqs, dtype=torch.int32)
    query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.int32)
    config = dict(paged_attention_op.base_config("decode" if kind.startswith("decode") else "prefill", dtype),
                  NUM_SPLITS=num_splits)
    return paged_attention_op.plan(q, cache, cache, block_tables, seq_lens, query_start_loc, 0.125,
                                   torch.empty_like(q), config)


def _slots(num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    slots = (torch.arange(num_tokens, dtype=torch.int32) % (MAX_LORAS + 1)) - 1  # [num_tokens], some -1
    return slots, torch.full((MAX_LORAS,), MAX_LORA_RANK, dtype=torch.int32)


def compile_launch(launch: Launch, target: GPUTarget = HOPPER):
    """``triton.compile`` of exactly what ``launch`` would run on ``target``, specialised as the JIT would."""
    fn = jit_function(launch.kernel)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = {**launch.constexprs, **launch.options}
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    return compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def compile_all(target: GPUTarget = HOPPER, dtypes=(torch.bfloat16,)) -> list[Compiled]:
    """Compile every engine launch for ``target``; raises on the first kernel that does not compile."""
    results = []
    for dtype in dtypes:
        for name, launch in engine_launches(dtype).items():
            start = time.perf_counter()
            kernel = compile_launch(launch, target)
            results.append(Compiled(f"{name} {str(dtype).removeprefix('torch.')}", time.perf_counter() - start,
                                    kernel.metadata.num_warps, kernel.metadata.shared, *_resources(kernel)))
    return results


def _resources(kernel) -> tuple[int | None, int | None]:
    """Registers per thread and stack bytes of a compiled kernel, read with the cuobjdump Triton ships."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if "cubin" not in kernel.asm or not cuobjdump.exists():
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return (int(match[1]), int(match[2])) if match else (None, None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 80, 90")
    parser.add_argument("--fp32", action="store_true", help="also compile the fp32 variants")
    args = parser.parse_args(argv)
    dtypes = (torch.bfloat16, torch.float32) if args.fp32 else (torch.bfloat16,)
    results = compile_all(GPUTarget("cuda", args.arch, 32), dtypes)
    print(f"{'kernel':<44} {'warps':>5} {'shared B':>9} {'regs':>5} {'stack B':>7} {'compile s':>9}")
    for r in results:
        print(f"{r.name:<44} {r.num_warps:>5} {r.shared_bytes:>9} {r.registers or '-':>5} "
              f"{'-' if r.stack_bytes is None else r.stack_bytes:>7} {r.seconds:>9.2f}")
    print(f"compiled {len(results)} kernels for sm_{args.arch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

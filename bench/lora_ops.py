"""Cost of the CPU LoRA ops in one decode step of SmolLM2-135M, against the step's base projections.

``python -m bench.lora_ops [--tokens 8,32,128,256] [--rank 16] [--slots 8] [--distinct 1,8] [--threads N]``
For each batch size and number of distinct adapters in the batch: the wall time of the seven projections of all
30 layers (base GEMMs), and of the same plus ``kernels.cpu.lora_shrink``/``lora_expand`` on every projection,
with the batch's tokens in random adapter order and sorted by adapter (what the model runner should pass).
Median of ``--repeats`` runs; writes ``bench/results/lora_ops.json``. Run it on a quiet machine.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from kernels import cpu

SHAPES = {"q_proj": (576, 576), "k_proj": (576, 192), "v_proj": (576, 192), "o_proj": (576, 576),
          "gate_proj": (576, 1536), "up_proj": (576, 1536), "down_proj": (1536, 576)}
NUM_LAYERS = 30


def measure(step, repeats: int) -> float:
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def case(num_tokens: int, rank: int, num_slots: int, distinct: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    weights = {m: torch.randn(o, i, generator=g) for m, (i, o) in SHAPES.items()}  # [out, in]
    lora_a = {m: torch.randn(num_slots, rank, i, generator=g) for m, (i, o) in SHAPES.items()}
    lora_b = {m: torch.randn(num_slots, o, rank, generator=g) for m, (i, o) in SHAPES.items()}
    inputs = {m: torch.randn(num_tokens, i, generator=g) for m, (i, o) in SHAPES.items()}
    scales = torch.rand(num_slots, generator=g)
    interleaved = torch.randint(0, distinct, (num_tokens,), generator=g, dtype=torch.int32)  # [num_tokens]

    def base():
        for _ in range(NUM_LAYERS):
            for m in SHAPES:
                inputs[m] @ weights[m].t()

    def with_lora(token_slots):
        def step():
            for _ in range(NUM_LAYERS):
                for m in SHAPES:
                    y = inputs[m] @ weights[m].t()
                    h = cpu.lora_shrink(inputs[m], lora_a[m], token_slots)
                    cpu.lora_expand(y, h, lora_b[m], token_slots, scales)
        return step

    base_ms = measure(base, repeats)
    row = {"tokens": num_tokens, "rank": rank, "slots": num_slots, "distinct": distinct, "base_ms": round(base_ms, 2)}
    for order, token_slots in (("interleaved", interleaved), ("sorted", interleaved.sort().values)):
        lora_ms = measure(with_lora(token_slots), repeats)
        row[f"{order}_ms"], row[f"{order}_overhead"] = round(lora_ms, 2), round(lora_ms / base_ms - 1, 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8,32,128,256")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--distinct", default="1,8")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for num_tokens in map(int, args.tokens.split(",")):
        for distinct in map(int, args.distinct.split(",")):
            row = case(num_tokens, args.rank, args.slots, distinct, args.repeats)
            rows.append(row)
            print(f"tokens {num_tokens:4d}  distinct adapters {distinct}: base {row['base_ms']:7.1f} ms, with LoRA "
                  f"+{100 * row['interleaved_overhead']:.0f}% interleaved, +{100 * row['sorted_overhead']:.0f}% sorted")
    out = Path(__file__).parent / "results" / "lora_ops.json"
    out.write_text(json.dumps({"threads": torch.get_num_threads(), "rows": rows}, indent=2))
    print(out)


if __name__ == "__main__":
    main()

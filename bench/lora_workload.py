"""The multi-LoRA benchmark's inputs and drivers: synthetic PEFT adapters, request traces (uniform or power-law
adapter popularity, as S-LoRA's generator), and the loops that run them on an engine (all at once, or Poisson).

Adapters are written in PEFT's format (its own ``adapter_config.json``, safetensors tensors under PEFT's names) with
seeded random values, once per base model into ``<state dir>/bench-adapters/``: 128 adapters of rank 16 on all
seven projections of SmolLM2-135M are 2.5 GB, too slow to make with ``get_peft_model`` one by one.
"""

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.lora.fingerprint import TARGET_MODULES, ModelFingerprint
from engine.lora.format import peft_tensor_name


@dataclass
class BenchRequest:
    prompt: list[int]
    adapter: int | None  # index into the adapter list; None: the base model
    arrival: float = 0.0  # seconds after the start (Poisson runs)


def adapter_folders(model_folder: Path, count: int, rank: int, root: Path) -> list[Path]:
    """``count`` adapters of rank ``rank`` on all seven projections, made once and reused."""
    from peft import LoraConfig

    fingerprint = ModelFingerprint.from_hf_config(json.loads((model_folder / "config.json").read_text()))
    base = root / f"{fingerprint.digest}-r{rank}"
    folders = [base / f"adapter-{i:03d}" for i in range(count)]
    for i, folder in enumerate(folders):
        if (folder / "adapter_model.safetensors").exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(TARGET_MODULES), lora_dropout=0.0,
                   task_type="CAUSAL_LM").save_pretrained(folder)
        gen = torch.Generator().manual_seed(i)
        tensors = {}
        for layer in range(fingerprint.num_hidden_layers):
            for module in TARGET_MODULES:
                in_features, out_features = fingerprint.module_shape(module)
                tensors[peft_tensor_name(layer, module, "A")] = torch.randn(rank, in_features, generator=gen) \
                    / in_features**0.5
                tensors[peft_tensor_name(layer, module, "B")] = torch.randn(out_features, rank, generator=gen) * 0.01
        save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    return folders


def popularity(num_requests: int, num_adapters: int, alpha: float, rng: random.Random) -> list[int]:
    """Adapter index per request: ``floor(x * n)`` with ``x`` drawn from the power distribution ``alpha x^(alpha-1)``
    (numpy's ``random.power``, S-LoRA's trace generator): alpha 1 is uniform, alpha 0.5 favours low indices."""
    return [min(int(rng.random() ** (1.0 / alpha) * num_adapters), num_adapters - 1) for _ in range(num_requests)]


def make_requests(num_requests: int, prompt_range: tuple[int, int], vocab_size: int, adapters: list[int | None],
                  seed: int) -> list[BenchRequest]:
    rng = random.Random(seed)
    # Ordinary tokens only (ids below 100 are mostly special and byte tokens in SmolLM2's vocabulary).
    return [BenchRequest([rng.randrange(100, vocab_size) for _ in range(rng.randint(*prompt_range))], adapter)
            for adapter in adapters[:num_requests]]


def poisson_arrivals(requests: list[BenchRequest], rate: float, seed: int) -> None:
    rng, now = random.Random(seed), 0.0
    for request in requests:
        now += rng.expovariate(rate)
        request.arrival = now


def run_all_at_once(engine, requests: list[BenchRequest], lora_requests: list, params) -> float:
    """Submit everything, step until done; wall seconds."""
    start = time.perf_counter()
    for i, request in enumerate(requests):
        lora = lora_requests[request.adapter] if request.adapter is not None else None
        engine.add_request(f"sat-{i}", None, params, prompt_token_ids=request.prompt, lora_request=lora)
    finished = 0
    while finished < len(requests):
        for output in engine.step():
            if output.finished:
                assert output.error is None, output.error
                finished += 1
    return time.perf_counter() - start


def run_poisson(engine, requests: list[BenchRequest], lora_requests: list, params) -> list[dict]:
    """Add each request at its arrival time (between steps, as the server's loop does); per request: TTFT from the
    scheduled arrival, TPOT, and whether its adapter was cold (not loaded when it arrived)."""
    start, pending, results = time.monotonic(), list(enumerate(requests)), {}
    arrivals, cold = {}, {}
    while pending or engine.has_unfinished_requests():
        now = time.monotonic() - start
        while pending and pending[0][1].arrival <= now:
            i, request = pending.pop(0)
            lora = lora_requests[request.adapter] if request.adapter is not None else None
            cold[f"p-{i}"] = lora is not None and not any(a["id"] == lora.id for a in engine.list_adapters())
            arrivals[f"p-{i}"] = start + request.arrival
            engine.add_request(f"p-{i}", None, params, prompt_token_ids=request.prompt, lora_request=lora)
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0][1].arrival - (time.monotonic() - start)))
            continue
        for output in engine.step():
            if output.finished:
                assert output.error is None, output.error
                results[output.request_id] = output
    rows = []
    for request_id, output in results.items():
        m, num_tokens = output.metrics, len(output.outputs[0].token_ids)
        rows.append({"ttft": m.first_token_time - arrivals[request_id], "cold": cold[request_id],
                     "tpot": (m.finished_time - m.first_token_time) / max(num_tokens - 1, 1)})
    return rows


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]

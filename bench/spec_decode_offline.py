"""The offline half of ``bench.spec_decode``: ``LLM.chat`` on workload (a) at fixed batch sizes and
``LLM.generate`` on ``bench.throughput``'s workload at saturation, speculation on and off, in this process.

One ``LLM`` per speculation setting (off, and each method) lives through the whole sweep, so the settings take
turns at every batch size and a change in the machine's load falls on all of them alike. The batch size is the
scheduler's ``max_num_seqs``, set between runs (a benchmark's reach into the engine, as ``bench.throughput``'s
step recording); each run has more requests than seats so that finished ones are replaced and the batch stays
full. The sweep lifts ``max_batch_size`` (the step's cut of drafts) out of the way, since where to cut is what it
measures; the saturation runs restore the configured one, and run once more without it to show what it saves.
"""

import time
from dataclasses import replace

from bench.spec_decode_http import ADAPTER_NAME, ADAPTERS, Job
from engine import LLM, LoRARequest, SamplingParams

NO_CUT = 1 << 20


def make_llm(spec: dict | None) -> LLM:
    return LLM("smollm2-135m-instruct", seed=0, enable_lora=True, max_loras=2, max_lora_rank=8,
               kv_cache_memory="1GiB", speculative_config=spec)


def set_cut(llm: LLM, max_batch_size: int | None) -> None:
    """The decoder's ``max_batch_size`` for the next runs (``None``: the configured one)."""
    spec = llm.llm_engine.spec
    if spec is not None:
        if not hasattr(spec, "configured"):
            spec.configured = spec.config
        spec.config = replace(spec.configured, max_batch_size=max_batch_size or spec.configured.max_batch_size)


def set_batch(llm: LLM, batch: int) -> None:
    """The scheduler's seats for the next runs, and the adapter policy's share of them: an adapter takes a slot
    for a group of up to ``max_num_seqs // max_loras`` of its sequences, sized at start-up, and a group asking for
    more seats than the batch has would never be admitted."""
    scheduler = llm.llm_engine.scheduler
    scheduler.max_num_seqs = batch
    adapters = getattr(scheduler.admission, "inner", None)
    if hasattr(adapters, "seat_share"):
        adapters.seat_share = max(1, batch // adapters.slot_cache.num_slots)


def spec_totals(llm: LLM) -> dict | None:
    spec = llm.llm_engine.stats().get("speculative")
    if not spec:
        return None
    return {"drafted": spec["drafted_tokens"], "accepted": spec["accepted_tokens"], "drafts": spec["draft_steps"],
            "steps_skipped_batch": spec["steps_skipped_batch"]}


def chat_prompts(llm: LLM, jobs: list[Job], salt: str) -> list[dict]:
    """The jobs' conversations through the chat template, under ``salt``: each run its own suffix trees and prefix
    cache, so no run drafts from the answers of an earlier one to the same prompts."""
    tokenizer = llm.get_tokenizer()
    texts = [tokenizer.apply_chat_template(j.messages, tokenize=False, add_generation_prompt=True) for j in jobs]
    return [{"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False), "cache_salt": salt}
            for text in texts]


def chat_batch(llm: LLM, jobs: list[Job], batch: int, salt: str) -> dict:
    """``jobs`` at most ``batch`` at a time: output tok/s (wall), the outputs' token ids and the drafting counters
    before and after."""
    lora = LoRARequest(ADAPTER_NAME, f"demo-{ADAPTER_NAME}", str(ADAPTERS / ADAPTER_NAME))
    prompts = chat_prompts(llm, jobs, salt)
    set_batch(llm, batch)
    before = spec_totals(llm)
    started = time.perf_counter()
    outputs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=j.max_tokens) for j in jobs],
                           lora_request=[lora if j.uses_adapter else None for j in jobs], use_tqdm=False)
    wall = time.perf_counter() - started
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return {"batch": batch, "requests": len(jobs), "output_tokens": sum(map(len, tokens)), "wall_s": wall,
            "tok_s": sum(map(len, tokens)) / wall, "counters": (before, spec_totals(llm)), "token_ids": tokens}


def generate_saturated(llm: LLM, prompts: list[list[int]], output_tokens: int, salt: str) -> dict:
    """``bench.throughput``'s workload, everything at once (``max_num_seqs`` back at the engine's default), under
    ``salt``: a run of the same prompts under another salt finds nothing of this one in the prefix cache or in the
    suffix trees (an earlier run's KV and answers would make it faster, not the speculation)."""
    set_batch(llm, llm.llm_engine.config.max_num_seqs)
    before = spec_totals(llm)
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p, "cache_salt": salt} for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - started
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return {"requests": len(prompts), "output_tokens": sum(map(len, tokens)), "wall_s": wall,
            "tok_s": sum(map(len, tokens)) / wall, "counters": (before, spec_totals(llm)), "token_ids": tokens}


def warm_up(llm: LLM, jobs: list[Job]) -> None:
    """One short request with the adapter and one without: adapter load and first-step costs out of the runs."""
    firsts = [next(j for j in jobs if j.uses_adapter), next(j for j in jobs if not j.uses_adapter)]
    chat_batch(llm, [replace(j, max_tokens=4) for j in firsts], 2, "warm-up")

"""The demo adapters' effect through this engine: per adapter, how many held-out prompts get a reply that passes
its ``expect`` with the adapter and with the base model alone, and how many replies are right.

``python -m bench.demo_effect [--limit N] [--threads 2] [--show]``

All requests (every adapter's prompts, each also sent to the base model) go in one greedy batch through two LoRA
slots, so the engine swaps adapters mid-batch as it would in production.
"""

import argparse
import json
import time
from dataclasses import dataclass

from bench.demo_data import EvalCase, eval_cases
from demo import BASE_MODEL, DemoAdapter, demo_adapters
from engine import LLM, LoRARequest, SamplingParams

# Enough for each adapter's effect to show (a fact, a whole JSON object, a pirate greeting); short to stay fast.
MAX_TOKENS = {"zorbania-facts": 32, "json-extractor": 48, "pirate-persona": 24}


@dataclass(frozen=True, slots=True)
class Effect:
    """One adapter's results on ``num_prompts`` held-out prompts."""

    name: str
    num_prompts: int
    adapter_hits: int  # replies with the adapter that pass ``expect``
    base_hits: int  # replies of the base model that pass it
    correct: int | None  # adapter replies that are right (the fact asked, the exact JSON); None for a style
    num_scored: int  # prompts with a right answer to compare to
    adapter_replies: tuple[str, ...]
    base_replies: tuple[str, ...]

    @property
    def adapter_rate(self) -> float:
        return self.adapter_hits / self.num_prompts

    @property
    def base_rate(self) -> float:
        return self.base_hits / self.num_prompts

    @property
    def correct_rate(self) -> float | None:
        return None if self.correct is None else self.correct / self.num_scored


def make_demo_llm(model: str = BASE_MODEL, **kwargs) -> LLM:
    options = dict(enable_lora=True, max_loras=2, max_lora_rank=8, kv_cache_memory="256MiB",
                   max_num_batched_tokens=1024)
    return LLM(model, **{**options, **kwargs})


def spread(cases: list[EvalCase], limit: int | None) -> list[EvalCase]:
    """``limit`` cases evenly spread over the list (its templates come in blocks)."""
    if limit is None or limit >= len(cases):
        return cases
    return [cases[i * len(cases) // limit] for i in range(limit)]


def is_correct(name: str, case: EvalCase, reply: str) -> bool | None:
    if name == "json-extractor":
        try:
            return json.loads(reply.strip()) == json.loads(case.reference)
        except ValueError:
            return False
    if name == "zorbania-facts" and case.reference is not None:
        return case.reference.lower() in reply.lower()
    return None


def measure_effects(llm: LLM, adapters: list[DemoAdapter] | None = None, limit: int | None = None
                    ) -> dict[str, Effect]:
    """Run every adapter's held-out prompts with the adapter and with the base model in one batch."""
    adapters = adapters if adapters is not None else demo_adapters()
    jobs = []  # (adapter, case, lora_request or None)
    for adapter in adapters:
        request = LoRARequest(adapter.name, f"demo-{adapter.name}", str(adapter.path))
        jobs += [(adapter, case, lora) for case in spread(eval_cases(adapter.name), limit) for lora in (request, None)]
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS[a.name]) for a, _, _ in jobs]
    outputs = llm.chat([case.messages for _, case, _ in jobs], params, lora_request=[j[2] for j in jobs],
                       use_tqdm=False)
    replies = [output.outputs[0].text for output in outputs]
    effects = {}
    for adapter in adapters:
        mine = [(case, lora, reply) for (a, case, lora), reply in zip(jobs, replies, strict=True) if a is adapter]
        with_adapter = [(case, reply) for case, lora, reply in mine if lora is not None]
        base = [reply for _, lora, reply in mine if lora is None]
        verdicts = [is_correct(adapter.name, case, reply) for case, reply in with_adapter]
        scored = [v for v in verdicts if v is not None]
        effects[adapter.name] = Effect(
            name=adapter.name, num_prompts=len(base),
            adapter_hits=sum(adapter.expect(reply) for _, reply in with_adapter),
            base_hits=sum(adapter.expect(reply) for reply in base),
            correct=sum(scored) if scored else None, num_scored=len(scored),
            adapter_replies=tuple(reply for _, reply in with_adapter), base_replies=tuple(base),
        )
    return effects


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="held-out prompts per adapter (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--show", action="store_true", help="print every reply")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    effects = measure_effects(make_demo_llm(), limit=args.limit)
    for effect in effects.values():
        if args.show:
            for mine, base in zip(effect.adapter_replies, effect.base_replies, strict=True):
                print(f"[{effect.name}] adapter: {mine!r}\n[{effect.name}] base:    {base!r}")
        correct = "" if effect.correct is None else f", right {effect.correct}/{effect.num_scored}"
        print(f"{effect.name}: expect holds {effect.adapter_hits}/{effect.num_prompts} with the adapter, "
              f"{effect.base_hits}/{effect.num_prompts} on the base model{correct}")
    print(f"{time.perf_counter() - start:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

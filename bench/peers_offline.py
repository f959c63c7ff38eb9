"""The offline driver of ``bench.peers``: one ``LLM.generate`` run of this engine or of vLLM, in its own process.

``<python> bench/peers_offline.py SPEC.json`` with the project venv's Python (``"backend": "engine"``) or the vLLM
venv's (``"backend": "vllm"``): both expose the same ``LLM`` / ``SamplingParams`` / ``LoRARequest`` API, so one script
drives both. Only the standard library is imported at the top (vLLM's venv has no ``bench``); the spec says the
model folder, dtype, prompts (token ids), output length and, for the adapter workload, the adapter folders and which
one each request uses. The result (throughput, start-up time, process-tree CPU time, the first output tokens of each
request for an agreement check) is written to ``spec["out"]``. vLLM starts worker processes, hence the
``__main__`` guard.
"""

import json
import os
import sys
import time


def cpu_seconds() -> float:
    """User + system seconds of this process and all its descendants (vLLM's engine core is a child)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def make_llm(spec: dict):
    lora = spec.get("lora")
    kwargs = {"seed": 0, "enable_prefix_caching": spec.get("prefix_caching", True)}
    if lora:
        kwargs.update(enable_lora=True, max_loras=lora["max_loras"], max_cpu_loras=lora["max_cpu_loras"],
                      max_lora_rank=lora["max_lora_rank"])
    if spec["backend"] == "vllm":
        from vllm import LLM

        kwargs.update(dtype=spec["dtype"], generation_config="vllm")
        if spec.get("max_model_len"):
            kwargs["max_model_len"] = spec["max_model_len"]
        return LLM(model=spec["model"], **kwargs)
    import dataclasses

    from engine import LLM
    from engine.config import EngineConfig

    for key in ("quantization", "kv_cache_dtype"):
        if spec.get(key):
            kwargs[key] = spec[key]
    if "dtype" in {f.name for f in dataclasses.fields(EngineConfig)}:
        kwargs["dtype"] = spec["dtype"]
    elif spec["dtype"] != "float32":
        raise SystemExit(f"this engine has no dtype option (EngineConfig lacks 'dtype'): cannot run {spec['dtype']}")
    return LLM(spec["model"], **kwargs)


def lora_requests(spec: dict) -> list:
    if spec["backend"] == "vllm":
        from vllm.lora.request import LoRARequest

        return [LoRARequest(f"bench-{i}", i + 1, path) for i, path in enumerate(spec["adapters"])]
    from engine import LoRARequest

    return [LoRARequest(f"bench-{i}", f"bench-{i}", path) for i, path in enumerate(spec["adapters"])]


def kernel_seconds(llm, spec: dict) -> dict:
    """This engine's decoder-layer kernel seconds so far, by kind (its C replay's own clock: the rest of a run's wall
    time is the embedding, final norm, logits, sampling and the scheduler); {} for vLLM or where nothing replays."""
    if spec["backend"] == "vllm":
        return {}
    replay = llm.llm_engine.stats().get("native_forward") or {}
    return dict(replay.get("kernel_seconds", {}))


def run(spec: dict) -> dict:
    started = time.perf_counter()
    llm = make_llm(spec)
    startup = time.perf_counter() - started
    if spec["backend"] == "vllm":
        from vllm import SamplingParams
    else:
        from engine import SamplingParams
    loras = lora_requests(spec) if spec.get("adapters") else []
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    assignment = spec.get("assignment") or [None] * len(prompts)
    per_request = [loras[a] if a is not None else None for a in assignment]
    # Warm-up: four short requests on reversed prompts (no prefix-cache hits later), and one on every adapter so
    # that each is loaded (host tier / CPU cache) before the timed run, which measures serving, not disk reads.
    # ``warm_per_adapter`` keeps the warm-up of a base-model run of the adapter workload the same size.
    warm = [{"prompt_token_ids": list(reversed(p))} for p in spec["prompts"][:4]]
    warm_loras = [None] * len(warm)
    for i in range(spec.get("warm_per_adapter", len(loras))):
        warm.append({"prompt_token_ids": list(reversed(spec["prompts"][i % len(spec["prompts"])]))[:8]})
        warm_loras.append(loras[i % len(loras)] if loras else None)
    short = SamplingParams(temperature=0, max_tokens=4)
    llm.generate(warm, short, lora_request=warm_loras if loras else None, use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=spec["output_tokens"], ignore_eos=True)
    kernels0 = kernel_seconds(llm, spec)
    load_start, cpu0, wall0 = os.getloadavg(), cpu_seconds(), time.perf_counter()
    outputs = llm.generate(prompts, params, lora_request=per_request if loras else None, use_tqdm=False)
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    kernels = {kind: round(seconds - kernels0.get(kind, 0.0), 3) for kind, seconds in kernel_seconds(llm, spec).items()}
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    expected = len(prompts) * spec["output_tokens"]
    if produced != expected:
        raise SystemExit(f"produced {produced} output tokens, expected {expected}")
    if spec["backend"] == "vllm":
        import vllm

        version = vllm.__version__
    else:
        version = "this repo"
    import torch

    return {"ok": True, "tok_s": produced / wall, "wall_s": wall, "cpu_s": cpu, "startup_s": startup,
            "output_tokens": produced, "requests": len(prompts), "version": version,
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "load_avg": [load_start[0], os.getloadavg()[0]], "kernel_seconds": kernels,
            "first_tokens": [list(o.outputs[0].token_ids[:16]) for o in outputs]}


def main() -> int:
    spec = json.loads(open(sys.argv[1]).read())
    result = run(spec)
    with open(spec["out"], "w") as out:
        json.dump(result, out)
    split = ", ".join(f"{kind} {seconds:.2f}" for kind, seconds in result["kernel_seconds"].items())
    split = f"; kernel s: {split}" if split else ""
    print(f"{spec['backend']} {spec['dtype']}: {result['tok_s']:.1f} output tok/s "
          f"({result['wall_s']:.1f} s, start-up {result['startup_s']:.1f} s){split}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

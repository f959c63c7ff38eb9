"""The vLLM driver of ``bench.structured``: the same constrained and free runs through vLLM's ``LLM.generate``.

``<vllm venv python> bench/structured_vllm.py SPEC.json``. Only the standard library is imported at the top (vLLM's
venv has no ``bench``); the spec holds the model folder, dtype, vLLM's structured-outputs backend, the prompts (token
ids), each prompt's schema, the requests of each batch size (prompt indices), ``max_tokens`` and ``repeats``. Per
batch size: the constrained run (``StructuredOutputsParams(json=..., disable_any_whitespace=True)``, greedy), then the
free run with each request's constrained length and EOS ignored, ``repeats`` times. A schema vLLM refuses is
listed in ``refused`` and its requests are left out. Writes ``spec["out"]``. vLLM starts worker processes, hence
the ``__main__`` guard.
"""

import json
import sys
import time


def generate(llm, prompts: list[list[int]], params: list) -> dict:
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - start
    completions = [o.outputs[0] for o in outputs]
    return {"wall_s": wall, "output_tokens": sum(len(c.token_ids) for c in completions),
            "lengths": [len(c.token_ids) for c in completions], "texts": [c.text for c in completions],
            "finish_reasons": [c.finish_reason for c in completions]}


def run(spec: dict) -> None:
    """Each batch size on a fresh ``LLM`` with ``max_num_seqs`` = the batch (vLLM fixes it at start-up); the result
    file is rewritten after each, so a run cut by its time limit still shows the sizes it finished."""
    import gc

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    prompts, schemas = spec["prompts"], spec["schemas"]
    result = {"ok": False, "version": vllm.__version__, "startup_s": {}, "warm_up_s": {}, "batches": {}}

    def constrained(i: int, max_tokens: int):
        so = StructuredOutputsParams(json=schemas[i], disable_any_whitespace=True)
        return SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=so)

    for batch, indices in spec["batches"].items():
        started = time.perf_counter()
        llm = LLM(model=spec["model"], dtype=spec["dtype"], seed=0, enable_prefix_caching=True,
                  max_num_seqs=int(batch), generation_config="vllm",
                  # vLLM 0.32's xgrammar and guidance backends read disable_any_whitespace from here, not per request
                  structured_outputs_config={"backend": spec["backend"], "disable_any_whitespace": True})
        result["startup_s"][batch] = time.perf_counter() - started
        # Warm-up as the engine's (every schema compiled, the model's paths warm), one schema at a time: a schema
        # vLLM refuses (its xgrammar backend turns down some features) fails alone, and its requests are left out.
        started = time.perf_counter()
        refused = {}
        for i, prompt in enumerate(prompts):
            try:
                llm.generate([{"prompt_token_ids": prompt}], constrained(i, 2), use_tqdm=False)
            except Exception as error:  # noqa: BLE001 - the refusal is the finding
                refused[i] = f"{type(error).__name__}: {error}"[:300]
        llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=2),
                     use_tqdm=False)
        result["warm_up_s"][batch] = time.perf_counter() - started
        result["refused"] = refused
        indices = [i for i in indices if i not in refused]
        batch_prompts = [prompts[i] for i in indices]
        params = [constrained(i, spec["max_tokens"]) for i in indices]
        runs = {"constrained": [], "free": []}
        for _ in range(spec["repeats"]):
            runs["constrained"].append(generate(llm, batch_prompts, params))
            free = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
                    for n in runs["constrained"][0]["lengths"]]
            runs["free"].append(generate(llm, batch_prompts, free))
        result["batches"][batch] = {"indices": indices, **runs}
        result["ok"] = len(result["batches"]) == len(spec["batches"])
        with open(spec["out"], "w") as out:
            json.dump(result, out)
        print(f"vllm {spec['backend']} batch {batch}: done", flush=True)
        del llm
        gc.collect()


def main() -> int:
    run(json.loads(open(sys.argv[1]).read()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

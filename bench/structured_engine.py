"""This engine's side of ``bench.structured``: constrained and free ``LLM.generate`` runs with every step timed, and
cold grammar compiles.

``StepProbe`` times each ``LLMEngine.step`` and, inside it, the model's forward pass (``ModelRunner.forward``:
the work constrained decoding never touches) and the constrained-decoding work: the batch mask fill (the backend's
``fill_bitmask_batch``), the whole of ``StructuredDecoding.mask`` (fill + apply) and the matchers' ``advance``. It
wraps the engine's own objects for the span of a run and puts them back after (the engine has no hooks for this,
and a benchmark must not change the engine's code).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.structured import StructuredOutputsParams
from engine.structured.decoding import StructuredDecoding

_MISSING = object()


@dataclass(slots=True)
class StepRecord:
    seconds: float
    num_seqs: int
    num_tokens: int  # tokens computed: num_seqs for a pure decode step, more with prefill
    forward_s: float = 0.0
    mask_s: float = 0.0
    fill_s: float = 0.0
    advance_s: float = 0.0


@dataclass
class StepProbe:
    """Use as ``with StepProbe(llm.llm_engine) as probe: llm.generate(...)``; ``probe.steps`` then holds a
    :class:`StepRecord` per step."""

    engine: object
    steps: list[StepRecord] = field(default_factory=list)

    def __enter__(self) -> StepProbe:
        engine, structured = self.engine, self.engine.structured
        backend = structured.backend  # built now, so that its fill can be wrapped
        # What each instance held of its own (nothing, for the engine's classes: their methods live on the class)
        runner = engine.model_runner
        self._saved = [(owner, name, owner.__dict__.get(name, _MISSING)) for owner, name in (
            (engine, "step"), (engine.scheduler, "schedule"), (runner, "forward"), (structured, "mask"),
            (backend, "fill_bitmask_batch"))]
        self._advance = StructuredDecoding.__dict__["advance"]
        self._pending: dict = {}
        engine.scheduler.schedule = self._timed_schedule(engine.scheduler.schedule)
        runner.forward = self._timed("forward_s", runner.forward)
        structured.mask = self._timed("mask_s", structured.mask)
        backend.fill_bitmask_batch = self._timed("fill_s", backend.fill_bitmask_batch)
        StructuredDecoding.advance = staticmethod(self._timed("advance_s", self._advance.__func__))
        engine.step = self._timed_step(engine.step)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, held in self._saved:
            if held is _MISSING:
                del owner.__dict__[name]  # the class's method shows again
            else:
                setattr(owner, name, held)
        StructuredDecoding.advance = self._advance

    def _timed_schedule(self, schedule):
        def wrapper():
            out = schedule()
            self._pending.update(num_seqs=len(out.seqs), num_tokens=out.num_batched_tokens)
            return out
        return wrapper

    def _timed(self, key: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._pending[key] = self._pending.get(key, 0.0) + time.perf_counter() - start
        return wrapper

    def _timed_step(self, step):
        def wrapper():
            self._pending = {}
            start = time.perf_counter()
            outputs = step()
            seconds = time.perf_counter() - start
            if self._pending.get("num_seqs"):  # an empty schedule ran no step
                self.steps.append(StepRecord(seconds, **self._pending))
            return outputs
        return wrapper


def chat_prompts(tokenizer, suite: list[dict]) -> list[list[int]]:
    """Each suite entry's prompt through the chat template, as token ids (the same ids go to vLLM)."""
    out = []
    for entry in suite:
        messages = [{"role": "user", "content": entry["prompt"] + " Answer with one JSON object only."}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def constraint(schema: dict) -> StructuredOutputsParams:
    # No whitespace between JSON tokens: a 135M model otherwise loops on newlines (vLLM gets the same option).
    return StructuredOutputsParams(json=schema, disable_any_whitespace=True)


def timed_generate(llm, prompts: list[list[int]], params: list) -> dict:
    """One ``generate`` of ``prompts`` under ``params`` (one each), every step probed."""
    with StepProbe(llm.llm_engine) as probe:
        start, cpu = time.perf_counter(), time.process_time()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    completions = [o.outputs[0] for o in outputs]
    # CPU seconds of this process (every thread): on shared cores they move less than wall time does
    return {"wall_s": wall, "cpu_s": cpu, "output_tokens": sum(len(c.token_ids) for c in completions),
            "lengths": [len(c.token_ids) for c in completions], "texts": [c.text for c in completions],
            "finish_reasons": [c.finish_reason for c in completions], "steps": probe.steps}


def constrained_then_free(llm, prompts: list[list[int]], schemas: list[dict], max_tokens: int,
                         repeats: int) -> dict:
    """Constrained, and free with each request's constrained length (EOS ignored), so that both runs have the
    same schedule step for step; ``repeats`` times, the order swapped every repeat. An untimed round of both comes
    first: the steps' shapes are new to oneDNN then (it builds a primitive per new batch size) and the grammars'
    lexer states are built lazily, so without it the first timed run pays one-time costs the second does not.
    Validity comes from the first timed constrained run."""
    from engine import SamplingParams

    constrained_params = [SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=constraint(s))
                          for s in schemas]
    warm = timed_generate(llm, prompts, constrained_params)
    free_params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in warm["lengths"]]
    timed_generate(llm, prompts, free_params)
    runs = {"constrained": [], "free": []}
    for repeat in range(repeats):
        order = ("constrained", "free") if repeat % 2 == 0 else ("free", "constrained")
        for kind in order:
            runs[kind].append(timed_generate(llm, prompts, constrained_params if kind == "constrained"
                                             else free_params))
    return runs


def warm_up(llm, prompts: list[list[int]], schemas: list[dict]) -> float:
    """Every schema compiled (cached for the timed runs) and the model's paths warm: two tokens per request."""
    from engine import SamplingParams

    start = time.perf_counter()
    params = [SamplingParams(temperature=0, max_tokens=2, structured_outputs=constraint(s)) for s in schemas]
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=2),
                 use_tqdm=False)
    return time.perf_counter() - start


def compile_times(tokenizer, backend_name: str, schemas: list[dict], passes: int) -> dict:
    """Milliseconds of each schema's compile, cold: a fresh backend and cache for every pass over the suite.
    A schema the backend refuses is listed with its error."""
    from engine.structured import GrammarCache, GrammarCompileError, make_backend

    samples, errors, build_ms = [], {}, []
    for _ in range(passes):
        start = time.perf_counter()
        backend = make_backend(tokenizer, backend_name, cache=GrammarCache())
        build_ms.append(1e3 * (time.perf_counter() - start))
        for i, schema in enumerate(schemas):
            start = time.perf_counter()
            try:
                backend.compile(constraint(schema))
            except GrammarCompileError as error:
                errors[i] = str(error)
                continue
            samples.append(1e3 * (time.perf_counter() - start))
    return {"samples_ms": samples, "errors": errors, "backend_build_ms": build_ms}


def engine_batches(backend_name: str, prompts: list[list[int]], schemas: list[dict], plan: dict[int, list[int]],
                   max_tokens: int, repeats: int, model: str) -> dict:
    """Each batch size's requests (prompt indices) on one engine whose constraints use ``backend_name``."""
    from engine import LLM

    started = time.perf_counter()
    llm = LLM(model, max_num_seqs=max(plan), seed=0, enable_prefix_caching=True)
    engine = llm.llm_engine
    engine.structured.backend_name = backend_name  # read when the backend is first built, in the warm-up
    startup = time.perf_counter() - started
    warm = warm_up(llm, prompts, schemas)
    batches = {}
    for batch, indices in plan.items():
        # The batch size is the scheduler's cap, read every step; the KV cache and the GEMM choice were sized
        # for the largest batch, so one engine serves every size (a fresh one per size would re-time its GEMMs).
        engine.scheduler.max_num_seqs = batch
        runs = constrained_then_free(llm, [prompts[i] for i in indices], [schemas[i] for i in indices],
                                     max_tokens, repeats)
        for run in runs["constrained"] + runs["free"]:
            run["steps"] = [_step_dict(s) for s in run["steps"]]
        batches[batch] = {"indices": indices, **runs}
        print(f"engine {backend_name} batch {batch}: done", flush=True)
    dtype = str(engine.config.torch_dtype(engine.model_config)).removeprefix("torch.")
    return {"ok": True, "backend": engine.structured.backend.name, "dtype": dtype, "startup_s": startup,
            "warm_up_s": warm, "batches": batches}


def _step_dict(step: StepRecord) -> dict:
    return {"s": step.seconds, "seqs": step.num_seqs, "tokens": step.num_tokens, "forward_s": step.forward_s,
            "mask_s": step.mask_s, "fill_s": step.fill_s, "advance_s": step.advance_s}

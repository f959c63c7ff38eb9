"""``LLMEngine``: requests in, one batched step at a time, outputs out.

A request goes through the input processor (checked, tokenized, made into sequences) to the scheduler; ``step()``
reads as schedule -> execute (one forward pass, one token per sequence that samples) -> output processing
(record tokens, detokenize, check stops, finish). The engine is single-threaded; an async server drives it from
one loop.

With ``enable_lora`` an :class:`engine.lora.adapter_manager.AdapterManager` owns the adapters; each step first
collects finished background loads, and a request whose adapter cannot be served finishes with
``finish_reason="error"`` and the adapter's error in ``RequestOutput.error`` (never an exception out of ``step``).
"""

import atexit
import gc
import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path

from engine.block_manager import BlockManager
from engine.config import EngineConfig, ModelConfig
from engine.distributed.sharding import ModelShard
from engine.fair_share import FairShare
from engine.fairness import FairAdmission
from engine.input_processor import InputProcessor
from engine.lora.errors import AdapterError
from engine.lora.request import LoRARequest
from engine.model_runner import ModelRunner
from engine.output_processor import OutputProcessor, Request
from engine.outputs import RequestMetrics, RequestOutput
from engine.sampler import SamplerOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import SequenceStatus
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.decoder import SpecDecoder
from engine.structured.decoding import StructuredDecoding
from kernels.cpu import native

logger = logging.getLogger(__name__)
_IDLE_LOAD_WAIT_S = 0.02
_NO_ADAPTERS = {
    "adapters": {"slots": 0, "resident": [], "host_tier": [], "hits": 0, "misses": 0, "evictions": 0,
                 "load_ms_p50": 0.0},
    "adapter_loads": {"loading": 0, "loads": 0, "failures": 0, "host_evictions": 0, "load_ms_p99": 0.0},
}


def resolve_model_folder(name_or_path: str) -> Path:
    """An HF folder as is, or a known model name through ``engine.models.prepare`` (converted once, cached)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    try:
        from engine.models.prepare import resolve_model
    except ImportError:
        raise ValueError(f"model {name_or_path!r} is not an HF folder and no model preparer is installed") from None
    return Path(resolve_model(name_or_path))


_unfreeze_registered = False


def _freeze_startup_objects() -> None:
    """The model, tokenizer and transformers' modules are hundreds of thousands of long-lived objects: keep the
    cyclic collector from rescanning them in the middle of steps. Shutdown gets them back (native bindings
    report anything still frozen as a leak)."""
    global _unfreeze_registered
    gc.collect()
    gc.freeze()
    if not _unfreeze_registered:
        atexit.register(gc.unfreeze)
        _unfreeze_registered = True


class LLMEngine:
    def __init__(self, config: EngineConfig):
        from transformers import AutoTokenizer  # heavy import, only for engines

        self.config = config
        folder = resolve_model_folder(config.model)
        self.model_config = ModelConfig.from_folder(folder)
        self.tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or folder)
        self.max_model_len = self._max_model_len()
        self.eos_token_ids = self._eos_token_ids(folder)
        # One tensor-parallel rank's part of the model and of the adapter slots (checked before any process starts)
        self.shard = ModelShard.of(self.model_config, 0, config.tensor_parallel_size) \
            if config.tensor_parallel_size > 1 else None
        # Adapter slots before the model runner, which sizes the KV cache from the device memory left.
        self.adapters = self._adapter_manager() if config.enable_lora else None
        self.structured = StructuredDecoding(self.tokenizer, vocab_size=self.model_config.vocab_size,
                                             eos_token_ids=self.eos_token_ids)
        self.model_runner = ModelRunner(config, self.model_config, folder, max_model_len=self.max_model_len,
                                        eos_token_ids=tuple(sorted(self.eos_token_ids)), structured=self.structured)
        if self.adapters is not None:
            self.model_runner.bind_lora(self.adapters.slot_cache)
        self.block_manager = BlockManager(self.model_runner.num_blocks, config.block_size,
                                          config.enable_prefix_caching)
        inner = self.adapters.admission if self.adapters is not None else None
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   check_invariants=config.check_invariants, admission=FairAdmission(inner))
        self.input_processor = InputProcessor(
            self.tokenizer, vocab_size=self.model_config.vocab_size, max_model_len=self.max_model_len,
            num_kv_blocks=self.block_manager.num_blocks, block_size=config.block_size,
            lora_enabled=self.adapters is not None, device=self.model_runner.device, structured=self.structured)
        self.output_processor = OutputProcessor(self.eos_token_ids, self.max_model_len)
        spec = SpeculativeConfig.from_dict(config.speculative_config)
        self.spec = SpecDecoder(spec, self.max_model_len) if spec is not None else None
        self.requests: dict[str, Request] = {}
        self._failed: list[RequestOutput] = []  # outputs of requests failed between steps, returned by the next
        # The engine's one set of counters: finished, aborted, prompt/generated/computed tokens, steps, step_errors
        self.counters = defaultdict(int)
        _freeze_startup_objects()

    def _adapter_manager(self):
        from engine.lora.adapter_manager import AdapterManager

        return AdapterManager(self.config, self.model_config, device=self.config.torch_device,
                              dtype=self.config.torch_dtype(self.model_config), shard=self.shard)

    def _max_model_len(self) -> int:
        limit = self.model_config.max_position_embeddings
        if self.model_config.sliding_window:  # no sliding-window attention here: stay inside one window
            limit = min(limit, self.model_config.sliding_window)
        if self.config.max_model_len is None:
            return limit
        if self.config.max_model_len > limit:
            raise ValueError(f"max_model_len {self.config.max_model_len} exceeds the model's limit of {limit}")
        return self.config.max_model_len

    def _eos_token_ids(self, folder: Path) -> set[int]:
        ids = set(self.model_config.eos_token_ids)
        generation = folder / "generation_config.json"
        if generation.exists():
            eos = json.loads(generation.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # ---- requests
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | None = None,
        params: SamplingParams | None = None,
        *,
        prompt_token_ids: list[int] | None = None,
        lora_request=None,
        cache_salt: str | None = None,
        fairness_key: str | None = None,
        fairness_weight: float | None = None,
        priority: str | None = None,
    ) -> None:
        """Queue a request; its ``params.n`` completions are scheduled as separate sequences. ``cache_salt``:
        prefix-cache blocks are shared only with requests of the same salt (None: with every unsalted one).
        ``fairness_key`` (opaque: a tenant's keyed hash), ``fairness_weight`` (default 1) and ``priority``
        (``interactive``, the default, or ``batch``): fair admission between keys (:mod:`engine.fairness`)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = params or SamplingParams()
        share = FairShare.of(fairness_key, fairness_weight, priority)
        text, token_ids, seqs = self.input_processor.process(request_id, prompt, params,
                                                             prompt_token_ids=prompt_token_ids,
                                                             lora_request=lora_request, cache_salt=cache_salt)
        for seq in seqs:
            seq.fair_share = share
            self.scheduler.add(seq)
        request = self.requests[request_id] = Request(request_id, text, token_ids, seqs,
                                                      RequestMetrics(time.monotonic()), lora_request)
        self.counters["prompt_tokens"] += len(token_ids)
        if lora_request is not None:
            try:
                self.adapters.check_request(lora_request)
            except AdapterError as exc:
                self._fail(request, exc)

    def _require_lora(self) -> None:
        if self.adapters is None:
            raise ValueError("this engine serves the base model only (LoRA is not enabled)")

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Finish requests now (reason ``abort``); unknown or finished ids are ignored."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            request = self.requests.pop(rid, None)
            if request is not None:
                self.scheduler.finish(request.seqs, "abort")
                self.counters["aborted"] += 1

    def recover_from_failed_step(self) -> list[str]:
        """After :meth:`step` raised: finish every request (reason ``abort``) so its blocks and adapter slot come
        back, and empty the prefix cache (the failed step registered blocks whose KV it may never have written).
        The ids finished. RuntimeError when the KV pool does not come back whole: the state is not to be trusted;
        TensorParallelError when a rank has died: nothing more can run."""
        self.model_runner.check_workers()
        ids = list(self.requests)
        self.counters["step_errors"] += 1
        self.abort_request(ids)
        manager = self.scheduler.block_manager
        if self.scheduler.running or self.scheduler.waiting or manager.num_used_blocks:
            raise RuntimeError(f"after aborting every request {manager.num_used_blocks} KV blocks are still held")
        manager.reset_prefix_cache()
        return ids

    def shutdown(self) -> None:
        """Stop what runs beside the engine: tensor-parallel worker processes, the adapter loader thread."""
        self.model_runner.shutdown()
        if self.adapters is not None:
            self.adapters.close()

    def note_abandoned(self, request_id: str) -> None:
        """A request aborted before it reached the engine (a server's queue): counted as aborted."""
        self.counters["aborted"] += 1

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self._failed)

    def has_pending_loads(self) -> bool:
        """Adapter loads in flight (the server keeps stepping while they run, to report them)."""
        return self.adapters is not None and self.adapters.has_pending_loads()

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ---- the loop
    def step(self) -> list[RequestOutput]:
        """One scheduling step and forward pass; outputs of the requests that produced a token or finished."""
        failed = self._poll_adapters()
        if self.spec is not None:
            self.spec.propose(self.scheduler.running, self.scheduler.num_steps)
        out = self.scheduler.schedule()
        if out.is_empty:
            if not failed and self.has_pending_loads():  # nothing to run until a load lands: wait for it briefly
                self.adapters.wait_for_load(_IDLE_LOAD_WAIT_S)
            return failed
        now = time.monotonic()
        sampled = self.model_runner.execute(out)
        if sampled.emitted is not None:
            self._record_drafts(out, sampled)
        self.scheduler.update(out, sampled.token_ids, sampled.emitted)
        self._count_step(out, sampled, now)
        result = self.output_processor.process(out.seqs, sampled, self.requests, time.monotonic())
        for reason, seqs in result.finished.items():
            self.scheduler.finish(seqs, reason)
            if self.spec is not None:
                for seq in seqs:
                    self.spec.finished(seq)
        return failed + [self._request_output(request) for request in result.touched.values()]

    def _record_drafts(self, out: SchedulerOutput, sampled: SamplerOutput) -> None:
        step = self.scheduler.num_steps
        for seq, tokens in zip(out.seqs, sampled.emitted, strict=True):
            if tokens is not None:
                self.spec.record(seq, len(seq.spec_token_ids), len(tokens) - 1, step)

    def _count_step(self, out: SchedulerOutput, sampled: SamplerOutput, now: float) -> None:
        self.counters["steps"] += 1
        self.counters["computed_tokens"] += out.num_batched_tokens
        emitted = sampled.emitted or [None] * len(sampled.token_ids)
        self.counters["generated_tokens"] += sum(len(extra) if extra is not None else token is not None
                                                 for token, extra in zip(sampled.token_ids, emitted, strict=True))
        for seq in out.seqs:
            metrics = self.requests[seq.request_id].metrics
            metrics.first_scheduled_time = metrics.first_scheduled_time or now

    def _request_output(self, request: Request) -> RequestOutput:
        """The request's output now; a finished request leaves the engine."""
        if request.finished:
            request.metrics.finished_time = time.monotonic()
            del self.requests[request.request_id]
            self.counters["finished"] += 1
        return self.output_processor.request_output(request)

    # ---- adapters
    def _poll_adapters(self) -> list[RequestOutput]:
        """Fail the waiting requests whose adapter load failed or turned out to be another version. A failed load
        fails only the requests that asked for what it read (path and sha256): another request for the same id
        with another source stays waiting, and the scheduler loads its source next."""
        if self.adapters is not None:
            for result in self.adapters.poll():
                for request in self._waiting_on(result.adapter_id):
                    try:
                        if result.error is not None:
                            if not _same_source(request.lora_request, result.source):
                                continue
                            raise result.error
                        self.adapters.check_request(request.lora_request)
                    except AdapterError as exc:
                        self._fail(request, exc)
        failed, self._failed = self._failed, []
        return failed

    def _waiting_on(self, adapter_id) -> list[Request]:
        return [r for r in self.requests.values() if r.lora_request is not None and r.lora_request.id == adapter_id
                and all(seq.status is SequenceStatus.WAITING for seq in r.seqs)]

    def _fail(self, request: Request, error: AdapterError) -> None:
        logger.warning("request %s fails: %s", request.request_id, error)
        self.scheduler.finish(request.seqs, "error")
        request.error = error
        self._failed.append(self._request_output(request))

    def check_adapter_source(self, lora_request: LoRARequest) -> None:
        """Raise ``AdapterSourceNotAllowed`` if the adapter's path is outside the allow-list."""
        self._require_lora()
        self.adapters.loader.check_source(lora_request)

    def load_adapter(self, lora_request: LoRARequest) -> Future:
        """Fetch an adapter into the host tier in the background; the future gives what ``list_adapters`` shows of
        it, or its error (``AdapterSourceNotAllowed``, ``AdapterFormatError``, ``AdapterLoadError``)."""
        self._require_lora()
        return self.adapters.load(lora_request)

    def unload_adapter(self, adapter_id: int | str) -> dict:
        """Drop an adapter from every tier; running requests using it finish first (it leaves its slot then)."""
        self._require_lora()
        return self.adapters.unload(adapter_id)

    def list_adapters(self) -> list[dict]:
        """Adapters this engine holds (in a slot or in the host tier); empty without LoRA."""
        return [] if self.adapters is None else self.adapters.list()

    # ---- introspection
    def stats(self) -> dict:
        """Counters and gauges (the engine server's ``/stats`` builds on these)."""
        bm = self.block_manager
        return {
            "requests": {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                         "finished": self.counters["finished"], "aborted": self.counters["aborted"]},
            "kv_blocks": {"total": bm.num_blocks, "used": bm.num_used_blocks, "cached": bm.num_cached_blocks},
            "prefix_cache_hit_rate": bm.hit_rate,
            "prefix_cache": {"queried_tokens": bm.num_queried_tokens, "hit_tokens": bm.num_hit_tokens},
            "tokens": {"prompt": self.counters["prompt_tokens"], "generated": self.counters["generated_tokens"],
                       "computed": self.counters["computed_tokens"]},
            "limits": {"max_num_seqs": self.config.max_num_seqs,
                       "max_num_batched_tokens": self.config.max_num_batched_tokens},
            "steps": self.counters["steps"],
            "step_errors": self.counters["step_errors"],
            "preemptions": self.scheduler.num_preemptions,
            "fairness": self.scheduler.admission.stats(),  # counters by opaque key, never a tenant's name
            "speculative": self.spec.stats() if self.spec is not None else None,
            "gemm": self.model_runner.gemm.stats(),  # dtype and the GEMM path of each projection per band of M
            "kernels": native.report(),  # the C kernels loaded, and any that did not build for this CPU
            "native_forward": self.model_runner.native_stats(),  # replayed steps, kernel seconds by kind; None: off
            "tensor_parallel": self.model_runner.parallel_stats(),  # collectives run and their time; None: TP 1
            **(self.adapters.stats() if self.adapters is not None else _NO_ADAPTERS),
        }


def _same_source(request: LoRARequest, loaded: LoRARequest | None) -> bool:
    """Whether ``request`` asks for what ``loaded`` read (unknown: assume so)."""
    if loaded is None:
        return True
    digest = (request.sha256 or "").lower(), (loaded.sha256 or "").lower()
    return request.path == loaded.path and digest[0] == digest[1]

"""``AdapterManager``: the engine's adapters in one place: loader, slot cache, admission policy, runtime API.

Built by ``LLMEngine`` when LoRA is enabled. The engine loop calls :meth:`poll` once per step: finished loads
enter the host tier, failed ones are returned so the engine can fail every request waiting on them, and the
futures handed out by :meth:`load` (the admin API) are resolved. Nothing here waits on I/O except
:meth:`wait_for_load`, which the engine calls only when it has nothing else to do.
"""

import logging
from concurrent.futures import Future

import torch

from engine.config import EngineConfig, ModelConfig
from engine.lora.admission import AdapterAdmission
from engine.lora.errors import AdapterError, AdapterLoadError
from engine.lora.fingerprint import ModelFingerprint
from engine.lora.loader import AdapterLoader
from engine.lora.request import LoRARequest
from engine.lora.slot_cache import AdapterId, AdapterSlotCache, LoadResult

logger = logging.getLogger(__name__)


class AdapterManager:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, *, device: torch.device,
                 dtype: torch.dtype, s3_client=None, shard=None):
        fingerprint = ModelFingerprint.from_hf_config(model_config.extra)
        # None: the offline API's caller may name any local folder (it can read them anyway).
        sources = ["/"] if config.adapter_sources is None else config.adapter_sources
        self.loader = AdapterLoader(fingerprint, max_rank=config.max_lora_rank, allowed_sources=sources,
                                    dtype=dtype, pin_memory=device.type == "cuda", s3_client=s3_client)
        self.slot_cache = AdapterSlotCache(fingerprint, self.loader, max_loras=config.max_loras,
                                           max_cpu_loras=config.max_cpu_loras, max_lora_rank=config.max_lora_rank,
                                           device=device, dtype=dtype, shard=shard)
        self.admission = AdapterAdmission(self.slot_cache, max_wait_steps=config.max_adapter_wait_steps,
                                           max_num_seqs=config.max_num_seqs)
        self._waiters: dict[AdapterId, list[tuple[LoRARequest, Future]]] = {}

    # ---------------------------------------------------------------- requests

    def check_request(self, request: LoRARequest) -> None:
        """Raise the adapter's error now if a request for it must fail: source outside the allow-list, or a
        sha256 other than the loaded version's."""
        self.loader.check_source(request)
        info = self.slot_cache.describe(request.id)
        if info is not None and request.sha256 is not None and request.sha256 != info["sha256"]:
            raise _mismatch(request.id, info["sha256"], request.sha256)

    # ---------------------------------------------------------------- the engine loop

    def poll(self) -> list[LoadResult]:
        """Collect finished loads (each reported once) and resolve the admin futures waiting on them. The engine
        fails the requests waiting on a failed load, and those that expect another sha256 than the one loaded."""
        results = self.slot_cache.poll()
        for result in results:
            if result.error is not None:
                logger.warning("adapter %r failed to load: %s", result.adapter_id, result.error)
            self._resolve(result.adapter_id, error=result.error)
        return results

    def has_pending_loads(self) -> bool:
        return self.slot_cache.num_loading > 0 or bool(self._waiters)

    def wait_for_load(self, timeout: float) -> None:
        self.slot_cache.wait_for_load(timeout)

    # ---------------------------------------------------------------- runtime API

    def load(self, request: LoRARequest) -> Future:
        """Bring an adapter into the host tier; the future gives :meth:`describe`'s dict or the adapter's error."""
        future: Future = Future()
        try:
            self.check_request(request)
        except AdapterError as exc:
            future.set_exception(exc)
            return future
        self.slot_cache.keep(request.id)  # loading an adapter that is being unloaded keeps it
        if self.slot_cache.is_loaded(request.id):
            future.set_result(self.slot_cache.describe(request.id))
            return future
        self._waiters.setdefault(request.id, []).append((request, future))
        self.slot_cache.request_load(request)
        return future

    def unload(self, adapter_id: AdapterId) -> dict:
        """Drop from every tier; an adapter that running sequences use leaves its slot when they finish."""
        known = self.slot_cache.describe(adapter_id) is not None or self.slot_cache.is_loading(adapter_id)
        now = self.slot_cache.unload(adapter_id)
        self._resolve(adapter_id, error=AdapterLoadError("load_cancelled", f"adapter {adapter_id!r} was unloaded"))
        return {"id": adapter_id, "known": known, "unloaded": now}

    def list(self) -> list[dict]:
        return [info for info in map(self.slot_cache.describe, self.slot_cache.loaded_ids()) if info is not None]

    def stats(self) -> dict:
        """``adapters`` of ``GET /stats``, exactly the protocol's keys, and ``adapter_loads`` for /metrics."""
        s = self.slot_cache.stats()
        adapters = {k: v for k, v in s.to_dict().items()
                    if k in ("slots", "resident", "host_tier", "hits", "misses", "evictions", "load_ms_p50")}
        loads = {"loading": len(s.loading), "loads": s.loads, "failures": s.load_failures,
                 "host_evictions": s.host_evictions, "load_ms_p99": s.load_ms_p99}
        return {"adapters": adapters, "adapter_loads": loads}

    def close(self) -> None:
        self.slot_cache.close()

    def _resolve(self, adapter_id: AdapterId, error: AdapterError | None = None) -> None:
        for request, future in self._waiters.pop(adapter_id, []):
            if future.done():
                continue
            if error is None:
                try:
                    self.check_request(request)
                except AdapterError as exc:
                    future.set_exception(exc)
                    continue
                future.set_result(self.slot_cache.describe(adapter_id))
            else:
                future.set_exception(error)


def _mismatch(adapter_id: AdapterId, loaded: str, expected: str | None) -> AdapterLoadError:
    return AdapterLoadError("sha256_mismatch", f"adapter {adapter_id!r} is loaded with sha256 {loaded}, "
                                               f"the request expects {expected or 'another'}")

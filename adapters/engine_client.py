"""The control plane's client of the engine protocol (``ENGINE_PROTOCOL.md``), the one every app uses.

- :class:`EngineClient` (blocking, for Celery workers): load, unload, a smoke generation, a warm compile of a
  structured-outputs constraint (the schema registry's).
- :func:`probe` (async): one read of ``/health`` and ``/stats``, for the gateway's replica pool and the console's
  engines page alike.
- The pieces the gateway's streaming path reuses: :func:`adapter_source` (the ``"adapter"`` field of a request),
  :func:`engine_headers` and :meth:`EngineError.from_response` / :meth:`EngineError.from_transport`.
"""

import asyncio
import random
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

SMOKE_PROMPT = "Hello"
# Statuses after which another try (later, or on another engine) may succeed.
RETRYABLE_STATUSES = (429, 502, 503, 504)


class EngineError(Exception):
    """An engine refused or could not be reached. ``status`` is None when no HTTP answer came back."""

    def __init__(self, status: int | None, code: str, message: str, url: str = "", param: str | None = None,
                 detail: str = ""):
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.url = url
        self.param = param  # the request field the engine named, if any
        self.detail = detail or message  # the engine's own words, without the URL or status: what a tenant may read

    @property
    def retryable(self) -> bool:
        """True when the engine is down or busy, False when it judged the request (or the adapter) wrong."""
        return self.status is None or self.status in RETRYABLE_STATUSES

    @classmethod
    def from_response(cls, response: httpx.Response) -> "EngineError":
        """From an error answer in the OpenAI shape ``{"error": {"message", "type", "code", "param"}}``."""
        try:
            error = response.json().get("error") or {}
        except (ValueError, AttributeError):
            error = {}
        if not isinstance(error, dict):
            error = {}
        code = error.get("code") if isinstance(error.get("code"), str) and error.get("code") else None
        message = error.get("message") if isinstance(error.get("message"), str) else response.text[:500]
        param = error.get("param") if isinstance(error.get("param"), str) else None
        return cls(response.status_code, code or f"engine_http_{response.status_code}",
                   f"engine answered {response.status_code}: {message}", str(response.request.url), param, message)

    @classmethod
    def from_transport(cls, url: str, exc: httpx.TransportError) -> "EngineError":
        return cls(None, "engine_unreachable", f"engine {url} unreachable: {type(exc).__name__}: {exc}", url)


def adapter_source(*, engine_id: str, uri: str, sha256: str) -> dict:
    """The ``"adapter"`` object of load and generation requests."""
    return {"id": engine_id, "uri": uri, "sha256": sha256}


def engine_headers(api_key: str, request_id: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {api_key}"}
    if request_id:
        headers["X-Request-Id"] = request_id
    return headers


class EngineClient:
    """One engine. Use as a context manager, or call :meth:`close`."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float, transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=engine_headers(api_key), timeout=timeout,
                                  transport=transport)

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict, *, ok_statuses: tuple[int, ...] = ()) -> httpx.Response:
        try:
            response = self._http.post(path, json=body)
        except httpx.TransportError as exc:
            raise EngineError.from_transport(self.base_url, exc) from None
        if response.is_success or response.status_code in ok_statuses:
            return response
        raise EngineError.from_response(response)

    def load_adapter(self, source: dict) -> dict:
        """``POST /v1/load_lora_adapter``: fetch, verify and keep the adapter in the host tier."""
        return self._post("/v1/load_lora_adapter", {"adapter": source}).json()

    def unload_adapter(self, engine_id: str) -> None:
        """``POST /v1/unload_lora_adapter``; an engine that does not know the id has nothing to unload."""
        self._post("/v1/unload_lora_adapter", {"id": engine_id}, ok_statuses=(404,))

    def smoke_generate(self, source: dict, *, max_tokens: int = 2) -> dict:
        """A short greedy completion through the adapter: its weights work in a real forward pass."""
        body = {"model": source["id"], "adapter": source, "prompt": SMOKE_PROMPT, "max_tokens": max_tokens,
                "min_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
        result = self._post("/v1/completions", body).json()
        choices = result.get("choices") if isinstance(result, dict) else None
        if not choices or result.get("usage", {}).get("completion_tokens", 0) < 1:
            raise EngineError(200, "smoke_generation_empty", f"engine {self.base_url} generated nothing: {result!r}",
                              self.base_url)
        return result

    def compile_structured_outputs(self, constraint: dict, *, cache_salt: str) -> dict:
        """``POST /v1/structured_outputs/compile``: compile ``constraint`` (``structured_outputs`` fields, e.g.
        ``{"json": schema}``) into the engine's grammar cache in the scope of ``cache_salt``; the engine answers
        ``{"object": "structured_outputs.compiled", "kind", "cached", "compile_ms"}``."""
        return self._post("/v1/structured_outputs/compile",
                          {"structured_outputs": constraint, "cache_salt": cache_salt}).json()


def warm_load(urls: Iterable[str], api_key: str, source: dict, *, timeout: float,
              transport: httpx.BaseTransport | None = None) -> str:
    """Load the adapter and generate through it on one engine (tried in random order); return its URL.

    Raises the engine's :class:`EngineError` at once when it refuses the adapter (no other engine would take
    it), or the last retryable one when no engine could be used."""
    urls = list(urls)
    if not urls:
        raise ValueError("warm_load needs at least one engine URL")
    last_error = None
    for url in random.sample(urls, len(urls)):
        with EngineClient(url, api_key, timeout=timeout, transport=transport) as client:
            loaded = False
            try:
                client.load_adapter(source)
                loaded = True
                client.smoke_generate(source)
                return url
            except EngineError as exc:
                if loaded:
                    _unload_quietly(client, source["id"])  # a refused adapter must not stay in the host tier
                if not exc.retryable:
                    raise
                last_error = exc
    raise last_error


def _unload_quietly(client: EngineClient, engine_id: str) -> None:
    try:
        client.unload_adapter(engine_id)
    except EngineError:
        pass  # the engine is failing anyway; the version's purge asks every engine again


def unload_everywhere(urls: Iterable[str], api_key: str, engine_id: str, *, timeout: float,
                      transport: httpx.BaseTransport | None = None) -> dict[str, EngineError]:
    """Ask every engine to drop the adapter; the failures, by engine URL (empty when all confirmed)."""
    failures = {}
    for url in urls:
        with EngineClient(url, api_key, timeout=timeout, transport=transport) as client:
            try:
                client.unload_adapter(engine_id)
            except EngineError as exc:
                failures[url] = exc
    return failures


def compile_everywhere(urls: Iterable[str], api_key: str, constraint: dict, *, cache_salt: str, timeout: float,
                       transport: httpx.BaseTransport | None = None) -> tuple[dict[str, dict], dict[str, EngineError]]:
    """Compile the constraint on every engine: (the answers of those that compiled it, the failures), by URL."""
    compiled, failures = {}, {}
    for url in urls:
        with EngineClient(url, api_key, timeout=timeout, transport=transport) as client:
            try:
                compiled[url] = client.compile_structured_outputs(constraint, cache_salt=cache_salt)
            except EngineError as exc:
                failures[url] = exc
    return compiled, failures


@dataclass(frozen=True, slots=True)
class Probe:
    """One read of an engine's ``/health`` and ``/stats``."""

    url: str
    health_status: int | None  # None: no answer
    stats: dict | None  # the /stats JSON, when it answered 200 with a JSON object
    problem: str = ""  # why there is no stats, in words

    @property
    def serving(self) -> bool:
        return self.health_status == 200 and self.stats is not None


async def probe(http: httpx.AsyncClient, url: str, api_key: str, *, timeout: float | httpx.Timeout) -> Probe:
    """``GET /health`` and ``/stats`` of one engine at once; never raises for the engine's failure."""
    base = url.rstrip("/")
    try:
        health, stats = await asyncio.gather(
            http.get(f"{base}/health", timeout=timeout),
            http.get(f"{base}/stats", headers=engine_headers(api_key), timeout=timeout))
    except httpx.TimeoutException:
        return Probe(url, None, None, "no answer within the timeout")
    except httpx.HTTPError as exc:
        return Probe(url, None, None, f"not reachable: {exc or type(exc).__name__}")
    if stats.status_code != 200:
        return Probe(url, health.status_code, None, f"/stats answered HTTP {stats.status_code}")
    try:
        body = stats.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return Probe(url, health.status_code, None, "/stats answered something that is not the engine protocol's JSON")
    return Probe(url, health.status_code, body)

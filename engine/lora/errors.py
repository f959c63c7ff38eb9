"""Why an adapter cannot be served. Torch-free: the Django side imports these with ``engine.lora.format``.

Every error carries a stable ``code`` (for APIs, metrics and the registry's status) and a precise ``message``.
How the engine server answers them (``ENGINE_PROTOCOL.md``, "Errors"):

* :class:`AdapterSourceNotAllowed` -> 403 (the source is outside ``ENGINE_ADAPTER_SOURCES``);
* :class:`AdapterFormatError` -> 422 with ``code`` naming the failed check;
* :class:`AdapterLoadError` -> 422, except ``code == "store_unreachable"`` -> 503 with ``Retry-After``.
"""


class AdapterError(Exception):
    """Base of every adapter refusal: ``code`` is stable, ``message`` says exactly what is wrong."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class AdapterFormatError(AdapterError, ValueError):
    """The adapter's files are not something the engine can serve (config, tensor names, shapes, file format)."""


class AdapterLoadError(AdapterError):
    """The adapter could not be fetched: missing at its source, store unreachable, or its sha256 differs."""


class AdapterSourceNotAllowed(AdapterLoadError, PermissionError):
    """The adapter's path is outside the allowed source prefixes; callers must not learn more than that."""

    def __init__(self, path: str):
        super().__init__("source_not_allowed", f"adapter source {path!r} is not under an allowed prefix")

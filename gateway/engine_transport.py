"""A lean HTTP/1.1 transport for the gateway's calls to engines, behind httpx's transport interface.

httpx's own transport (httpcore over anyio, h11 for the protocol) spent about a fifth of the gateway's CPU on a
loaded 2-core machine: a socket-readability probe of every pooled connection on each request, anyio's stream
layers, and h11's event objects for every SSE chunk of every stream. Engines speak one narrow dialect of
HTTP/1.1 (uvicorn: keep-alive, ``Content-Length`` or chunked bodies), so this transport speaks just that, on
asyncio streams:

* connections are kept per origin and reused; one the engine closed while idle is seen as at EOF and dropped
  for free, and a request on a kept connection that ends without a byte of answer within 0.1 s of being written
  is sent again once on a new one (the engine had closed it idle); after that the engine may have begun the
  request (it sends no status line before the first token), so it is never sent twice;
* a chunked body is decoded from whatever one read brought, so chunks that arrived together come out as one
  piece (the relay then sends them in one write) and each is handed on the moment it is complete;
* failures are httpx's exceptions (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``ReadError``,
  ``RemoteProtocolError``, ``PoolTimeout``), with httpx's timeouts (connect, read per read, pool), so callers
  handle them as before;
* closing a response before its end closes its connection, which is how an engine request is aborted.
"""

import asyncio
import ssl
from collections.abc import AsyncIterator

import httpx

_MAX_HEAD = 64 * 1024  # status line and headers
_READ_SIZE = 64 * 1024
# A kept connection that ends without a byte of answer this soon after the request was written had been closed
# by the engine while idle (uvicorn's keep-alive timeout): it is safe to send again. Later, the engine may have
# begun the request (it sends no status line before the first token), so it is never sent twice.
_IDLE_CLOSE_RACE_S = 0.1
_HEX = frozenset(b"0123456789abcdefABCDEF")


class _Connection:
    __slots__ = ("reader", "writer", "origin")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, origin: tuple):
        self.reader = reader
        self.writer = writer
        self.origin = origin

    @property
    def usable(self) -> bool:
        # A read timeout stored on the reader by _Body's timer right as the answer completed also rules it out.
        return not self.reader.at_eof() and not self.writer.is_closing() and self.reader.exception() is None

    def close(self) -> None:
        self.writer.close()


class EngineTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 to engines; at most ``max_connections`` requests open at once (others wait up to the
    pool timeout)."""

    def __init__(self, *, max_connections: int, max_idle_per_origin: int = 64):
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple, list[_Connection]] = {}
        self._max_idle = max_idle_per_origin
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout("no free connection to the engine in time", request=request) from None
        try:
            return await self._send(request, timeouts)
        except BaseException:
            self._slots.release()
            raise

    async def _send(self, request: httpx.Request, timeouts: dict) -> httpx.Response:
        url = request.url
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        head = _request_head(request)
        body = request.content
        conn = self._kept(origin)
        if conn is not None:
            try:
                return await self._exchange(conn, head, body, request, timeouts)
            except _NoAnswer:
                pass  # closed by the engine while idle: it never saw the request
        conn = await self._connect(origin, request, timeouts.get("connect"))
        try:
            return await self._exchange(conn, head, body, request, timeouts)
        except _NoAnswer:
            raise httpx.RemoteProtocolError("the engine closed the connection without answering",
                                            request=request) from None

    def _kept(self, origin: tuple) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
            conn.close()
        return None

    async def _connect(self, origin: tuple, request: httpx.Request, timeout: float | None) -> _Connection:
        scheme, host, port = origin
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=self._ssl if scheme == "https" else None, limit=_MAX_HEAD)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"{host}:{port}: {exc}", request=request) from None
        return _Connection(reader, writer, origin)

    async def _exchange(self, conn: _Connection, head: bytes, body: bytes, request: httpx.Request,
                        timeouts: dict) -> httpx.Response:
        loop = asyncio.get_running_loop()
        sent = None  # when the request was written
        try:
            conn.writer.write(head + body)
            async with asyncio.timeout(timeouts.get("write")):
                await conn.writer.drain()
            sent = loop.time()
            async with asyncio.timeout(timeouts.get("read")):
                raw = await conn.reader.readuntil(b"\r\n\r\n")
            version, status, headers = _parse_head(raw)
            stream = _Body(self, conn, headers, request, timeouts.get("read"), http_10=version == b"HTTP/1.0",
                           no_body=request.method == "HEAD" or status in (204, 304) or 100 <= status < 200)
        except BaseException as exc:
            conn.close()
            idle_close = sent is None or loop.time() - sent < _IDLE_CLOSE_RACE_S
            error = _exchange_error(exc, request, writing=sent is None, idle_close=idle_close)
            if error is None:
                raise
            raise error from None
        return httpx.Response(status, headers=headers, stream=stream, extensions={"http_version": b"HTTP/1.1"})

    def _done(self, conn: _Connection, reusable: bool) -> None:
        """A response is over: its connection back to the pool (or closed) and its slot free."""
        self._slots.release()
        idle = self._idle.setdefault(conn.origin, [])
        if reusable and not self._closed and len(idle) < self._max_idle and conn.usable:
            idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


class _NoAnswer(Exception):
    """The connection ended before a single byte of the answer."""


def _exchange_error(exc: BaseException, request: httpx.Request, *, writing: bool,
                    idle_close: bool) -> Exception | None:
    """What a failed exchange raises: httpx's error, _NoAnswer (a kept connection the engine had closed while
    idle: safe to send again) or None (re-raise ``exc`` as it is: cancellation, a bug)."""
    if isinstance(exc, TimeoutError):  # before OSError, which it is
        if writing:
            return httpx.WriteTimeout("sending the request to the engine timed out", request=request)
        return httpx.ReadTimeout("the engine did not answer in time", request=request)
    if isinstance(exc, asyncio.IncompleteReadError):
        if not exc.partial and idle_close:
            return _NoAnswer()
        return httpx.RemoteProtocolError("the engine closed the connection before its answer's headers ended",
                                         request=request)
    if isinstance(exc, asyncio.LimitOverrunError):
        return httpx.RemoteProtocolError("the engine's answer headers are too large", request=request)
    if isinstance(exc, ValueError):
        return httpx.RemoteProtocolError(f"malformed answer from the engine: {exc}", request=request)
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)) and idle_close:
        return _NoAnswer()
    if isinstance(exc, OSError):
        return (httpx.WriteError if writing else httpx.ReadError)(str(exc) or type(exc).__name__, request=request)
    return None


class _Body(httpx.AsyncByteStream):
    def __init__(self, transport: EngineTransport, conn: _Connection, headers: list[tuple[bytes, bytes]],
                 request: httpx.Request, read_timeout: float | None, *, no_body: bool, http_10: bool = False):
        self._transport = transport
        self._conn = conn
        self._request = request
        self._timeout = read_timeout
        self._finished = False
        self._keep_alive = not http_10
        length, chunked = None, False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise ValueError(f"Content-Length {value[:40]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.strip().lower().endswith(b"chunked")
            elif name == b"connection":
                tokens = {token.strip().lower() for token in value.split(b",")}
                if b"close" in tokens:
                    self._keep_alive = False
                elif b"keep-alive" in tokens and http_10:
                    self._keep_alive = True
        self._loop = asyncio.get_running_loop()
        self._reading = False
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._chunked = chunked and not no_body
        self._remaining = 0 if no_body else length  # None: until the connection closes
        if not chunked and length is None and not no_body:
            self._keep_alive = False
        if no_body or (not chunked and length == 0):
            self._finish()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._finished:
            return
        try:
            if self._chunked:
                async for data in self._chunks():
                    yield data
            else:
                async for data in self._plain():
                    yield data
        except TimeoutError:
            self.abort()
            raise httpx.ReadTimeout("the engine fell silent", request=self._request) from None
        except (ConnectionError, OSError) as exc:
            self.abort()
            raise httpx.ReadError(f"the engine connection broke: {exc}", request=self._request) from None

    async def _read(self, size: int = _READ_SIZE) -> bytes:
        """What is buffered or next arrives (b"" at the end). The read timeout is one timer per response,
        re-armed lazily, rather than a timeout scope per read: a stream makes a read per token."""
        if self._timeout is not None:
            self._deadline = self._loop.time() + self._timeout
            if self._timer is None:
                self._timer = self._loop.call_at(self._deadline, self._check_silence)
        self._reading = True
        try:
            return await self._conn.reader.read(size)
        finally:
            self._reading = False

    def _check_silence(self) -> None:
        self._timer = None
        if self._finished:
            return
        now = self._loop.time()
        if self._reading and now >= self._deadline:
            self._conn.reader.set_exception(TimeoutError())  # wakes the pending read with it
            return
        self._timer = self._loop.call_at(max(self._deadline, now + 0.001) if self._reading
                                         else now + self._timeout, self._check_silence)

    async def _next(self) -> bytes:
        data = await self._read()
        if not data:
            self.abort()
            raise httpx.RemoteProtocolError("the engine closed the connection before the end of its answer",
                                            request=self._request)
        return data

    async def _plain(self) -> AsyncIterator[bytes]:
        while self._remaining is None or self._remaining > 0:
            data = await self._read(_READ_SIZE if self._remaining is None else min(_READ_SIZE, self._remaining))
            if not data:
                if self._remaining is None:  # delimited by the connection's end
                    self._finish()
                    return
                self.abort()
                raise httpx.RemoteProtocolError("the engine's answer was shorter than its Content-Length",
                                                request=self._request)
            if self._remaining is not None:
                self._remaining -= len(data)
            yield data
        self._finish()

    async def _chunks(self) -> AsyncIterator[bytes]:
        """Chunked transfer coding: every complete chunk in what has been read, joined, per read."""
        buffer = b""
        need = None  # size of the chunk being read (its data and CRLF); None: at a size line
        while True:
            out = []
            while True:
                if need is None:
                    end = buffer.find(b"\r\n")
                    if end < 0:
                        if len(buffer) > 1024:
                            self.abort()
                            raise httpx.RemoteProtocolError("bad chunk size line", request=self._request)
                        break
                    token = buffer[:end].split(b";", 1)[0].strip()
                    if not token or not _HEX.issuperset(token):
                        self.abort()
                        raise httpx.RemoteProtocolError("bad chunk size line", request=self._request)
                    size = int(token, 16)
                    buffer = buffer[end + 2:]
                    if size == 0:
                        if out:
                            yield b"".join(out)
                        await self._trailer(buffer)
                        return
                    need = size
                if len(buffer) < need + 2:
                    break
                if buffer[need:need + 2] != b"\r\n":
                    self.abort()
                    raise httpx.RemoteProtocolError("a chunk did not end where its size said", request=self._request)
                out.append(buffer[:need])
                buffer = buffer[need + 2:]
                need = None
            if out:
                yield b"".join(out) if len(out) > 1 else out[0]
            buffer += await self._next()

    async def _trailer(self, buffer: bytes) -> None:
        """After the last chunk: optional trailer fields, then an empty line."""
        while True:
            if buffer.startswith(b"\r\n"):
                break
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                buffer = buffer[end + 4:]
                break
            buffer += await self._next()
        if buffer[2:] if buffer.startswith(b"\r\n") else buffer:
            self._keep_alive = False  # bytes past the end of the answer: do not trust the connection
        self._finish()

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._stop_timer()
            self._transport._done(self._conn, self._keep_alive)

    def abort(self) -> None:
        if not self._finished:
            self._finished = True
            self._stop_timer()
            self._transport._done(self._conn, False)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def aclose(self) -> None:
        self.abort()  # before the end: the connection is closed (an engine aborts the request)


def _request_head(request: httpx.Request) -> bytes:
    url = request.url
    target = url.raw_path
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
    has_host = False
    for name, value in request.headers.raw:
        lower = name.lower()
        if lower == b"host":
            has_host = True
        elif lower in (b"connection", b"transfer-encoding", b"content-length"):
            continue
        lines.append(name + b": " + value)
    if not has_host:
        lines.append(b"Host: " + url.netloc)
    lines.append(b"Content-Length: " + str(len(request.content)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _parse_head(raw: bytes) -> tuple[bytes, int, list[tuple[bytes, bytes]]]:
    lines = raw[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    if version not in (b"HTTP/1.0", b"HTTP/1.1") or not rest[:3].isdigit():
        raise ValueError(f"status line {lines[0][:80]!r}")
    status = int(rest[:3])
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise ValueError(f"header line {line[:80]!r}")
        headers.append((name, value.strip()))
    return version, status, headers

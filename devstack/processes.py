"""A group of child processes started together and stopped together (make run, the whole-stack fixture)."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from devstack.services import ROOT, port_open


@dataclass(slots=True)
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path | None
    port: int | None = None


@dataclass(slots=True)
class ProcessGroup:
    """Children of this process, each in its own session so a Ctrl-C reaches only us; stop() ends them all."""

    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: list[str], *, port: int | None = None, wait_s: float = 60,
              ready=None, extra_env: dict[str, str] | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        env = {**os.environ, **self.env, **(extra_env or {})}
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        child = Child(name, proc, log_path, port)
        self.children.append(child)
        try:
            self._wait_ready(child, wait_s, ready)
        except Exception:
            self.stop()
            raise
        return child

    def _wait_ready(self, child: Child, wait_s: float, ready) -> None:
        if child.port is None and ready is None:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if child.proc.poll() is not None:
                raise RuntimeError(f"{child.name} exited with code {child.proc.returncode}; log:\n{tail(child)}")
            if (child.port is None or port_open("127.0.0.1", child.port)) and (ready is None or ready()):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{child.name} not ready within {wait_s:.0f}s; log:\n{tail(child)}")

    def check_alive(self) -> list[Child]:
        """Children that have exited."""
        return [child for child in self.children if child.proc.poll() is not None]

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM every child's process group, then SIGKILL what is left after ``timeout``."""
        for child in reversed(self.children):
            _signal_group(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in reversed(self.children):
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child.proc, signal.SIGKILL)
                child.proc.wait(5)
        self.children.clear()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def tail(child: Child, lines: int = 40) -> str:
    if child.log_path is None or not child.log_path.exists():
        return ""
    return "\n".join(child.log_path.read_text(errors="replace").splitlines()[-lines:])


def python(*args: str) -> list[str]:
    return [sys.executable, *args]

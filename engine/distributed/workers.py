"""Rank 0's side of tensor parallelism: spawn the workers, send each step, notice a rank that died, stop them.

A rank that dies ends the engine: the next collective fails at once (its connections close; a rank that hangs
instead fails it after ``distributed_timeout_s``), and before each step the workers' processes are checked. Either
way :meth:`TensorParallelWorkers.run_step` raises :class:`TensorParallelError` and keeps raising it: the group
cannot be trusted again. Stopping sends STOP, then terminates and finally kills what is left; a finalizer does the
same for an engine dropped without :meth:`stop` (no orphan processes).

With ``nnodes`` K > 1 rank 0 spawns only its node's N / K - 1 other ranks and meets the remote ones at the
rendezvous (engine.distributed.rendezvous), publishing its config there. It cannot watch remote processes: a remote
rank that dies fails the collective in flight when its connections close (or after ``distributed_timeout_s``).
"""

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import weakref
from pathlib import Path

import torch

from engine.config import EngineConfig, ModelConfig
from engine.distributed.group import TensorParallelGroup
from engine.distributed.keepalive import KeepAlive
from engine.distributed.rendezvous import open_store, publish, wait_joined
from engine.distributed.sharding import ModelShard
from engine.distributed.step_channel import SlotContents, StepChannel
from engine.distributed.worker import RankSpec, WorkerSpec, rank_device, run_rank, run_worker
from engine.models.gguf_file import GGUF_FILE

logger = logging.getLogger(__name__)
_STOP_WAIT_S = 10.0
_DEATH_WAIT_S = 2.0


class TensorParallelError(RuntimeError):
    """A tensor-parallel rank died or stopped answering: the engine cannot serve anything more."""


class TensorParallelWorkers:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, folder: Path, max_model_len: int):
        check_supported(config, folder)
        size, nnodes = config.tensor_parallel_size, config.nnodes
        self.local_ranks = size // nnodes  # ranks 0..local_ranks-1 run on this node
        shard = ModelShard.of(model_config, 0, size)
        init_method = config.distributed_init or f"tcp://127.0.0.1:{_free_port()}"
        threads = config.num_threads_per_rank or max(1, len(os.sched_getaffinity(0)) // self.local_ranks)
        context = multiprocessing.get_context("spawn")
        self.processes = []
        for rank in range(1, self.local_ranks):
            if nnodes == 1:
                target, spec = (
                    run_worker,
                    WorkerSpec(config, model_config, Path(folder), max_model_len, rank, init_method, threads),
                )
            else:  # the same config, through the rendezvous as the remote ranks get it
                target, spec = (
                    run_rank,
                    RankSpec(
                        Path(folder), rank, size, nnodes, init_method, config.distributed_start_timeout_s, threads
                    ),
                )
            process = context.Process(target=target, args=(spec,), name=f"engine-tp-rank-{rank}", daemon=True)
            process.start()
            self.processes.append(process)
        self._finalizer = weakref.finalize(self, _end_processes, self.processes)
        self.failure: TensorParallelError | None = None
        try:
            torch.set_num_threads(threads)
            store = None
            if nnodes > 1:
                store = open_store(init_method, 0, size, config.distributed_start_timeout_s)
                publish(store, config, model_config, max_model_len)
                wait_joined(store, size)
            self.group = TensorParallelGroup(
                shard,
                rank_device(config, 0),
                init_method=init_method,
                timeout_s=config.distributed_timeout_s,
                store=store,
            )
        except BaseException:
            self._finalizer()
            raise
        self.channel = StepChannel(self.group)
        self.keepalive = KeepAlive(self.group, self._remote_silent) if nnodes > 1 else None
        self._slot_journal: list | None = None
        logger.info(
            "tensor parallelism: %d ranks on %d node(s) (%s, %d threads each, rendezvous %s)",
            size,
            nnodes,
            self.group.backend,
            threads,
            init_method,
        )

    def follow_slots(self, buffers) -> None:
        """Send every write and clear of rank 0's adapter slot buffers to the workers with the next step."""
        buffers.journal = self._slot_journal = []

    def run_step(self, input_ids, batch, forward):
        """Broadcast the step, then run rank 0's ``forward(input_ids, batch)`` (whose collectives meet the
        workers'); its result. TensorParallelError when a rank is gone."""
        self.check()
        events = []
        if self._slot_journal:
            events = [
                (slot, None if adapter is None else SlotContents.of(adapter)) for slot, adapter in self._slot_journal
            ]
            self._slot_journal.clear()
        try:
            self.channel.send(input_ids, batch, events)
            return forward(input_ids, batch)
        except Exception as exc:  # a broken peer (RuntimeError), or rank 0 failing mid-step: the ranks are out of step
            raise self._fail(f"the step failed ({type(exc).__name__}: {exc})") from exc

    def check(self) -> None:
        """Raise TensorParallelError if a rank has died (or failed before)."""
        if self.failure is not None:
            raise self.failure
        if not all(p.is_alive() for p in self.processes):
            raise self._fail("")

    def _fail(self, detail: str) -> TensorParallelError:
        # A peer's connection closes as it dies, an instant before its exit status exists: wait that instant, so
        # the error names the rank that died rather than "stopped answering".
        ended = multiprocessing.connection.wait([p.sentinel for p in self.processes], timeout=_DEATH_WAIT_S)
        for process in self.processes:
            if process.sentinel in ended:  # its files are closed; its exit status comes a moment later
                process.join(_DEATH_WAIT_S)
        dead = [
            f"rank {rank} (pid {p.pid}) {_exit_reason(p.exitcode)}"
            for rank, p in enumerate(self.processes, 1)
            if not p.is_alive()
        ]
        remote = (
            f" (ranks {self.local_ranks}..{self.group.size - 1} run on other nodes)"
            if self.local_ranks < self.group.size
            else ""
        )
        what = ", ".join(dead) if dead else f"a rank stopped answering{remote}"
        self.failure = TensorParallelError(
            f"tensor-parallel {what}{': ' + detail if detail else ''}; the engine cannot go on"
        )
        logger.error("%s", self.failure)
        return self.failure

    def _remote_silent(self, exc: Exception) -> None:
        """The keep-alive failed (a rank gone, or silent past the timeout): the next step raises."""
        if self.failure is None:
            self.failure = TensorParallelError(
                f"tensor-parallel keep-alive failed ({type(exc).__name__}: {exc}); the engine cannot go on"
            )
            logger.error("%s", self.failure)

    def stats(self) -> dict:
        return self.group.stats()

    def stop(self) -> None:
        """Stop every worker (STOP if the group still works, then terminate, then kill) and leave the group."""
        if self.keepalive is not None:  # its last beat, before STOP: the workers' keep-alive threads return
            self.keepalive.stop()
        if self.failure is None and all(p.is_alive() for p in self.processes):
            try:
                self.channel.send_stop()
            except RuntimeError as exc:
                logger.warning("tensor-parallel workers did not take STOP (%s); terminating them", exc)
            for process in self.processes:
                process.join(_STOP_WAIT_S)
        self.abort()

    def abort(self) -> None:
        """Terminate (then kill) the workers without a word to them, and leave the group: for a start-up that
        failed, when the ranks may be in different collectives."""
        self._finalizer()
        if self.keepalive is not None:
            self.keepalive.stop()
        self.group.close()


def check_supported(config: EngineConfig, folder: Path) -> None:
    """Refuse what is not sharded: quantized weights (int8 at load, GGUF files) are split by no code here."""
    if config.quantization is not None or (Path(folder) / GGUF_FILE).exists():
        raise ValueError(
            "tensor parallelism runs float weights only (dtype auto, float32, bfloat16 or float16): "
            "int8 quantization and GGUF checkpoints are not sharded"
        )


def _end_processes(processes) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(_STOP_WAIT_S)
        if process.is_alive():
            process.kill()
            process.join()


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _free_port() -> int:
    """A port free now on loopback (the rendezvous binds it an instant later, as torchrun's default does)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

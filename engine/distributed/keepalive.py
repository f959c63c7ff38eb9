"""A multi-node group's keep-alive: rank 0 and every rank meet in a one-element all-reduce every
``timeout / 4`` seconds, on a gloo group of its own, from a thread of their own.

Why: between steps a worker waits for the next step message with no timeout (an idle engine sends nothing). A
rank 0 that dies on the same machine closes its connections and that wait fails at once; a rank 0 whose machine
vanishes (power, network partition) closes nothing, and the wait would last forever. The keep-alive's all-reduce
has the group's ``distributed_timeout_s``: a worker whose rank 0 stops beating exits within that time, and rank 0
notes a remote rank that stops answering before its next step. Rank 0 ends it with a last beat of 0 (the MIN of
every rank's value), so the workers' threads return before the group is torn down.
"""

import logging
import threading

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


class KeepAlive:
    def __init__(self, group, on_failure):
        """``group``: a ``TensorParallelGroup`` with its ``keepalive_group``; ``on_failure(exc)`` runs in the
        thread when a beat fails (a rank gone or silent past the timeout), after which the thread ends."""
        self.group = group
        self.interval_s = group.timeout_s / 4
        self.on_failure = on_failure
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-tp-keepalive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        leader = self.group.rank == 0
        while True:
            last = leader and self._stopping.wait(self.interval_s)
            beat = torch.tensor([0 if last else 1], dtype=torch.int64)
            try:
                dist.all_reduce(beat, op=dist.ReduceOp.MIN, group=self.group.keepalive_group)
            except RuntimeError as exc:
                self.on_failure(exc)
                return
            if int(beat) == 0:
                return

    def stop(self) -> None:
        """Rank 0: the last beat (the workers' threads return), and wait for the thread (a silent rank bounds
        that by the group's timeout). Other ranks: wait for rank 0's last beat, bounded the same way."""
        self._stopping.set()
        self._thread.join(self.group.timeout_s + self.interval_s)

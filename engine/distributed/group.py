"""This process's membership of a tensor-parallel group: its shard, its process groups and the collectives the
model runs, each timed.

Three process groups, created in the same order on every rank:
  * ``device_group``: the model's collectives (gloo on CPU, NCCL on CUDA), with the configured timeout, so a rank
    that stops answering in the middle of a step fails the step instead of hanging it;
  * ``cpu_group``: gloo for Python objects (adapter slot writes), same timeout (it is the device group on CPU);
  * ``idle_group``: gloo for the step message a worker waits for between steps, with no practical timeout: an idle
    engine sends nothing, and a worker must not give up on it. A dead peer still ends that wait at once (its
    connection closes).
A multi-node group (``store`` given) has a fourth, ``keepalive_group`` (gloo, the configured timeout), for the
beats of engine.distributed.keepalive: a rank 0 whose machine vanishes closes no connection.
"""

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.distributed.sharding import ModelShard

_IDLE_TIMEOUT = timedelta(days=3650)


class TensorParallelGroup:
    def __init__(self, shard: ModelShard, device: torch.device, *, init_method: str, timeout_s: float, store=None):
        """``store``: the multi-node rendezvous's ``TCPStore`` (engine.distributed.rendezvous), the groups made on
        it, keep-alive group included; None: torch.distributed's own rendezvous at ``init_method``."""
        if dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is already initialized in this process: one tensor-parallel "
                "engine per process (shut the other one down first)"
            )
        self.shard, self.device = shard, device
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=timeout_s)
        rendezvous = {"store": store} if store is not None else {"init_method": init_method}
        dist.init_process_group(backend, **rendezvous, rank=shard.rank, world_size=shard.size, timeout=timeout)
        self.backend = backend
        self.device_group = dist.group.WORLD
        self.cpu_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else self.device_group
        self.idle_group = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)
        self.keepalive_group = dist.new_group(backend="gloo", timeout=timeout) if store is not None else None
        self.timeout_s = timeout_s
        self.seconds = {"all_reduce": 0.0, "gather": 0.0, "broadcast": 0.0}
        self.counts = {"all_reduce": 0, "gather": 0, "broadcast": 0, "broadcast_bytes": 0}

    @property
    def rank(self) -> int:
        return self.shard.rank

    @property
    def size(self) -> int:
        return self.shard.size

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:  # [T, hidden] partial sums -> the sum, in place
        start = time.perf_counter()
        dist.all_reduce(tensor, group=self.device_group)
        self.seconds["all_reduce"] += time.perf_counter() - start
        self.counts["all_reduce"] += 1
        return tensor

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor | None:
        """This rank's vocabulary columns [N, rows] -> the whole logits [N, vocab] on rank 0, None elsewhere."""
        start = time.perf_counter()
        width = self.shard.max_vocab_rows
        if logits.shape[1] < width:
            logits = torch.nn.functional.pad(logits, (0, width - logits.shape[1]))
        parts = [torch.empty_like(logits) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(logits.contiguous(), parts, dst=0, group=self.device_group)
        self.seconds["gather"] += time.perf_counter() - start
        self.counts["gather"] += 1
        if parts is None:
            return None
        return torch.cat(
            [part[:, :count] for part, (_, count) in zip(parts, self.shard.vocab_spans, strict=True)], dim=1
        )

    def broadcast(self, tensor: torch.Tensor, *, idle: bool) -> None:
        """Rank 0's ``tensor`` into every rank's (same shape); ``idle``: on the group without a timeout."""
        start = time.perf_counter()
        dist.broadcast(tensor, src=0, group=self.idle_group if idle else self.cpu_group)
        self.seconds["broadcast"] += time.perf_counter() - start
        self.counts["broadcast"] += 1
        self.counts["broadcast_bytes"] += tensor.nbytes

    def broadcast_object(self, value=None):
        """Rank 0's picklable ``value`` on every rank (adapter slot writes: rare, megabytes, not per step)."""
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's ``value`` (the KV block count each rank's memory allows). On the idle
        group: ranks reach it when their model has loaded, which may take long on one of them."""
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.idle_group)
        return int(tensor)

    def stats(self) -> dict:
        """Collectives run and their time on this rank: a collective's time includes waiting for the slowest rank
        to reach it. On CUDA NCCL calls return when queued, so their times there are launch times."""
        return {
            "size": self.size,
            "backend": self.backend,
            **{f"{name}s": count for name, count in self.counts.items() if name != "broadcast_bytes"},
            "broadcast_bytes": self.counts["broadcast_bytes"],
            **{f"{name}_ms": round(1e3 * seconds, 3) for name, seconds in self.seconds.items()},
        }

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

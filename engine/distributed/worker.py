"""A tensor-parallel worker: ranks 1..N-1, each a process spawned by the engine (rank 0) or, with ``nnodes`` > 1,
by ``python -m engine worker`` on another node (:func:`run_node`).

It loads the same model folder keeping only its shard, sizes its KV cache for its KV heads (the block count is
the smallest any rank allows, agreed at start-up), builds its part of the adapter slots, then loops: receive the
step, apply the adapter slot writes it carries, run the forward pass (the collectives meet rank 0's). It exits
when rank 0 sends STOP, and with an error when rank 0 goes away (its connections close).

A multi-node rank (:class:`RankSpec`) knows only its model folder, its rank and the rendezvous: it takes rank 0's
``EngineConfig`` from the rendezvous (engine.distributed.rendezvous), so no engine flag can differ between nodes.
"""

import dataclasses
import logging
import multiprocessing
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig, ModelConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    config: EngineConfig
    model_config: ModelConfig
    folder: Path
    max_model_len: int
    rank: int
    init_method: str
    num_threads: int


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """Rank ``rank``'s device: CPU for every rank, or the ``rank``-th CUDA device from the configured one."""
    device = config.torch_device
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


@dataclass(frozen=True, slots=True)
class RankSpec:
    """A rank of a multi-node group: what it knows before the rendezvous (the rest comes from rank 0)."""

    folder: Path
    rank: int
    size: int
    nnodes: int
    init_method: str
    start_timeout_s: float
    num_threads: int | None = None  # None: rank 0's num_threads_per_rank, else this node's CPUs / its ranks


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A worker node (``python -m engine worker``): ranks ``node_rank * size / nnodes`` onwards."""

    folder: Path
    node_rank: int
    size: int
    nnodes: int
    init_method: str
    start_timeout_s: float
    num_threads: int | None = None

    def __post_init__(self):
        if type(self.nnodes) is not int or self.nnodes < 2:
            raise ValueError(f"a worker node belongs to a group of 2 or more nodes, got nnodes {self.nnodes!r}")
        if self.size % self.nnodes:
            raise ValueError(
                f"tensor_parallel_size {self.size} does not divide by nnodes {self.nnodes}: every "
                "node runs tensor_parallel_size / nnodes ranks"
            )
        if not 1 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"node_rank must be in 1..{self.nnodes - 1} (node 0 is `engine serve`), got {self.node_rank}"
            )

    def rank_spec(self, local_rank: int) -> RankSpec:
        rank = self.node_rank * (self.size // self.nnodes) + local_rank
        return RankSpec(
            self.folder, rank, self.size, self.nnodes, self.init_method, self.start_timeout_s, self.num_threads
        )


def run_worker(spec: WorkerSpec) -> None:
    """The worker process's whole life (the target of ``multiprocessing``'s spawn)."""
    from engine.distributed.group import TensorParallelGroup
    from engine.distributed.sharding import ModelShard

    _log_as(spec.rank)
    torch.set_num_threads(spec.num_threads)
    device = rank_device(spec.config, spec.rank)
    config = dataclasses.replace(spec.config, device=str(device))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    shard = ModelShard.of(spec.model_config, spec.rank, config.tensor_parallel_size)
    group = TensorParallelGroup(shard, device, init_method=spec.init_method, timeout_s=config.distributed_timeout_s)
    _serve_steps(config, spec.model_config, spec.folder, spec.max_model_len, group)


def run_rank(spec: RankSpec) -> None:
    """A multi-node rank's whole life: the rendezvous, rank 0's config, then the steps. RendezvousError when the
    group does not meet or this rank's model folder is not rank 0's model; RuntimeError when rank 0 goes away."""
    from engine.distributed import rendezvous
    from engine.distributed.group import TensorParallelGroup
    from engine.distributed.keepalive import KeepAlive
    from engine.distributed.sharding import ModelShard

    _log_as(spec.rank)
    store = rendezvous.open_store(spec.init_method, spec.rank, spec.size, spec.start_timeout_s)
    try:
        published = rendezvous.read_published(store, spec.rank)
        model_config = _check_published(spec, published)
    except ValueError as exc:
        rendezvous.report_joined(store, spec.rank, str(exc))
        raise rendezvous.RendezvousError(f"rank {spec.rank}: {exc}") from None
    rendezvous.report_joined(store, spec.rank)
    local_ranks = spec.size // spec.nnodes
    device = rank_device(published.config, spec.rank % local_ranks)
    config = dataclasses.replace(published.config, model=str(spec.folder), device=str(device))
    threads = spec.num_threads or config.num_threads_per_rank or max(1, len(os.sched_getaffinity(0)) // local_ranks)
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    shard = ModelShard.of(model_config, spec.rank, spec.size)
    group = TensorParallelGroup(
        shard, device, init_method=spec.init_method, timeout_s=config.distributed_timeout_s, store=store
    )
    logger.warning("rank %d of %d joined (%s, %d threads)", spec.rank, spec.size, device, threads)
    keepalive = KeepAlive(group, _rank_0_silent)
    _serve_steps(config, model_config, spec.folder, published.max_model_len, group, before_close=keepalive.stop)


def _rank_0_silent(exc: Exception) -> None:
    """The keep-alive failed: rank 0 (or a peer) is gone, while the main thread may wait for a step forever."""
    logger.error("the keep-alive with rank 0 failed (%s): exiting", exc)
    logging.shutdown()
    os._exit(1)


def run_node(spec: NodeSpec) -> None:
    """``python -m engine worker``: this node's first rank here, the others in processes it spawns (ended when it
    ends); returns when rank 0 stops the group, raises when the group fails."""
    local_ranks = spec.size // spec.nnodes
    context = multiprocessing.get_context("spawn")
    others = [
        context.Process(
            target=run_rank, args=(spec.rank_spec(i),), name=f"engine-tp-rank-{spec.rank_spec(i).rank}", daemon=True
        )
        for i in range(1, local_ranks)
    ]
    for process in others:
        process.start()
    try:
        run_rank(spec.rank_spec(0))
        for process in others:  # they took the same STOP
            process.join()
    finally:
        for process in others:
            if process.is_alive():
                process.terminate()
                process.join()


def _check_published(spec: RankSpec, published):
    """This rank's ``ModelConfig``; ValueError when rank 0's group or model differs from this rank's."""
    config = published.config
    if (config.tensor_parallel_size, config.nnodes) != (spec.size, spec.nnodes):
        raise ValueError(
            f"rank 0 runs tensor_parallel_size {config.tensor_parallel_size} over nnodes {config.nnodes}, this "
            f"node was started with {spec.size} over {spec.nnodes}"
        )
    model_config = ModelConfig.from_folder(spec.folder)
    if model_config != ModelConfig.from_dict(published.model_config):
        raise ValueError(f"the model at {spec.folder} is not rank 0's ({config.model}): their config.json differ")
    return model_config


def _log_as(rank: int) -> None:
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s rank {rank} %(levelname)s %(message)s")


def _serve_steps(
    config: EngineConfig, model_config: ModelConfig, folder: Path, max_model_len: int, group, before_close=None
) -> None:
    """Load the shard, then run every step rank 0 sends until STOP; ``before_close()`` before leaving the group."""
    from engine.distributed.step_channel import StepChannel
    from engine.model_runner import ModelRunner

    device, shard = group.device, group.shard
    buffers = _slot_buffers(config, model_config, shard, device) if config.enable_lora else None
    runner = ModelRunner(config, model_config, folder, max_model_len=max_model_len, eos_token_ids=(), parallel=group)
    if buffers is not None:
        runner.bind_lora(buffers)
    channel = StepChannel(group)
    with torch.inference_mode():
        while (message := channel.receive(device)) is not None:
            for slot, contents in message.slot_events:  # in rank 0's order: a clear, then the slot's new adapter
                if contents is None:
                    buffers.clear(slot)
                else:
                    buffers.write(slot, contents)
            runner.forward(message.input_ids, message.batch)
    if before_close is not None:
        before_close()
    group.close()


def _slot_buffers(config: EngineConfig, model_config: ModelConfig, shard, device):
    from engine.lora.fingerprint import ModelFingerprint
    from engine.lora.slot_buffers import SlotBuffers

    return SlotBuffers(
        ModelFingerprint.from_hf_config(model_config.extra),
        num_slots=config.max_loras,
        max_rank=config.max_lora_rank,
        device=device,
        dtype=config.torch_dtype(model_config),
        shard=shard,
    )

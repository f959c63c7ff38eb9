"""A tensor-parallel worker: ranks 1..N-1, each a process spawned by the engine (rank 0).

It loads the same model folder keeping only its shard, sizes its KV cache for its KV heads (the block count is
the smallest any rank allows, agreed at start-up), builds its part of the adapter slots, then loops: receive the
step, apply the adapter slot writes it carries, run the forward pass (the collectives meet rank 0's). It exits
when rank 0 sends STOP, and with an error when rank 0 goes away (its connections close).
"""

import dataclasses
import logging
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


def run_worker(spec: WorkerSpec) -> None:
    """The worker process's whole life (the target of ``multiprocessing``'s spawn)."""
    from engine.distributed.group import TensorParallelGroup
    from engine.distributed.sharding import ModelShard
    from engine.distributed.step_channel import StepChannel
    from engine.model_runner import ModelRunner

    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s rank {spec.rank} %(levelname)s %(message)s")
    torch.set_num_threads(spec.num_threads)
    device = rank_device(spec.config, spec.rank)
    config = dataclasses.replace(spec.config, device=str(device))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    shard = ModelShard.of(spec.model_config, spec.rank, config.tensor_parallel_size)
    group = TensorParallelGroup(shard, device, init_method=spec.init_method, timeout_s=config.distributed_timeout_s)
    buffers = _slot_buffers(config, spec.model_config, shard, device) if config.enable_lora else None
    runner = ModelRunner(
        config, spec.model_config, spec.folder, max_model_len=spec.max_model_len, eos_token_ids=(), parallel=group
    )
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

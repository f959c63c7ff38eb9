"""The multi-node rendezvous (``nnodes`` > 1), torchrun-style: a ``TCPStore`` at ``tcp://HOST:PORT`` (or
``env://``: ``MASTER_ADDR`` and ``MASTER_PORT``), hosted by rank 0, that every rank of every node joins.

The store carries the start-up handshake before any process group exists, each step bounded by the start-up
timeout (``distributed_start_timeout_s``):
  1. rank 0 opens the store and waits for all N ranks to connect (a node that never comes: ``RendezvousError``
     "1/2 clients joined" after the timeout; a rank 0 that never comes: the same on the worker's side);
  2. rank 0 publishes its ``EngineConfig``, its model's ``config.json`` and ``max_model_len`` (JSON): the one
     source of truth, so a worker node needs only its model folder, its node rank and the rendezvous;
  3. every other rank checks the published config against its own (group size, node count, its folder's
     ``config.json``) and reports "joined" or its error; rank 0 reads every report and fails with the first error.
Then each rank creates the process groups on the same store (engine.distributed.group).
"""

import dataclasses
import json
import os
from datetime import timedelta
from urllib.parse import urlsplit

import torch.distributed as dist

from engine.config import EngineConfig, ModelConfig

_CONFIG_KEY = "engine/config"
_JOINED_KEY = "engine/joined/{rank}"
_OK = "ok"


class RendezvousError(RuntimeError):
    """The ranks of a multi-node group did not all meet (within the start-up timeout) or do not agree."""


@dataclasses.dataclass(frozen=True, slots=True)
class Published:
    config: EngineConfig
    model_config: dict  # rank 0's config.json
    max_model_len: int


def store_address(init_method: str) -> tuple[str, int]:
    """(host, port) of ``tcp://HOST:PORT`` or of ``env://`` (``MASTER_ADDR``, ``MASTER_PORT``, as torchrun)."""
    if init_method == "env://":
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
        if missing:
            raise ValueError(f"distributed_init env:// needs {' and '.join(missing)} in the environment")
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    url = urlsplit(init_method)
    if url.scheme != "tcp" or not url.hostname or url.port is None:
        raise ValueError(f"a multi-node rendezvous is tcp://HOST:PORT or env://, got {init_method!r}")
    return url.hostname, url.port


def open_store(init_method: str, rank: int, size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0 hosts the store, the others connect to it; every rank then waits until all ``size`` have.
    RendezvousError after ``timeout_s``."""
    host, port = store_address(init_method)
    try:
        return dist.TCPStore(
            host,
            port,
            size,
            is_master=rank == 0,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=True,  # every rank counts itself in, and waits for all
        )
    except dist.DistError as exc:
        who = "every node's ranks" if rank == 0 else "rank 0 (engine serve on node 0)"
        raise RendezvousError(
            f"tensor-parallel rendezvous at {host}:{port} (rank {rank} of {size}): {who} did not join within "
            f"the start-up timeout of {timeout_s:g} s ({exc})"
        ) from None


def publish(store: dist.TCPStore, config: EngineConfig, model_config: ModelConfig, max_model_len: int) -> None:
    """Rank 0's config with what ``auto`` means resolved here (device, dtypes: a node whose CPU or GPUs differ must
    still run rank 0's), its model's config.json and ``max_model_len``."""
    resolved = dataclasses.replace(
        config,
        device=str(config.torch_device),
        dtype=_dtype_name(config.torch_dtype(model_config)),
        kv_cache_dtype=_dtype_name(config.kv_cache_torch_dtype(model_config)),
    )
    body = {"config": dataclasses.asdict(resolved), "model_config": model_config.extra, "max_model_len": max_model_len}
    store.set(_CONFIG_KEY, json.dumps(body))


def read_published(store: dist.TCPStore, rank: int) -> Published:
    """What rank 0 published; ValueError when this engine cannot take its config (another version's fields)."""
    body = json.loads(_get(store, _CONFIG_KEY, f"rank {rank}: rank 0's engine config"))
    try:
        config = EngineConfig(**body["config"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"rank 0's engine config does not fit this node's engine (another version?): {exc}") from None
    return Published(config, body["model_config"], body["max_model_len"])


def report_joined(store: dist.TCPStore, rank: int, error: str | None = None) -> None:
    store.set(_JOINED_KEY.format(rank=rank), error or _OK)


def wait_joined(store: dist.TCPStore, size: int) -> None:
    """Rank 0: every other rank's report; RendezvousError naming the first rank that refused to join."""
    for rank in range(1, size):
        report = _get(store, _JOINED_KEY.format(rank=rank), f"rank {rank}'s report")
        if report != _OK:
            raise RendezvousError(f"tensor-parallel rank {rank} refused to join: {report}")


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _get(store: dist.TCPStore, key: str, what: str) -> str:
    try:
        return store.get(key).decode()
    except dist.DistError as exc:
        raise RendezvousError(
            f"tensor-parallel rendezvous: {what} did not come within the start-up timeout ({exc})"
        ) from None

"""Tensor parallelism on ``torch.distributed``: one model split Megatron-style over N ranks of one engine.

Rank 0 is the engine process (scheduler, sampler and its own shard); ranks 1..N-1 are worker processes spawned by
it (:mod:`engine.distributed.workers`) that load the same folder, keep their shard and run each step's forward
pass as it arrives (:mod:`engine.distributed.worker`). What each rank holds: :mod:`engine.distributed.sharding`;
the collectives: :mod:`engine.distributed.group`; the step message: :mod:`engine.distributed.step_channel`. Across
machines (``nnodes`` > 1) the other nodes' ranks come from ``python -m engine worker``
(:func:`engine.distributed.worker.run_node`) through :mod:`engine.distributed.rendezvous`, and
:mod:`engine.distributed.keepalive` ends a group whose rank 0 goes silent.
"""

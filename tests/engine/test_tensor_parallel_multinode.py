"""Multi-node tensor parallelism simulated on one machine: node 0 is this test process (``LLM(...,
tensor_parallel_size=2, nnodes=2, distributed_init=tcp://127.0.0.1:PORT)``), node 1 a ``python -m engine worker``
process the test starts. The worker is started first: it retries its connection until node 0's rendezvous is up.

Every test has its own timeout and every wait is on a condition (a process exit, a raised error) with a bound.
"""

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from engine import LLM, SamplingParams
from engine.async_engine import AsyncEngine, EngineDead
from engine.config import EngineConfig
from engine.distributed.rendezvous import RendezvousError, store_address
from engine.distributed.worker import NodeSpec
from engine.distributed.workers import TensorParallelError
from engine.llm_engine import LLMEngine
from tests.engine.test_tensor_parallel import ADAPTERS, PROMPTS, STRESS, mixed_batch, running, tokens
from tests.lora.engine_support import GREEDY, make_adapters, make_llm
from tests.support.tiny_llama import make_tiny_llama

EXIT_BOUND_S = 60  # a worker whose rank 0 is gone exits well within this (its connections close at once)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tp-nodes-model"))  # 4 query heads over 2 KV heads


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    return make_adapters(model_dir, tmp_path_factory.mktemp("tp-nodes-adapters"), ADAPTERS)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_worker(
    folder, url: str | None, *, env: dict | None = None, timeout_s: float = 60, size: int = 2
) -> subprocess.Popen:
    """Node 1: ``python -m engine worker``, with flags (``url``) or torchrun's environment only (``env``). Its
    output goes to a file (c10d logs every connection retry: a pipe nobody reads could fill and block it)."""
    command = [sys.executable, "-m", "engine", "worker", str(folder), "--tensor-parallel-size", str(size)]
    if url is not None:
        command += ["--nnodes", "2", "--node-rank", "1", "--distributed-init", url]
    command += ["--distributed-start-timeout", str(timeout_s)]
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
    process.log = log
    return process


def ended(process: subprocess.Popen, timeout_s: float = EXIT_BOUND_S) -> tuple[int, str]:
    """The process's exit code and output, once it exits (TimeoutExpired past ``timeout_s``: a hang)."""
    process.wait(timeout_s)
    process.log.seek(0)
    return process.returncode, process.log.read()


def node0(model_dir, port: int, **kwargs) -> dict:
    """Node 0's settings (``kwargs`` override them); a start-up timeout that turns a worker that failed to start
    into an error soon."""
    defaults = dict(
        tensor_parallel_size=2, nnodes=2, distributed_init=f"tcp://127.0.0.1:{port}", distributed_start_timeout_s=60
    )
    return defaults | kwargs


@pytest.mark.timeout(300)
def test_two_nodes_match_one_and_the_worker_exits_when_rank_0_shuts_down(model_dir, adapters):
    """Node 1 gets everything from the rendezvous (dtype, KV blocks, LoRA slots and rank): its command names only
    the model and, here, torchrun's environment (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK)."""
    prompts, loras = mixed_batch(adapters)
    expected = tokens(make_llm(model_dir, **STRESS).generate(prompts, GREEDY, lora_request=loras, use_tqdm=False))
    port = free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NNODES": "2", "NODE_RANK": "1"}
    worker = start_worker(model_dir, None, env=env)
    try:
        with running(make_llm(model_dir, **node0(model_dir, port), **STRESS)) as two:
            assert two.llm_engine.model_runner.workers.processes == []  # node 0 has one rank: itself
            assert tokens(two.generate(prompts, GREEDY, lora_request=loras, use_tqdm=False)) == expected
            stats = two.llm_engine.stats()
            assert worker.poll() is None
        assert stats["preemptions"] > 0 and stats["adapters"]["evictions"] > 0  # slot rewrites reached node 1
        assert stats["tensor_parallel"]["all_reduces"] == 2 * 2 * stats["steps"]
        code, output = ended(worker)  # STOP reached it: a clean exit
        assert code == 0, output
        assert "rank 1 of 2 joined" in output and "stopped by rank 0" in output
    finally:
        worker.kill()


@pytest.mark.timeout(300)
def test_four_ranks_on_two_nodes_spawn_their_second_rank_on_each_node_and_match_one(tmp_path):
    """TP=4 over 2 nodes: node 0 spawns rank 1, node 1's worker runs rank 2 and spawns rank 3; all four take rank
    0's config from the rendezvous, and all end when rank 0 shuts down."""
    folder = make_tiny_llama(tmp_path / "four-kv", num_heads=4, num_kv_heads=4)
    expected = tokens(make_llm(folder, enable_lora=False, gemm="torch").generate(PROMPTS, GREEDY, use_tqdm=False))
    port = free_port()
    worker = start_worker(folder, f"tcp://127.0.0.1:{port}", size=4)
    try:
        with running(
            make_llm(folder, enable_lora=False, gemm="torch", **node0(folder, port, tensor_parallel_size=4))
        ) as llm:
            assert len(llm.llm_engine.model_runner.workers.processes) == 1
            assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == expected
        code, output = ended(worker)
        assert code == 0, output
        assert "rank 2 of 4 joined" in output and "rank 3 of 4 joined" in output
    finally:
        worker.kill()


@pytest.mark.timeout(240)
def test_a_remote_worker_killed_mid_run_ends_the_engine_within_a_bounded_time(model_dir):
    port = free_port()
    worker = start_worker(model_dir, f"tcp://127.0.0.1:{port}")
    core = LLMEngine(
        EngineConfig(
            model=str(model_dir), dtype="float32", gemm="torch", distributed_timeout_s=30, **node0(model_dir, port)
        )
    )

    async def stream_until_killed(engine: AsyncEngine) -> None:
        received = 0
        params = SamplingParams(temperature=0, max_tokens=900, ignore_eos=True)
        async for _ in engine.generate("long", PROMPTS[0], params):
            received += 1
            if received == 3:
                worker.kill()

    async def run():
        engine = AsyncEngine(core)
        with pytest.raises(EngineDead, match="tensor-parallel"):
            await asyncio.wait_for(stream_until_killed(engine), timeout=60)
        assert engine.is_dead
        with pytest.raises(EngineDead):
            await anext(engine.generate("next", PROMPTS[1], GREEDY))
        await engine.shutdown(grace_s=0)

    try:
        asyncio.run(run())
    finally:
        core.shutdown()
        worker.kill()
    assert worker.wait(EXIT_BOUND_S) == -signal.SIGKILL


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["SIGKILL", "SIGSTOP"])
def test_a_worker_whose_rank_0_dies_or_goes_silent_between_steps_exits(model_dir, how):
    """Rank 0 (in a process of its own) dies without a word (SIGKILL: its connections close) or goes silent
    (SIGSTOP: they stay open, as when its machine vanishes) while node 1 waits for the next step: the broken
    connection, or the keep-alive missing past ``distributed_timeout_s`` (4 s here), ends the worker."""
    port = free_port()
    worker = start_worker(model_dir, f"tcp://127.0.0.1:{port}")
    script = textwrap.dedent(f"""
        import sys
        from engine import LLM, SamplingParams
        llm = LLM({str(model_dir)!r}, dtype="float32", gemm="torch", tensor_parallel_size=2, nnodes=2,
                  distributed_init="tcp://127.0.0.1:{port}", distributed_timeout_s=4, distributed_start_timeout_s=60)
        llm.generate([[21, 22, 23]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        print("served", flush=True)
        sys.stdin.read()
    """)
    rank0 = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert rank0.stdout.readline().strip() == "served"  # a step ran across both nodes
        assert worker.poll() is None
        rank0.send_signal(how)
        started = time.monotonic()
        code, output = ended(worker)
        assert code == 1, output
        assert re.search(r"node 1: |keep-alive with rank 0 failed", output), output
        assert time.monotonic() - started < EXIT_BOUND_S
    finally:
        rank0.kill()
        rank0.wait(EXIT_BOUND_S)
        worker.kill()


@pytest.mark.timeout(240)
def test_a_remote_worker_gone_silent_between_steps_fails_the_next_step(model_dir):
    """A stopped worker (SIGSTOP: no connection closes) misses the keep-alive: within ``distributed_timeout_s``
    rank 0 knows, and the next generate raises at once instead of waiting on the step's collectives."""
    port = free_port()
    worker = start_worker(model_dir, f"tcp://127.0.0.1:{port}")
    try:
        llm = LLM(str(model_dir), dtype="float32", gemm="torch", **node0(model_dir, port, distributed_timeout_s=4))
        with running(llm):
            assert tokens(llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False))
            workers = llm.llm_engine.model_runner.workers
            worker.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + EXIT_BOUND_S
            while workers.failure is None and time.monotonic() < deadline:
                workers.keepalive._thread.join(0.1)  # the keep-alive thread ends when its beat fails
            with pytest.raises(TensorParallelError, match="keep-alive failed"):
                llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    finally:
        worker.kill()
        worker.wait(EXIT_BOUND_S)


@pytest.mark.timeout(120)
def test_a_node_that_never_comes_fails_start_up_within_the_start_up_timeout(model_dir):
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=r"did not join within the start-up timeout of 3 s .*1/2 clients"):
        LLM(str(model_dir), dtype="float32", **node0(model_dir, free_port(), distributed_start_timeout_s=3))
    assert time.monotonic() - started < 30


@pytest.mark.timeout(120)
def test_a_worker_whose_rank_0_never_comes_exits_within_its_start_up_timeout(model_dir):
    started = time.monotonic()
    code, output = ended(start_worker(model_dir, f"tcp://127.0.0.1:{free_port()}", timeout_s=3))
    assert code == 1 and "rank 0 (engine serve on node 0) did not join within the start-up timeout" in output
    assert time.monotonic() - started < EXIT_BOUND_S


@pytest.mark.timeout(240)
def test_a_worker_node_with_another_model_is_refused_at_the_rendezvous(model_dir, tmp_path):
    other = make_tiny_llama(tmp_path / "other", seed=2, hidden_size=96, num_heads=6, num_kv_heads=3)
    port = free_port()
    worker = start_worker(other, f"tcp://127.0.0.1:{port}")
    try:
        with pytest.raises(RendezvousError, match="rank 1 refused to join: the model at .* is not rank 0's"):
            LLM(str(model_dir), dtype="float32", **node0(model_dir, port))
        code, _ = ended(worker)
        assert code == 1
    finally:
        worker.kill()


def test_node_counts_that_do_not_fit_are_refused(model_dir):
    with pytest.raises(ValueError, match="tensor_parallel_size 3 does not divide by nnodes 2"):
        EngineConfig(model=str(model_dir), tensor_parallel_size=3, nnodes=2, distributed_init="tcp://h:1")
    with pytest.raises(ValueError, match="nnodes 2 needs distributed_init tcp://HOST:PORT"):
        EngineConfig(model=str(model_dir), tensor_parallel_size=2, nnodes=2)
    with pytest.raises(ValueError, match="node_rank must be in 1..1"):
        NodeSpec(model_dir, 0, 2, 2, "tcp://h:1", 3.0)
    with pytest.raises(ValueError, match="does not divide by nnodes"):
        NodeSpec(model_dir, 1, 3, 2, "tcp://h:1", 3.0)


def test_the_commands_take_torchruns_environment(monkeypatch):
    from engine.server import cli

    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("NNODES", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    worker = cli.build_parser().parse_args(["worker", "m", "--tensor-parallel-size", "4"])
    assert (worker.nnodes, worker.node_rank, cli.distributed_init(worker)) == (2, 1, "env://")
    assert store_address("env://") == ("10.0.0.1", 29500)
    serve = cli.engine_kwargs(cli.build_parser().parse_args(["serve", "m", "--tensor-parallel-size", "4"]))
    assert (serve["nnodes"], serve["distributed_init"], serve["distributed_start_timeout_s"]) == (2, "env://", 300)
    with pytest.raises(SystemExit, match="serve` is node 0"):  # NODE_RANK 1 is a worker node
        cli.main(["serve", "m", "--tensor-parallel-size", "4"])
    monkeypatch.delenv("NNODES")
    monkeypatch.delenv("MASTER_ADDR")
    assert cli.build_parser().parse_args(["serve", "m"]).nnodes == 1
    with pytest.raises(SystemExit):  # a worker without $NNODES must be told --nnodes
        cli.build_parser().parse_args(["worker", "m", "--tensor-parallel-size", "4", "--node-rank", "1"])
    with pytest.raises(ValueError, match="env:// needs MASTER_ADDR"):
        store_address("env://")

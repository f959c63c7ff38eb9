"""Tensor parallelism on CPU: two gloo ranks (this process and one spawned worker) against one rank.

In fp32 the all-reduce of two partial sums rounds differently from one GEMM's sum, but the tiny models' peaked
logits (tests/support/tiny_llama.py) leave no near-ties, so greedy tokens are compared for exact identity. Every
test that starts workers has its own timeout: a hang is a failure, never a stuck suite.
"""

import asyncio
import contextlib
import multiprocessing
import os
import signal

import psutil
import pytest

from engine import LLM, SamplingParams
from engine.async_engine import AsyncEngine, EngineDead
from engine.config import EngineConfig, ModelConfig
from engine.distributed.sharding import ModelShard, balanced_span
from engine.distributed.workers import TensorParallelError
from engine.llm_engine import LLMEngine
from tests.lora.engine_support import GREEDY, lora_request, make_adapters, make_llm, prompts_of_lengths
from tests.support.tiny_llama import make_tiny_llama

ADAPTERS = {
    "r4-all": dict(
        rank=4,
        alpha=8,
        use_rslora=True,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    "r8-kvo-up": dict(rank=8, alpha=8, target_modules=["k_proj", "v_proj", "o_proj", "up_proj"]),
    "r16-mlp": dict(rank=16, alpha=16, target_modules=["gate_proj", "up_proj", "down_proj"]),
}
PROMPTS = prompts_of_lengths([3, 18, 41, 25, 9, 33])
# Small pool and token budget: 18 sequences of up to 53 tokens in 24 blocks of 4 preempt, 41-token prompts chunk.
STRESS = dict(num_kv_blocks=24, max_num_batched_tokens=16, max_loras=2, gemm="torch")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tp-model"))  # 4 query heads over 2 KV heads


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    return make_adapters(model_dir, tmp_path_factory.mktemp("tp-adapters"), ADAPTERS)


def mixed_batch(adapters) -> tuple[list[list[int]], list]:
    names = [None, *adapters]
    pairs = [(prompt, names[(i + j) % len(names)]) for j in range(3) for i, prompt in enumerate(PROMPTS)]
    requests = {name: lora_request(name, folder) for name, folder in adapters.items()}
    return [p for p, _ in pairs], [requests.get(n) for _, n in pairs]


def tokens(outputs) -> list[list[int]]:
    assert all(o.error is None for o in outputs)
    return [o.outputs[0].token_ids for o in outputs]


@contextlib.contextmanager
def running(llm: LLM):
    """The LLM, shut down however the test ends (one tensor-parallel engine per process at a time)."""
    try:
        yield llm
    finally:
        llm.shutdown()


def worker_pids(llm: LLM) -> list[int]:
    return [p.pid for p in llm.llm_engine.model_runner.workers.processes]


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


@pytest.mark.timeout(300)
def test_two_ranks_match_one_on_mixed_adapters_chunked_prefill_and_preemption(model_dir, adapters):
    prompts, loras = mixed_batch(adapters)
    one = make_llm(model_dir, **STRESS)
    expected = tokens(one.generate(prompts, GREEDY, lora_request=loras, use_tqdm=False))
    base = tokens(one.generate(prompts, GREEDY, use_tqdm=False))
    assert one.llm_engine.stats()["preemptions"] > 0
    with running(make_llm(model_dir, tensor_parallel_size=2, **STRESS)) as two:
        pids = worker_pids(two)
        assert tokens(two.generate(prompts, GREEDY, lora_request=loras, use_tqdm=False)) == expected
        assert tokens(two.generate(prompts, GREEDY, use_tqdm=False)) == base
        stats = two.llm_engine.stats()
    assert sum(a != b for a, b in zip(expected, base, strict=True)) >= len(PROMPTS) * 2  # the adapters act
    assert stats["preemptions"] > 0 and stats["adapters"]["evictions"] > 0  # slot rewrites reached the worker
    assert stats["kv_blocks"]["total"] == 24 and stats["kv_blocks"]["used"] == 0
    parallel = stats["tensor_parallel"]
    assert parallel["size"] == 2 and parallel["broadcasts"] >= stats["steps"]
    assert parallel["all_reduces"] == 2 * 2 * stats["steps"]  # o_proj and down_proj of 2 layers per step
    assert_gone(pids)  # shut down: no orphan
    assert multiprocessing.active_children() == []


@pytest.mark.timeout(300)
def test_uneven_heads_tied_embeddings_biases_and_an_odd_vocabulary(tmp_path_factory):
    """3 KV heads over 2 ranks (2 and 1, with 6 and 3 query heads), a vocabulary of odd size (the gather pads),
    a tied lm_head (a view of each rank's embedding rows) and o_proj biases (added by rank 0 only)."""
    folder = make_tiny_llama(
        tmp_path_factory.mktemp("tp-uneven"),
        seed=2,
        hidden_size=96,
        num_heads=6,
        num_kv_heads=3,
        vocab_size=501,
        tie_word_embeddings=True,
        attention_bias=True,
    )
    adapters = make_adapters(folder, tmp_path_factory.mktemp("tp-uneven-adapters"), {"r4-all": ADAPTERS["r4-all"]})
    assert ModelConfig.from_folder(folder).vocab_size % 2 == 1
    prompts, loras = mixed_batch(adapters)
    expected = tokens(make_llm(folder, **STRESS).generate(prompts, GREEDY, lora_request=loras, use_tqdm=False))
    with running(make_llm(folder, tensor_parallel_size=2, **STRESS)) as two:
        assert two.llm_engine.model_runner.num_kv_heads == 2
        assert tokens(two.generate(prompts, GREEDY, lora_request=loras, use_tqdm=False)) == expected


@pytest.mark.timeout(240)
def test_a_worker_killed_mid_run_ends_the_async_engine_and_its_requests(model_dir):
    core = LLMEngine(
        EngineConfig(
            model=str(model_dir), dtype="float32", gemm="torch", tensor_parallel_size=2, distributed_timeout_s=30
        )
    )
    pids = [p.pid for p in core.model_runner.workers.processes]

    async def stream_until_killed(engine: AsyncEngine) -> int:
        received = 0
        params = SamplingParams(temperature=0, max_tokens=900, ignore_eos=True)
        async for _ in engine.generate("long", PROMPTS[0], params):
            received += 1
            if received == 3:
                os.kill(pids[0], signal.SIGKILL)
        return received

    async def run():
        engine = AsyncEngine(core)
        with pytest.raises(EngineDead, match="rank 1"):
            await asyncio.wait_for(stream_until_killed(engine), timeout=60)
        assert engine.is_dead
        with pytest.raises(EngineDead):  # new requests are refused at once (the server answers 503)
            await anext(engine.generate("next", PROMPTS[1], GREEDY))
        await engine.shutdown(grace_s=0)

    try:
        asyncio.run(run())
    finally:
        core.shutdown()
    assert_gone(pids)


@pytest.mark.timeout(240)
def test_a_worker_killed_between_steps_makes_generate_raise_at_once(model_dir):
    with running(LLM(str(model_dir), dtype="float32", gemm="torch", tensor_parallel_size=2)) as llm:
        process = llm.llm_engine.model_runner.workers.processes[0]
        assert tokens(llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False))
        os.kill(process.pid, signal.SIGKILL)
        process.join(30)
        for _ in range(2):  # and again: the engine stays failed, it never hangs
            with pytest.raises(TensorParallelError, match="rank 1 .* was killed by SIGKILL"):
                llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        assert llm.llm_engine.requests == {} and llm.llm_engine.block_manager.num_used_blocks == 0
    assert multiprocessing.active_children() == []


@pytest.mark.timeout(240)
def test_shutdown_after_a_step_larger_than_the_message_stops_the_workers_cleanly(model_dir):
    """A 700-token prompt outgrows the step message's first capacity (the workers resize it); STOP still reaches
    them afterwards, and they exit on their own (code 0), not by SIGTERM."""
    with running(LLM(str(model_dir), dtype="float32", gemm="torch", tensor_parallel_size=2)) as llm:
        workers = llm.llm_engine.model_runner.workers
        assert tokens(llm.generate([prompts_of_lengths([700])[0]], GREEDY, use_tqdm=False))
        assert workers.channel.buffer.numel() > 1024
    assert [p.exitcode for p in workers.processes] == [0]


@pytest.mark.parametrize("size", [0, -1, "2", True, 1.5])
def test_a_tensor_parallel_size_that_is_not_a_positive_int_is_refused(model_dir, size):
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive int"):
        EngineConfig(model=str(model_dir), tensor_parallel_size=size)


def test_more_ranks_than_kv_heads_is_refused_before_any_process_starts(model_dir):
    with pytest.raises(ValueError, match="tensor_parallel_size 3 exceeds the model's 2 KV heads"):
        LLM(str(model_dir), dtype="float32", tensor_parallel_size=3)
    assert multiprocessing.active_children() == []


def test_quantized_weights_and_bad_init_methods_are_refused(model_dir):
    with pytest.raises(ValueError, match="float weights only"):
        LLM(str(model_dir), quantization="int8", tensor_parallel_size=2)
    assert multiprocessing.active_children() == []
    with pytest.raises(ValueError, match="distributed_init must be a torch.distributed init method"):
        EngineConfig(model=str(model_dir), tensor_parallel_size=2, distributed_init="localhost:29500")


def test_balanced_spans_cover_everything_once_with_the_first_ranks_one_larger():
    assert [balanced_span(9, 2, r) for r in range(2)] == [(0, 5), (5, 4)]
    assert [balanced_span(3, 3, r) for r in range(3)] == [(0, 1), (1, 1), (2, 1)]
    assert [balanced_span(1536, 2, r) for r in range(2)] == [(0, 768), (768, 768)]


def test_smollm2_shapes_split_by_kv_group_over_two_ranks():
    config = ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=1e5,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    first, second = ModelShard.of(config, 0, 2), ModelShard.of(config, 1, 2)
    assert (first.q_heads, first.kv_heads, second.q_heads, second.kv_heads) == ((0, 6), (0, 2), (6, 3), (2, 1))
    assert first.vocab == (0, 24576) and second.vocab == (24576, 24576) and first.max_vocab_rows == 24576
    # LoRA follows the base weights: B split for column-parallel modules, A for row-parallel ones
    assert second.lora_spans("q_proj") == (None, (384, 192)) and second.lora_spans("k_proj") == (None, (128, 64))
    assert second.lora_spans("o_proj") == ((384, 192), None) and second.lora_spans("down_proj") == ((768, 768), None)
    assert first.lora_spans("gate_proj") == (None, (0, 768))

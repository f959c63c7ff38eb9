"""Continuous batching without a model: budgets, chunked prefill, FCFS, preemption by recompute."""

import itertools

from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus

BLOCK = 4
_ids = itertools.count()


def make_seq(num_tokens: int, first_token: int = 0) -> Sequence:
    i = next(_ids)
    return Sequence(i, f"r{i}", list(range(first_token, first_token + num_tokens)), SamplingParams(),
                    arrival_index=i)


def make_scheduler(num_blocks=64, max_num_seqs=8, max_tokens=32, caching=True) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BLOCK, caching), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_tokens, check_invariants=True)


def run_step(scheduler: Scheduler, token: int = 7):
    """Schedule, then pretend the model ran: sequences whose context is complete sample ``token``."""
    out = scheduler.schedule()
    sampled = [token if s.num_computed_tokens + n == s.num_tokens else None
               for s, n in zip(out.seqs, out.num_new_tokens, strict=True)]
    scheduler.update(out, sampled)
    return out


def plan(out) -> list[tuple[int, int]]:
    return [(seq.seq_id, n) for seq, n in zip(out.seqs, out.num_new_tokens, strict=True)]


def test_long_prompt_is_chunked_and_mixed_with_decodes():
    scheduler = make_scheduler(max_tokens=10)
    short, long = make_seq(3), make_seq(25)
    scheduler.add(short)
    scheduler.add(long)
    out = run_step(scheduler)
    assert plan(out) == [(short.seq_id, 3), (long.seq_id, 7)]
    out = run_step(scheduler)
    assert plan(out) == [(short.seq_id, 1), (long.seq_id, 9)]  # one decode token + the next chunk
    assert long.num_computed_tokens == 16 and long.num_output_tokens == 0
    out = run_step(scheduler)
    assert plan(out) == [(short.seq_id, 1), (long.seq_id, 9)]
    assert long.num_computed_tokens == 25 and long.num_output_tokens == 1  # prompt done: first token sampled
    out = run_step(scheduler)
    assert plan(out) == [(short.seq_id, 1), (long.seq_id, 1)]


def test_sequence_cap_keeps_the_rest_waiting_in_order():
    scheduler = make_scheduler(max_num_seqs=2)
    seqs = [make_seq(2) for _ in range(4)]
    for seq in seqs:
        scheduler.add(seq)
    out = run_step(scheduler)
    assert [s.seq_id for s in out.seqs] == [seqs[0].seq_id, seqs[1].seq_id]
    assert list(scheduler.waiting) == seqs[2:]
    scheduler.finish([seqs[0]], "stop")
    assert seqs[0].status is SequenceStatus.FINISHED and seqs[0].block_table == []
    out = run_step(scheduler)
    assert [s.seq_id for s in out.seqs] == [seqs[1].seq_id, seqs[2].seq_id]


def test_budget_stops_admission_at_the_first_waiting_sequence_that_does_not_fit_blocks():
    scheduler = make_scheduler(num_blocks=4, max_tokens=64)
    big, small = make_seq(20), make_seq(2)  # big needs 5 blocks: more than the pool; FCFS blocks small too
    scheduler.add(big)
    scheduler.add(small)
    assert scheduler.schedule().is_empty
    assert list(scheduler.waiting) == [big, small]


def test_out_of_blocks_preempts_the_newest_and_requeues_it_first():
    scheduler = make_scheduler(num_blocks=4, max_tokens=64)
    old, new = make_seq(4), make_seq(4)  # one full block each after prefill
    scheduler.add(old)
    scheduler.add(new)
    run_step(scheduler)  # both prefilled, one token sampled each: both need a second block next
    assert [len(s.block_table) for s in (old, new)] == [1, 1]
    run_step(scheduler)  # decode: blocks 3 and 4 of 4 taken
    assert scheduler.block_manager.num_free_blocks == 0
    for _ in range(3):
        run_step(scheduler)  # both fill their second block: 9 tokens each need a third
    out = run_step(scheduler)
    assert out.preempted == [new]
    assert new.status is SequenceStatus.WAITING and new.num_computed_tokens == 0 and new.block_table == []
    assert list(scheduler.waiting) == [new] and scheduler.running == [old]
    assert plan(out) == [(old.seq_id, 1)]
    assert scheduler.num_preemptions == 1 and new.num_preemptions == 1


def test_preempted_sequence_recomputes_its_tokens_and_hits_its_own_cached_prefix():
    scheduler = make_scheduler(num_blocks=5, max_tokens=64)
    old, new = make_seq(8, first_token=0), make_seq(8, first_token=100)
    scheduler.add(old)
    scheduler.add(new)
    run_step(scheduler)  # 2 blocks each; both now hold 9 tokens, so each needs a third block next
    while not scheduler.waiting:
        run_step(scheduler)
    assert scheduler.waiting[0] is new and new.num_preemptions == 1
    generated = new.num_output_tokens
    scheduler.finish([old], "stop")  # room again
    out = run_step(scheduler)
    assert plan(out)[0][0] == new.seq_id
    # its two full prompt blocks were still cached: only the rest is recomputed
    assert new.num_cached_tokens == 8
    assert plan(out) == [(new.seq_id, new.num_prompt_tokens + generated - 8)]


def test_self_preemption_when_a_lone_sequence_cannot_grow_then_it_resumes():
    scheduler = make_scheduler(num_blocks=3, max_tokens=64)
    a, b = make_seq(8), make_seq(3)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)  # a: 2 blocks, b: 1 block -> pool empty
    out = run_step(scheduler)  # a needs a third block (9 tokens): b (newest) is preempted
    assert out.preempted == [b]
    assert [s.seq_id for s in out.seqs] == [a.seq_id]


def test_finish_of_a_waiting_sequence_removes_it():
    scheduler = make_scheduler()
    a = make_seq(3)
    scheduler.add(a)
    scheduler.finish([a], "abort")
    assert not scheduler.has_unfinished() and a.finish_reason == "abort"


def test_running_order_stays_fcfs_after_readmission():
    scheduler = make_scheduler(num_blocks=6, max_tokens=64)
    seqs = [make_seq(4, first_token=10 * i) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    for _ in range(12):
        run_step(scheduler)  # invariants (FCFS order, refcounts) are asserted every step
        assert [s.arrival_index for s in scheduler.running] == sorted(s.arrival_index for s in scheduler.running)
    assert scheduler.num_preemptions > 0

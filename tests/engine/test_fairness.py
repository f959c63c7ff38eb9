"""Fair admission (engine.fairness): VTC's counter arithmetic, the rejoin lift, priorities, weights, work
conservation and preemption past the imbalance threshold, on the scheduler without a model; then through the
engine with a tiny model."""

import itertools

import pytest

from engine.block_manager import BlockManager
from engine.fair_share import FairShare
from engine.fairness import OUTPUT_WEIGHT, PREFILL_WEIGHT, FairAdmission, VirtualTokenCounter
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence

BLOCK = 4
_ids = itertools.count()


def make_seq(num_tokens: int, key: str | None = None, weight: float = 1.0, priority: str | None = None,
             max_output: int = 4) -> Sequence:
    i = next(_ids)
    seq = Sequence(i, f"r{i}", list(range(num_tokens)), SamplingParams(max_tokens=max_output), arrival_index=i)
    seq.fair_share = FairShare.of(key, weight, priority)
    return seq


def make_scheduler(max_num_seqs=1, max_tokens=64, num_blocks=256, **fair) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BLOCK, False), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_tokens, check_invariants=True, admission=FairAdmission(**fair))


def run(scheduler: Scheduler, steps: int) -> list[Sequence]:
    """Run ``steps`` steps; a sequence finishes after ``max_tokens`` outputs. The sequences admitted, in order."""
    admitted = []
    for _ in range(steps):
        out = scheduler.schedule()
        admitted += [s for s, n in zip(out.seqs, out.num_new_tokens, strict=True)
                     if s.num_computed_tokens == s.num_cached_tokens and n and s not in admitted]
        sampled = [7 if s.num_computed_tokens + n == s.num_tokens else None
                   for s, n in zip(out.seqs, out.num_new_tokens, strict=True)]
        scheduler.update(out, sampled)
        scheduler.finish([s for s in out.seqs if s.num_output_tokens >= s.params.max_tokens], "length")
    return admitted


def test_counter_charges_weighted_tokens_over_the_weight():
    vtc = VirtualTokenCounter()
    vtc.charge("a", 1.0, prefill_tokens=10, output_tokens=3)
    vtc.charge("b", 2.0, prefill_tokens=10, output_tokens=3)
    assert vtc.counters["a"] == PREFILL_WEIGHT * 10 + OUTPUT_WEIGHT * 3 == 16
    assert vtc.counters["b"] == 8


def test_a_returning_key_is_lifted_to_the_least_backlogged_counter_and_banks_no_credit():
    vtc = VirtualTokenCounter()
    vtc.join("a")
    vtc.charge("a", 1.0, 100, 0)
    vtc.join("b")  # new: starts at a's counter, not at 0
    assert vtc.counters["b"] == 100
    vtc.charge("b", 1.0, 150, 0)
    vtc.leave("b")
    vtc.join("b")  # rejoins above the floor: keeps its own counter
    assert vtc.counters["b"] == 250
    vtc.leave("a")
    vtc.leave("b")
    vtc.join("c")  # nobody backlogged: the floor is the greatest counter, so nobody is owed anything
    assert vtc.counters["c"] == 250


def test_a_flooding_key_waits_behind_another_keys_first_request():
    scheduler = make_scheduler(max_num_seqs=1)
    flood = [make_seq(8, "a") for _ in range(4)]
    for seq in flood:
        scheduler.add(seq)
    run(scheduler, 1)  # a's first is admitted alone; then b arrives
    late = make_seq(8, "b")
    scheduler.add(late)
    order = run(scheduler, 40)
    assert order[:2] == [late, flood[1]]  # FCFS would run all of a's first


def test_without_keys_the_order_is_first_come_first_served():
    fair, plain = make_scheduler(max_num_seqs=2), Scheduler(BlockManager(256, BLOCK, False), max_num_seqs=2,
                                                            max_num_batched_tokens=64, check_invariants=True)
    for scheduler in (fair, plain):
        for n in (8, 3, 12, 5, 9):
            scheduler.add(make_seq(n))
    fair_plans = [[(s.request_id[1:], n) for s, n in zip(o.seqs, o.num_new_tokens, strict=True)]
                  for o in (fair.schedule() for _ in range(1))]
    plain_plans = [[(s.request_id[1:], n) for s, n in zip(o.seqs, o.num_new_tokens, strict=True)]
                   for o in (plain.schedule() for _ in range(1))]
    offset = int(fair_plans[0][0][0]) - int(plain_plans[0][0][0])  # ids differ by construction order only
    assert [[(int(i) - offset, n) for i, n in p] for p in fair_plans] == [[(int(i), n) for i, n in p]
                                                                          for p in plain_plans]
    assert fair.admission.stats()["backlogged_keys"] == 0  # the unkeyed share is never listed


def test_interactive_goes_before_batch_whatever_the_counters():
    scheduler = make_scheduler(max_num_seqs=1)
    batch = [make_seq(8, "a", priority="batch") for _ in range(3)]
    for seq in batch:
        scheduler.add(seq)
    run(scheduler, 1)
    urgent = make_seq(8, "a", priority="interactive")  # same key, and its counter is the one just charged
    scheduler.add(urgent)
    assert run(scheduler, 30)[0] is urgent


def test_weights_one_to_two_give_one_to_two_service_while_both_are_backlogged():
    scheduler = make_scheduler(max_num_seqs=1, max_tokens=64)
    light = [make_seq(8, "light", weight=1) for _ in range(60)]
    heavy = [make_seq(8, "heavy", weight=2) for _ in range(60)]
    for a, b in zip(light, heavy, strict=True):
        scheduler.add(a)
        scheduler.add(b)
    order = run(scheduler, 150)  # both stay backlogged throughout: 60 each is more than 150 steps serve
    assert all(s in light or s in heavy for s in order)
    served = {"light": sum(s in light for s in order), "heavy": sum(s in heavy for s in order)}
    assert served["light"] + served["heavy"] >= 20
    assert 1.8 <= served["heavy"] / served["light"] <= 2.2, served


def test_work_conserving_an_idle_key_holds_no_seat_back():
    scheduler = make_scheduler(max_num_seqs=4)
    scheduler.admission.vtc.join("idle")  # a key with a huge head start that sends nothing now
    scheduler.admission.vtc.leave("idle")
    busy = [make_seq(8, "busy") for _ in range(6)]
    for seq in busy:
        scheduler.add(seq)
    out = scheduler.schedule()
    assert len(out.seqs) == 4  # every seat taken by the only backlogged key


def test_preemption_only_past_the_threshold_and_after_the_minimum_run():
    # two keys of one seat each: no seat imbalance, only the counters can justify a preemption
    scheduler = make_scheduler(max_num_seqs=2, max_tokens=64, preempt_threshold=100.0, min_run_steps=5)
    hogs = [make_seq(8, key, max_output=1000) for key in ("hog-a", "hog-b")]
    for seq in hogs:
        scheduler.add(seq)
    run(scheduler, 3)
    newcomer = make_seq(8, "new")
    scheduler.add(newcomer)  # lifted to the least hog counter: no imbalance yet, no preemption
    run(scheduler, 10)
    assert scheduler.num_preemptions == 0 and newcomer.num_computed_tokens == 0
    # The hogs keep being served (an output a step at weight 2) while the newcomer's counter stands still: past
    # the threshold of 100 the most served hog (the newer, on a tie) makes room, once.
    counters, gaps = scheduler.admission.vtc.counters, []
    while newcomer.num_computed_tokens == 0:
        gaps.append(max(counters["hog-a"], counters["hog-b"]) - counters["new"])
        run(scheduler, 1)
        assert len(gaps) < 200, "the newcomer was never admitted"
    assert gaps[-1] > 100 >= gaps[-2]  # admitted at the first step past the threshold
    assert scheduler.num_preemptions == 1 and scheduler.admission.num_fair_preemptions == 1
    assert hogs[1].num_preemptions == 1 and hogs[0].num_preemptions == 0


def test_a_key_with_no_seat_gets_one_from_a_key_holding_several_after_their_minimum_run():
    scheduler = make_scheduler(max_num_seqs=3, max_tokens=64, preempt_threshold=1e9, min_run_steps=4)
    hogs = [make_seq(8, "hog", max_output=1000) for _ in range(3)]
    for seq in hogs:
        scheduler.add(seq)
    run(scheduler, 2)
    newcomer = make_seq(8, "new")
    scheduler.add(newcomer)
    run(scheduler, 1)
    assert newcomer.num_computed_tokens == 0  # the hogs ran 3 steps, under their minimum of 4
    run(scheduler, 2)
    assert newcomer.num_computed_tokens > 0 and scheduler.admission.num_fair_preemptions == 1
    assert [h.num_preemptions for h in hogs] == [0, 0, 1]  # the newest of the crowding key
    run(scheduler, 20)  # the newcomer holds a seat now: no more preemptions for it
    assert scheduler.admission.num_fair_preemptions == 1


def test_a_preempted_sequence_is_not_preempted_again_before_it_ran_its_minimum():
    scheduler = make_scheduler(max_num_seqs=1, max_tokens=64, preempt_threshold=10.0, min_run_steps=6)
    hog = make_seq(8, "hog", max_output=1000)
    scheduler.add(hog)
    run(scheduler, 8)
    others = [make_seq(8, f"k{i}", max_output=1) for i in range(3)]
    for seq in others:
        scheduler.add(seq)
    run(scheduler, 60)
    assert all(seq.is_finished for seq in others)
    assert hog.num_preemptions >= 1
    assert scheduler.admission.num_fair_preemptions == hog.num_preemptions


@pytest.mark.parametrize("kwargs, field", [({"fairness_weight": 0}, "fairness_weight"),
                                           ({"fairness_weight": True}, "fairness_weight"),
                                           ({"priority": "urgent"}, "priority"),
                                           ({"fairness_key": ""}, "fairness_key")])
def test_bad_fairness_fields_are_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        FairShare.of(kwargs.get("fairness_key"), kwargs.get("fairness_weight"), kwargs.get("priority"))


def test_engine_serves_keys_fairly_and_reports_counters(tiny_llama):
    from engine import LLM

    engine = LLM(str(tiny_llama), check_invariants=True, max_num_seqs=2).llm_engine
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"a{i}", list(range(1, 9)), params, fairness_key="tenant-a")
    engine.add_request("b0", list(range(1, 9)), params, fairness_key="tenant-b", fairness_weight=2,
                       priority="batch")
    stats = engine.stats()["fairness"]
    assert stats["backlogged_keys"] == 2 and set(stats["counters"]) == {"tenant-a", "tenant-b"}
    done = []
    while engine.has_unfinished_requests():
        done += [o.request_id for o in engine.step() if o.finished]
    assert sorted(done) == ["a0", "a1", "a2", "b0"]
    stats = engine.stats()["fairness"]
    assert stats["backlogged_keys"] == 0 and stats["known_keys"] == 2
    with pytest.raises(ValueError, match="priority"):
        engine.add_request("bad", [1, 2, 3], params, priority="now")


@pytest.mark.parametrize("fields, param", [({"fairness_weight": -1}, "fairness_weight"),
                                           ({"fairness_weight": "2"}, "fairness_weight"),
                                           ({"priority": "later"}, "priority"),
                                           ({"fairness_key": "x" * 257}, "fairness_key")])
def test_the_contract_refuses_bad_fairness_fields_by_name(fields, param):
    from engine.contract.errors import ContractError
    from engine.contract.requests import parse_request

    with pytest.raises(ContractError) as caught:
        parse_request("completion", {"model": "m", "prompt": "hi", **fields}, trusted=True)
    assert caught.value.param == param


def test_fairness_fields_are_engine_only_and_read_when_trusted():
    from engine.contract.errors import ContractError
    from engine.contract.requests import parse_request

    body = {"model": "m", "prompt": "hi", "fairness_key": "k", "fairness_weight": 2, "priority": "batch"}
    parsed = parse_request("completion", body, trusted=True)
    assert (parsed.fairness_key, parsed.fairness_weight, parsed.priority) == ("k", 2, "batch")
    with pytest.raises(ContractError) as caught:  # a gateway client cannot send them
        parse_request("completion", {"model": "m", "prompt": "hi", "priority": "batch"})
    assert caught.value.param == "priority"


def test_seat_leveling_gives_a_waiting_key_a_seat_from_one_holding_more_then_stops_at_the_balance():
    scheduler = make_scheduler(max_num_seqs=4, max_tokens=64, preempt_threshold=1e9, min_run_steps=2)
    light = [make_seq(8, "light", max_output=1000) for _ in range(3)]
    hogs = [make_seq(8, "hog", max_output=1000) for _ in range(5)]
    for seq in [light[0], *hogs]:
        scheduler.add(seq)
    assert run(scheduler, 1) == [light[0], *hogs[:3]]
    scheduler.add(light[1])  # light holds 1 seat, hog 3: hog would still hold 2 >= light's 2 after the move
    assert run(scheduler, 1) == []  # the hogs ran 1 step, under their minimum of 2
    assert run(scheduler, 1) == [light[1]]
    assert [h.num_preemptions for h in hogs] == [0, 0, 1, 0, 0]  # the newest running hog
    scheduler.add(light[2])  # 2 seats each now: a move would leave hog 1 against light's 3, never done
    assert run(scheduler, 30) == []
    assert scheduler.admission.num_fair_preemptions == 1 and scheduler.admission.seats == {"light": 2, "hog": 2}


def test_seat_leveling_counts_seats_over_the_weight():
    scheduler = make_scheduler(max_num_seqs=4, max_tokens=64, preempt_threshold=1e9, min_run_steps=1)
    hogs = [make_seq(8, "hog", weight=3, max_output=1000) for _ in range(4)]
    for seq in hogs:
        scheduler.add(seq)
    run(scheduler, 1)
    light = [make_seq(8, "light", max_output=1000) for _ in range(2)]
    for seq in light:
        scheduler.add(seq)
    assert run(scheduler, 30) == [light[0]]  # 4/3 -> 3/3 for 0 -> 1; then 3/3 -> 2/3 would give light 2
    assert scheduler.admission.seats == {"hog": 3, "light": 1} and [h.num_preemptions for h in hogs] == [0, 0, 0, 1]


def test_keys_tied_on_the_counter_go_by_the_seats_they_hold():
    scheduler = make_scheduler(max_num_seqs=2, max_tokens=64)
    hogs = [make_seq(8, "hog", max_output=1000), make_seq(8, "hog", max_output=1), make_seq(8, "hog")]
    for seq in hogs:
        scheduler.add(seq)
    assert run(scheduler, 1) == hogs[:2]  # hogs[1] finished: one seat free, hogs[0] holds the other
    newcomer = make_seq(8, "new")
    scheduler.add(newcomer)  # lifted to exactly the hog's counter
    counters = scheduler.admission.vtc.counters
    assert counters["new"] == counters["hog"]
    assert run(scheduler, 1) == [newcomer]  # fewer seats wins the tie, not the hog's earlier arrival


def test_one_key_in_both_priority_classes_is_ordered_whole():
    admission = FairAdmission()
    batch = [make_seq(8, "a", priority="batch") for _ in range(2)]
    interactive = [make_seq(8, "a") for _ in range(3)]
    assert list(admission.order([*batch, *interactive], step=0)) == [*interactive, *batch]


def test_seats_stay_counted_through_preemptions_for_blocks_and_for_fairness():
    # 24 blocks of 4 tokens for 6 seats of growing sequences: the pool runs dry, and the keys' seats are levelled
    scheduler = make_scheduler(max_num_seqs=6, max_tokens=64, num_blocks=24, min_run_steps=1)
    seqs = [make_seq(8, "hog", max_output=12) for _ in range(8)] + [make_seq(8, f"k{i}", max_output=12)
                                                                    for i in range(4)]
    for seq in seqs[:8]:
        scheduler.add(seq)
    run(scheduler, 2)
    for seq in seqs[8:]:
        scheduler.add(seq)
    run(scheduler, 200)  # check_invariants: the seats by key match the running sequences after every step
    assert all(seq.is_finished for seq in seqs) and scheduler.admission.seats == {}
    assert scheduler.num_preemptions > scheduler.admission.num_fair_preemptions > 0


def test_a_key_one_prompt_ahead_but_holding_fewer_seats_goes_first_and_further_ahead_waits():
    admission = FairAdmission(tie_tolerance=256)
    heavy, light = make_seq(8, "heavy"), make_seq(8, "light")
    for seq in (heavy, light):
        admission.join(seq)
    # light was charged a 200-token prompt when its last request got in; heavy's counter grows over 14 seats
    admission.vtc.counters.update(heavy=1000.0, light=1200.0)
    admission.seats.update(heavy=14, light=1)
    assert list(admission.order([heavy, light], step=0)) == [light, heavy]
    admission.vtc.counters["light"] = 1300.0  # past the tolerance: the counter decides, whatever the seats
    assert list(admission.order([heavy, light], step=0)) == [heavy, light]
    admission.vtc.counters["light"] = 1200.0
    admission.seats.update(light=14)  # tied on both: the exact counter decides
    assert list(admission.order([heavy, light], step=0)) == [heavy, light]
    exact = FairAdmission(tie_tolerance=0)  # plain VTC: the least served first
    for seq in (heavy, light):
        exact.join(seq)
    exact.vtc.counters.update(heavy=1000.0, light=1200.0)
    exact.seats.update(heavy=14, light=1)
    assert list(exact.order([heavy, light], step=0)) == [heavy, light]


def test_two_requests_of_a_key_arriving_together_both_get_seats_at_the_next_step():
    scheduler = make_scheduler(max_num_seqs=6, max_tokens=64, preempt_threshold=1e9, min_run_steps=1)
    hogs = [make_seq(8, "hog", max_output=1000) for _ in range(8)]
    for seq in hogs:
        scheduler.add(seq)
    run(scheduler, 2)
    light = [make_seq(8, "light", max_output=1000) for _ in range(3)]
    for seq in light[:2]:
        scheduler.add(seq)
    assert run(scheduler, 1) == light[:2]  # two victims in one step, each seat counted as light's
    assert scheduler.admission.num_fair_preemptions == 2 and scheduler.admission.seats == {"hog": 4, "light": 2}
    scheduler.add(light[2])  # hog 4 -> 3 against light 2 -> 3: still level, one more move
    assert run(scheduler, 1) == [light[2]]
    run(scheduler, 20)  # 3 and 3: a move would leave hog 2 against light's 4, never done
    assert scheduler.admission.num_fair_preemptions == 3 and scheduler.admission.seats == {"hog": 3, "light": 3}


def step_tokens(out, key: str) -> list[int]:
    return [n for seq, n in zip(out.seqs, out.num_new_tokens, strict=True) if seq.fair_share.key == key]


def test_while_keys_compete_a_step_computes_few_prompt_tokens_for_the_crowd_and_its_whole_budget_after():
    scheduler = make_scheduler(max_num_seqs=6, max_tokens=256, step_prefill_tokens=24, contention_steps=3)
    light = make_seq(8, "light", max_output=6)
    decoding = [make_seq(8, "heavy", max_output=1000) for _ in range(2)]
    for seq in (*decoding, light):
        scheduler.add(seq)
    out = scheduler.schedule()  # no seats held yet, nobody favoured: three 8-token prompts fill the 24
    assert sorted(out.num_new_tokens) == [8, 8, 8]
    scheduler.update(out, [7, 7, 7])
    heavy = [make_seq(40, "heavy", max_output=1000) for _ in range(3)]
    for seq in heavy:
        scheduler.add(seq)
    prompts = []
    while light.num_output_tokens < 6:
        out = scheduler.schedule()
        assert step_tokens(out, "light") == [1]  # its decode every step, never held back
        prompts.append(sum(n for n in step_tokens(out, "heavy") if n > 1))
        scheduler.update(out, [7 if s.num_computed_tokens + n >= s.num_tokens else None
                               for s, n in zip(out.seqs, out.num_new_tokens, strict=True)])
    assert prompts == [24, 24, 24, 24, 24]  # 120 prompt tokens of the key with more seats, 24 a step
    scheduler.finish([light], "length")
    run(scheduler, 3)  # heavy alone: the rationing ends 3 steps after light left
    scheduler.finish(heavy, "length")
    more = [make_seq(40, "heavy", max_output=1000) for _ in range(2)]
    for seq in more:
        scheduler.add(seq)
    out = scheduler.schedule()
    assert sorted(step_tokens(out, "heavy")) == [1, 1, 40, 40]  # the whole budget again


def test_a_seatless_key_gets_a_step_of_its_own_for_its_whole_prompt_once():
    scheduler = make_scheduler(max_num_seqs=4, max_tokens=256, step_prefill_tokens=8)
    heavy = [make_seq(8, "heavy", max_output=1000) for _ in range(4)]
    for seq in heavy:
        scheduler.add(seq)
    run(scheduler, 2)
    scheduler.finish([heavy[0]], "length")  # a free seat
    scheduler.add(make_seq(40, "heavy", max_output=1000))
    light = make_seq(100, "light", max_output=1000)
    scheduler.add(light)
    out = scheduler.schedule()
    assert out.seqs == [light] and out.num_new_tokens == [100]  # its prompt whole, beyond the 8; nobody else
    scheduler.update(out, [7])
    out = scheduler.schedule()  # then everyone runs (the new heavy sequence waits for a seat)
    assert sorted(step_tokens(out, "heavy")) == [1, 1, 1] and step_tokens(out, "light") == [1]


def test_a_favoured_key_that_cannot_get_in_does_not_hold_the_others_back_twice():
    # 10 blocks of 4 tokens: the heavy sequences hold 6; light's 40-token prompt needs 10 and cannot get in
    scheduler = make_scheduler(max_num_seqs=4, max_tokens=256, num_blocks=10, step_prefill_tokens=8)
    heavy = [make_seq(8, "heavy", max_output=1000) for _ in range(3)]
    for seq in heavy:
        scheduler.add(seq)
    run(scheduler, 1)
    light = make_seq(40, "light", max_output=1)
    scheduler.add(light)
    out = scheduler.schedule()  # light's step: nobody else runs, and light is short of blocks
    assert out.is_empty and light.num_computed_tokens == 0
    out = scheduler.schedule()
    assert step_tokens(out, "heavy") == [1, 1, 1]  # the heavy decodes go on

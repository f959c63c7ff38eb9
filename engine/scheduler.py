"""``Scheduler``: continuous batching under a token budget and a sequence cap.

Every step: running sequences first (FCFS), each gets the tokens it still lacks (one decode token, or the next
chunk of its prompt) while the budget lasts; then waiting sequences are admitted in FCFS order. There are no
prefill and decode phases: a long prompt is split across steps (chunked prefill) and mixed with decodes.
When the block pool runs dry the newest running sequence is preempted: its blocks are freed and it is
recomputed later (its own prefix blocks are likely still cached).

Which waiting sequences are tried, in what order, and whether each may join is the admission policy's call
(:mod:`engine.admission`): first come, first served by default; with multi-LoRA
:class:`engine.lora.admission.AdapterAdmission` (resident adapters first, bounded waiting, loads started for the
others; a running sequence pins its adapter's slot from admission until it finishes or is preempted). The engine
wraps it in :class:`engine.fairness.FairAdmission`: waiting sequences go by tenant (priority class, then the least
service so far, then the fewest seats), and when the batch has no room one running sequence a step may be
preempted for the least-served waiting tenant: when its tenant holds more seats (over its weight) than the waiting
one would with one more, when the waiting tenant is far behind on service, or when it is ``batch`` and the waiting
one ``interactive``. While keys compete it also rations the prompt tokens a step computes (``PrefillAllowance``):
a few for the keys holding the most seats, the whole prompt for a seatless key, and a step of its own for it.
"""

import bisect
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.admission import Decision, FirstComeFirstServed, PrefillAllowance
from engine.block_manager import BlockManager
from engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class SchedulerOutput:
    """The sequences of one step, in batch order, with how many new tokens each computes."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


def _arrival(seq: Sequence) -> int:
    return seq.arrival_index


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 check_invariants: bool = False, admission=None):
        self.block_manager = block_manager
        self.admission = admission or FirstComeFirstServed()
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.check_invariants = check_invariants
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # arrival order: the last one is preempted first
        self.num_preemptions = 0
        self.num_steps = 0
        self._short_of_blocks = False  # the last step left waiting sequences out for want of KV blocks
        self._allowance: PrefillAllowance | None = None  # this step's limit on prompt tokens, the policy's

    def add(self, seq: Sequence) -> None:
        assert seq.status is SequenceStatus.WAITING and not seq.block_table
        seq.arrival_step = self.num_steps
        self.waiting.append(seq)
        self.admission.join(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.waiting and (len(self.running) >= self.max_num_seqs or self._short_of_blocks):
            self._preempt_for_fairness()
        self._allowance = self.admission.prefill_allowance(self.running, self.waiting, self.num_steps,
                                                           self.max_num_seqs - len(self.running))
        budget = self._schedule_running(out)
        self._short_of_blocks = False
        if not out.preempted:  # short of blocks: admitting more would only preempt again
            self._schedule_waiting(out, budget)
        self.admission.account(out.seqs, out.num_new_tokens)
        self.num_steps += 1
        if self.check_invariants:
            self._check(out)
        return out

    def _preempt_for_fairness(self) -> None:
        """The batch is full: running sequences make room while the policy names one (a much more served key's)."""
        freed = 0
        while (victim := self.admission.victim(self.running, self.waiting, self.num_steps, freed)) is not None:
            self.running.remove(victim)
            self._preempt(victim)
            freed += 1

    def _schedule_running(self, out: SchedulerOutput) -> int:
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if self._allowance is not None and self._allowance.excludes(seq):  # another key's step: it waits
                seq.spec_token_ids = []
                i += 1
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens + len(seq.spec_token_ids), budget)
            chunk = self._allowance is not None and num_new > 1 and not seq.spec_token_ids  # a prompt chunk
            if seq.spec_token_ids:  # a draft takes what the budget and the blocks leave, never a seat of another
                num_new = self._fit_draft(seq, num_new)
            elif chunk:
                num_new = self._allowance.allows(seq, num_new)
                if num_new == 0:  # its prompt waits for a step with room (it keeps its seat and blocks)
                    i += 1
                    continue
            while not self.block_manager.can_append(seq, num_new):
                victim = self.running.pop()  # the newest; never one already scheduled (those are before i)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    return budget
            self.block_manager.may_append(seq, num_new)
            out.add(seq, num_new)
            budget -= num_new
            if chunk:
                self._allowance.spend(seq, num_new)
            i += 1
        return budget

    def _fit_draft(self, seq: Sequence, num_new: int) -> int:
        base = seq.num_tokens - seq.num_computed_tokens
        keep = max(0, num_new - base)
        while keep and not self.block_manager.can_append(seq, base + keep):
            keep -= 1
        del seq.spec_token_ids[keep:]
        return base + keep

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        admitted = set()
        for seq in self.admission.order(self.waiting, self.num_steps):
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            allowed = budget if self._allowance is None else self._allowance.allows(seq, budget)
            if allowed == 0:
                if self._allowance.favoured is None:
                    break  # nobody else may compute a prompt this step
                continue
            decision = self.admission.decide(seq, self.num_steps, self.max_num_seqs - len(self.running))
            if decision is Decision.STOP:
                break
            if decision is Decision.SKIP:
                continue
            num_new = self._admit(seq, allowed)
            if num_new == 0:
                self._short_of_blocks = True
                break  # short of blocks: nobody younger may overtake on blocks
            if self._allowance is not None:
                self._allowance.spend(seq, num_new)
            admitted.add(id(seq))
            bisect.insort(self.running, seq, key=_arrival)
            out.add(seq, num_new)
            budget -= num_new
        if admitted:
            self.waiting = deque(seq for seq in self.waiting if id(seq) not in admitted)

    def _admit(self, seq: Sequence, budget: int) -> int:
        """Give a waiting sequence its cached prefix and blocks for its first chunk; 0 if blocks are short."""
        self.admission.prepare(seq)
        computed = self.block_manager.get_computed_blocks(seq)
        num_cached = len(computed) * self.block_manager.block_size
        num_new = min(seq.num_tokens - num_cached, budget)
        if not self.block_manager.can_allocate(seq, computed, num_new):
            return 0
        self.block_manager.allocate(seq, computed, num_new)
        self.admission.acquire(seq)
        seq.num_computed_tokens = seq.num_cached_tokens = num_cached
        seq.status = SequenceStatus.RUNNING
        self.admission.admitted(seq, self.num_steps)
        return num_new

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        self.admission.release(seq)
        seq.num_computed_tokens = 0
        seq.spec_token_ids = []
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)  # victims leave newest first, so FCFS order is kept at the front

    def update(self, out: SchedulerOutput, sampled_token_ids: list[int | None],
               emitted: list[list[int] | None] | None = None) -> None:
        """Record a finished step: tokens computed, and the token sampled for each sequence that sampled. A
        sequence that drafted emits ``emitted[i]`` (its kept drafts, then one token): the KV of its rejected drafts
        is dropped by counting only the kept ones as computed, and the blocks they took are freed."""
        for i, (seq, num_new, token_id) in enumerate(zip(out.seqs, out.num_new_tokens, sampled_token_ids,
                                                          strict=True)):
            drafts = seq.spec_token_ids
            if drafts:
                tokens = emitted[i]
                seq.num_computed_tokens += num_new - (len(drafts) - (len(tokens) - 1))
                seq.token_ids.extend(tokens)
                seq.spec_token_ids = []
                self.block_manager.trim(seq)
                continue
            seq.num_computed_tokens += num_new
            if token_id is not None:
                seq.token_ids.append(token_id)

    def finish(self, seqs: Iterable[Sequence], reason: str) -> None:
        """Remove sequences (running or waiting) for good and release their blocks."""
        done = {id(seq) for seq in seqs if not seq.is_finished}
        if not done:
            return
        for seq in [*self.running, *self.waiting]:
            if id(seq) in done:
                self.block_manager.free(seq)
                self.admission.release(seq)
                self.admission.leave(seq)
                seq.status = SequenceStatus.FINISHED
                seq.finish_reason = reason
        self.running = [seq for seq in self.running if id(seq) not in done]
        self.waiting = deque(seq for seq in self.waiting if id(seq) not in done)

    def _check(self, out: SchedulerOutput) -> None:
        assert out.num_batched_tokens <= self.max_num_batched_tokens, "token budget exceeded"
        assert len(self.running) <= self.max_num_seqs, "sequence cap exceeded"
        assert len({id(s) for s in out.seqs}) == len(out.seqs), "a sequence scheduled twice"
        order = [seq.arrival_index for seq in self.running]
        assert order == sorted(order), "running sequences out of FCFS order"
        for seq, num_new in zip(out.seqs, out.num_new_tokens, strict=True):
            assert seq.status is SequenceStatus.RUNNING and num_new > 0
            assert seq.num_computed_tokens + num_new <= seq.num_tokens + len(seq.spec_token_ids)
            assert len(seq.block_table) * self.block_manager.block_size >= seq.num_computed_tokens + num_new
        for seq in self.waiting:
            assert seq.status is SequenceStatus.WAITING and not seq.block_table and seq.num_computed_tokens == 0
            assert seq.lora_slot == -1, f"{seq} pins a slot while waiting"
        self.block_manager.check_invariants(self.running)
        self.admission.check_invariants(self.running)

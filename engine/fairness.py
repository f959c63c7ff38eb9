"""Fair admission between tenants: the Virtual Token Counter (VTC; Sheng et al., "Fairness in Serving Large
Language Models", OSDI '24), with priority classes, around any admission policy.

Each request may carry an opaque ``fairness_key`` (the gateway sends a keyed hash of the tenant, never its name),
a ``fairness_weight`` and a ``priority`` class. Per key the engine keeps a counter of the service it got, in
weighted tokens over the key's weight: ``(PREFILL_WEIGHT * prompt tokens computed + OUTPUT_WEIGHT * tokens
generated) / weight``, charged as steps run (recomputation after preemption counts: it is work done for the key).
Waiting sequences are admitted in order of (priority, counter, the inner policy's order): the backlogged key with
the least service goes first, so a tenant flooding the queue waits behind the others' first tokens, and the
engine stays work-conserving (an idle key never holds seats back). Within one step the order is recomputed as
sequences are admitted, each admission counted at its prompt's cost, so one step's seats spread over the keys.

A key that was idle (nothing waiting or running) rejoins at ``max(its counter, the least backlogged counter)``:
idling banks no credit. When nobody is backlogged the floor is the greatest counter, so the next keys to arrive
start even.

Waiting keys tied on the counter go by the seats they hold over their weight, fewest first, then by the exact
counter, then by the inner policy's order. Counters less than ``tie_tolerance`` weighted tokens (default 256, about
one prompt) above the least backlogged one count as tied: a light tenant is charged its whole prompt the step it is
admitted, which lifts its counter past a heavy tenant's that grows a few tokens a step over many seats, and without
the tolerance its next request would wait for the heavy one to catch up although it holds a fraction of its seats
(the light tenant's p99 TTFT in ``bench.fairness``). Counters further apart than that go by the counter alone, so
VTC's bound on the gap between backlogged keys grows by the tolerance and no more.

Running sequences are preempted for fairness only when the batch has no seat or blocks for the least-served
waiting key, and only past a stated imbalance:

- *seat leveling*: a running key no less served (within the tie tolerance) holds more seats over its weight than
  the waiting key would with one more (``(seats - 1) / weight >= (its seats + 1) / its weight``). A light tenant
  whose request arrives at a batch full of a heavy tenant's gets a seat at the next step instead of waiting for one
  to free. A seat only moves from a key that, after the move, still holds at least as many weighted seats as the
  one it went to, so the reverse move is never allowed and two keys cannot trade a seat back and forth (each such
  preemption lowers the sum over keys of seats squared over weight).
- *counter gap*: the waiting key's counter is more than ``preempt_threshold`` weighted tokens below a running
  key's (it waits for lack of blocks, or with weights that seat leveling does not see).
- *priority*: an ``interactive`` sequence waits behind ``batch`` ones.

The victim ran at least ``min_run_steps`` steps since it was last admitted: the newest sequence of the running key
holding the most seats over its weight (then the most served). A step may preempt one victim for each sequence the
waiting key has queued, each seat freed counted as the waiting key's: two requests of a light tenant arriving
together both get in at the next step. A preempted sequence keeps its key's counter; its recompute is charged like
any prefill, and mostly hits its own blocks in the prefix cache.

While keys compete (two or more backlogged, and for ``contention_steps``, 64, after the last step they were), steps
are kept short, because a request's first token waits for the step in flight when it arrives and then for its own
step, and prompt tokens are what make a step long (on the 2-core Zen 3 VM a step of 16 decodes takes ~85 ms, one
with a 100-token prompt beside them ~300 ms):

- a step computes at most ``step_prefill_tokens`` (64) prompt tokens (chunks of running prompts and first chunks
  of admissions) for every key but a *favoured* one: the least-served waiting key when it holds fewer seats over its
  weight than the key holding the most; the favoured key's prompts go whole (within the token budget), so a light
  tenant's first token is never split over steps. 64 rather than 128: on the Zen 5 VM (bf16) a light request's
  first token waits for a step whose 128-token chunk beside 16 decodes was most of it, and its p99 TTFT in
  ``bench.fairness`` read 2.04x alone at 128 against 1.27x and 1.49x at 64, output tokens a step with keys 0.963 of
  arrival order's at 128 against 0.939 and 0.944 at 64;
- when the favoured key has a seat to go to, the step is its own: only its sequences run (its prompt, its decodes),
  the others' decodes wait one step. Its prompt then costs what it costs alone, and the others lose about nothing
  (the prompt's time is the step's either way: ~220 ms alone and ~80 ms for the decodes, against ~300 ms together).
  Once per favoured key until one of its sequences is admitted, so a key that cannot get in (short of blocks, an
  adapter loading) does not hold the others back step after step.

With no keys and one priority (every request unkeyed and ``interactive``), the inner policy's order is kept as is:
today's behaviour. Keys are opaque strings; ``/stats`` shows their counters, never a tenant's name.
"""

import heapq
from collections.abc import Iterable, Iterator

from engine.admission import Decision, FirstComeFirstServed, PrefillAllowance
from engine.fair_share import PRIORITIES, UNKEYED, FairShare
from engine.sequence import Sequence, SequenceStatus

__all__ = ["PRIORITIES", "UNKEYED", "FairAdmission", "FairShare", "VirtualTokenCounter"]

PREFILL_WEIGHT = 1.0  # VTC's w_p: a prompt token computed
OUTPUT_WEIGHT = 2.0  # VTC's w_q: a generated token (a decode step costs more than a prompt token in a chunk)
STEP_PREFILL_TOKENS = 64  # prompt tokens a step computes for crowding keys while keys compete
CONTENTION_STEPS = 64  # steps that keys count as competing after the last one with two backlogged
TIE_TOLERANCE = 256.0  # weighted tokens within which counters count as tied (about one prompt)
MAX_IDLE_KEYS = 65_536  # counters of idle keys kept past this are dropped, least served first


class VirtualTokenCounter:
    """Service counters per key and which keys are backlogged (have sequences waiting or running)."""

    def __init__(self, prefill_weight: float = PREFILL_WEIGHT, output_weight: float = OUTPUT_WEIGHT,
                 max_idle_keys: int = MAX_IDLE_KEYS):
        self.prefill_weight = prefill_weight
        self.output_weight = output_weight
        self.max_idle_keys = max_idle_keys
        self.counters: dict[str | None, float] = {}
        self.backlog: dict[str | None, int] = {}  # key -> sequences queued or running (only keys with some)

    def floor(self) -> float:
        """Where a key rejoining now starts: the least backlogged counter, or the greatest when none is."""
        if self.backlog:
            return min(self.counters[key] for key in self.backlog)
        return max(self.counters.values(), default=0.0)

    def join(self, key: str | None) -> None:
        """A sequence of ``key`` was queued."""
        if key not in self.backlog:
            self.counters[key] = max(self.counters.get(key, 0.0), self.floor())
            self.backlog[key] = 0
        self.backlog[key] += 1

    def leave(self, key: str | None) -> None:
        """A sequence of ``key`` finished (or was aborted)."""
        left = self.backlog[key] - 1
        if left:
            self.backlog[key] = left
            return
        del self.backlog[key]
        idle = len(self.counters) - len(self.backlog)
        if idle > self.max_idle_keys:  # a key below the floor would be lifted to it on rejoin anyway
            idle_keys = sorted((k for k in self.counters if k not in self.backlog), key=self.counters.__getitem__)
            for k in idle_keys[: idle - self.max_idle_keys]:
                del self.counters[k]

    def charge(self, key: str | None, weight: float, prefill_tokens: int, output_tokens: int) -> None:
        cost = (self.prefill_weight * prefill_tokens + self.output_weight * output_tokens) / weight
        self.counters[key] = self.counters.get(key, 0.0) + cost

    def cost(self, share: FairShare, prefill_tokens: int) -> float:
        return self.prefill_weight * prefill_tokens / share.weight


class FairAdmission:
    """Wraps an admission policy (first come first served, or the adapters' one): its decisions and hooks stand,
    the order it gives is regrouped by (priority, counter, weighted seats). See the module docstring."""

    def __init__(self, inner=None, *, preempt_threshold: float = 8192.0, min_run_steps: int = 16,
                 tie_tolerance: float = TIE_TOLERANCE, step_prefill_tokens: int | None = STEP_PREFILL_TOKENS,
                 contention_steps: int = CONTENTION_STEPS):
        self.inner = inner or FirstComeFirstServed()
        self.vtc = VirtualTokenCounter()
        self.preempt_threshold = preempt_threshold
        self.tie_tolerance = tie_tolerance
        self.min_run_steps = min_run_steps
        self.num_fair_preemptions = 0
        self.num_own_steps = 0  # steps given to a favoured key alone
        self.seats: dict[str | None, int] = {}  # key -> its running sequences (only keys with some)
        self._admitted_step: dict[int, int] = {}  # id(seq) -> the step it was admitted at, while it runs
        self.step_prefill_tokens = step_prefill_tokens
        self.contention_steps = contention_steps
        self._contended_until = 0  # keys compete (prompt tokens are rationed) before this step
        self._favour_pending: tuple | None = None  # a favoured key that had the step to itself, not yet admitted

    # ---- what the engine tells it
    def join(self, seq: Sequence) -> None:
        self.vtc.join(seq.fair_share.key)

    def leave(self, seq: Sequence) -> None:
        self.vtc.leave(seq.fair_share.key)

    def account(self, seqs: Iterable[Sequence], num_new_tokens: Iterable[int]) -> None:
        """Charge a scheduled step: each sequence's prompt (or recompute) tokens and its generated token."""
        for seq, num_new in zip(seqs, num_new_tokens, strict=True):
            share = seq.fair_share
            total = seq.num_computed_tokens + num_new  # before the scheduler's update
            generated = 1 if total >= seq.num_tokens else 0  # this step samples a token for it
            self.vtc.charge(share.key, share.weight, num_new - generated, generated)

    def _rank(self, share: FairShare, floor: float, extra_cost: float = 0.0) -> tuple[int, float, float, float]:
        """Who goes first between waiting keys, lowest first: (priority, counter with those within the tie tolerance
        of ``floor``, the least backlogged counter, counted as equal, seats held over the weight, counter)."""
        counter = self.vtc.counters.get(share.key, 0.0) + extra_cost
        return (share.priority, max(counter, floor + self.tie_tolerance), self.seats.get(share.key, 0) / share.weight,
                counter)

    # ---- the admission policy interface
    def order(self, waiting: Iterable[Sequence], step: int) -> Iterable[Sequence]:
        inner = self.inner.order(waiting, step)
        queues: dict[tuple[int, str | None], list[Sequence]] = {}
        for seq in inner:
            share = seq.fair_share
            queues.setdefault((share.priority, share.key), []).append(seq)
        if len(queues) <= 1:
            return next(iter(queues.values()), [])
        return self._fair_order(queues)

    def _fair_order(self, queues: dict[tuple[int, str | None], list[Sequence]]) -> Iterator[Sequence]:
        # (rank so far this step, first position in the inner order, next index, queue); popped lowest first
        floor = self.vtc.floor()
        heap = [(self._rank(seqs[0].fair_share, floor), position, 0, seqs)
                for position, seqs in enumerate(queues.values())]
        heapq.heapify(heap)
        charged: dict[str | None, float] = {}  # key -> prompt cost of its sequences admitted so far this step
        while heap:
            _, position, index, seqs = heapq.heappop(heap)
            seq = seqs[index]
            yield seq
            share = seq.fair_share
            if seq.status is SequenceStatus.RUNNING:  # admitted: the rest of this step sees its cost and its seat
                charged[share.key] = charged.get(share.key, 0.0) + self.vtc.cost(
                    share, seq.num_tokens - seq.num_cached_tokens)
            if index + 1 < len(seqs):
                heapq.heappush(heap, (self._rank(share, floor, charged.get(share.key, 0.0)), position, index + 1, seqs))

    def decide(self, seq: Sequence, step: int, free_seats: int) -> Decision:
        return self.inner.decide(seq, step, free_seats)

    def prepare(self, seq: Sequence) -> None:
        self.inner.prepare(seq)

    def acquire(self, seq: Sequence) -> None:
        self.inner.acquire(seq)

    def admitted(self, seq: Sequence, step: int) -> None:
        self._admitted_step[id(seq)] = step
        key = seq.fair_share.key
        if self._favour_pending == (seq.fair_share.priority, key):
            self._favour_pending = None
        self.seats[key] = self.seats.get(key, 0) + 1

    def release(self, seq: Sequence) -> None:
        self.inner.release(seq)
        if self._admitted_step.pop(id(seq), None) is None:  # it was waiting (finished or aborted there)
            return
        key = seq.fair_share.key
        left = self.seats[key] - 1
        if left:
            self.seats[key] = left
        else:
            del self.seats[key]

    def check_invariants(self, running: list[Sequence]) -> None:
        self.inner.check_invariants(running)
        seats: dict = {}
        for seq in running:
            seats[seq.fair_share.key] = seats.get(seq.fair_share.key, 0) + 1
        assert seats == self.seats, f"seats by key {self.seats} but {seats} running"
        for key, count in seats.items():
            assert self.vtc.backlog.get(key, 0) >= count, f"fairness key {key!r} runs more than it has queued"

    # ---- preemption for fairness
    def victim(self, running: list[Sequence], waiting: Iterable[Sequence], step: int,
               freed: int = 0) -> Sequence | None:
        """The running sequence to preempt so the least-served waiting key gets in (seat leveling, counter gap
        or priority: see the module docstring), or None. Called only when the batch has no room for the waiting;
        ``freed``: the seats already freed this step, each counted as the waiting key's."""
        candidates = list(waiting)
        if not candidates or not running:
            return None
        floor = self.vtc.floor()
        best = min(candidates, key=lambda seq: self._rank(seq.fair_share, floor)).fair_share
        queued = sum((seq.fair_share.priority, seq.fair_share.key) == (best.priority, best.key) for seq in candidates)
        if freed >= queued:  # every sequence the key has waiting has a seat to go to
            return None
        best_priority, best_counter, _, _ = self._rank(best, floor)
        best_held = self.seats.get(best.key, 0) + freed
        victim, victim_rank = None, None
        for seq in running:  # arrival order: a later one of the same rank is newer
            share = seq.fair_share
            if share.priority < best_priority or (share.priority, share.key) == (best_priority, best.key):
                continue
            if step - self._admitted_step[id(seq)] < self.min_run_steps:
                continue
            priority, counter, seats, _ = self._rank(share, floor)
            outranked = priority > best_priority
            gap = self.vtc.counters.get(share.key, 0.0) - self.vtc.counters.get(best.key, 0.0)  # unclamped
            behind = gap > self.preempt_threshold
            # (held - 1) / weight >= (best held + 1) / best weight, multiplied out: exact for whole weights
            held = self.seats[share.key]
            over_seated = counter >= best_counter and (held - 1) * best.weight >= (best_held + 1) * share.weight
            if not (outranked or behind or over_seated):
                continue
            rank = (priority, seats, counter)
            if victim_rank is None or rank >= victim_rank:
                victim, victim_rank = seq, rank
        if victim is not None:
            self.num_fair_preemptions += 1
        return victim

    # ---- short steps while keys compete
    def prefill_allowance(self, running: list[Sequence], waiting: Iterable[Sequence], step: int,
                          free_seats: int) -> PrefillAllowance | None:
        """While keys compete, the prompt tokens a step computes for keys other than a favoured one (see the module
        docstring); None when they do not (one key backlogged for ``contention_steps``) or no limit is set."""
        if self.step_prefill_tokens is None:
            return None
        if len(self.vtc.backlog) >= 2:
            self._contended_until = step + self.contention_steps
        if step >= self._contended_until:
            return None
        firsts: dict[tuple, FairShare] = {}
        for seq in waiting:
            share = seq.fair_share
            firsts.setdefault((share.priority, share.key), share)
        if not firsts:
            return PrefillAllowance(None, self.step_prefill_tokens)
        floor = self.vtc.floor()
        best = min(firsts.values(), key=lambda share: self._rank(share, floor))
        crowd = max((self.seats[seq.fair_share.key] / seq.fair_share.weight for seq in running), default=0.0)
        if self.seats.get(best.key, 0) / best.weight >= crowd:
            return PrefillAllowance(None, self.step_prefill_tokens)
        favoured = (best.priority, best.key)
        if free_seats > 0 and self._favour_pending != favoured:
            self._favour_pending = favoured  # the step is its own; once, until one of its sequences is admitted
            self.num_own_steps += 1
            return PrefillAllowance(favoured, 0, exclusive=True)
        return PrefillAllowance(favoured, self.step_prefill_tokens)

    def stats(self) -> dict:
        backlogged = {key: round(self.vtc.counters[key], 1) for key in self.vtc.backlog if key is not None}
        values = list(backlogged.values())
        return {"backlogged_keys": len(backlogged), "known_keys": sum(k is not None for k in self.vtc.counters),
                "counter_spread": round(max(values) - min(values), 1) if values else 0.0,
                "preemptions": self.num_fair_preemptions, "own_steps": self.num_own_steps,
                "step_prefill_tokens": self.step_prefill_tokens,
                "counters": dict(sorted(backlogged.items(), key=lambda kv: kv[1])[:64])}

"""``AdapterAdmission``: the admission policy with adapters. Which waiting sequences may join the batch, in what order.

Rules:
* a waiting sequence whose adapter is not loaded starts its load and is skipped; it never blocks those behind it;
* at most ``max_loras`` distinct adapters run at once: every running sequence pins its adapter's slot, so a
  sequence whose adapter has no slot and finds none free or evictable waits;
* resident adapters first: sequences of the base model or of an adapter already in a slot are admitted before
  those that need a slot (which may evict an adapter others in the queue are about to use), each group oldest
  first;
* bounded waiting: a sequence queued more than ``max_wait_steps`` steps ago is *overdue*; overdue sequences go
  first, oldest first, and if the oldest overdue one is blocked for want of a slot, the pinned adapter with the
  fewest running sequences is drained (no new sequence of it is admitted) until its slot can be given away.
  Other adapters keep running meanwhile, so the batch stays full while one slot is being freed. An adapter with
  overdue sequences of its own waiting (its group split over steps by the token budget) is drained only when every
  pinned adapter has some: draining it would leave them for a slot of their own later, a whole extra turn of a slot.
* an adapter takes a slot as a group: its waiting sequences are ordered together (at the place of its oldest),
  and it takes a slot only when the batch has seats for ``min(its waiting sequences, max_num_seqs // max_loras)``
  of them. A slot is held until the adapter's last sequence finishes, so a slot taken for the few sequences that
  fit would run them alone long after the rest of the batch, while whole groups of other adapters wait for it.
  When the oldest overdue sequence lacks seats, nothing younger is
  admitted until they are free (the finishing sequences free them), so a big group cannot be passed over for ever.
"""

from collections.abc import Iterable

from engine.admission import Decision, FirstComeFirstServed
from engine.lora.slot_cache import AdapterId, AdapterSlotCache
from engine.sequence import Sequence, adapter_content_key

_OVERDUE, _READY, _NEEDS_SLOT = 0, 1, 2


class AdapterAdmission(FirstComeFirstServed):
    def __init__(self, slot_cache: AdapterSlotCache, *, max_wait_steps: int, max_num_seqs: int):
        self.slot_cache = slot_cache
        self.max_wait_steps = max_wait_steps
        self.seat_share = max(1, max_num_seqs // slot_cache.num_slots)  # seats a slot's group asks for, at most
        self.drained: AdapterId | None = None  # the adapter whose slot is being freed for an overdue sequence
        self._waiting: dict[AdapterId, int] = {}  # admissible waiting sequences per adapter (this step's order)
        self._overdue: set[AdapterId] = set()  # adapters with an overdue waiting sequence (this step's order)

    def order(self, waiting: Iterable[Sequence], step: int) -> list[Sequence]:
        """The waiting sequences that may be admitted this step, in the order to try them; starts missing loads."""
        self.drained = None
        tiers: list[tuple[int, int, int, Sequence]] = []
        states: dict[AdapterId, int | None] = {}  # adapter -> tier; None: not admissible now
        first: dict[tuple[int, AdapterId], int] = {}  # (tier, adapter needing a slot) -> its oldest arrival
        self._waiting, self._overdue = {}, set()
        for seq in waiting:
            group = seq.arrival_index
            if seq.lora_request is None:
                tier = _READY
            else:
                adapter_id = seq.lora_request.id
                if adapter_id not in states:
                    states[adapter_id] = self._tier_of(seq)
                tier = states[adapter_id]
                if tier is None:
                    continue
                self._waiting[adapter_id] = self._waiting.get(adapter_id, 0) + 1
            if step - seq.arrival_step > self.max_wait_steps:
                tier = _OVERDUE
                if seq.lora_request is not None:
                    self._overdue.add(seq.lora_request.id)
            if seq.lora_request is not None and states[seq.lora_request.id] == _NEEDS_SLOT:
                group = first.setdefault((tier, seq.lora_request.id), seq.arrival_index)  # waiting is FCFS
            tiers.append((tier, group, seq.arrival_index, seq))
        tiers.sort(key=lambda item: item[:3])
        return [seq for *_, seq in tiers]

    def _tier_of(self, seq: Sequence) -> int | None:
        cache, request = self.slot_cache, seq.lora_request
        if cache.is_unloading(request.id):
            return None  # leaves its slot when its running sequences finish; loaded again after that
        if cache.is_resident(request.id):
            return _READY
        if cache.is_loaded(request.id):
            return _NEEDS_SLOT
        cache.request_load(request)  # no-op while loading
        return None

    def decide(self, seq: Sequence, step: int, free_seats: int) -> Decision:
        """Admit ``seq`` when it can get its adapter's slot now (always, for the base model), with ``free_seats``
        sequences still to admit this step; STOP when the oldest overdue sequence waits for seats (nobody younger
        may take them)."""
        if seq.lora_request is None:
            return Decision.ADMIT
        adapter_id = seq.lora_request.id
        if adapter_id == self.drained:
            return Decision.SKIP
        overdue = step - seq.arrival_step > self.max_wait_steps
        if self.slot_cache.is_resident(adapter_id):
            return Decision.ADMIT
        if self.slot_cache.can_acquire(adapter_id):
            if free_seats >= min(self._waiting.get(adapter_id, 1), self.seat_share):
                return Decision.ADMIT
            return Decision.STOP if overdue else Decision.SKIP
        if self.drained is None and overdue:
            pins = self.slot_cache.pin_counts()
            # The least used adapter frees its slot soonest, but not one with overdue sequences of its own waiting (a
            # group the token budget split over steps): drained, they would wait until its slot is free and then take
            # a slot again, a whole extra turn of a slot for a few sequences, as overdue as this one.
            candidates = {a: n for a, n in pins.items() if a not in self._overdue} or pins
            if candidates:
                self.drained = min(candidates, key=candidates.__getitem__)
        return Decision.SKIP

    def prepare(self, seq: Sequence) -> None:
        """Key the sequence's prefix-cache blocks by the loaded weights' content hash (before any lookup)."""
        if seq.lora_request is None:
            return
        key = adapter_content_key(self.slot_cache.content_hash(seq.lora_request.id))
        if seq.cache_key != key:
            seq.cache_key = key
            seq.block_hashes = []  # computed under a provisional key; the sequence holds no blocks yet

    def acquire(self, seq: Sequence) -> None:
        if seq.lora_request is not None:
            seq.lora_slot = self.slot_cache.acquire(seq.lora_request.id)

    def release(self, seq: Sequence) -> None:
        if seq.lora_slot >= 0:
            self.slot_cache.release(seq.lora_request.id)
            seq.lora_slot = -1

    def check_invariants(self, running: list[Sequence]) -> None:
        """Every running sequence pins its adapter's slot, and the slot cache counts exactly those pins."""
        cache = self.slot_cache
        pins: dict = {}
        for seq in running:
            if seq.lora_request is not None:
                assert seq.lora_slot == cache.slot_of(seq.lora_request.id) >= 0, f"{seq} runs without its slot"
                pins[seq.lora_request.id] = pins.get(seq.lora_request.id, 0) + 1
        held = {r.id: r.pinned_by for r in cache.stats().resident if r.pinned_by}
        assert pins == held, f"running sequences pin {pins}, the slot cache holds {held}"
        cache.check_invariants()

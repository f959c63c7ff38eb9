"""Admission policies: which waiting sequences the scheduler tries to admit each step, and in what order.

The scheduler has one waiting loop; a policy gives it the order (:meth:`order`), says of each sequence whether
to admit it, pass over it or stop there (:meth:`decide`), and hears what happens to admitted and released
sequences. :class:`FirstComeFirstServed` is the default; with LoRA the engine uses
:class:`engine.lora.admission.AdapterAdmission`; the engine wraps either in :class:`engine.fairness.FairAdmission`,
which regroups the order by tenant and owns the hooks below that only fairness needs (no-ops here).
"""

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from engine.sequence import Sequence


class Decision(enum.Enum):
    ADMIT = "admit"
    SKIP = "skip"  # not now; those after it may still be admitted
    STOP = "stop"  # admit nobody else this step


@dataclass(slots=True)
class PrefillAllowance:
    """How many prompt tokens one step may compute beyond what the token budget allows: the sequences of
    ``favoured`` (a ``(priority, key)`` pair, or None) compute their prompts whole, every other sequence's prompt
    chunk comes out of ``tokens``. ``exclusive``: the step is the favoured key's alone (no other sequence computes
    anything, decodes included)."""

    favoured: tuple | None
    tokens: int
    exclusive: bool = False

    def _is_favoured(self, seq: Sequence) -> bool:
        return self.favoured is not None and (seq.fair_share.priority, seq.fair_share.key) == self.favoured

    def excludes(self, seq: Sequence) -> bool:
        return self.exclusive and not self._is_favoured(seq)

    def allows(self, seq: Sequence, wanted: int) -> int:
        """The prompt tokens ``seq`` may compute this step, of the ``wanted`` it lacks."""
        return wanted if self._is_favoured(seq) else min(wanted, self.tokens)

    def spend(self, seq: Sequence, num_tokens: int) -> None:
        if not self._is_favoured(seq):
            self.tokens -= num_tokens


class FirstComeFirstServed:
    """Oldest first, each admitted when its blocks and the budget allow."""

    def order(self, waiting: Iterable[Sequence], step: int) -> Iterable[Sequence]:
        return waiting

    def decide(self, seq: Sequence, step: int, free_seats: int) -> Decision:
        return Decision.ADMIT

    def prepare(self, seq: Sequence) -> None:
        """Before the prefix-cache lookup of a sequence about to be admitted."""

    def acquire(self, seq: Sequence) -> None:
        """After the sequence got its blocks: it runs from now on."""

    def release(self, seq: Sequence) -> None:
        """The sequence stopped running (finished, aborted or preempted)."""

    def admitted(self, seq: Sequence, step: int) -> None:
        """The sequence was admitted (it is running) at scheduler step ``step``."""

    def check_invariants(self, running: list[Sequence]) -> None:
        """Debug checks at the end of a step."""

    # ---- fairness hooks (engine.fairness.FairAdmission)
    def join(self, seq: Sequence) -> None:
        """A sequence was queued for the first time."""

    def leave(self, seq: Sequence) -> None:
        """A sequence left for good (finished or aborted)."""

    def account(self, seqs: list[Sequence], num_new_tokens: list[int]) -> None:
        """A step was scheduled: these sequences compute these many tokens."""

    def victim(self, running: list[Sequence], waiting: Iterable[Sequence], step: int,
               freed: int = 0) -> Sequence | None:
        """A running sequence to preempt so a waiting one can be served (the batch has no room; ``freed`` seats were
        already freed this step); None: keep all."""
        return None

    def prefill_allowance(self, running: list[Sequence], waiting: Iterable[Sequence], step: int,
                          free_seats: int) -> PrefillAllowance | None:
        """The step's limit on prompt tokens beyond the token budget (called after :meth:`victim`, with the seats
        then free); None: only the budget limits them."""
        return None

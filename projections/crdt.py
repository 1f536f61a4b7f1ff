"""The replicated data types the fold (``projections.fold``) is built from.

- ``LWWRegister``: a value with a stamp; merge keeps the greater stamp. A stamp is the
  bytes of ``projections.fold.stamp_of`` (8-byte big-endian HLC, instance id, event id),
  so comparing bytes orders writes by (HLC, instance id, event id). ``NO_STAMP`` is below
  every stamp: a register nobody wrote, which any write replaces.
- ``GCounter``: one entry per actor (an instance incarnation) holding the largest total
  that actor reported; merge takes the per-actor maximum; the value is the sum. An actor
  announces its new *total*, never "+1", so a redelivered or retried announcement cannot
  count twice, and an announcement whose outcome was unknown is subsumed by the next.
  The fold keeps one entry per row (``ApplicationRow``) and joins it with
  ``GCounter.join_entry``; an engine that keeps per-experience totals in memory keeps a
  ``GCounter`` per experience and feeds it those rows with ``merge_entry``.

Merges are commutative, associative and idempotent (``tests/test_crdt.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar
from uuid import UUID

T = TypeVar("T")

Stamp = bytes  # 8-byte big-endian HLC + instance id + event id: compares like the tuple
NO_STAMP: Stamp = b""


@dataclass(frozen=True, slots=True)
class LWWRegister(Generic[T]):
    """A last-writer-wins register. One stamp names one write, so equal stamps carry
    equal values."""

    value: T
    stamp: Stamp = NO_STAMP

    def merge(self, other: LWWRegister[T]) -> LWWRegister[T]:
        return other if other.stamp > self.stamp else self


@dataclass(slots=True)
class GCounter:
    """A grow-only counter: the largest total each actor reported. Totals of 0 or less
    count as no entry, so equal counters have equal ``entries``. ``merge`` and
    ``merge_entry`` update the counter in place (like ``Row.merge``)."""

    entries: dict[UUID, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.entries = {actor: total for actor, total in self.entries.items() if total > 0}

    @staticmethod
    def join_entry(mine: int, theirs: int) -> int:
        """The join of two totals one actor reported: the larger."""
        return theirs if theirs > mine else mine

    @property
    def value(self) -> int:
        return sum(self.entries.values())

    def get(self, actor: UUID) -> int:
        return self.entries.get(actor, 0)

    def merge_entry(self, actor: UUID, total: int) -> int:
        """Merge one actor's reported total; returns how much ``value`` grew (0 for a
        repeated or stale total)."""
        old = self.entries.get(actor, 0)
        new = GCounter.join_entry(old, total)
        if new == old:
            return 0
        self.entries[actor] = new
        return new - old

    def merge(self, other: GCounter) -> GCounter:
        """The join (returns self, updated)."""
        for actor, total in other.entries.items():
            self.merge_entry(actor, total)
        return self

    def copy(self) -> GCounter:
        return GCounter(self.entries)  # __post_init__ copies

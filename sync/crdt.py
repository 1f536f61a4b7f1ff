"""The replicated data types behind Pulse's counts and fields, as plain values.

- ``GCounter``: one entry per actor (an instance incarnation) holding the largest total
  that actor reported; merge takes the per-actor maximum; the value is the sum. An actor
  announces its new *total*, never "+1", so a redelivered or retried announcement cannot
  count twice, and an announcement whose outcome was unknown is subsumed by the next.
- ``LWWRegister``: a value with a stamp (HLC, instance id, event id); merge keeps the
  greater stamp.

The projection's fold (``projections.fold``) applies these same rules to its rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar
from uuid import UUID

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GCounter:
    entries: dict[UUID, int] = field(default_factory=dict)

    @property
    def value(self) -> int:
        return sum(self.entries.values())

    def get(self, actor: UUID) -> int:
        return self.entries.get(actor, 0)

    def increment(self, actor: UUID, by: int = 1) -> GCounter:
        if by < 0:
            raise ValueError(f"a G-counter only grows; got an increment of {by}")
        return GCounter({**self.entries, actor: self.get(actor) + by})

    def merge(self, other: GCounter) -> GCounter:
        merged = dict(self.entries)
        for actor, total in other.entries.items():
            merged[actor] = max(merged.get(actor, 0), total)
        return GCounter(merged)


Stamp = tuple[int, UUID, UUID]  # (hlc, instance id, event id)


@dataclass(frozen=True, slots=True)
class LWWRegister(Generic[T]):
    value: T
    stamp: Stamp

    def set(self, value: T, stamp: Stamp) -> LWWRegister[T]:
        return self.merge(LWWRegister(value, stamp))

    def merge(self, other: LWWRegister[T]) -> LWWRegister[T]:
        return other if other.stamp > self.stamp else self

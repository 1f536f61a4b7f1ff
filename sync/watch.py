"""Changes to experiences as an instance applies them: ``PulseDB.watch_experiences``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Literal
from uuid import UUID

import msgspec

from eventlog import events as ev
from eventlog.errors import PulseError
from eventlog.log import LogEntry

ChangeKind = Literal["created", "updated", "archived", "unarchived", "invalidated", "deleted"]
CHANGE_OF: dict[type, ChangeKind] = {
    ev.ExperienceRecorded: "created",
    ev.ExperienceUpdated: "updated",
    ev.ExperienceReinforced: "updated",
    ev.ExperienceArchived: "archived",
    ev.ExperienceUnarchived: "unarchived",
    ev.ExperienceInvalidated: "invalidated",
    ev.ExperienceDeleted: "deleted",
}


class ExperienceChange(msgspec.Struct, frozen=True, kw_only=True):
    """One applied change to an experience, as ``watch_experiences`` yields it."""

    kind: ChangeKind
    experience_id: UUID
    collective_id: UUID
    seq: int  # stream sequence of the event (0 for a caller that is not an admin)
    instance_id: UUID  # the incarnation that wrote it


def change_of(entry: LogEntry) -> ExperienceChange | None:
    """The change an applied entry makes to an experience, if it makes one."""
    event = entry.event
    kind = CHANGE_OF.get(type(event))
    if kind is None or event is None:
        return None
    return ExperienceChange(
        kind=kind,
        experience_id=event.experience_id,  # type: ignore[union-attr]
        collective_id=event.collective_id,  # type: ignore[union-attr,arg-type]
        seq=entry.seq,
        instance_id=event.instance_id,
    )


class ExperienceWatch:
    """An async iterator of ``ExperienceChange``, registered when created.

    It holds at most ``limit`` changes its reader has not taken yet; a reader that falls
    further behind is dropped (its next read raises ``PulseError``: watch again and
    re-read what changed), so a stalled reader cannot make the instance hold every
    change in memory."""

    def __init__(
        self,
        watchers: set[ExperienceWatch],
        limit: int = 10_000,
        admit: Callable[[ExperienceChange], Awaitable[bool]] | None = None,
        *,
        sequences: bool = True,
    ) -> None:
        self._watchers = watchers
        self._admit = admit  # which changes its reader may see (None: every one)
        self._sequences = sequences  # False: changes say seq 0 (sync.instance)
        self._queue: asyncio.Queue[ExperienceChange | None] = asyncio.Queue(maxsize=limit)
        self._overflowed = False
        self._ended = False
        watchers.add(self)

    def offer(self, change: ExperienceChange) -> None:
        try:
            self._queue.put_nowait(change)
        except asyncio.QueueFull:
            self._overflowed = True
            self.close()

    def end(self) -> None:
        """The instance closed: the iteration stops once what is queued is read."""
        self._ended = True
        self.close()
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    def __aiter__(self) -> ExperienceWatch:
        return self

    async def __anext__(self) -> ExperienceChange:
        while True:
            change = await self._next()
            if self._admit is None or await self._admit(change):
                if not self._sequences:
                    change = msgspec.structs.replace(change, seq=0)
                return change

    async def _next(self) -> ExperienceChange:
        if self._overflowed and self._queue.empty():
            raise PulseError(
                f"watch: the reader fell more than {self._queue.maxsize} changes behind; "
                "watch again and re-read"
            )
        if self._ended and self._queue.empty():
            raise StopAsyncIteration
        change = await self._queue.get()
        if change is None:
            self.close()
            raise StopAsyncIteration
        return change

    def close(self) -> None:
        self._watchers.discard(self)

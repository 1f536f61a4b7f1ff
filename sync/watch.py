"""Changes to experiences as an instance applies them: ``PulseDB.watch_experiences``,
and the watchers of an instance (``Watching``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal
from uuid import UUID

import msgspec

from eventlog import events as ev
from eventlog.errors import NotFoundError, PulseError
from eventlog.log import LogEntry
from projections import queries
from sync import access
from sync.gate import Gate
from sync.reading import Reader

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
    further behind is dropped (its next read, after what is queued, raises
    ``PulseError``: watch again and re-read what changed), so a stalled reader cannot make
    the instance hold every change in memory.

    A reader that may not see every change (``admit``) counts only those it may see
    toward that bound: a task admits each change as it arrives, whether the reader reads
    or not, and queues the admitted ones for it. Counted before admission, the moment a
    stalled reader is dropped would tell how much was written that it may not see.
    (Changes wait for admission in a queue of their own, ``backlog`` times larger, which
    fills only if admission itself falls that far behind the log.)"""

    def __init__(
        self,
        watchers: set[ExperienceWatch],
        limit: int = 10_000,
        admit: Callable[[ExperienceChange], Awaitable[bool]] | None = None,
        *,
        sequences: bool = True,
        backlog: int = 10,
    ) -> None:
        self._watchers = watchers
        self._sequences = sequences  # False: changes say seq 0 (sync.instance)
        self._limit, self._backlog = limit, backlog * limit
        # (bounded by _deliver and offer, so that the end always fits)
        self._queue: asyncio.Queue[ExperienceChange | None] = asyncio.Queue()
        self._arriving: asyncio.Queue[ExperienceChange | None] | None = None
        self._admitting: asyncio.Task[None] | None = None
        self._overflowed = False
        if admit is not None:
            self._arriving = asyncio.Queue()
            self._admitting = asyncio.ensure_future(self._admit_all(admit))
        watchers.add(self)

    def offer(self, change: ExperienceChange) -> None:
        if self._arriving is None:
            self._deliver(change)
        elif self._arriving.qsize() >= self._backlog:
            self._overflow()
        else:
            self._arriving.put_nowait(change)

    def _deliver(self, change: ExperienceChange) -> None:
        if self._queue.qsize() >= self._limit:
            self._overflow()
        else:
            self._queue.put_nowait(change)

    def _overflow(self) -> None:
        self._overflowed = True
        self.close()
        self._queue.put_nowait(None)

    async def _admit_all(self, admit: Callable[[ExperienceChange], Awaitable[bool]]) -> None:
        assert self._arriving is not None
        while not self._overflowed:
            change = await self._arriving.get()
            try:
                admitted = change is not None and await admit(change)
            except PulseError:  # the instance is closing: what is queued is all
                change = None
            if change is None:
                self._queue.put_nowait(None)
                return
            if admitted:
                if not self._sequences:
                    change = msgspec.structs.replace(change, seq=0)
                self._deliver(change)

    def end(self) -> None:
        """The instance closed: the iteration stops once what is queued is read."""
        self._watchers.discard(self)
        (self._arriving if self._arriving is not None else self._queue).put_nowait(None)

    def __aiter__(self) -> ExperienceWatch:
        return self

    async def __anext__(self) -> ExperienceChange:
        change = await self._queue.get()
        if change is None:
            self._queue.put_nowait(None)  # (every later read ends too)
            self.close()
            if self._overflowed:
                raise PulseError(
                    f"watch: the reader fell more than {self._limit} changes behind; "
                    "watch again and re-read"
                )
            raise StopAsyncIteration
        return change

    def close(self) -> None:
        """Stop taking changes."""
        self._watchers.discard(self)
        if self._admitting is not None and not self._admitting.done():
            if asyncio.current_task() is not self._admitting:
                self._admitting.cancel()


class Watching:
    """The watchers of this instance: every change replication applies is offered to
    each (``applied``), and ``watch_experiences`` makes one for the caller."""

    def __init__(self, reads: Reader, gate: Gate) -> None:
        self.reads, self.gate = reads, gate
        self.watchers: set[ExperienceWatch] = set()

    def applied(self, entry: LogEntry) -> None:
        """A replication listener: offer the change an entry makes to every watcher."""
        if self.watchers:
            change = change_of(entry)
            if change is not None:
                for watcher in list(self.watchers):
                    watcher.offer(change)

    def end_all(self) -> None:
        """The instance closes: every watch ends once what it holds is read."""
        for watch in list(self.watchers):
            watch.end()

    def watch_experiences(self) -> ExperienceWatch:
        """Changes to experiences as this instance applies them, whichever host wrote them,
        from the moment of this call, those the caller may see (a delete: of an experience
        it could see while this host held it). Iterate it with ``async for``; it ends when
        the instance closes (or call ``close()`` on it). A change's ``seq`` is its stream
        sequence for admins and 0 for any other caller (sequences count every host's
        writes, those it may not see among them)."""
        me = self.gate.me()
        if me.admin:
            return ExperienceWatch(self.watchers)

        async def admit(change: ExperienceChange) -> bool:
            if change.kind == "deleted":  # to those who could see it (unknown here: no one)
                facts = await self.reads.read(queries.deleted_access, change.experience_id)
                return facts is not None and me.sees(
                    facts.visibility, me.member(facts.owner_id, facts.collective_id),
                    facts.author_owner, facts.author_agent,
                )  # fmt: skip
            with access.acting(me):
                try:
                    await self.gate.entity("experience", change.experience_id, write=False)
                except NotFoundError:
                    return False
                return True

        return ExperienceWatch(self.watchers, admit=admit, sequences=False)

"""Replication: the tail of the log into the engine, the applied sequence, and the
writers waiting for their own sequence (read-your-writes).

A tail of the log from the engine's applied sequence hands every entry to the projection
engine (``projections.engine``) as it arrives, what the tail read at once in one
hand-over (what this host wrote as it was written, known by its message id before its
body is decoded: ``writing``); the engine applies whatever has queued up as one batch
and reports each batch back. Those reports advance
the applied sequence on the loop, feed the clock, wake the writers waiting for their
sequence, and are told to whoever listens (``listen``: the gate forgets what a delete
changed, the tokens are read again, the watchers hear of experiences). Nothing here
calls DuckDB, FAISS or tantivy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import heapq
import itertools
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from uuid import UUID

from eventlog import events as ev
from eventlog import subjects
from eventlog.errors import LogUnavailable, PulseError
from eventlog.jetstream import JetStreamLog, cancelled
from eventlog.log import EventLog, LogEntry
from eventlog.sealing import Sealer, tombstone_scope
from projections.engine import Applied, Engine
from sync.hlc import MAX_AHEAD_MS, HybridClock, wall_ms

log = logging.getLogger("pulse.instance")

DELETES = (ev.CollectiveDeleted, ev.ExperienceDeleted, ev.RelationDeleted, ev.InsightDeleted,
           ev.WisdomDeleted, ev.SessionDeleted, ev.ThreadDeleted)  # fmt: skip
WRITTEN_MAX = 20_000  # own writes remembered for the tail
BACKLOG_LIMIT = 50_000  # entries handed to the engine and not applied: the tail waits
KEPT_ASIDE_MAX = 10_000  # recent dead letters remembered for the writers waiting on them


class Replication:
    """The tail, the applied sequence and its waiters (see the module docstring).
    ``filters``: the subjects the host reads now (None: all of them; ``sync.following``
    changes them while the host runs)."""

    def __init__(
        self,
        log_: EventLog,
        engine: Engine,
        sealer: Sealer,
        clock: HybridClock,
        instance_id: UUID,
        filters: Callable[[], list[str] | None],
    ) -> None:
        self.log, self.engine, self.sealer, self.clock = log_, engine, sealer, clock
        self.instance_id = instance_id
        self.filters = filters
        self._loop = asyncio.get_running_loop()
        self.applied = engine.seq  # the last stream sequence applied here
        self.submitted = engine.seq  # the last one the tail handed to the engine
        self.failure: BaseException | None = None  # why the tail stopped
        self.closed = False
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # a heap by seq
        self._tickets = itertools.count()
        self._task: asyncio.Task[None] | None = None
        # recent sequences of writes that landed after a tombstone of their collective or
        # entity (the engine tells) -> which: the writer forgets such a write again
        self.landed_dead: dict[int, str] = {}
        self.kept_aside: dict[int, str] = {}  # recent sequences kept aside -> why
        # the latest time the stream stored a message this host read (0: none yet): an
        # event's clock close enough to it is within the bound of any later one
        self.log_ms = 0
        # what this instance wrote, by message id (its event id), until its tail brings it
        # back (then it is handed over as written, neither decoded nor decrypted again:
        # ``EventLog.tail``'s ``own``); the oldest go first
        self._own: dict[str, ev.Event] = {}
        self._purging: set[asyncio.Future[None]] = set()  # copies forgotten (a leaf's)
        self._listeners: list[Callable[[LogEntry], None]] = []
        self._after_batch: list[Callable[[], None]] = []
        engine.subscribe(self._on_applied)

    def listen(
        self,
        each: Callable[[LogEntry], None] | None = None,
        after_batch: Callable[[], None] | None = None,
    ) -> None:
        """Call ``each`` with every applied entry (not a dead letter), on the loop, and
        ``after_batch`` after every batch, before the writers waiting on it wake."""
        if each is not None:
            self._listeners.append(each)
        if after_batch is not None:
            self._after_batch.append(after_batch)

    # -- the tail -------------------------------------------------------------------------

    def start(self, from_seq: int | None = None) -> None:
        """Tail the log from ``from_seq`` (default: past what the engine applied)."""
        self._task = asyncio.create_task(self._replicate(from_seq), name="pulse-replication")

    async def stop(self) -> None:
        if self._task is not None:
            await cancelled({self._task})  # (cancelled until it takes: see there)
            self._task = None

    async def _replicate(self, from_seq: int | None = None) -> None:
        try:
            start = self.engine.seq + 1 if from_seq is None else from_seq
            engine = self.engine
            async for batch in self._tail(start):
                fresh: list[LogEntry] = []
                for entry in batch:
                    if entry.stored_ms is not None and entry.stored_ms > self.log_ms:
                        self.log_ms = entry.stored_ms  # (the writer's own events come back too)
                    if entry.seq <= engine.seq:
                        continue  # a writer here handed it over already
                    if isinstance(entry.event, ev.Sealed):
                        entry = await self._opened(entry)
                    fresh.append(entry)
                if not fresh:
                    continue  # no need to wake the engine
                engine.submit(fresh)  # one hand-over for what the tail read at once
                self.submitted = submitted = fresh[-1].seq
                if engine.backlog > BACKLOG_LIMIT:  # let the engine catch its breath
                    await self.wait_applied(submitted - BACKLOG_LIMIT // 2, timeout=600)
            raise LogUnavailable("the log tail ended")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # keep the reason; waiters raise it
            log.exception("replication stopped")
            self.failure = exc
            self.wake_all()

    async def _tail(self, start: int) -> AsyncGenerator[Sequence[LogEntry], None]:
        """The log's tail from ``start``, in lists: as the JetStream log read them (one
        list per drain of its consumer's inbox) where its tail is that log's own, else
        one entry at a time."""
        log_, filters = self.log, self.filters()
        tail = log_.tail_batches
        if isinstance(log_, JetStreamLog) and type(log_).tail is not JetStreamLog.tail:
            tail = functools.partial(EventLog.tail_batches, log_)  # (its own tail, through)
        async for batch in tail(start, subjects=filters, own=self._own_event):
            yield batch

    async def _opened(self, entry: LogEntry) -> LogEntry:
        """A sealed entry of the tail, opened: a write of this instance comes back as the
        event it wrote (no decryption; where the log did not give it back so already);
        another host's is opened with its key."""
        assert entry.event is not None
        own = self._own_event(str(entry.event.event_id), entry.subject)
        if own is not None:
            return dataclasses.replace(entry, event=own, error=None)
        (opened,) = await self.sealer.open((entry,))
        return opened

    def _own_event(self, msg_id: str, subject: str) -> ev.Event | None:
        """The event this instance wrote as message ``msg_id`` (taken: the tail reads it
        once), or None. Its subject need not be compared (working it out costs more than
        the rest of the look-up): the stream refuses a second message with an id within
        its duplicate window, and the first one with a fresh random id is this host's."""
        return self._own.pop(msg_id, None)

    def writing(self, events: Sequence[ev.Event]) -> None:
        """Remember what this instance is about to write, by message id, for its tail
        (``_own_event``): the tail may bring an event back before its append returns."""
        written = self._own
        for event in events:
            written[str(event.event_id)] = event
        while len(written) > WRITTEN_MAX:
            del written[next(iter(written))]

    # -- what the engine applied ----------------------------------------------------------

    def _on_applied(self, applied: Applied) -> None:
        """Called on the engine thread after every batch: hand the news to the loop."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._applied_on_loop, applied)

    def _applied_on_loop(self, applied: Applied) -> None:
        self.applied = max(self.applied, applied.seq)
        if applied.kept_aside:
            self.kept_aside.update(applied.kept_aside)
            while len(self.kept_aside) > KEPT_ASIDE_MAX:
                del self.kept_aside[next(iter(self.kept_aside))]
        if applied.landed_dead:
            self.landed_dead.update(applied.landed_dead)
            while len(self.landed_dead) > KEPT_ASIDE_MAX:
                del self.landed_dead[next(iter(self.landed_dead))]
        latest = 0
        trusted = ev.pack_hlc(wall_ms() + MAX_AHEAD_MS, ev.HLC_LOGICAL_MAX)
        for entry in applied.entries:
            event = entry.event
            if event is None or entry.seq in applied.kept_aside:
                continue  # a dead letter changes nothing here either
            if latest < event.hlc <= trusted:  # the clock takes in none further ahead
                latest = event.hlc
            if isinstance(event, (*DELETES, ev.CollectiveCreated)):
                self.sealer.forget(event)
                if isinstance(event, DELETES) and event.instance_id != self.instance_id:
                    self._purge_copy(event, entry.seq)
            for listener in self._listeners:
                listener(entry)
        if latest:
            self.clock.observe(latest)
        for after in self._after_batch:
            after()
        while self._waiters and self._waiters[0][0] <= self.applied:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    def _purge_copy(self, event: ev.Event, seq: int) -> None:
        """Another host deleted: forget this host's own copy of the log's messages too,
        where it has one (a leaf's streams: ``EventLog.purge_copy``), in the background;
        a failure is logged (its next delete of the subject, or a rebuild, redoes it)."""
        if type(self.log).purge_copy is EventLog.purge_copy:
            return  # one shared stream: the deleting host purged it
        if isinstance(event, ev.CollectiveDeleted):
            subject = f"{subjects.PREFIX}.c.{event.collective_id}.>"
        else:
            subject = subjects.subject_for(event)
        name, prefix = tombstone_scope(event) or (None, None)
        keys = functools.partial(self.sealer.keyring.destroy_copies, name, prefix=prefix)

        async def purge() -> None:
            try:
                await self.log.purge_copy(subject, before_seq=seq)
                await keys()
            except Exception:
                log.warning("forgetting this host's copy of %s failed", subject, exc_info=True)

        task = asyncio.ensure_future(purge())
        self._purging.add(task)
        task.add_done_callback(self._purging.discard)

    # -- waiting for a sequence -----------------------------------------------------------

    def wake_all(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    async def wait_applied(self, seq: int, timeout: float = 60.0) -> None:
        """Return once this host applied stream sequence ``seq``; LogUnavailable past
        ``timeout``, PulseError when replication stopped or the instance closed."""
        if self.applied < seq and self.failure is None and not self.closed:
            future: asyncio.Future[None] = self._loop.create_future()
            heapq.heappush(self._waiters, (seq, next(self._tickets), future))
            try:
                async with asyncio.timeout(timeout):  # not wait_for: see jetstream._pull
                    await future
            except TimeoutError:
                raise LogUnavailable(
                    f"the local state did not reach stream sequence {seq} within "
                    f"{timeout:g} s (it is at {self.applied})"
                ) from None
        if self.failure is not None:
            raise PulseError(f"replication stopped: {self.failure!r}") from self.failure
        if self.applied < seq:
            raise PulseError("the instance is closed")

    async def caught_up(self, timeout: float = 60.0) -> int:
        """Wait until this host applied everything the log holds now of what it reads;
        returns that sequence."""
        target = await self.log.reached(self.filters(), timeout)
        await self.wait_applied(target, timeout)
        return target

    def check_open(self) -> None:
        if self.closed:
            raise PulseError("the instance is closed")

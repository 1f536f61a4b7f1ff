"""The projection engine: one thread owns a projection (its memory, DuckDB, FAISS and
tantivy); the asyncio loop hands it work and awaits the result.

    loop                                   engine thread
    ----                                   -------------
    submit(entries) / apply(entries)  -->  fold everything queued, as one batch
    run(fn, *args)                    -->  fn(projection, *args) after that batch
    listeners  <------------------------   Applied(seq, entries, kept_aside) per batch
                                           every flush_interval: the changed rows
                                           handed to the flusher thread, which
                                           writes DuckDB beside the engine
                                           index files saved after save_interval,
                                           once a second passes without events
                                           snapshot.duckdb refreshed (copied on a
                                           thread of its own) when the state changed

Group commit: the thread takes whatever arrived while it was busy, so it applies one
event when idle and thousands under load, and writes DuckDB once per ``flush_interval``
whatever the number of events. The write itself (10-40 ms of DuckDB whatever its rows)
is not on this thread: the engine takes the batch (``Projection.hand_off``, well under
a millisecond) and the projection's flusher writes it (``store.Flusher``), so a write
offered meanwhile is applied and its writer woken at once; what needs DuckDB up to date
(SQL on the state, the snapshot's copy, a save, a scrub, a stop) waits for the flusher.
A read (``run``) waits only for the batch in hand, never for a SQL round trip, and never
blocks the loop: ``/health``, replication and other callers keep moving while a batch
applies or a query runs.

An engine never stops on an event: a batch whose apply raises is split in halves until
the culprit is found, and that event becomes a dead letter (see ``Projection.skip``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import duckdb

from eventlog.errors import PulseError
from eventlog.keys import Keyring
from eventlog.limits import check_ranges
from eventlog.log import EventLog, LogEntry
from eventlog.sealing import Sealer
from projections.analytics import SqlLimits, SqlQuery, SqlResult, run_async, sandbox
from projections.analytics import export as export_views
from projections.past import PastTables, sql_tables
from projections.projection import Progress, Projection, ProjectionSettings
from projections.snapshot import Snapshot, SnapshotStatus
from projections.sqlworker import SqlWorkers

log = logging.getLogger("pulse.engine")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Applied:
    """What one batch applied: the sequence reached, its entries, the entries of it that
    were kept aside as dead letters (sequence -> reason), and the entries that landed
    after a tombstone of their collective or entity (sequence -> "collective" or
    "entity"; not worked out while catching up, when no writer waits)."""

    seq: int
    entries: Sequence[LogEntry]
    kept_aside: dict[int, str]
    landed_dead: dict[int, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Apply:
    entries: Sequence[LogEntry]
    done: concurrent.futures.Future[int] | None
    only_next: bool = False  # an offer: apply only if it continues what is applied
    bulk: bool = False  # catching up: index and write DuckDB in large batches


@dataclass(slots=True)
class _Call:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    done: concurrent.futures.Future[Any]


_STOP = object()
_WAKE = object()  # a snapshot's copy, or a DuckDB write, ended
SMALL_BATCH = 64  # events a batch indexes before its writers are woken
QUIET = 1.0  # seconds without events before the index files are saved
SQL_TEMP = "sql-temp"  # the SQL workers' temp files, beside the state (removed at open)
SCRUB_DUTY = 10  # a rewrite waits at least this many times its last duration
PRELOAD_KEYS_AFTER = 1000  # events behind at which a catch-up reads every data key first


class Engine:
    """The owner of one projection; start with ``await Engine.start(directory)``."""

    def __init__(self, directory: Path, settings: ProjectionSettings | None) -> None:
        self.directory = directory
        self.settings = settings or ProjectionSettings()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._listeners: list[Callable[[Applied], None]] = []
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._projection: Projection | None = None
        self.seq = 0  # applied in memory; written by the engine thread only
        self.events_applied = 0
        self._submitted = 0
        self._applied_count = 0
        self._busy_at = 0.0  # when the engine last applied something
        self._bulk = False  # catching up: DuckDB is written every checkpoint_events only
        self._thread = threading.Thread(target=self._run, name="pulse-engine", daemon=True)
        self._stop_lock = threading.Lock()
        self._stopped = False  # set before the last look at the inbox
        # what opens the sealed events read from the log (``eventlog.sealing``): an
        # instance's own; None: one with the log's key store, made at the first read
        self.sealer: Sealer | None = None
        self.lent = 0  # SQL cursors handed out and not closed (a scrub waits for none)
        self._queries: set[SqlQuery] = set()  # queries on lent cursors (a scrub stops them)
        self._forgetting = 0  # scrubs waiting for the lent cursors: none is handed out
        self._scrub_took = 0.0  # seconds the last rewrite of the files took
        # the analysts' snapshot (``projections.snapshot``), once the projection is open
        self.snapshot: Snapshot | None = None
        # the processes that run the SQL of principals that may not see every row, over
        # the snapshot (``projections.sqlworker``); None: no snapshot, run here
        self.sql_workers: SqlWorkers | None = None
        self._lent_lock = threading.Lock()  # (released on the threads that ran the query)
        # held by the engine thread for each round of work, and by an inline read (``now``)
        self.round = threading.Lock()
        self._put_count = 0  # work items queued (under _stop_lock) ...
        self._handled = 0  # ... and handled by a round (under round)

    @classmethod
    async def start(
        cls, directory: str | Path, settings: ProjectionSettings | None = None
    ) -> Engine:
        """Open the projection of ``directory`` on a new engine thread (reading DuckDB
        back into memory and loading the indexes happens there, off the loop)."""
        engine = cls(Path(directory), settings)
        engine._thread.start()
        await asyncio.wrap_future(engine._ready)
        return engine

    # -- handing work over (any thread) -----------------------------------------------------

    def subscribe(self, listener: Callable[[Applied], None]) -> None:
        """Call ``listener`` on the engine thread after every applied batch."""
        self._listeners.append(listener)

    @property
    def backlog(self) -> int:
        """Entries handed over and not applied yet."""
        return self._submitted - self._applied_count

    def _put(self, item: _Apply | _Call) -> None:
        """Queue work, or refuse it once the engine has stopped (never left hanging)."""
        with self._stop_lock:
            if not self._stopped:
                self._put_count += 1
                self._inbox.put(item)
                return
        if item.done is not None and not item.done.done():
            item.done.set_exception(PulseError("the projection engine is stopped"))

    def submit(self, entries: Sequence[LogEntry]) -> None:
        """Queue entries to apply (stream order); returns at once."""
        self._submitted += len(entries)
        self._put(_Apply(entries, None))

    def offer(self, entries: Sequence[LogEntry]) -> None:
        """Entries a writer just had acknowledged, in stream order: applied at once if
        they continue exactly what is applied (so no other host's event is skipped),
        dropped otherwise (the tail delivers them). A write then need not wait for its
        own event to travel back through the tail and the decoder."""
        self._put(_Apply(entries, None, only_next=True))

    async def apply(self, entries: Sequence[LogEntry], *, bulk: bool = False) -> int:
        """Apply entries and return the sequence reached. Without ``bulk`` the batch is
        indexed and written to DuckDB before this returns; with it (catching up), the
        indexes and DuckDB follow in large batches (a read or a flush brings them up to
        date first)."""
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._submitted += len(entries)
        self._put(_Apply(entries, done, bulk=bulk))
        return await asyncio.wrap_future(done)

    def call(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(projection, *args)`` on the engine thread."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(_Call(fn, args, done))
        return done

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Await ``fn(projection, *args)`` run on the engine thread; a read marked
        ``inline`` (``projections.queries.inline``) runs on this thread instead when the
        engine is between rounds (see ``now``)."""
        if getattr(fn, "inline", False):
            done, found = self.now(fn, *args)
            if done:  # (a turn for the loop's other tasks, as an awaited hand-off gives)
                await asyncio.sleep(0)
                return found  # type: ignore[return-value]
        return await asyncio.wrap_future(self.call(fn, *args))

    def now(self, fn: Callable[..., T], *args: Any) -> tuple[bool, T | None]:
        """``(True, fn(projection, *args))`` run on this thread if the engine thread is
        between rounds, has no work queued and everything applied is indexed, else
        ``(False, None)`` at once
        (never waits). The projection is the engine thread's: ``round`` is held by it for
        every round of work, and by this call while ``fn`` runs, so ``fn`` sees the
        state between two rounds, as a queued call does, without the two thread hand-
        offs. Read-your-writes holds: a write returns once its round applied it, and a
        round that is not a catch-up's indexes what it applied before it lets go (a
        catch-up's leaves ``unindexed_events``: then the read is queued)."""
        projection = self._projection
        if projection is None or not self._ready.done() or self._stopped:
            return False, None
        if not self.round.acquire(blocking=False):
            return False, None
        try:  # (work queued before this read, or taken by a round not begun: it waits)
            if self._stopped or self._handled != self._put_count or projection.unindexed_events:
                return False, None
            return True, fn(projection, *args)
        finally:
            self.round.release()

    # -- conveniences over run --------------------------------------------------------------

    async def catch_up(
        self,
        log_: EventLog,
        *,
        progress: Progress | None = None,
        subjects: Sequence[str] | None = None,
    ) -> int:
        """Apply everything the log holds past what is applied (on ``subjects`` only, when
        given: a host that follows some collectives); returns how many events. Reading
        the next batch overlaps with applying the previous one."""
        start = self.seq
        end = await log_.last_seq(subjects)
        applied = 0
        pending: collections.deque[tuple[asyncio.Future[int], int]] = collections.deque()

        async def settle() -> None:
            nonlocal applied
            future, count = pending.popleft()
            reached = await future
            applied += count
            if progress is not None:
                progress(reached - start, max(end - start, reached - start))

        # What a catch-up allocates is rows that live as long as the projection and
        # entries that die young without cycles: the cyclic collector would walk the
        # growing state again and again for nothing (half of a 1M-event rebuild: 45 s -> 23 s).
        # It is off until the end, when what was built is frozen out of its sight.
        collecting = gc.isenabled() and end - start >= self.settings.bulk_index_events
        sealer = self._sealer(log_)
        preloaded = end - start >= PRELOAD_KEYS_AFTER
        if preloaded:  # one read of the key store, not one per entity
            await sealer.keyring.preload()
        if collecting:
            gc.disable()
        try:
            # a log that can read a long stretch in a second process does (JetStream)
            if subjects is None:
                read = getattr(log_, "read_bulk", log_.read)
                batches = read(start + 1, batch_size=self.settings.batch_size)
            else:
                batches = log_.read(
                    start + 1, batch_size=self.settings.batch_size, subjects=subjects
                )
            async for batch in batches:
                batch = await sealer.open(batch)
                pending.append((asyncio.ensure_future(self.apply(batch, bulk=True)), len(batch)))
                if len(pending) > 2:
                    await settle()
            while pending:
                await settle()
        finally:  # ends the bulk mode, even when reading failed
            if preloaded:
                sealer.keyring.trim()
            try:
                await self.run(Projection.save)
            finally:
                if collecting:
                    gc.enable()
        await self.run(_out_of_the_collectors_sight, 2)
        await self.readmit(log_)
        return applied

    async def readmit(self, log_: EventLog) -> int:
        """After an upgrade, read every message kept aside again, each by its sequence
        (on a log in partitions, its position; the log still holds it), and fold what now
        reads (``Projection.readmit``);
        returns how many now apply. Nothing is read unless this Pulse reads a newer wire
        schema than the one that kept them aside, but for sealed events whose key had
        not reached the key store: those are read again at every open."""
        due = await self.run(Projection.readmit_due)
        if not due:
            return 0
        if log_.numbered_here and any(position is None for _, _, position in due):
            unplaced = sum(1 for _, _, position in due if position is None)
            log.warning(
                "%d dead letters are not read again: kept aside on a log in partitions "
                "before Pulse kept where (schema 12); a rebuild reads them again",
                unplaced,
            )
            due = [d for d in due if d[2] is not None]
        entries: list[LogEntry] = []
        gone: list[int] = []
        for seq, subject, position in due:  # (a log in partitions: found by its position)
            found = await log_.entry_at(seq, subject, position)
            if found is not None:
                # (a key missing still is not waited for again: it was, when first read)
                entries.extend(await self._sealer(log_).open([found], key_wait=0.0))
            else:
                gone.append(seq)
        readable = await self.run(Projection.readmit, entries, gone)
        log.info("read %d dead letters again: %d now apply", len(due), readable)
        return readable

    def _sealer(self, log_: EventLog) -> Sealer:
        if self.sealer is None:
            self.sealer = Sealer(Keyring(log_.key_store()))
        return self.sealer

    async def flush(self) -> int:
        """Write DuckDB up to what is applied; returns the sequence it reflects."""
        return await self.run(Projection.flush)

    async def digest(self, collective_id: UUID | None = None) -> str:
        return await self.run(Projection.digest, collective_id)

    async def backfill(
        self, log_: EventLog, collective_id: UUID, up_to: int, *, restart: bool = False
    ) -> int:
        """Fold a collective's events up to sequence ``up_to``, from before what is
        applied: a collective this host starts to follow (``projections.scope``).
        ``restart``: an earlier backfill of it did not finish (the history rows it wrote
        go first). Returns how many events."""
        if restart:  # (a log numbered here gives a collective's past below 1: all of it)
            drop_to = 0 if log_.numbered_here else up_to
            await self.run(Projection.drop_history, collective_id, drop_to)
        done = 0
        history = log_.collective_history(collective_id, up_to, batch_size=self.settings.batch_size)
        async with contextlib.aclosing(history) as batches:
            async for batch in batches:
                due = await self._sealer(log_).open(batch)
                done += await self.run(Projection.backfill, due)
        await self.run(Projection.flush)
        return done

    async def checkpoint(self) -> tuple[int, int]:
        """(sequence applied and flushed, events applied in all)."""
        return await self.run(Projection.checkpoint)

    # the limits of the SQL sandbox (projections.analytics); None: from $PULSE_SQL_* at
    # the first cursor. Set it to change them; the next cursor applies them.
    sql_limits: SqlLimits | None = None
    _sandboxed: tuple[int, SqlLimits] | None = None  # (connection, limits) last applied

    def limits(self) -> SqlLimits:
        """The SQL sandbox's limits (read from the environment the first time)."""
        if self.sql_limits is None:
            self.sql_limits = SqlLimits.from_env()
        return self.sql_limits

    async def cursor(self) -> tuple[duckdb.DuckDBPyConnection, int]:
        """A DuckDB cursor in a transaction over a flushed state, and the sequence that
        state reflects: for SQL that may take long, run off the engine thread (DuckDB
        reads are concurrent). Roll it back and close it when done; a query run on it is
        ``track``ed, so that a rewrite of the files after a delete can stop it. The
        database is in the SQL sandbox from the first cursor on (``analytics.sandbox``:
        no extension loading, settings locked, the memory and temp-file limits of
        ``limits()``). While a rewrite waits for the cursors lent before it, none is
        handed out: forgetting first."""
        limits = self.limits()

        def flushed_cursor(p: Projection) -> tuple[duckdb.DuckDBPyConnection, int] | None:
            if self._forgetting or (
                p.scrub_since is not None
                and time.monotonic() - p.scrub_since >= self._scrub_after()
                and not self._forget_now(p)
            ):
                return None
            seq = p.flush()
            self._sandbox(p, limits)
            cursor = p.store.con.cursor()
            cursor.begin()  # its snapshot starts here, before the engine writes again
            with self._lent_lock:
                self.lent += 1
            return cursor, seq

        # (a poll, not an event: the rewrite is done on the engine thread, off the loop)
        while (lent := await self.run(flushed_cursor)) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # the rewrite stopped the queries in its way
        return lent

    def _sandbox(self, p: Projection, limits: SqlLimits) -> None:
        """Put the engine's DuckDB in the SQL sandbox (once per connection and limits):
        the queries on its cursors, and the snapshot it copies, are the analysts'."""
        if self._sandboxed != (id(p.store.con), limits):
            sandbox(p.store.con, limits)
            self._sandboxed = (id(p.store.con), limits)

    def track(self, query: SqlQuery) -> None:
        """``query`` runs on a cursor of ``cursor()``: a rewrite of the files after a
        delete cancels it (``SqlQuery.cancel("forgetting")``) rather than wait for it."""
        with self._lent_lock:
            self._queries.add(query)

    def release(self, query: SqlQuery | None = None) -> None:
        """A cursor of ``cursor()`` is closed (by whoever ran its query): a scrub may
        reopen the database once none is open (``Store.rewrite``)."""
        with self._lent_lock:
            self.lent -= 1
            if query is not None:
                self._queries.discard(query)

    def _stop_queries(self) -> None:
        """Cancel every query on a lent cursor: the files are to be rewritten."""
        with self._lent_lock:
            queries = list(self._queries)
        for query in queries:
            query.cancel("forgetting")

    def _forget_now(self, projection: Projection) -> bool:
        """On the engine thread, a rewrite is due: do it if no cursor is lent (True);
        else cancel the queries on them, to do it once they are closed (False)."""
        if self.lent > 0:
            self._stop_queries()
            return False
        took = self._scrub(projection)
        self._scrub_took = sum(took.values())
        log.info("rewrote the state's files after a delete: %s", took)
        return True

    async def pin_snapshot(
        self, as_of: tuple[int, int | None] | None = None
    ) -> tuple[int, PastTables | None]:
        """Bring the analysts' snapshot up to what is applied (a refresh now, if it
        lacks anything) and wait for it: the file a SQL worker reads
        (``projections.sqlworker``) then holds the caller's own writes. ``as_of``
        (sequence, moment in ms): the past tables of that moment, computed for the very
        state the snapshot copies. Returns the sequence the snapshot holds and the past
        tables (None: the present)."""

        limits = self.limits()

        def pin(
            p: Projection,
        ) -> tuple[concurrent.futures.Future[None] | None, int, PastTables | None]:
            self._sandbox(p, limits)
            snapshot = self.snapshot
            assert snapshot is not None
            copying = snapshot.current(p)
            tables = None if as_of is None else sql_tables(p, as_of[0], as_of[1])
            return copying, p.handed_seq, tables  # (what the copy holds at least)

        copying, seq, tables = await self.run(pin)
        if copying is not None:
            try:
                await asyncio.wrap_future(copying)
            except Exception:  # (logged by the copy's thread)
                raise PulseError(
                    "query: the analysts' snapshot, which it reads, could not be brought up "
                    "to date; retry"
                ) from None
        return seq, tables

    async def sql(
        self,
        query: str,
        activities: list[Any],
        limit: int,
        *,
        viewer: Any = None,
        show_seq: bool = True,
        moment: tuple[int, int | None] | None = None,
    ) -> SqlResult:
        """Run one read-only SQL query (checked by the caller: ``check_read_only``) off
        the engine thread: in a worker process over the analysts' snapshot, brought up to
        date first, or without a snapshot on a cursor of this DuckDB (``cursor()``,
        ``track``ed). ``viewer``: a principal that is not an admin (its views filtered in
        SQL; None: every row); ``show_seq``: the result says the sequence it reflects
        (else 0); ``moment`` (sequence, ms): as of then (``projections.past``).
        Cancelling the awaiting task interrupts the query."""
        limits = self.limits()
        workers = self.sql_workers
        if workers is not None:  # in a process of its own, over the snapshot
            seq, tables = await self.pin_snapshot(moment)
            if moment is not None:
                seq = min(seq, moment[0])
            asked = workers.query(
                query, activities, limit, limits, viewer, tables, seq=seq if show_seq else 0
            )
            return await run_async(asked)  # cancelling the caller kills it
        cursor, seq = await self.cursor()  # (no snapshot: here, on a cursor)
        tables = None
        if moment is not None:
            at, ms = moment
            try:
                tables = await self.run(sql_tables, at, ms)
            except BaseException:
                self.returned(cursor)
                raise
            seq = min(seq, at)
        run = SqlQuery(
            cursor, query, activities, limit, seq if show_seq else 0, limits,
            viewer=viewer, past=tables, on_close=lambda: self.release(run),
        )  # fmt: skip
        self.track(run)  # a rewrite after a delete cancels it
        return await run_async(run)  # cancelling the caller interrupts it

    async def export(self, directory: Path, activities: list[Any]) -> dict[str, int]:
        """Every view as a Parquet file in ``directory`` (and the activities), from one
        transaction over a flushed state (``analytics.export``); the rows per file."""
        cursor, _ = await self.cursor()
        return await asyncio.to_thread(export_views, cursor, directory, activities, self.release)

    def returned(self, cursor: duckdb.DuckDBPyConnection) -> None:
        """Close a cursor of ``cursor()`` that no query thread holds, and release it."""
        with contextlib.suppress(duckdb.Error):
            cursor.close()
        self.release()

    def writer_failure(self) -> str | None:
        """Why the projection's DuckDB writer fails (None: it does not): it keeps what
        it could not write and tries again; meanwhile the SQL of the present and the
        snapshot wait, and the log holds everything past DuckDB's checkpoint."""
        projection = self._projection
        error = None if projection is None else projection.flusher.error
        return None if error is None else repr(error)

    def snapshot_status(self) -> SnapshotStatus | None:
        """The analysts' snapshot: its path, the sequence it holds, its age and bound
        (None: this engine keeps none)."""
        return None if self.snapshot is None else self.snapshot.status()

    async def scrub(self, timeout: float = 60.0) -> dict[str, float]:
        """Rewrite the state's files now (``Projection.scrub``: ``pulse compact``): the
        SQL queries in flight are cancelled (their callers are told to retry), none
        starts until it is done; returns the seconds each part took. Only an export (a
        file of every row, an admin's) is waited for, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        self._forgetting += 1
        try:
            while True:
                self._stop_queries()
                if self.lent == 0:
                    took = await self.run(_scrub_when_free, self)
                    if took is not None:
                        return took
                if time.monotonic() > deadline:
                    raise PulseError(
                        f"{self.lent} SQL cursors (an export?) are still open after "
                        f"{timeout:g} s; compact again"
                    )
                await asyncio.sleep(0.02)
        finally:
            self._forgetting -= 1

    async def close(self) -> None:
        """Flush, save the indexes and stop the thread (and the SQL workers)."""
        if self.sql_workers is not None:
            await asyncio.to_thread(self.sql_workers.close)
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            await asyncio.to_thread(self._thread.join)

    # -- the engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            projection = self._projection = Projection(self.directory, self.settings)
        except BaseException as exc:
            with self._stop_lock:
                self._stopped = True
            self._ready.set_exception(exc)
            return
        self.seq = projection.seq
        projection.flusher.on_written = lambda: self._inbox.put(_WAKE)
        interval = self.settings.snapshot_interval
        if interval is not None:
            try:
                self.snapshot = Snapshot(self.directory, interval, lambda: self._inbox.put(_WAKE))
                self.snapshot.adopt(projection)
                self.sql_workers = SqlWorkers(self.snapshot.path, self.directory / SQL_TEMP)
                self.snapshot.on_replaced = self.sql_workers.replaced
            except Exception:  # the state serves without it; the log says why
                log.exception("the analysts' snapshot could not be opened; going on without")
                self.snapshot = None
        self._ready.set_result(None)
        stopping = False
        while not stopping:
            try:
                items = [self._inbox.get(timeout=self._idle_timeout(projection))]
            except queue.Empty:
                items = []
            while True:
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            try:
                with self.round:
                    try:
                        stopping = self._handle(projection, items)
                    finally:
                        self._handled += sum(isinstance(i, (_Apply, _Call)) for i in items)
            except Exception as exc:  # a bug must not stop the engine: fail this round only
                log.exception("the engine failed on a round of work; going on")
                for item in items:
                    future = item.done if isinstance(item, (_Apply, _Call)) else None
                    if future is not None and not future.done():
                        future.set_exception(exc)
                stopping = any(item is _STOP for item in items)
        self.round.acquire()  # (kept: no read runs inline from here on)
        try:
            if self.snapshot is not None:
                self.snapshot.close(projection)  # waits for a copy; the last changes
        except Exception:
            log.exception("refreshing the analysts' snapshot at the stop failed")
        try:
            projection.close()
        except Exception:
            log.exception("closing the projection failed; the log still holds every event")
        with self._stop_lock:
            self._stopped = True  # from now on work is refused at the door
        while True:  # anything queued behind the stop is refused, not left hanging
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            pending: concurrent.futures.Future[Any] | None = (
                item.done if isinstance(item, (_Apply, _Call)) else None
            )
            if pending is not None and not pending.done():
                pending.set_exception(PulseError("the projection engine is stopped"))

    def _handle(self, projection: Projection, items: list[Any]) -> bool:
        """One round: apply what queued up as one batch, answer the calls, write DuckDB
        when due; returns whether a stop was asked for."""
        stopping = False
        entries: list[LogEntry] = []
        waiting: list[concurrent.futures.Future[int]] = []
        calls: list[_Call] = []
        bulk = False
        following = projection.seq + 1  # the sequence that continues what is applied
        handed_over = 0  # entries of submit / apply (the backlog counts those)
        for item in items:
            if isinstance(item, _Apply):
                if not item.entries:
                    if item.done is not None:
                        waiting.append(item.done)  # nothing to apply: answered at once
                    continue
                if item.only_next:
                    first = item.entries[0].seq
                    if first > following or item.entries[-1].seq < following:
                        continue  # a gap before it, or already applied: the tail has it
                    fresh = _in_range([e for e in item.entries if e.seq >= following])
                    if fresh:
                        entries.extend(fresh)
                        following = fresh[-1].seq + 1
                    continue
                handed_over += len(item.entries)
                bulk = bulk or item.bulk
                entries.extend(item.entries)
                following = max(following, item.entries[-1].seq + 1)
                if item.done is not None:
                    waiting.append(item.done)
            elif isinstance(item, _Call):
                calls.append(item)
            elif item is _STOP:
                stopping = True
        self._applied_count += handed_over
        if calls or (entries and not bulk):
            self._bulk = False  # a catch-up ends with a call (saving); live work is here
        elif bulk:
            self._bulk = True
        projection.defer_graphs = self._bulk
        if entries:
            self._busy_at = time.monotonic()
            self._apply(projection, entries, bulk)  # listeners (writers waiting) hear now
        if calls or not bulk or projection.unindexed_events >= self.settings.bulk_index_events:
            projection.sync_indexes()  # after the writers were woken, before any read
        for call in calls:
            if call.done.set_running_or_notify_cancel():
                try:
                    call.done.set_result(call.fn(projection, *call.args))
                except BaseException as exc:
                    call.done.set_exception(exc)
        # a catch-up (apply with a future) hears after its batch is written to DuckDB,
        # so the progress it reports is durable; live writers heard above already
        self._housekeeping(
            projection,
            flush=stopping
            or (bool(waiting) and not bulk)
            or (bulk and projection.unflushed >= self.settings.checkpoint_events),
            save=stopping,
            bulk=self._bulk,
            changed_at=self._busy_at if entries else time.monotonic(),
            stopping=stopping,
        )
        for future in waiting:
            if not future.done():  # a caller may have given up (cancelled) meanwhile
                future.set_result(self.seq)
        return stopping

    def _idle_timeout(self, projection: Projection) -> float | None:
        now = time.monotonic()
        if self._bulk:
            return None  # the catch-up's next batch, or its closing call, wakes us
        due: list[float] = []
        if projection.scrub_since is not None:  # (SQL readers in flight: look again soon)
            scrub = projection.scrub_since + self._scrub_after()
            due.append(scrub if self.lent == 0 else max(scrub, now + 0.02))
        if self.snapshot is not None and (snapshot := self.snapshot.due()) is not None:
            due.append(snapshot)
        if projection.dirty:  # (while the flusher writes, its end wakes the engine)
            if not projection.flusher.busy:
                due.append(projection.last_flush + self.settings.flush_interval)
        elif projection.saved_seq < projection.flushed_seq:
            due.append(
                max(projection.last_save + self.settings.save_interval, self._busy_at + QUIET)
            )
        return max(0.0, min(due) - now) if due else None

    def _scrub_after(self) -> float:
        """Seconds a delete waits for the files to be rewritten: ``scrub_after``, or ten
        times what the last rewrite took if that is longer (under a stream of deletes,
        rewriting a large state takes at most a tenth of the engine's time)."""
        return max(self.settings.scrub_after, SCRUB_DUTY * self._scrub_took)

    def _save_due(self, projection: Projection, now: float) -> bool:
        """Index files are saved once ``save_interval`` has passed and the engine has been
        quiet for a moment (writing them holds the thread for tens of milliseconds, which
        a write waiting behind it would feel), or in any case after ten intervals."""
        if projection.saved_seq >= projection.flushed_seq:
            return False
        since = now - projection.last_save
        return (since >= self.settings.save_interval and now - self._busy_at >= QUIET) or (
            since >= 10 * self.settings.save_interval
        )

    def _apply(self, projection: Projection, entries: list[LogEntry], bulk: bool = False) -> None:
        before = projection.seq
        if (
            entries
            and entries[0].seq > before
            and all(  # one stretch of a read, as a catch-up hands it over
                b.seq - a.seq == 1 for a, b in zip(entries, entries[1:], strict=False)
            )
        ):
            ordered = entries
        else:
            fresh: dict[int, LogEntry] = {}  # an offer and the tail may both carry one event
            for entry in entries:
                if entry.seq > before:
                    fresh.setdefault(entry.seq, entry)
            if not fresh:
                return
            ordered = [fresh[seq] for seq in sorted(fresh)]
        rejected = projection.memory.rejected
        rejected_before = len(rejected)
        self._apply_or_split(projection, ordered)
        if len(ordered) <= SMALL_BATCH:
            # a few events index in microseconds: do it before waking the writers, who
            # would otherwise contend for the GIL with it; a large batch wakes them first
            projection.sync_indexes()
        self.seq = projection.seq
        self.events_applied += len(ordered)
        kept_aside = (  # looked for only when this batch kept something aside
            {e.seq: rejected[e.seq].reason for e in ordered if e.seq in rejected}
            if len(rejected) > rejected_before
            else {}
        )
        landed_dead: dict[int, str] = {}
        if not bulk:
            memory = projection.memory
            for entry in ordered:
                if entry.event is not None and (why := memory.landed_dead(entry.event)):
                    landed_dead[entry.seq] = why
        applied = Applied(self.seq, ordered, kept_aside, landed_dead)
        for listener in self._listeners:
            try:
                listener(applied)
            except Exception:
                log.exception("a listener of applied batches failed")

    def _apply_or_split(self, projection: Projection, entries: Sequence[LogEntry]) -> None:
        """Apply a batch; if it raises, apply its halves (the fold is order-free and
        idempotent, so what the failed attempt merged is merged again harmlessly) until
        the one event that raises is found and kept aside."""
        try:
            projection.apply(entries)
        except Exception as exc:
            if len(entries) == 1:
                log.warning("event at sequence %d kept aside: %r", entries[0].seq, exc)
                projection.skip(entries[0], f"cannot apply: {exc}")
                return
            middle = len(entries) // 2
            self._apply_or_split(projection, entries[:middle])
            self._apply_or_split(projection, entries[middle:])

    def _housekeeping(
        self,
        projection: Projection,
        *,
        flush: bool,
        save: bool,
        bulk: bool = False,
        changed_at: float = 0.0,
        stopping: bool = False,
    ) -> None:
        """Hand DuckDB's write to the flusher when it is due (or write it and wait for
        it, when asked: ``flush``), save the indexes when that is due,
        rewrite the files when a delete waits for it, and refresh the analysts' snapshot
        when it is due; in a bulk round only write DuckDB, and only when asked.
        ``changed_at``: when what this round applied was applied."""
        now = time.monotonic()
        snapshot = self.snapshot
        if snapshot is not None:
            snapshot.ended()
            snapshot.note(projection, changed_at)
        try:
            projection.flusher.check()  # (a writer thread that died starts again)
            if flush:  # asked for: DuckDB up to date before the round ends
                projection.flush()
            elif (
                not bulk
                and projection.dirty
                and not projection.flusher.busy  # (memory gathers the changes meanwhile)
                and (
                    now - projection.last_flush >= self.settings.flush_interval
                    or projection.unflushed >= self.settings.flush_events
                )
            ):
                projection.hand_off()  # written beside the engine (store.Flusher)
            if save or self._save_due(projection, now):
                projection.save(background=not save)  # (the files written beside the engine)
                _out_of_the_collectors_sight(projection, 2)  # quiet: nobody waits on it
            if (
                not bulk
                and projection.scrub_since is not None
                and now - projection.scrub_since >= self._scrub_after()
            ):
                try:  # (queries in its way are cancelled; it is done once they are gone)
                    self._forget_now(projection)
                except Exception:  # tried again after the bound, not at once
                    projection.scrub_since = now
                    raise
        except Exception:  # DuckDB refused: keep applying in memory, try again later
            log.exception("writing the projection failed; retrying at the next interval")
            projection.last_flush = projection.last_save = now
        if (
            snapshot is not None
            and not bulk
            and not stopping
            and (due := snapshot.due()) is not None
            and due <= time.monotonic()
        ):
            try:
                snapshot.refresh(projection)
            except Exception:  # (its copy's own failures are logged by its thread)
                log.exception("refreshing the analysts' snapshot failed; trying again later")

    def _scrub(self, projection: Projection) -> dict[str, float]:
        """``Projection.scrub``, once the snapshot's copy in flight has ended; the
        snapshot becomes a copy of the rewritten file (live rows only)."""
        snapshot = self.snapshot
        if snapshot is None:
            return projection.scrub()
        snapshot.settle()

        def copy(fresh: Path) -> None:
            try:
                snapshot.publish(fresh, projection)
            except Exception:  # forgetting first: no snapshot rather than a stale one
                log.exception("copying the rewritten state to the snapshot failed; removed it")
                snapshot.drop()

        return projection.scrub(copy)


def sql_of_projection(p: Projection, query: str, limit: int, as_of: int | None = None) -> SqlResult:
    """A SQL query over a projection that no engine runs (tools and benchmarks that hold
    a bare ``Projection``), on the calling thread, with every row (an admin's), as of
    sequence ``as_of`` (None: now). An engine's queries go through ``Engine.sql``."""
    tables = None if as_of is None else sql_tables(p, as_of)
    cursor = p.store.con.cursor()
    cursor.begin()
    return SqlQuery(cursor, query, [], limit, p.seq, SqlLimits(), past=tables).run()


def _scrub_when_free(projection: Projection, engine: Engine) -> dict[str, float] | None:
    if engine.lent > 0:  # a cursor handed out since the loop looked (an export): wait
        return None
    return engine._scrub(projection)


def _out_of_the_collectors_sight(_: Projection, generation: int) -> None:
    """Collect the garbage, then freeze what survives out of the cyclic collector's
    sight. The folded rows live as long as the projection (and are freed by reference
    counting, without cycles, when it closes); left in view, every full collection walks
    all of them and pauses every thread, tens of milliseconds per 100,000 rows, which
    showed as spikes in write latency and /health. Run with a full collection first (so
    no garbage cycle is frozen for good) after catching up and after the periodic saves,
    which wait for a quiet moment."""
    gc.collect(generation)
    gc.freeze()


def _in_range(offered: list[LogEntry]) -> list[LogEntry]:
    """The offered entries up to the first whose event breaks a limit of
    ``eventlog.limits``: that one is left to the tail, whose decoded copy the codec
    refuses in the same words as on every other host (offers skip the codec)."""
    for at, entry in enumerate(offered):
        try:
            check_ranges(entry.event)  # type: ignore[arg-type]
        except ValueError:
            return offered[:at]
    return offered

"""The analysts' snapshot: a read-only copy of the state's DuckDB file, refreshed by the
engine, that any other process may open while Pulse runs.

DuckDB lets one process write a database file, and while it writes, no other process may
open it, not even read-only ("Could not set lock on file ... Conflicting lock is held").
The engine writes ``state.duckdb`` several times a second, so an analyst's DuckDB CLI,
notebook, pandas or Polars could not read it while Pulse ran. The snapshot is another
file, ``snapshot.duckdb`` beside it (``<data dir>/state/snapshot.duckdb``), that no
process keeps open for writing: ``duckdb.connect(path, read_only=True)`` opens it at any
moment, and every table and view of the state is in it, under the same names.

How it is made, and why so:

- A refresh writes a new file (``.tmp``), then ``os.replace``s it onto
  ``snapshot.duckdb``. A reader that opens the path after the rename reads the new
  file, whole; one that had the old file open reads the old one until it closes it (on
  Linux the unlinked file lives on for it). A reader never sees a file half written,
  and the writer never waits for readers.
- Caught up, usually: the new file is a byte copy of the current snapshot (which no
  process writes, so the copy is whole), into which the rows changed since are merged:
  every keyed table's rows with ``updated_seq`` at or past the snapshot's sequence
  (every write stamps the rows it writes), the history tables' rows past it (they are
  only appended to), and the few small tables whole. A 20,000-experience state costs
  tens of milliseconds so, against a second or more to copy it whole
  (``ops/bench/snapshot.py``).
- Copied whole (``COPY FROM DATABASE``, a logical copy) when the snapshot cannot be
  caught up that way: the first time, after anything that removes rows or adds them
  under old sequences (a delete, a backfill, dead letters read again:
  ``Projection.reshaped``), after a failed refresh, and once the snapshot's file has
  grown past twice the state's and more (rows replaced leave free blocks). A logical copy holds
  live rows only, none of the bytes deleted rows leave in the state's free blocks, so
  after a delete the snapshot forgets what the state forgot. The views are copied as
  their SQL, naming their tables unqualified, so they read the copy's own tables.
- Off the engine thread: the engine hands what it applied to the projection's DuckDB
  writer (``Projection.hand_off``: it does not wait for the write) and a cursor to a
  thread of this module, which waits for that write, opens the cursor's transaction
  (the state as of that moment, whatever is written after), copies and renames; DuckDB
  reads run beside the writer's writes. The engine thread is woken when a copy ends. A
  scrub (which reopens the state's file) and a stop wait for a copy in flight.
- Only when something changed: the projection counts its DuckDB writes handed off
  (``Projection.writes``); the snapshot is stale while that count, or anything applied
  and not yet handed off, is past what it holds. (A copy may hold a write or two more
  than it counts, handed off while it waited: the next refresh then copies again.)
- The bound. A change waits at most ``wait()`` plus one refresh to be in the snapshot:
  refreshes start at most every ``wait()`` seconds (``snapshot_interval``, 1 s, or ten
  times what the last refresh of the kind owed, caught up or whole, took if that is
  longer, so that refreshing a large state costs at most about a tenth of a core), and
  the refresh takes what the last of its kind took. ``status()`` reports the bound, the sequence
  the snapshot holds and its current age (how long the oldest change it lacks has
  waited); ``pulse status`` and ``/health`` print them.
- Forgetting: a delete is a change like any other, so the snapshot is rewritten from
  the live, already purged, state within the bound; a scrub (``pulse compact``) puts a
  copy of its own freshly rewritten file in place at once. The old file's name is gone
  at the rename (a reader that still holds it open keeps reading it until it closes it:
  the SQL workers of ``projections.sqlworker`` are told, ``on_replaced``, and let go).
- Crash safety: the snapshot is derived; a ``.tmp`` left by a crash is removed when the
  engine opens, and a snapshot that does not hold the state's checkpoint and schema is
  refreshed at once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import msgspec

if TYPE_CHECKING:  # (the projection module imports the engine, which imports this one)
    from projections.projection import Projection

log = logging.getLogger("pulse.snapshot")

SNAPSHOT_NAME = "snapshot.duckdb"
SNAPSHOT_DUTY = 10  # refreshes wait at least this many times the last one's duration
# a snapshot file past this many times the state's (write-ahead log included), plus
# GROWTH_FLOOR bytes, is copied whole again
GROWTH, GROWTH_FLOOR = 2, 32 * 1024 * 1024
APPENDED = ("audit_rows", "count_history")  # history: rows only added, by sequence
_ALIAS = "pulse_snapshot"  # the copy's name while it is attached to the engine's database


class SnapshotStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The analysts' snapshot, as ``pulse status`` and ``/health`` report it."""

    path: str  # open it with duckdb.connect(path, read_only=True)
    seq: int  # the stream sequence the snapshot holds (0: none written yet)
    taken_at: str | None  # when the state it holds was read (UTC, ISO 8601)
    age: float  # seconds the oldest change it does not hold has waited (0: current)
    bound: float  # seconds within which a change reaches it, at the last copy's cost
    took: float  # seconds the last refresh took


class Snapshot:
    """The snapshot of one state directory; the engine thread calls every method but
    ``status`` (any thread) and the copy (its own thread)."""

    def __init__(self, directory: Path, interval: float, wake: Callable[[], None]) -> None:
        self.path = directory / SNAPSHOT_NAME
        self._tmp = directory / (SNAPSHOT_NAME + ".tmp")
        self.interval = interval
        self._wake = wake  # tells the engine thread a copy ended
        self._lock = threading.Lock()  # the fields a copy's thread sets
        self.seq = 0
        self.took = 0.0  # seconds the last refresh took
        self.whole = False  # whether it copied the state whole (or caught the copy up)
        self._took = {True: 0.0, False: 0.0}  # ... the last whole copy, the last catch-up
        self._taken_at: str | None = None
        # (Projection.writes, Projection.reshaped) in the snapshot (or the copy in
        # flight); None: nothing it can be caught up from
        self._holds: tuple[int, int] | None = None
        self._whole_owed = True  # (for the bound) the next refresh copies the state whole
        self._started = -1e9  # when the last refresh began (monotonic)
        self._stale_since: float | None = None  # the oldest change nothing holds yet
        self._copying: concurrent.futures.Future[None] | None = None
        self._copying_since: float | None = None  # the oldest change the copy takes
        # told (on the thread that did it) when a whole copy took the path's place or
        # the file is gone: a reader of the old file must let go of it (the SQL workers)
        self.on_replaced: Callable[[], None] | None = None
        self._remove_leftovers()

    # -- the engine thread -----------------------------------------------------------------

    def adopt(self, projection: Projection) -> None:
        """At open: take the snapshot on disk as current if it holds the state's
        checkpoint and schema version (a clean stop leaves it so); otherwise it is
        stale from now, and refreshed at the first round."""
        wanted = _identity(projection.store.con)
        found: tuple[object, ...] | None = None
        taken_at: tuple[str] | None = None
        if self.path.exists():
            try:
                con = duckdb.connect(str(self.path), read_only=True)
                try:
                    found = _identity(con)
                    taken_at = con.execute(
                        "SELECT value FROM meta WHERE key = 'snapshot_taken_at'"
                    ).fetchone()
                finally:
                    con.close()
            except duckdb.Error:  # unreadable (a crash, a disk fault): written again
                found = None
        if found is not None and found == wanted:
            self.seq = int(wanted[0])  # type: ignore[call-overload]
            self._taken_at = taken_at[0] if taken_at else None
            self._holds = (projection.writes, projection.reshaped)
        else:
            self._stale_since = time.monotonic()

    def stale(self, projection: Projection) -> bool:
        """Whether the projection holds changes the snapshot (or the copy in flight)
        does not."""
        return (
            projection.dirty
            or self._holds is None
            or projection.writes != self._holds[0]
            or projection.reshaped != self._holds[1]
        )

    def _whole(self, projection: Projection) -> bool:
        """Whether the next refresh must copy the state whole (see the module)."""
        return self._holds is None or projection.reshaped != self._holds[1]

    def note(self, projection: Projection, at: float) -> None:
        """After an engine round: changes at ``at`` the snapshot does not hold."""
        if self._stale_since is None and self.stale(projection):
            self._stale_since = at
            self._whole_owed = self._whole(projection)
        elif self._stale_since is not None and not self._whole_owed:
            self._whole_owed = self._whole(projection)

    def wait(self) -> float:
        """Seconds between the starts of two refreshes: ``interval``, or ten times what
        the last refresh of the kind owed (caught up, or whole) took if that is longer."""
        return max(self.interval, SNAPSHOT_DUTY * self._took[self._whole_owed])

    def due(self) -> float | None:
        """When the next refresh may start (monotonic); None: none is due, or a copy
        is in flight (its end wakes the engine)."""
        if self._stale_since is None or self._copying is not None:
            return None
        return max(self._started + self.wait(), self._stale_since)

    def refresh(self, projection: Projection) -> concurrent.futures.Future[None]:
        """Start a refresh: hand off what is applied to the DuckDB writer, and on a
        thread of its own wait for that write, pin the state in a cursor's transaction
        and copy it; returns the copy's future."""
        self.settle()
        self._started = time.monotonic()  # (a failure too waits for the next turn)
        written = projection.hand_off()
        self._remove_leftovers()
        whole = self._whole(projection) or not self.path.exists()
        if not whole:
            state = sum(
                f.stat().st_size
                for f in (projection.store.path, Path(f"{projection.store.path}.wal"))
                if f.exists()
            )
            whole = self.path.stat().st_size > GROWTH * state + GROWTH_FLOOR
        cursor = projection.store.con.cursor()  # (made here: the engine's connection)
        self._holds = (projection.writes, projection.reshaped)
        self._copying_since, self._stale_since = self._stale_since, None
        copying: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._copying = copying
        thread = threading.Thread(
            target=self._copy,
            args=(cursor, written, None if whole else self.seq, copying),
            name="pulse-snapshot",
            daemon=True,
        )
        thread.start()
        return copying

    def current(self, projection: Projection) -> concurrent.futures.Future[None] | None:
        """Make the file hold what the projection holds: the copy (started now if it
        lacks anything, else the one in flight) to wait for; None: it holds it."""
        if self.stale(projection):
            return self.refresh(projection)
        return self._copying

    def settle(self) -> None:
        """Wait for a copy in flight to end (before the state's file is reopened, the
        projection closes, or another refresh starts)."""
        copying = self._copying
        if copying is None:
            return
        concurrent.futures.wait([copying])
        self._copying = None
        if copying.exception() is not None:  # (logged) what it was to hold is still owed,
            self._holds = None  # and copied whole (what the failure left is unknown)
            waiting = [t for t in (self._copying_since, self._stale_since) if t is not None]
            self._stale_since = min(waiting, default=time.monotonic())
        with self._lock:
            self._copying_since = None

    def ended(self) -> None:
        """An engine round: let go of a copy that has ended."""
        if self._copying is not None and self._copying.done():
            self.settle()

    def publish(self, fresh: Path, projection: Projection) -> None:
        """Put a copy of ``fresh`` (the state's file just rewritten by a scrub: live rows
        only, nothing written to it since) in place of the snapshot."""
        self.settle()
        self._remove_leftovers()
        start = time.perf_counter()
        taken_at = _now()
        shutil.copyfile(fresh, self._tmp)
        con = duckdb.connect(str(self._tmp))
        try:
            con.execute("INSERT OR REPLACE INTO meta VALUES ('snapshot_taken_at', ?)", [taken_at])
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.replace(self._tmp, self.path)
        self._replaced()
        with self._lock:
            self.seq = projection.flushed_seq
            self._taken_at = taken_at
            self.took = time.perf_counter() - start
            self.whole = True
        self._holds = (projection.writes, projection.reshaped)
        self._started = time.monotonic()
        self._stale_since = self._copying_since = None

    def drop(self) -> None:
        """Remove the snapshot (a copy that could not be made must not leave an older
        one holding what was deleted); the next refresh writes it whole."""
        self.settle()
        self.path.unlink(missing_ok=True)
        self._replaced()
        self._holds = None
        if self._stale_since is None:
            self._stale_since = time.monotonic()
        self._whole_owed = True

    def close(self, projection: Projection) -> None:
        """At a stop: wait for the copy in flight, then refresh once more if the state
        changed since (so the path holds the state Pulse stopped at)."""
        self.settle()
        if self.stale(projection):
            self.refresh(projection)
            self.settle()

    def status(self) -> SnapshotStatus:
        now = time.monotonic()
        with self._lock:
            waiting = [t for t in (self._copying_since, self._stale_since) if t is not None]
            return SnapshotStatus(
                path=str(self.path),
                seq=self.seq,
                taken_at=self._taken_at,
                age=round(max(0.0, now - min(waiting)), 3) if waiting else 0.0,
                bound=round(self.wait() + self._took[self._whole_owed], 3),
                took=round(self.took, 3),
            )

    # -- the copy's thread -----------------------------------------------------------------

    def _copy(
        self,
        cursor: duckdb.DuckDBPyConnection,
        written: concurrent.futures.Future[int] | None,
        since: int | None,
        copying: concurrent.futures.Future[None],
    ) -> None:
        """Once the DuckDB write ``written`` has ended (None: none was in flight), copy
        the state pinned in ``cursor``'s transaction: whole, or (``since``: the sequence
        the snapshot holds) into a copy of the snapshot, the changes since. A write that
        failed fails the copy (it is tried again, whole, at a later refresh)."""
        try:
            try:
                if written is not None:
                    written.result()
                start = time.perf_counter()  # (what it took: the copy, not the write)
                taken_at = _now()
                cursor.begin()
                # reading the checkpoint pins the transaction's view of the state here
                found = cursor.execute("SELECT seq FROM checkpoint WHERE id = 1").fetchone()
                seq = int(found[0]) if found else 0
                named = cursor.execute("SELECT current_database()").fetchone()
                assert named is not None
                database = str(named[0])
                if since is None:
                    cursor.execute(f"ATTACH '{_quoted(self._tmp)}' AS {_ALIAS}")
                    cursor.execute(f'COPY FROM DATABASE "{database}" TO {_ALIAS}')
                else:
                    shutil.copyfile(self.path, self._tmp)
                    cursor.execute(f"ATTACH '{_quoted(self._tmp)}' AS {_ALIAS}")
                    for statement in _catching_up(cursor, database, since):
                        cursor.execute(statement)
                cursor.execute(
                    f"INSERT OR REPLACE INTO {_ALIAS}.meta VALUES ('snapshot_taken_at', ?)",
                    [taken_at],
                )
                cursor.commit()
                cursor.execute(f"DETACH {_ALIAS}")
            finally:
                with contextlib.suppress(duckdb.Error):
                    cursor.close()  # (a failed copy: rolls back and detaches)
            os.replace(self._tmp, self.path)
            if since is None:
                self._replaced()
        except BaseException as exc:
            log.exception("refreshing the analysts' snapshot failed; trying again later")
            self._remove_leftovers()
            copying.set_exception(exc)
        else:
            with self._lock:
                self.seq = seq
                self._taken_at = taken_at
                self.took = self._took[since is None] = time.perf_counter() - start
                self.whole = since is None
                self._copying_since = None
            copying.set_result(None)
        self._wake()

    def _replaced(self) -> None:
        if self.on_replaced is not None:
            try:
                self.on_replaced()
            except Exception:
                log.exception("telling the snapshot's readers it was replaced failed")

    def _remove_leftovers(self) -> None:
        for leftover in (self._tmp, Path(f"{self._tmp}.wal")):
            leftover.unlink(missing_ok=True)


def _catching_up(cursor: duckdb.DuckDBPyConnection, database: str, since: int) -> list[str]:
    """The statements that bring a copy of the snapshot (attached as ``_ALIAS``) holding
    the state up to ``since`` to the state: per table of the state, the rows written at
    or past ``since`` replace theirs (tables keyed and stamped with ``updated_seq``;
    a row written again is the same row), the history's rows past ``since`` are added,
    and any other table is copied whole (the checkpoint, meta, the dead letters)."""
    columns: dict[str, set[str]] = {}
    for table, column in cursor.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = ? "
        "AND schema_name = 'main' AND table_name IN (SELECT table_name FROM duckdb_tables() "
        "WHERE database_name = ? AND schema_name = 'main')",
        [database, database],
    ).fetchall():
        columns.setdefault(table, set()).add(column)
    statements = []
    for table, names in sorted(columns.items()):
        source, target = f'"{database}".main.{table}', f"{_ALIAS}.main.{table}"
        if table in APPENDED:
            statements.append(
                f"INSERT INTO {target} SELECT * FROM {source} WHERE seq > {int(since)}"
            )
        elif "updated_seq" in names:
            statements.append(
                f"INSERT OR REPLACE INTO {target} SELECT * FROM {source} "
                f"WHERE updated_seq >= {int(since)}"
            )
        else:
            statements.append(f"DELETE FROM {target}")
            statements.append(f"INSERT INTO {target} SELECT * FROM {source}")
    return statements


def _identity(con: duckdb.DuckDBPyConnection) -> tuple[object, ...]:
    """What says a snapshot holds a state: its checkpoint, its schema version, and the
    number of rows of each of its history tables (a backfill that started over removes
    some without moving the checkpoint)."""
    checkpoint = con.execute("SELECT seq, applied FROM checkpoint WHERE id = 1").fetchone()
    version = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    counts = [con.execute(f"SELECT count(*) FROM {t}").fetchone() for t in APPENDED]
    return (*(checkpoint or (0, 0)), version[0] if version else None, *counts)


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")

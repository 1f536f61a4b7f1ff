"""DuckDB storage of the folded rows: the analytical copy and the checkpoint.

The engine (``projections.engine``) folds events in memory (``projections.state``) and
takes the rows that changed since its last write as a ``Batch`` (their values frozen:
``freeze``); the projection's ``Flusher`` thread writes the batches in order, each with
``Store.write``: one columnar insert per table (Arrow columns, staged on that thread)
and the checkpoint advanced in the same transaction. Whatever happened after the
checkpoint is still in the log, so a crash loses nothing. On open, ``rows`` reads the
state back into memory. One writer per database: the instance's process."""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import hashlib
import json
import logging
import operator
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from itertools import repeat
from pathlib import Path
from typing import Any
from uuid import UUID, SafeUUID

import duckdb
import msgspec
import numpy as np
import pyarrow as pa

from eventlog.errors import PulseError
from projections import schema
from projections.fold import (
    ApplicationRow,
    CheckpointRow,
    CollectiveRow,
    ExperienceRow,
    InsightRow,
    PendingWriteRow,
    RelationRow,
    Row,
    SessionRow,
    ThreadRow,
    TokenRow,
    WisdomRow,
)
from projections.state import Audited, Counted, Rejected

TABLE_OF: dict[type[Row], str] = {
    CollectiveRow: "collective_rows",
    ExperienceRow: "experience_rows",
    ApplicationRow: "application_rows",
    RelationRow: "relation_rows",
    InsightRow: "insight_rows",
    WisdomRow: "wisdom_rows",
    TokenRow: "token_rows",
    SessionRow: "session_rows",
    CheckpointRow: "checkpoint_rows",
    PendingWriteRow: "pending_write_rows",
    ThreadRow: "thread_rows",
}
# the rows of a thread apart from its tombstone: a part of it, not an entity of their own
_THREAD_PARTS = (CheckpointRow, PendingWriteRow)


log = logging.getLogger("pulse.store")

CHECKPOINT_THRESHOLD = "256MB"  # see Store.__init__
# The flusher folds DuckDB's write-ahead log into the file once the log passes this
# (``Flusher``): until a checkpoint, DuckDB keeps every row written since the last one in
# memory as well as in the log (145 MB at 50,000 experiences ingested without a pause)
WAL_FOLD = 16 * 2**20
# DuckDB's buffer pool for the engine (see Store._connect). Not lower: the analysts'
# snapshot copies through this instance, and its whole copy failed at 128 MB (out of
# memory at 30,000 experiences: the blocks it pins cannot be evicted)
MEMORY_LIMIT = "1GB"


def first(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...] | None:
    """The first row of a query's result (None: no row), with the result read to its end.

    ``fetchone()`` leaves the result open, and with it the cursor's transaction, until
    the next statement on that cursor: on the engine's connection, idle while a host
    ingests, that kept a transaction open for good, so DuckDB could not clean up the
    versions the flusher's UPDATEs left and refused every CHECKPOINT ("other write
    transactions active"), holding every row written since the open in memory
    (``IN_MEMORY_TABLE``: 145 MB at 50,000 experiences) and its write-ahead log growing."""
    rows = result.fetchall()
    return tuple(rows[0]) if rows else None


def stored_columns(row_type: type[Row]) -> list[str]:
    """The fields of a row type DuckDB holds (all but a placed row's strays)."""
    return [f.name for f in fields(row_type) if f.name != "strays"]


class StateInUse(PulseError):
    """Another process holds the projection's database (DuckDB allows one writer)."""


class SchemaError(PulseError):
    """The database was written by a newer Pulse, or cannot be migrated."""


@contextlib.contextmanager
def holding_file(database: Path, doing: str) -> Iterator[None]:
    """Hold a database file the way its owner does (DuckDB: one process per file) while
    the block runs, so that no other process opens it meanwhile (a service starting
    fails): StateInUse, naming the holder's pid when DuckDB tells it, while another
    process has it open. A file DuckDB cannot read is not held (whoever is ``doing``
    something to it replaces it)."""
    con = None
    try:
        con = duckdb.connect(str(database))
    except duckdb.Error as exc:
        if "lock" in str(exc).lower():
            holder = re.search(r"\(PID (\d+)\)", str(exc))
            raise StateInUse(
                f"{doing}: the state {database} is open in another process"
                + (f" (pid {holder.group(1)})" if holder else "")
                + f"; stop it first (Ctrl-C on pulse up), then run pulse {doing}"
            ) from None
    try:
        yield
    finally:
        if con is not None:
            with contextlib.suppress(duckdb.Error):
                con.close()


def _column(values: list[Any], sql_type: str) -> np.ndarray[Any, Any]:
    """One staged column: UUIDs as text, lists as JSON text (cast back in SQL)."""
    if sql_type == "UUID":  # 32 hex digits: cheaper than str(UUID), and DuckDB reads them
        values = [None if v is None else v.hex for v in values]
    elif sql_type.endswith("[]"):
        values = [None if v is None else json.dumps([str(x) for x in v]) for v in values]
    elif sql_type == "BLOB":  # embeddings read as views of the exact-vectors file
        values = [v if v is None or isinstance(v, bytes) else bytes(v) for v in values]
    return np.array(values, dtype=object)


def _cast(column: str, sql_type: str) -> str:
    if sql_type.endswith("[]"):
        return f"CAST(CAST({column} AS JSON) AS {sql_type}) AS {column}"
    return f"CAST({column} AS {sql_type}) AS {column}"


# what the periodic write stages its rows as: Arrow columns of the table's own types, which
# DuckDB reads as they are (no cast to plan, no Python object to look at for each value)
_ARROW_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(), "BLOB": pa.binary(), "DOUBLE": pa.float64(),
    "BIGINT": pa.int64(), "UBIGINT": pa.uint64(), "INTEGER": pa.int32(),
    "BOOLEAN": pa.bool_(), "VARCHAR[]": pa.list_(pa.string()),
    "UBIGINT[]": pa.list_(pa.uint64()),
}  # fmt: skip


def _arrow_column(values: list[Any], sql_type: str) -> tuple[pa.Array, str]:
    """One column to write, and how the SELECT reads it: UUIDs as 16 bytes (a UUID
    extension array), lists of UUIDs as lists of their 32 hex digits (cast in SQL)."""
    if sql_type == "UUID":
        storage = pa.array([None if v is None else v.bytes for v in values], pa.binary(16))
        return pa.ExtensionArray.from_storage(pa.uuid(), storage), ""
    if sql_type == "UUID[]":
        hexes = [None if v is None else [x.hex for x in v] for v in values]
        return pa.array(hexes, pa.list_(pa.string())), sql_type
    return pa.array(values, _ARROW_TYPES[sql_type]), ""  # (embeddings: bytes, ``freeze``)


def _arrow_table(columns: dict[str, tuple[list[Any], str]]) -> tuple[pa.Table, str]:
    """Columns (values, SQL type) as an Arrow table, and the SELECT clause that reads
    them in order (``... FROM <the table's name>``)."""
    arrays, select = {}, []
    for name, (values, sql_type) in columns.items():
        arrays[name], cast = _arrow_column(values, sql_type)
        select.append(f"CAST({name} AS {cast}) AS {name}" if cast else name)
    return pa.table(arrays), "SELECT " + ", ".join(select)


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where a frozen row (``freeze``) holds what ``write`` looks at."""

    names: tuple[str, ...]  # the stored columns, then vec_id where the table has one
    get: Callable[[Row], tuple[Any, ...]]  # a row's stored values, in one C call
    key: int  # the first key column (the row's id)
    deleted: int | None
    create_seq: int | None
    embedding: int | None
    vec_id: bool


def _layout(row_type: type[Row]) -> _Layout:
    found = _LAYOUTS.get(row_type)
    if found is None:
        found = _LAYOUTS[row_type] = _lay_out(row_type)
    return found


def _lay_out(row_type: type[Row]) -> _Layout:
    names = stored_columns(row_type)
    at = {n: i for i, n in enumerate(names)}
    vec_id = row_type in (ExperienceRow, InsightRow)  # (checked against the table: Store)
    return _Layout(
        names=(*names, "vec_id") if vec_id else tuple(names),
        get=operator.attrgetter(*names),
        key=at[row_type.KEY[0]],
        deleted=at.get("deleted"),
        create_seq=at.get("create_seq"),
        embedding=at.get("embedding"),
        vec_id=vec_id,
    )


_LAYOUTS: dict[type[Row], _Layout] = {}


def freeze(
    rows: dict[type[Row], list[Row]],
    vec_ids: dict[UUID, int],
    view: Callable[[int], bytes | memoryview],
) -> dict[type[Row], list[tuple[Any, ...]]]:
    """The values ``write`` stores of rows, as they are now: the rows stay the engine's
    (the fold changes them in place), the tuples are the flusher's. An embedding held in
    the exact-vectors file (``fold.held``) is copied from it (``view``: its slot, which
    may be overwritten later), and the row's vector id looked up (``vec_ids`` keeps
    changing)."""
    frozen: dict[type[Row], list[tuple[Any, ...]]] = {}
    for row_type, batch in rows.items():
        layout = _layout(row_type)
        values = [layout.get(r) for r in batch]
        if (at := layout.embedding) is not None:
            for i, v in enumerate(values):
                if type(v[at]) is int:
                    values[i] = (*v[:at], bytes(view(v[at])), *v[at + 1 :])
        if layout.vec_id:
            key = layout.key
            values = [(*v, vec_ids.get(v[key])) for v in values]
        frozen[row_type] = values
    return frozen


_COLLECTIVE_DELETED = stored_columns(CollectiveRow).index("deleted")


@dataclass(slots=True)
class Batch:
    """One DuckDB write: what memory held past the last one, taken by the engine thread
    (``Projection.hand_off``) and written by the flusher's (``Flusher``)."""

    rows: dict[type[Row], list[tuple[Any, ...]]]  # frozen (``freeze``)
    forgotten: set[tuple[UUID, UUID | None]]  # (experience, collective named): counts that go
    rejected: list[Rejected]  # kept aside since
    last_seq: int  # the checkpoint it moves to
    count: int  # events applied since the last one
    audited: list[Audited] = field(default_factory=list)
    counted: list[Counted] = field(default_factory=list)
    readmitted: set[int] = field(default_factory=set)  # no longer kept aside
    owe_scrub: bool = False  # a delete in it waits for the files to be rewritten
    strays: list[tuple[UUID, UUID]] = field(default_factory=list)  # stray tombstones
    # a log in partitions: per partition, the last sequence applied (moved with the
    # checkpoint); None: a log of one stream
    positions: dict[int, int] | None = None


# the views' SQL as this Pulse writes them: an open re-creates them only when the file's
# differ (another version of Pulse), not on every open
_VIEWS_ID = hashlib.sha256(schema.VIEWS.encode()).hexdigest()[:16]


class Store:
    """The DuckDB file of a projection."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self.con = self._connect()
        self._writer: duckdb.DuckDBPyConnection | None = None  # the flusher's cursor
        if not read_only:
            self._migrate()
        self._types = {
            table: {row[0]: row[1] for row in self.con.execute(f"DESCRIBE {table}").fetchall()}
            for table in TABLE_OF.values()
        }
        for row_type, table in TABLE_OF.items():  # (what freeze lays out)
            assert _layout(row_type).vec_id == ("vec_id" in self._types[table]), table
        # what ``write`` knows of the file, so that it runs only the statements it needs:
        # the checkpoint row (then moved by an UPDATE), the sequence it holds (a row
        # created past it is new to the file: a plain INSERT), the collectives deleted
        found = first(self.con.execute("SELECT seq FROM checkpoint WHERE id = 1"))
        self._checkpointed = found is not None
        self._written_seq = int(found[0]) if found else 0
        self._deleted_collectives: set[UUID] = {
            r[0]
            for r in self.con.execute(
                "SELECT collective_id FROM collective_rows WHERE deleted"
            ).fetchall()
        }

    def _connect(self) -> duckdb.DuckDBPyConnection:
        try:
            con = duckdb.connect(str(self.path), read_only=self.read_only)
        except duckdb.IOException as exc:
            raise StateInUse(
                f"the projection {self.path} is in use by another process ({exc}); stop it, "
                "or ask the running instance instead"
            ) from exc
        con.execute("SET enable_progress_bar = false")  # it would print to our stdout
        # DuckDB keeps what it reads and writes in its buffer pool up to ``memory_limit``
        # (80% of the machine's memory unless set): while a host ingests, the pool grew
        # with the rows (114-145 MB at 50,000 experiences, about 2 KB each, most of it
        # the analysts' snapshot's copy, which runs through this instance). Past the
        # limit DuckDB evicts or spills what it can. The analysts' SQL sets its own
        # (``projections.analytics.sandbox``) when it first runs a query here.
        con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
        if not self.read_only:
            # DuckDB folds its write-ahead log into the database file when the log passes
            # this size, inside whichever commit crosses it: tens of milliseconds with
            # embeddings, in the middle of a burst of writes. The projection checkpoints
            # itself when it saves its indexes (a quiet moment); this is the backstop.
            con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
        return con

    def drop_cache(self, *, above: int = 0) -> None:
        """Let go of the table blocks DuckDB keeps after reading every row (tens of MB
        it would hold for good): the connection is closed and opened again. Only when
        it holds more than ``above`` bytes: closing checkpoints and opening reads the
        file again, tens of milliseconds that a small state need not pay on every open."""
        if above > 0:
            found = self.con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()")
            held = first(found)
            if held is None or held[0] is None or int(held[0]) <= above:
                return
        self._let_go_of_writer()
        self.con.close()
        self.con = self._connect()

    def _migrate(self) -> None:
        self.con.execute(schema.TABLES)
        found = dict(
            self.con.execute(
                "SELECT key, value FROM meta WHERE key IN ('schema_version', 'views')"
            ).fetchall()
        )
        version = int(found["schema_version"]) if "schema_version" in found else None
        if version is not None and version > schema.SCHEMA_VERSION:
            raise SchemaError(
                f"{self.path} has schema {version}; this Pulse knows up to "
                f"{schema.SCHEMA_VERSION}: upgrade Pulse, or `pulse rebuild` from the log"
            )
        if version == schema.SCHEMA_VERSION and found.get("views") == _VIEWS_ID:
            return  # as this Pulse leaves it: nothing to write (the common open)
        self.con.begin()
        for step in range(version or schema.SCHEMA_VERSION, schema.SCHEMA_VERSION):
            for statement in schema.MIGRATIONS[step]:
                if callable(statement):
                    statement(self.con)
                else:
                    self.con.execute(statement)
        self.con.execute(
            "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(schema.SCHEMA_VERSION)]
        )
        self.con.execute(schema.VIEWS)
        self.con.execute("INSERT OR REPLACE INTO meta VALUES ('views', ?)", [_VIEWS_ID])
        self.con.commit()

    def checkpoint_file(self, con: duckdb.DuckDBPyConnection | None = None) -> bool:
        """Fold the write-ahead log into the database file now; False: not now.

        DuckDB refuses a checkpoint while a transaction on another cursor of the
        database writes (cursors are lent to the analysts' snapshot, which copies the
        state on a thread of its own, and to SQL). The write-ahead log already holds
        every committed write durably, so a save that meets such a transaction leaves
        the fold to the next save rather than fail: a save failing at the end of a
        catch-up stopped a host from opening (seen on hosts reopened after a kill).
        ``con``: the cursor to run it on (the flusher's, on its thread: ``Flusher``)."""
        try:
            (con or self.con).execute("CHECKPOINT")
        except duckdb.TransactionException as error:
            if "other write transactions" not in str(error):
                raise
            return False
        return True

    def writer(self) -> duckdb.DuckDBPyConnection:
        """The connection the flusher writes on: a cursor of this store's (a DuckDB
        connection is used by one thread at a time), made on the thread that owns the
        store, and let go of whenever the file is closed or reopened."""
        if self._writer is None:
            self._writer = self.con.cursor()
        return self._writer

    def _let_go_of_writer(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(duckdb.Error):
                self._writer.close()
            self._writer = None

    def close(self) -> None:
        self._let_go_of_writer()
        self.con.close()

    def rewrite(self, copy: Callable[[Path], None] | None = None) -> None:
        """Put a fresh copy of the database in place of its file, so that nothing deleted
        from it is left in free blocks (DuckDB neither overwrites nor returns them; not
        on CHECKPOINT, not on VACUUM). The copy is made on a connection of its own, and
        this store's connection is opened again on the new file. No other connection
        may be open (the engine waits for SQL readers and the snapshot's copy).
        ``copy(fresh)``: called with the fresh file, complete, before it is put in place."""
        fresh = self.path.with_name(self.path.name + ".rewrite")
        for leftover in (fresh, Path(f"{fresh}.wal")):
            leftover.unlink(missing_ok=True)
        file_id = os.urandom(8).hex()  # says the connection opened after is on the copy
        self._let_go_of_writer()
        self.con.close()
        try:
            con = duckdb.connect(str(self.path))
            try:
                con.execute("CHECKPOINT")
                found = first(con.execute("SELECT current_database()"))
                assert found is not None
                con.execute(f"ATTACH '{fresh}' AS pulse_rewrite")
                con.execute(f'COPY FROM DATABASE "{found[0]}" TO pulse_rewrite')
                con.execute(
                    "INSERT OR REPLACE INTO pulse_rewrite.meta VALUES ('file_id', ?)", [file_id]
                )
                con.execute("DETACH pulse_rewrite")
            finally:
                con.close()
            with open(fresh, "rb+") as written:
                os.fsync(written.fileno())
            if copy is not None:
                copy(fresh)
            os.replace(fresh, self.path)
            Path(f"{self.path}.wal").unlink(missing_ok=True)  # (none after the checkpoint)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        finally:
            self.con = self._connect()
        for _ in range(50):  # DuckDB hands back a database still open elsewhere (the old
            found = first(  # file, unlinked): wait for it to be let go
                self.con.execute("SELECT value FROM meta WHERE key = 'file_id'")
            )
            if found is not None and found[0] == file_id:
                return
            self.con.close()
            time.sleep(0.1)
            self.con = self._connect()
        # still the old one: what is written now goes to the unlinked file, and the
        # next open catches up from the log past the copy's checkpoint
        raise PulseError(f"{self.path}: still open elsewhere after it was rewritten")

    def scrub_owed(self) -> bool:
        """Whether a delete applied here still waits for the files to be rewritten."""
        found = first(self.con.execute("SELECT value FROM meta WHERE key = 'scrub_owed'"))
        return bool(found and found[0] == "1")

    def owe_scrub(self, owed: bool) -> None:
        self.con.execute(
            "INSERT OR REPLACE INTO meta VALUES ('scrub_owed', ?)", ["1" if owed else "0"]
        )

    def partition_positions(self) -> dict[int, int]:
        """Per partition of a log in partitions, the last sequence the checkpoint holds."""
        rows = self.con.execute("SELECT part, seq FROM partition_positions").fetchall()
        return {int(part): int(seq) for part, seq in rows}

    def checkpoint(self) -> tuple[int, int]:
        """(last applied stream sequence, number of events applied so far)."""
        found = first(self.con.execute("SELECT seq, applied FROM checkpoint WHERE id = 1"))
        return (int(found[0]), int(found[1])) if found else (0, 0)

    # -- writing the engine's changes in bulk -----------------------------------------------

    def write(self, batch: Batch, con: duckdb.DuckDBPyConnection | None = None) -> None:
        """Write a batch the engine took from memory (``Batch``) and move the checkpoint,
        in one transaction: one columnar insert per table, whatever the number of events
        behind it. ``con``: the connection to write on (the flusher's cursor; default
        this store's own).

        A row whose create the log put past the checkpoint is new to the file: it is
        appended, not upserted (a keyed upsert costs DuckDB 2-3 times the CPU). One
        that was written before its create (a change that came first) is found so by
        DuckDB; the transaction is then rolled back and written again upserting all."""
        con = self.con if con is None else con
        deleted = set(self._deleted_collectives)
        layout = _layout(CollectiveRow)
        for values in batch.rows.get(CollectiveRow, ()):
            key = values[layout.key]
            if values[_COLLECTIVE_DELETED]:
                deleted.add(key)
            else:
                deleted.discard(key)

        def transaction(new_after: int | None) -> None:  # (rolled back whole on any error)
            con.begin()
            try:
                if batch.readmitted:
                    con.execute(
                        "DELETE FROM undecodable WHERE seq IN "
                        f"({', '.join(str(int(s)) for s in sorted(batch.readmitted))})"
                    )
                for row_type, frozen in batch.rows.items():
                    if frozen:
                        self._replace(con, row_type, frozen, batch.last_seq, new_after)
                self._drop_thread_parts(con, batch.rows)
                if batch.counted:
                    self._counted(con, batch.counted)
                if batch.forgotten:
                    self._forget_counts(con, batch.forgotten)
                if batch.strays:
                    con.executemany(
                        "INSERT OR IGNORE INTO stray_tombstones VALUES (?, ?)", batch.strays
                    )
                for r in batch.rejected:
                    con.execute(
                        "INSERT OR REPLACE INTO undecodable "
                        "(seq, subject, reason, instance_id, position) VALUES (?, ?, ?, ?, ?)",
                        [r.seq, r.subject, r.reason, r.instance_id, r.position],
                    )
                if batch.audited:
                    self._audit(con, batch.audited, batch.rows, deleted)
                if self._checkpointed:  # (an UPDATE costs DuckDB a third of an upsert)
                    con.execute(
                        "UPDATE checkpoint SET seq = ?, applied = applied + ? WHERE id = 1",
                        [batch.last_seq, batch.count],
                    )
                else:
                    con.execute(
                        "INSERT INTO checkpoint VALUES (1, ?, ?)", [batch.last_seq, batch.count]
                    )
                if batch.positions:
                    con.executemany(
                        "INSERT OR REPLACE INTO partition_positions VALUES (?, ?)",
                        sorted(batch.positions.items()),
                    )
                if batch.owe_scrub:  # (a delete waits for the files to be rewritten)
                    con.execute("INSERT OR REPLACE INTO meta VALUES ('scrub_owed', '1')")
                con.commit()
            except BaseException:
                con.rollback()
                raise

        for new_after in (self._written_seq, None):  # (None: the second try upserts all)
            try:
                transaction(new_after)
                break
            except duckdb.ConstraintException:
                if new_after is None:
                    raise
        self._checkpointed = True
        self._written_seq = batch.last_seq
        self._deleted_collectives = deleted

    def _audit(
        self,
        con: duckdb.DuckDBPyConnection,
        audited: Sequence[Audited],
        rows: dict[type[Row], list[tuple[Any, ...]]],
        deleted_collectives: set[UUID],
    ) -> None:
        """Add the batch's events to the audit; then forget the history of what the batch
        deleted (the log forgets it too), all but the deletes themselves."""
        seq, event_type, collective, entity, entity_id, owner, agent, instance, hlc, change = zip(
            *audited, strict=True
        )
        staged_audit, select = _arrow_table({  # (read by DuckDB by name)
            "seq": (list(seq), "BIGINT"), "event_type": (list(event_type), "VARCHAR"),
            "collective_id": (list(collective), "UUID"), "entity": (list(entity), "VARCHAR"),
            "entity_id": (list(entity_id), "UUID"), "author_owner": (list(owner), "VARCHAR"),
            "author_agent": (list(agent), "VARCHAR"), "instance_id": (list(instance), "UUID"),
            "hlc": (list(hlc), "UBIGINT"), "change": (list(change), "VARCHAR"),
        })  # fmt: skip
        con.execute(
            f"INSERT INTO audit_rows {select} FROM staged_audit"
        )  # (a sequence is applied once: the audit needs no key, and no index to keep up)
        gone = [
            v[layout.key] for t in TABLE_OF
            if t not in (CollectiveRow, ApplicationRow, TokenRow, *_THREAD_PARTS)
            if (layout := _layout(t)).deleted is not None
            for v in rows.get(t, ()) if v[layout.deleted]
        ]  # fmt: skip
        # what the log keeps of a deleted entity is its latest tombstone and what came
        # after it (the delete purged the rest), and of a deleted collective what came from
        # its tombstone on: so does the history (``projections.past`` reads it)
        if gone:
            con.execute(
                f"DELETE FROM audit_rows WHERE entity_id IN ({uuid_literals(gone)}) "
                "AND seq < (SELECT max(d.seq) FROM audit_rows d WHERE d.entity_id = "
                "audit_rows.entity_id AND d.event_type LIKE '%.deleted')"
            )
        # and a write that landed after its collective's delete: its writer purged it
        # from the log (``sync.core``), without a tombstone of its own (only when the
        # batch names a deleted collective: the statement costs more than the insert)
        if not deleted_collectives.isdisjoint(collective):
            con.execute(
                "DELETE FROM audit_rows WHERE seq >= ? AND event_type NOT LIKE '%.deleted' "
                "AND collective_id IN (SELECT collective_id FROM collective_rows WHERE deleted)",
                [min(seq)],
            )
        key, deleted = _layout(CollectiveRow).key, _COLLECTIVE_DELETED
        dropped = [v[key] for v in rows.get(CollectiveRow, ()) if v[deleted]]
        if dropped:
            con.execute(
                f"DELETE FROM audit_rows WHERE collective_id IN ({uuid_literals(dropped)}) "
                "AND seq < (SELECT max(d.seq) FROM audit_rows d WHERE d.collective_id = "
                "audit_rows.collective_id AND d.event_type = 'collective.deleted')"
            )

    def _drop_thread_parts(
        self, con: duckdb.DuckDBPyConnection, rows: dict[type[Row], list[tuple[Any, ...]]]
    ) -> None:
        """What a batch's thread tombstones made gone (``MemoryState._index_thread``
        dropped it from memory): the rows of a deleted thread, the writes of a deleted
        checkpoint, as the file held them."""
        threads = [(v[0], v[1]) for v in rows.get(ThreadRow, ()) if v[2]]
        if threads:
            pairs = ", ".join(f"('{t}'::UUID, '{c}'::UUID)" for t, c in threads)
            for table in ("checkpoint_rows", "pending_write_rows"):
                con.execute(f"DELETE FROM {table} WHERE (thread_id, collective_id) IN ({pairs})")
        deleted = _layout(CheckpointRow).deleted
        assert deleted is not None
        pruned = [v[:4] for v in rows.get(CheckpointRow, ()) if v[deleted]]
        for thread, collective, namespace, checkpoint in pruned:
            con.execute(
                "DELETE FROM pending_write_rows WHERE thread_id = ? AND collective_id = ? "
                "AND checkpoint_ns = ? AND checkpoint_id = ?",
                [thread, collective, namespace, checkpoint],
            )

    @staticmethod
    def _forget_counts(
        con: duckdb.DuckDBPyConnection, forgotten: set[tuple[UUID, UUID | None]]
    ) -> None:
        """Delete the counts, and their history, that reports naming a collective made
        of an experience deleted there (``MemoryState._count``)."""
        ids = uuid_literals({eid for eid, _ in forgotten})
        pairs = ", ".join(
            f"('{UUID(str(eid))}'::UUID, {_uuid_or_null(cid)}::UUID)"
            for eid, cid in sorted(forgotten, key=str)
        )
        for table in ("application_rows", "count_history"):
            con.execute(  # (the ids alone first: DuckDB prunes row groups by literal keys)
                f"DELETE FROM {table} WHERE experience_id IN ({ids}) AND "
                f"(experience_id, collective_id) IN (SELECT * FROM (VALUES {pairs}))"
            )

    def _counted(self, con: duckdb.DuckDBPyConnection, counted: Sequence[Counted]) -> None:
        """Add a batch's reinforcements to the counts' history."""
        seq, experience, instance, collective, applications, hlc, owner, agent = zip(
            *counted, strict=True
        )
        staged_counts, select = _arrow_table({  # (read by DuckDB by name)
            "seq": (list(seq), "BIGINT"), "experience_id": (list(experience), "UUID"),
            "instance_id": (list(instance), "UUID"), "collective_id": (list(collective), "UUID"),
            "applications": (list(applications), "UBIGINT"), "hlc": (list(hlc), "UBIGINT"),
            "author_owner": (list(owner), "VARCHAR"), "author_agent": (list(agent), "VARCHAR"),
        })  # fmt: skip
        con.execute(f"INSERT INTO count_history {select} FROM staged_counts")

    def _replace(
        self,
        con: duckdb.DuckDBPyConnection,
        row_type: type[Row],
        rows: list[tuple[Any, ...]],
        seq: int,
        new_after: int | None,
    ) -> None:
        """Write frozen rows of a type: those created past ``new_after`` (the checkpoint
        the file held) appended, the others upserted (all of them, with None)."""
        table = TABLE_OF[row_type]
        at = _layout(row_type).create_seq
        new: list[tuple[Any, ...]] = []
        if new_after is not None and at is not None:
            new = [v for v in rows if (v[at] or 0) > new_after]
        if new:
            if len(new) < len(rows):
                fresh = {id(v) for v in new}
                self._insert(con, table, row_type, [v for v in rows if id(v) not in fresh],
                             seq, "INSERT OR REPLACE")  # fmt: skip
            self._insert(con, table, row_type, new, seq, "INSERT")
        else:
            self._insert(con, table, row_type, rows, seq, "INSERT OR REPLACE")

    def _insert(
        self,
        con: duckdb.DuckDBPyConnection,
        table: str,
        row_type: type[Row],
        rows: list[tuple[Any, ...]],
        seq: int,
        verb: str,
    ) -> None:
        types = self._types[table]
        names = _layout(row_type).names
        columns = {n: ([v[i] for v in rows], types[n]) for i, n in enumerate(names)}
        columns["updated_seq"] = ([seq] * len(rows), "BIGINT")
        staged, select = _arrow_table({c: columns[c] for c in types})  # (read by name)
        con.execute(f"{verb} INTO {table} {select} FROM staged")

    def staged(
        self,
        row_type: type[Row],
        rows: Sequence[Row],
        vec_ids: dict[UUID, int],
        seq: int,
        view: Callable[[int], bytes | memoryview],
    ) -> tuple[dict[str, np.ndarray[Any, Any]], str]:
        """Rows as columns DuckDB reads (a dict of arrays), and the SELECT clause that
        casts them to the table's types (``... FROM <the dict's name>``); ``view``: an
        embedding held in the exact-vectors file (``fold.held``), as ``freeze``."""
        types = self._types[TABLE_OF[row_type]]
        names = stored_columns(row_type)
        staged: dict[str, np.ndarray[Any, Any]] = {}
        for n in names:
            values = [getattr(r, n) for r in rows]
            if n == "embedding":
                values = [view(v) if type(v) is int else v for v in values]
            staged[n] = _column(values, types[n])
        if "vec_id" in types:
            staged["vec_id"] = np.array([vec_ids.get(r.key()[0]) for r in rows], dtype=object)
        staged["updated_seq"] = np.full(len(rows), seq, dtype=np.int64)
        return staged, "SELECT " + ", ".join(_cast(c, types[c]) for c in types)

    def wire_schema(self) -> int:
        """The wire schema version (``eventlog.codec.SCHEMA_VERSION``) of the Pulse that
        kept aside the messages held here (1 before it was recorded: the only one then)."""
        found = first(self.con.execute("SELECT value FROM meta WHERE key = 'wire_schema'"))
        return int(found[0]) if found else 1

    def set_wire_schema(self, version: int) -> None:
        self.con.execute("INSERT OR REPLACE INTO meta VALUES ('wire_schema', ?)", [str(version)])

    def stray_tombstones(self) -> list[tuple[UUID, UUID]]:
        """(experience, collective) of each delete that named another collective than
        the experience's row (``MemoryState.load_strays``)."""
        return [
            (UUID(str(e)), UUID(str(c)))
            for e, c in self.con.execute("SELECT * FROM stray_tombstones").fetchall()
        ]

    def rejected(self) -> list[Rejected]:
        return [
            Rejected(seq=int(r[0]), subject=r[1], reason=r[2], instance_id=r[3], position=r[4])
            for r in self.con.execute(
                "SELECT seq, subject, reason, instance_id, position FROM undecodable ORDER BY seq"
            ).fetchall()
        ]

    def changed_since(self, seq: int) -> dict[str, set[UUID]]:
        """Ids of experiences, insights and collectives written after ``seq``."""
        return {
            table: {
                r[0]
                for r in self.con.execute(
                    f"SELECT {key} FROM {table}_rows WHERE updated_seq > ?", [seq]
                ).fetchall()
            }
            for table, key in (("experience", "experience_id"), ("insight", "insight_id"),
                               ("collective", "collective_id"))
        }  # fmt: skip

    # -- reading ---------------------------------------------------------------------------

    def rows(
        self,
        row_type: type[Row],
        *,
        without: tuple[str, ...] = (),
        vectors: Numbered | None = None,
    ) -> dict[tuple[Any, ...], Row]:
        """Every stored row of a type, as fold rows; the columns named in ``without``
        are left NULL (the projection reads embeddings from its vector files). With
        ``vectors``, the rows that have a local FAISS id are noted there (``Numbered``)."""
        table = TABLE_OF[row_type]
        columns = stored_columns(row_type)
        types = self._types[table]
        # how each column becomes Python values, chosen once (``_Column``)
        how = [_Column.of(n, types[n], n in without) for n in columns]
        stamps = [i for i, h in enumerate(how) if h is _Column.STAMP]
        # what is selected for each column (a UUID that is each row's own: its two
        # 64-bit halves, which make its int with no text to parse; DuckDB would make
        # each UUID by calling ``uuid.UUID``, about 5 us apiece), and where it starts
        names: list[str] = []
        at: list[int] = []
        for n, kind in zip(columns, how, strict=True):
            at.append(len(names))
            if n in without:
                names.append(f"NULL AS {n}")
            elif kind is _Column.UUID:
                whole = f"CAST({n} AS UHUGEINT)"
                names += [f"({whole} >> 64)::UBIGINT", f"({whole} & {_LOW_64})::UBIGINT"]
            elif kind is _Column.UUID_SHARED:
                names.append(f"CAST({n} AS VARCHAR)")
            elif kind is _Column.UUID_LIST:
                names.append(f"CAST({n} AS VARCHAR[])")
            else:
                names.append(n)
        if vectors is not None:
            names.append("vec_id")
        # read as Arrow, each column made Python values at once: DuckDB's own rows
        # (``fetchmany``) cost about a microsecond a value, half of a million's open
        batches = self.con.sql(f"SELECT {', '.join(names)} FROM {table}").to_arrow_reader(100_000)
        # values many rows repeat (a collective, a type, an agent, the stamps a create
        # gives every register of its row) are kept once: a row costs a third less
        shared: dict[Any, Any] = {}
        keep = shared.setdefault
        found: dict[tuple[Any, ...], Row] = {}
        key = row_type.key
        first_stamp = stamps[0] if stamps else -1
        # column by column, each batch: the rows are made by one ``map`` over the columns
        for batch in batches:
            arrays = batch.columns
            cols: list[Any] = [None] * len(columns)
            for i, kind in enumerate(how):
                array = arrays[at[i]]
                if kind is _Column.PLAIN and array.null_count == 0:
                    cols[i] = array.to_numpy(zero_copy_only=False).tolist()
                elif kind is _Column.UUID:
                    cols[i] = _uuid_column(array, arrays[at[i] + 1])
                elif kind is _Column.UUID_SHARED:
                    cols[i] = _shared_column(array, keep, made_of=_uuids)
                elif kind is _Column.UUID_LIST:  # (as text, each made here)
                    cols[i] = [None if v is None else tuple(_uuids(v)) for v in array.to_pylist()]
                elif kind is _Column.LIST:  # (lists come back as Python lists: tuples here)
                    cols[i] = [None if v is None else tuple(v) for v in array.to_pylist()]
                elif kind is _Column.LIST_SHARED:
                    cols[i] = [
                        None if v is None else keep(t := tuple(v), t) for v in array.to_pylist()
                    ]
                elif kind is _Column.SHARED:
                    cols[i] = _shared_column(array, keep)
                elif i == first_stamp:  # (mostly each row's own)
                    cols[i] = array.to_pylist()
                elif kind is _Column.STAMP:  # the first stamp's object wherever it is equal
                    cols[i] = _like(cols[first_stamp], arrays[at[first_stamp]], array, keep)
                else:
                    cols[i] = array.to_pylist()
            made = list(map(row_type, *cols))
            keys = list(map(key, made))
            found.update(zip(keys, made, strict=True))
            if vectors is not None:
                numbered = [
                    (number, k[0], row)
                    for number, k, row in zip(arrays[-1].to_pylist(), keys, made, strict=True)
                    if number is not None
                ]
                vectors.rows.update((number, row) for number, _, row in numbered)
                vectors.numbers.update((row_id, number) for number, row_id, _ in numbered)
        return found

    def embeddings(self, row_type: type[Row], ids: Iterable[UUID]) -> dict[UUID, bytes]:
        """The stored embeddings of some experiences or insights."""
        table, key = TABLE_OF[row_type], row_type.KEY[0]
        wanted = sorted(set(ids), key=str)
        found: dict[UUID, bytes] = {}
        for start in range(0, len(wanted), 5000):
            literals = uuid_literals(wanted[start : start + 5000])
            for row_id, embedding in self.con.execute(
                f"SELECT {key}, embedding FROM {table} WHERE {key} IN ({literals}) "
                "AND embedding IS NOT NULL"
            ).fetchall():
                found[row_id] = embedding
        return found

    def drop_history(self, collective_id: UUID, up_to: int) -> None:
        """Remove a collective's history rows up to a sequence: what an unfinished backfill
        wrote (``projections.scope``), before it runs again."""
        with self.con.cursor() as cur:
            for table in ("audit_rows", "count_history"):
                cur.execute(
                    f"DELETE FROM {table} WHERE collective_id = ? AND seq <= ?",
                    [collective_id, up_to],
                )

    def digest(self, collective_id: UUID | None = None) -> str:
        """SHA-256 of the logical state: every base table's rows, sorted, local columns out;
        with ``collective_id``, that collective's rows only."""
        h = hashlib.sha256()
        queries = schema.DIGEST_QUERIES if collective_id is None else schema.DIGEST_BY_COLLECTIVE
        for name, query in queries.items():
            h.update(name.encode())
            params: dict[str, Any] = {}
            if collective_id is not None:
                params = {"cid": collective_id} if "$cid" in query else {}
                if "$prefix" in query:
                    params = {"prefix": f"pulse.c.{collective_id}."}
            result = self.con.execute(query, params) if params else self.con.execute(query)
            while batch := result.fetchmany(10_000):
                for row in batch:
                    h.update(msgspec.msgpack.encode(row))
        return h.hexdigest()


def uuid_literals(ids: Any) -> str:
    """UUIDs as a SQL list of literals (str(UUID) is hex digits and dashes: safe to inline).

    Point lookups by literal keys let DuckDB prune row groups; a joined parameter list
    makes it scan the table."""
    return ", ".join(f"'{UUID(str(i))}'" for i in sorted(ids, key=str))


def _uuid_or_null(value: UUID | None) -> str:
    return "NULL" if value is None else f"'{UUID(str(value))}'"


_new_object, _set_slot = object.__new__, object.__setattr__


def _uuids(texts: list[str]) -> list[UUID]:
    """``UUID(text)`` of each of DuckDB's texts of a UUID (36 characters, lower case),
    made as ``UUID.__init__`` makes one (its two slots) without its parsing, and with no
    Python call per UUID (``map`` over C functions): 0.7 us each, not 1.8."""
    made: list[UUID] = list(map(_new_object, repeat(UUID, len(texts))))
    deque(map(_set_slot, made, repeat("int"), map(int, map(_no_dashes, texts), repeat(16))), 0)
    deque(map(_set_slot, made, repeat("is_safe"), repeat(_UNKNOWN)), 0)
    return made


def _uuid_column(high: pa.Array, low: pa.Array) -> Sequence[UUID | None]:
    """The UUIDs of a column read as its two 64-bit halves (NULL: None), made as
    ``_uuids`` makes them, from the halves' ints: 0.43 us each, not 0.73 from text."""
    if high.null_count == 0:
        highs, lows = high.to_numpy().tolist(), low.to_numpy().tolist()
        return _made(list(map(operator.or_, map(operator.lshift, highs, repeat(64)), lows)))
    pairs = list(zip(high.to_pylist(), low.to_pylist(), strict=True))
    made = iter(_made([h << 64 | lo for h, lo in pairs if h is not None]))
    return [None if h is None else next(made) for h, _ in pairs]


def _made(ints: list[int]) -> list[UUID]:
    """UUIDs of their ints, made as ``UUID.__init__`` makes one (its two slots)."""
    made: list[UUID] = list(map(_new_object, repeat(UUID, len(ints))))
    deque(map(_set_slot, made, repeat("int"), ints), 0)
    deque(map(_set_slot, made, repeat("is_safe"), repeat(_UNKNOWN)), 0)
    return made


_LOW_64 = "18446744073709551615::UHUGEINT"  # (2**64 - 1)
_no_dashes = operator.methodcaller("replace", "-", "")


class _Column(enum.Enum):
    """How ``Store.rows`` makes a column's Python values."""

    PLAIN = "numbers, made at once by numpy when no value is NULL"
    UUID = "UUIDs, each its own: read as two 64-bit halves (``_uuid_column``)"
    UUID_SHARED = "UUIDs many rows repeat: each made once and shared"
    UUID_LIST = "lists of UUIDs, as tuples"
    LIST = "lists, as tuples"
    LIST_SHARED = "lists many rows repeat, as tuples shared"
    SHARED = "values many rows repeat: each made once and shared (``_shared_column``)"
    STAMP = "stamps: the first stamp column's object where equal to it (``_like``)"
    OTHER = "anything else (Arrow's ``to_pylist``)"

    @classmethod
    def of(cls, name: str, sql_type: str, left_out: bool) -> _Column:
        repeated = name in _REPEATED
        if left_out:
            return cls.OTHER  # (NULL)
        if sql_type == "UUID":
            return cls.UUID_SHARED if repeated else cls.UUID
        if sql_type == "UUID[]":
            return cls.UUID_LIST
        if sql_type.endswith("[]"):
            return cls.LIST_SHARED if repeated else cls.LIST
        if name.endswith("_stamp"):
            return cls.STAMP
        if repeated:
            return cls.SHARED
        return cls.PLAIN if sql_type in _PLAIN_NUMBERS else cls.OTHER


def _shared_column(
    array: pa.Array, keep: Callable[[Any, Any], Any], made_of: Callable[[list[Any]], Any] = list
) -> list[Any]:
    """A column's values with each distinct value made once (``made_of`` the distinct
    values: UUIDs from their text) and kept once (``keep``: across the columns too), by
    Arrow's dictionary encoding: no Python work per row but a ``map`` of look-ups."""
    encoded = array.dictionary_encode()
    distinct = [keep(v, v) for v in made_of(encoded.dictionary.to_pylist())]
    distinct.append(None)  # (where the value is NULL)
    at = encoded.indices.fill_null(len(distinct) - 1).to_numpy(zero_copy_only=False).tolist()
    return list(map(distinct.__getitem__, at))


def _like(
    values: list[Any], reference: pa.Array, array: pa.Array, keep: Callable[[Any, Any], Any]
) -> list[Any]:
    """A column's values, taking ``values`` (those of the ``reference`` column) wherever
    the two columns are equal: a create stamps every register of its row alike, so a
    row's stamps are one object, made once, not one each."""
    import pyarrow.compute as pc  # (here: its import costs every process 90 ms of CPU)

    same = pc.equal(array, reference).fill_null(False).to_numpy(zero_copy_only=False)
    if not same.any():
        return _shared_column(array, keep)
    found = list(values)
    differ = np.flatnonzero(~same)
    if differ.size:
        for at, value in zip(differ.tolist(), array.take(differ).to_pylist(), strict=True):
            found[at] = value
    return found


_UNKNOWN = SafeUUID.unknown  # (an enum member's look-up is a property's call: 3 s a million)


# the types whose Arrow column without nulls numpy makes Python values of at once
_PLAIN_NUMBERS = frozenset(("BIGINT", "INTEGER", "UBIGINT", "DOUBLE", "BOOLEAN"))

_REPEATED = frozenset(
    ("collective_id", "owner_id", "experience_type", "type_data", "source_agent",
     "source_task", "domain", "related_files", "relation_type", "instance_id",
     "visibility", "author_owner", "author_agent")
)  # fmt: skip


@dataclass
class Numbered:
    """The rows read that have a local FAISS id (``Store.rows``): by that id, for the
    open to find each indexed vector's row by an int; and the id of each, keyed by the
    row's own id object (not a second UUID made of the same text: a million of them
    were 2 s of an open and 90 MB)."""

    rows: dict[int, Row] = field(default_factory=dict)
    numbers: dict[UUID, int] = field(default_factory=dict)


class Flusher:
    """The thread that writes a store's batches (``Batch``), one transaction each, in
    the order they were handed over, on a cursor of its own; the engine thread only takes
    the batch from memory (``Projection.hand_off``) and goes on applying.

    Why a thread: a write costs DuckDB 10-40 ms whatever its rows (planning and binding
    the statements of a wide keyed table), and on the engine thread every write offered
    meanwhile waited for it (the p99 of a write). DuckDB releases the GIL while it
    works, so the engine applies beside it; what still holds the GIL is staging the
    rows as Arrow columns (done here too, off the engine thread).

    In order, each batch with its checkpoint: DuckDB's checkpoint always equals the rows
    it holds, so a crash loses nothing (the log holds every event past it). A write
    DuckDB refuses (a conflict, a full disk) is logged and tried again every
    ``retry_after`` seconds (at once when ``drain`` asks), the batch and those behind it
    kept: nothing is lost, and the engine hands over nothing more meanwhile (memory
    keeps gathering the changes). ``drain`` waits until everything handed over is
    written, or raises the error of the attempt that failed meanwhile. A thread that
    died is started again by ``check`` (the engine calls it every round)."""

    def __init__(
        self,
        store: Store,
        *,
        retry_after: float = 1.0,
        on_written: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self.retry_after = retry_after
        self.on_written = on_written  # called (on this thread) after each batch is written
        self.gate = threading.Lock()  # held around each write (a test holds it to stall one)
        self._cond = threading.Condition()
        self._queue: deque[tuple[Batch, duckdb.DuckDBPyConnection, concurrent.futures.Future[int]]]
        self._queue = deque()
        self._failures = 0  # attempts that failed, ever
        self._retry_now = False
        self._closed = False
        self.error: BaseException | None = None  # why the batch in hand failed (None: it has not)
        self.written_seq = store.checkpoint()[0]  # the checkpoint DuckDB holds
        self.restarts = 0
        self.seconds = 0.0  # spent writing (wall, this thread), for benchmarks and health
        # a CHECKPOINT asked for (``checkpoint_soon``): the cursor to run it on
        self._checkpoint: duckdb.DuckDBPyConnection | None = None
        self.checkpoints = 0  # run on this thread (tests, benchmarks)
        self.refused = 0  # ... and refused by DuckDB (another cursor's write transaction)
        self.wal_fold = WAL_FOLD  # fold the write-ahead log once it is this long (bytes)
        self._wal = Path(f"{store.path}.wal")
        self._thread = self._start()

    def _start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="pulse-flusher", daemon=True)
        thread.start()
        return thread

    @property
    def busy(self) -> bool:
        """Whether a batch handed over is not written yet."""
        return bool(self._queue)

    def put(self, batch: Batch, con: duckdb.DuckDBPyConnection) -> concurrent.futures.Future[int]:
        """Hand a batch over, to be written on ``con`` after those before it; returns its
        future: the checkpoint once written, or the error of its first failed attempt
        (it is tried again all the same)."""
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise PulseError("the projection's DuckDB writer is closed")
            self._queue.append((batch, con, done))
            self._cond.notify_all()
        return done

    def checkpoint_soon(self, con: duckdb.DuckDBPyConnection) -> None:
        """Fold DuckDB's write-ahead log into its file on this thread, on ``con``, once
        the batches handed over before are written (``Store.checkpoint_file``): the
        engine thread does not wait for it. A write-ahead log holds every committed
        write durably: the fold only keeps the log short, and one refused (another
        cursor writing) is left to the next."""
        with self._cond:
            if not self._closed:
                self._checkpoint = con
                self._cond.notify_all()

    def wait_written(self, seq: int, timeout: float | None = None) -> bool:
        """Wait, on any thread, until DuckDB holds sequence ``seq`` (True), or a write
        failed, the writer closed or ``timeout`` passed meanwhile (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            failures = self._failures
            while self.written_seq < seq:
                if self._closed or self._failures != failures or self.error is not None:
                    return False
                if not self._queue:  # nothing handed over reaches it
                    return False
                left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def last(self) -> concurrent.futures.Future[int] | None:
        """The future of the last batch handed over and not written yet (None: none)."""
        with self._cond:
            return self._queue[-1][2] if self._queue else None

    def drain(self) -> int:
        """Wait until every batch handed over is written; returns the checkpoint. A
        batch that keeps failing is tried once more now, and its error raised if that
        attempt fails (it stays, to be tried again)."""
        self.check()
        with self._cond:
            if not self._queue:
                return self.written_seq
            failures = self._failures
            self._retry_now = True
            self._cond.notify_all()
            while self._queue and self._failures == failures and not self._closed:
                self._cond.wait(0.5)
                if not self._thread.is_alive():
                    break
            if self._queue:
                raise self.error or PulseError("the projection's DuckDB writer stopped")
            return self.written_seq

    def check(self) -> bool:
        """Start the thread again if it died (True); a writer must not stop for good."""
        if self._closed or self._thread.is_alive():
            return False
        log.error("the DuckDB writer thread died; starting it again (nothing is lost)")
        self.restarts += 1
        self._thread = self._start()
        return True

    def close(self) -> None:
        """Stop the thread once it is done with the write in hand; batches not written
        are dropped (the log holds their events past the checkpoint)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._cond:
            left, self._queue = list(self._queue), deque()
        for _, _, done in left:
            if not done.done():
                done.set_exception(PulseError("the projection closed before this write"))

    def _fold(self, con: duckdb.DuckDBPyConnection) -> None:
        start = time.perf_counter()
        try:
            with self.gate:
                folded = self._store.checkpoint_file(con)
            if folded:
                self.checkpoints += 1
            else:
                self.refused += 1
        except duckdb.ConnectionException:  # the cursor went with a reopened file meanwhile
            log.debug("DuckDB's file was reopened before its write-ahead log was folded")
        except Exception:  # (the next save asks again; the log holds every write)
            log.exception("folding DuckDB's write-ahead log into its file failed")
        finally:
            self.seconds += time.perf_counter() - start

    def _wal_bytes(self) -> int:
        """The length of DuckDB's write-ahead log (0: none). Until a checkpoint folds it
        into the file, DuckDB holds the rows it logged in memory too (tagged
        ``IN_MEMORY_TABLE`` in ``duckdb_memory()``), so a log left to grow to
        ``CHECKPOINT_THRESHOLD`` between the engine's saves, which wait for a quiet
        moment, held about 3 KB per experience written meanwhile. Folding it on this
        thread costs DuckDB about 10 us of CPU per experience."""
        try:
            return self._wal.stat().st_size
        except OSError:
            return 0

    def _run(self) -> None:
        try:
            self._write_in_turn()
        except BaseException:  # (``check`` starts another; the batch in hand stays)
            log.exception("the DuckDB writer thread stopped")

    def _write_in_turn(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed and self._checkpoint is None:
                    self._cond.wait()
                if self._closed:
                    return
                if not self._queue:  # (a checkpoint asked for, every batch before it written)
                    checkpoint, self._checkpoint = self._checkpoint, None
                else:
                    checkpoint = None
                    batch, con, done = self._queue[0]
                    self._retry_now = False
            if checkpoint is not None:
                self._fold(checkpoint)
                continue
            start = time.perf_counter()
            try:
                with self.gate:
                    self._store.write(batch, con)
            except Exception as exc:
                log.exception(
                    "writing the projection to DuckDB failed (up to sequence %d); trying "
                    "again in %g s, nothing is lost",
                    batch.last_seq,
                    self.retry_after,
                )
                with self._cond:
                    self._failures += 1
                    self.error = exc
                    self._cond.notify_all()
                if not done.done():
                    done.set_exception(exc)
                with self._cond:  # wait before trying again (a drain asks at once)
                    deadline = time.monotonic() + self.retry_after
                    while not (self._retry_now or self._closed):
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                continue
            finally:
                self.seconds += time.perf_counter() - start
            with self._cond:
                self._queue.popleft()
                self.written_seq = batch.last_seq
                self.error = None
                self._cond.notify_all()
            if not done.done():
                done.set_result(batch.last_seq)
            if self._wal_bytes() > self.wal_fold:
                self._fold(con)
            if self.on_written is not None:
                try:
                    self.on_written()
                except Exception:
                    log.exception("telling the engine a DuckDB write ended failed")

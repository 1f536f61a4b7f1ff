"""A host's projection of the log: the engine's memory, the DuckDB copy, the FAISS
indexes and the full-text index of one state directory.

    <state dir>/state.duckdb       rows, views and the checkpoint (written in bulk)
    <state dir>/snapshot.duckdb    a copy for other processes (``projections.snapshot``)
    <state dir>/vectors/*.faiss    FAISS indexes + manifest.json (the sequence they reflect)
    <state dir>/vectors/exact-*.f32 the exact vectors, memory-mapped (rows point into them)
    <state dir>/text/              the tantivy index (committed before the manifest)

``apply`` folds a batch into memory (``projections.state``) and keeps the vector and text
indexes in step: that is all a write waits for. ``hand_off`` takes the rows changed
since the last one (their values, frozen) and hands them to the projection's DuckDB
writer thread (``store.Flusher``), which writes them with the checkpoint in one
transaction while the engine goes on applying; ``flush`` hands off and waits until
DuckDB holds everything applied (what reads DuckDB asks for it first); ``save`` flushes
and saves the indexes with the sequence they reflect. On open, memory is read back from
DuckDB, the indexes are loaded and reconciled with it, and whatever they miss is
caught up from the stored rows, never from the network. The log holds every event past
the DuckDB checkpoint, so a crash loses nothing: the tail replays it.

An event that cannot be applied (unreadable, a value out of range, anything that makes
folding it raise) is kept aside as a dead letter with its sequence, subject, reason
and writer; the rest of its batch applies. One bad event never stops a host.

A message kept aside because a newer Pulse wrote it is not lost: once this host runs a
Pulse that reads a newer wire schema than the one that kept it aside (an upgrade), the
engine reads every dead letter again by its sequence (``readmit_due``, ``readmit``) and
what now reads is folded, in any order as always; the wire schema is recorded in
``meta``.

A ``Projection`` is not thread-safe: ``projections.engine.Engine`` owns it on one thread
(its flusher writes only the batches handed to it, on a DuckDB cursor of its own).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import gc
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
import numpy as np
import pyarrow as pa

from eventlog import codec
from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from eventlog.partitions import part_of, seq_of
from eventlog.sealing import KEY_MISSING
from projections.fold import (
    ROW_TYPES,
    ApplicationRow,
    ExperienceRow,
    FoldState,
    InsightRow,
    Placed,
    Row,
    held,
    held_at,
    row_of,
    rows_of,
    vector_bytes,
)
from projections.schema import MISPLACED
from projections.state import Audited, MemoryState, Rejected, Touched
from projections.store import Batch, Flusher, Numbered, Store, freeze, holding_file
from projections.text import Document, TextIndex
from projections.vectors import (
    ExactVectors,
    VectorIndex,
    read_index_file,
    read_manifest,
    write_manifest,
)

log = logging.getLogger("pulse.projection")
REINDEX_PROGRESS_S = 5.0  # between two lines of a re-index's progress

# Writes the index files of a save in the background (``Projection.save(background=True)``)
_SAVER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulse-index-save")

Progress = Callable[[int, int], None]  # (applied so far, total to apply)
_Adds = dict[tuple[UUID, int], tuple[list[int], list[bytes], list[UUID]]]


@dataclass(frozen=True, slots=True)
class ProjectionSettings:
    hnsw_threshold: int = 10_000  # vectors per collective before its index becomes HNSW
    ef_search: int = 128  # HNSW search breadth (recall against speed)
    batch_size: int = 5000  # events per read when catching up
    # seconds between DuckDB writes while events arrive: each costs DuckDB ~10-30 ms
    # whatever its rows (on the flusher's thread, not the engine's), and the log holds
    # what is not written yet; readers of DuckDB (SQL, the snapshot) have it written first
    flush_interval: float = 1.0
    flush_events: int = 5000  # ... or this many events applied since the last one
    save_interval: float = 30.0  # seconds between index saves while events arrive
    # catching up (a rebuild, a restart behind the log): the indexes take events in
    # batches this large (FAISS builds its graph in parallel for large adds), and DuckDB
    # is written every ``checkpoint_events``; the log holds everything past the
    # checkpoint, so a crash costs at most that many events applied again
    bulk_index_events: int = 20_000
    checkpoint_events: int = 200_000
    # seconds a deleted entity's text and vector may stay in this host's files (DuckDB,
    # FAISS, tantivy) before they are rewritten without it (``Projection.scrub``)
    scrub_after: float = 5.0
    # seconds between refreshes of the analysts' snapshot (``projections.snapshot``:
    # ``snapshot.duckdb``, which other processes open while this one writes the state);
    # at least ten times what the last refresh took. None: no snapshot
    snapshot_interval: float | None = 1.0


# DuckDB's cache of table blocks worth a reopen once the rows are loaded (below it, the
# reopen would cost more than the memory it gives back)
DROP_CACHE_ABOVE = 16 * 2**20

_DELETES = (
    ev.CollectiveDeleted, ev.ExperienceDeleted, ev.RelationDeleted, ev.InsightDeleted,
    ev.WisdomDeleted, ev.SessionDeleted, ev.ThreadDeleted,
)  # fmt: skip


class Projection:
    """The folded state of one directory; ``apply`` batches, ``flush``, ``save``."""

    def __init__(self, directory: str | Path, settings: ProjectionSettings | None = None) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.settings = settings or ProjectionSettings()
        self._owner = threading.get_ident()  # the one thread that may change it
        self.store = Store(self.dir / "state.duckdb")
        self._seq = self.store.checkpoint()[0]
        # a log in partitions (eventlog.partitioned.LocalLog): per partition, the last
        # sequence applied, written with the checkpoint (empty for a log of one stream)
        self.positions: dict[int, int] = self.store.partition_positions()
        if self._seq == 0:  # what it keeps aside from now on, this Pulse kept aside
            self.store.set_wire_schema(codec.SCHEMA_VERSION)
        self.handed_seq = self._seq  # what the batches handed to the flusher reach
        self._unflushed = 0  # events applied in memory since the last hand-off
        self._readmitted: set[int] = set()  # dead letters no longer, not yet so in DuckDB
        self.writes = 0  # DuckDB writes handed off since it opened (the snapshot follows them)
        # changes that remove rows or add them under old sequences (deletes, backfills,
        # dead letters read again): the snapshot is then copied whole, not caught up
        self.reshaped = 0
        # the thread that writes DuckDB (``store.Flusher``); a failed write is tried
        # again every flush interval
        self.flusher = Flusher(self.store, retry_after=self.settings.flush_interval)
        try:
            self._open()
        except BaseException:
            self.flusher.close()
            raise

    def _open(self) -> None:
        # The rows read now live as long as the projection and hold no cycles: the cyclic
        # collector is kept out of the load (its full passes walked the growing state
        # again and again), and what the load made is frozen out of its sight after it
        # (``gc.freeze``; reference counting still frees the rows when it closes)
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._load()
        finally:
            gc.freeze()
            if collecting:
                gc.enable()
        self.store.drop_cache(above=DROP_CACHE_ABOVE)  # the rows are in memory now
        _give_back_freed_memory()  # loading freed much more than it keeps

    def _load(self) -> None:
        # the saved vector indexes are read on a thread of their own while the rows are
        # (FAISS lets go of the GIL: 0.4 s of a million's open, overlapped)
        saved_seq, entries = read_manifest(self.dir / "vectors")
        reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulse-open")
        reading: dict[str, concurrent.futures.Future[Any]] = {
            name: reader.submit(read_index_file, self.dir / "vectors" / name)
            for name in entries
            if saved_seq and (self.dir / "vectors" / name).exists()
        }
        reader.shutdown(wait=False)
        try:
            numbered = self._load_rows()
        except BaseException:
            for future in reading.values():
                future.cancel()
            raise
        if read_manifest(self.dir / "vectors")[0] == 0:
            # no saved indexes (new, crashed before its first save, or an older format):
            # the text index is refilled from the rows with the vector indexes
            shutil.rmtree(self.dir / "text", ignore_errors=True)
        self.text = TextIndex(self.dir / "text")
        (self.dir / "vectors").mkdir(exist_ok=True)
        self.vectors: dict[tuple[str, UUID], VectorIndex] = {}
        self.exact: dict[int, ExactVectors] = {}  # by dimension
        self.caches: dict[Any, Any] = {}  # derived read structures (see queries._Columns)
        # the dimension and the language the indexes assume, by collective
        self._live_collectives: dict[UUID, tuple[int | None, str]] = {}
        self._unindexed = Touched.nothing()  # applied, not yet in the indexes
        self._saving: concurrent.futures.Future[bool] | None = None  # a background save
        self.unindexed_events = 0  # events applied since the indexes were brought up
        # a catch-up (the engine's bulk rounds): vector indexes without a graph yet only
        # keep what is added, built in one add at their next use (``VectorIndex.add``)
        self.defer_graphs = False
        self._load_indexes(reading, numbered.rows)
        if self.text.recreated:  # made under another analysis: filled again from the rows
            self._reindex_text()
        self.last_flush = self.last_save = time.monotonic()
        # since when a delete applied here waits for the files to be rewritten (None:
        # nothing waits); a scrub a crash prevented is done soon after opening
        self.scrub_since: float | None = self.last_flush if self.store.scrub_owed() else None

    def _reindex_text(self) -> None:
        """Fill the text index again from the rows (its analysis changed: an upgrade),
        saying how far it has got every few seconds. The vector indexes stay as saved;
        the rows applied since they were saved are put in both again as they load."""
        documents = len(self.memory.experiences) + len(self.memory.insights)
        log.warning(
            "text index: its analysis changed (an upgrade); indexing the text of %d "
            "experiences and insights again", documents
        )  # fmt: skip
        started = shown = time.monotonic()
        done = 0

        def counted() -> Iterator[Document]:
            nonlocal done, shown
            for document in self._text_documents():
                yield document
                done += 1
                if time.monotonic() - shown >= REINDEX_PROGRESS_S:
                    shown = time.monotonic()
                    log.warning("text index: %d of about %d documents indexed", done, documents)

        made = self.text.rewrite(counted())
        log.warning(
            "text index: %d documents indexed again in %.1f s", made, time.monotonic() - started
        )

    def _load_rows(self) -> Numbered:
        self.memory = MemoryState()
        # the experiences and insights that have a local FAISS id (``_load_indexes``
        # finds the rows of the saved indexes' vectors in it, then lets it go)
        numbered = Numbered()
        tables = [
            self.store.rows(
                t, without=_HELD_APART.get(t, ()), vectors=numbered if t in _HELD_APART else None
            )
            for t in ROW_TYPES
        ]
        self.memory.load((row for table in tables for row in table.values()), numbered.numbers)
        self.memory.load_strays(self.store.stray_tombstones())
        for rejected in self.store.rejected():
            self.memory.rejected[rejected.seq] = rejected
        return numbered

    # -- applying --------------------------------------------------------------------------

    @property
    def seq(self) -> int:
        """The last stream sequence applied (in memory)."""
        return self._seq

    @property
    def unflushed(self) -> int:
        """Events applied in memory since the last hand-off to the DuckDB writer."""
        return self._unflushed

    @property
    def flushed_seq(self) -> int:
        """The sequence DuckDB's checkpoint holds (written by the flusher)."""
        return self.flusher.written_seq

    @property
    def dirty(self) -> bool:
        """Applied in memory but not yet handed to the DuckDB writer (``hand_off``;
        ``flusher.busy``: handed, not written yet)."""
        return (
            self.handed_seq != self._seq
            or bool(self.memory.unflushed_rejected)
            or bool(self._readmitted)
            or self.memory.has_changes()
        )

    def apply(self, entries: Sequence[LogEntry]) -> Touched:
        """Fold a batch of log entries (in stream order) into memory; the vector and text
        indexes follow at the next ``sync_indexes``. An entry that cannot be folded
        becomes a dead letter; the others apply."""
        self._check_owner()
        fresh = [e for e in entries if e.seq > self._seq]
        if not fresh:
            return Touched.nothing()
        touched = self._fold(fresh)
        self._seq = fresh[-1].seq
        if self.positions or fresh[0].position is not None or fresh[-1].position is not None:
            self._at_positions(fresh)  # (a log in partitions: LocalLog)
        return touched

    def _at_positions(self, entries: Sequence[LogEntry]) -> None:
        positions = self.positions
        for entry in entries:
            if entry.position is not None:
                part, seq = part_of(entry.position), seq_of(entry.position)
                if seq > positions.get(part, 0):
                    positions[part] = seq

    def backfill(self, entries: Sequence[LogEntry]) -> int:
        """Fold entries from before what is applied: the past events of a collective this
        host starts following (``projections.scope``); the applied sequence stays. The
        fold is order-free, so they land as if they had come in their turn. Returns how
        many were folded."""
        self._check_owner()
        if not entries:
            return 0
        self._fold(list(entries))
        self.reshaped += 1
        for key in [k for k in self.caches if k[0] == "past"]:
            self.caches.pop(key)  # the history before them changed: pasts are made again
        self.sync_indexes()
        return len(entries)

    def readmit_due(self) -> list[tuple[int, str, int | None]]:
        """The dead letters to read again (sequence, subject, position: in a log in
        partitions, where the log holds it; else None): the messages kept aside
        unread or unapplied, when this Pulse reads a newer wire schema than the one that
        kept them aside (it was upgraded); otherwise those sealed with a key that had not
        reached the key store (``eventlog.sealing``). (Events kept aside for naming
        another collective than their entity's were folded: they stay as they are.) With
        none to read, the version is recorded."""
        self._check_owner()
        due = sorted(
            (r.seq, r.subject, r.position)
            for r in self.memory.rejected.values()
            if not r.reason.startswith(MISPLACED)
        )
        if due and self.store.wire_schema() < codec.SCHEMA_VERSION:
            return due
        if self.store.wire_schema() != codec.SCHEMA_VERSION:
            self.store.set_wire_schema(codec.SCHEMA_VERSION)
        return sorted(
            (r.seq, r.subject, r.position)
            for r in self.memory.rejected.values()
            if r.reason.startswith(KEY_MISSING)
        )  # (sealed events whose key had not come: it may have since)

    def readmit(self, entries: Sequence[LogEntry], gone: Sequence[int]) -> int:
        """Fold again the dead letters ``readmit_due`` named, as read again from the log
        (``entries``; ``gone``: those the log no longer holds, forgotten since: no host
        reading the log now would see them). The fold is order-free, so what reads now
        lands as if it had come in its turn; what still cannot be read or applied is
        kept aside again, with today's reason (as a host of this version reading the log
        from the start has it). Written to DuckDB with the version; returns how many
        now apply."""
        self._check_owner()
        memory = self.memory
        again = [e for e in entries if e.seq in memory.rejected]
        dropped = {e.seq for e in again} | {s for s in gone if s in memory.rejected}
        for seq in dropped:
            del memory.rejected[seq]
        memory.unflushed_rejected = [r for r in memory.unflushed_rejected if r.seq not in dropped]
        self._readmitted |= dropped
        self.reshaped += 1
        if again:
            self._fold(again)
        self.flush()
        self.store.set_wire_schema(codec.SCHEMA_VERSION)
        return sum(1 for e in again if e.seq not in memory.rejected)

    def _fold(self, fresh: list[LogEntry]) -> Touched:
        """Fold entries into memory (the indexes follow at ``sync_indexes``)."""
        delta = FoldState()
        for entry in fresh:
            if entry.event is None:
                error = entry.error
                self.memory.reject(
                    Rejected(
                        seq=entry.seq, subject=entry.subject,
                        reason=error.reason if error else "unreadable",
                        instance_id=getattr(error, "instance_id", None),
                        position=entry.position,
                    )
                )  # fmt: skip
                continue
            event = entry.event
            if isinstance(event, _DELETES):
                self.reshaped += 1
                if self.scrub_since is None:
                    self.scrub_since = time.monotonic()
            try:
                row = row_of(event)  # (one row: every event but a task's writes)
                rows = (row,) if row is not None else rows_of(event)
                for row in rows:
                    _fits_store(row)
                    if isinstance(row, Placed) and row.create_event is not None:
                        # where the log put it (see Placed): its stream sequence, or
                        # its position in a log in partitions (the same on every host)
                        row.create_seq = entry.seq if entry.position is None else entry.position
                for row in rows:
                    delta.add(row, owned=True)
                if rows:
                    row = rows[0]
                    if type(row) is not ApplicationRow:  # (a reinforcement: see _audited)
                        self.memory.unflushed_audit.append(_audited(entry.seq, event))
                    else:
                        self.memory.unflushed_counts.append(
                            (entry.seq, row.experience_id, row.instance_id, row.collective_id,
                             row.applications, row.last_hlc, event.author_owner,
                             event.author_agent)
                        )  # fmt: skip
            except Exception as exc:  # an event no rule can fold: keep it aside
                log.warning("event at sequence %d kept aside: %s", entry.seq, exc)
                self.memory.reject(
                    Rejected(
                        seq=entry.seq, subject=entry.subject, reason=f"cannot apply: {exc}",
                        instance_id=entry.event.instance_id, position=entry.position,
                    )
                )  # fmt: skip
        touched = self.memory.merge(delta)
        for entry in fresh:  # an event naming another collective than its entity's
            if entry.event is not None and (why := self.memory.misplaced(entry.event)):
                self.memory.reject(
                    Rejected(
                        seq=entry.seq, subject=entry.subject, reason=why,
                        instance_id=entry.event.instance_id, position=entry.position,
                    )
                )  # fmt: skip
        pending = self._unindexed
        pending.experiences |= touched.experiences
        pending.insights |= touched.insights
        pending.collectives |= touched.collectives
        self._unflushed += len(fresh)
        self.unindexed_events += len(fresh)
        return touched

    def sync_indexes(self) -> None:
        """Bring the vector and text indexes up to what is applied. ``apply`` leaves that
        for later, so a write waits only for the fold: the engine does it after waking
        the writers, before any read, and before a flush; so do the queries that search."""
        pending = self._unindexed
        self.unindexed_events = 0
        if pending.experiences or pending.insights or pending.collectives:
            self._unindexed = Touched.nothing()
            self._sync(pending)

    def _check_owner(self) -> None:
        if threading.get_ident() != self._owner:
            raise RuntimeError(
                "a projection is changed only by the thread that opened it (its engine); "
                "hand the work to projections.engine.Engine"
            )

    def skip(self, entry: LogEntry, reason: str) -> None:
        """Keep an entry aside as a dead letter and move past it (the engine found that
        applying it raises)."""
        self._check_owner()
        event = entry.event
        self.memory.reject(
            Rejected(
                seq=entry.seq, subject=entry.subject, reason=reason,
                instance_id=event.instance_id if event is not None else None,
                position=entry.position,
            )
        )  # fmt: skip
        if entry.seq > self._seq:
            self._seq = entry.seq
            self._unflushed += 1
            if entry.position is not None:
                self._at_positions((entry,))

    # -- DuckDB and the index files ----------------------------------------------------------

    def hand_off(self) -> concurrent.futures.Future[int] | None:
        """Take what memory holds past the last hand-off (the changed rows' values, the
        audit, the counts, the dead letters) and hand it to the DuckDB writer, with the
        checkpoint it moves to; returns at once. The future is the batch's (or, with
        nothing new or while DuckDB refuses the last one, the last batch's not written
        yet; None: DuckDB holds everything).
        The engine does this every ``flush_interval`` while the writer is idle; a write
        is taken whole, so batches are written in order and the checkpoint always
        matches the rows DuckDB holds."""
        self._check_owner()
        self.sync_indexes()  # assigns the vector ids the rows are written with
        self.last_flush = time.monotonic()
        if not self.dirty or self.flusher.error is not None:
            return self.flusher.last()  # (while a write is refused, memory gathers the rest)
        memory = self.memory
        rows, forgotten, rejected = memory.take_dirty()
        audited, memory.unflushed_audit = memory.unflushed_audit, []
        counted, memory.unflushed_counts = memory.unflushed_counts, []
        strays, memory.unflushed_strays = memory.unflushed_strays, []
        try:
            batch = Batch(
                freeze(rows, memory.vec_ids, self.embedding_view), forgotten, rejected,
                self._seq, self._unflushed, audited, counted, self._readmitted,
                owe_scrub=self.scrub_since is not None, strays=strays,
                positions=dict(self.positions) if self.positions else None,
            )  # fmt: skip
            done = self.flusher.put(batch, self.store.writer())
        except BaseException:  # (the writer is closed): memory keeps it for the next
            memory.restore_dirty(rows, forgotten, rejected)
            memory.unflushed_audit = audited + memory.unflushed_audit
            memory.unflushed_counts = counted + memory.unflushed_counts
            memory.unflushed_strays = strays + memory.unflushed_strays
            raise
        self._readmitted = set()
        self.writes += 1
        self.handed_seq = self._seq
        self._unflushed = 0
        return done

    def flush(self) -> int:
        """Hand off what memory holds and wait until DuckDB holds everything applied;
        returns the sequence DuckDB now reflects. Raises the error of a write DuckDB
        refused meanwhile (the writer keeps the batch, and tries it again)."""
        self.hand_off()
        seq = self.flusher.drain()
        if self.dirty:  # held back while a write was refused: written now
            self.hand_off()
            seq = self.flusher.drain()
        return seq

    def save(self, *, background: bool = False) -> None:
        """Flush, then save the indexes with the sequence they reflect. ``background``:
        return at once, the files written by a thread of their own (``_save_behind``;
        nothing is done while the last one is under way)."""
        if background:
            self._start_save()
            return
        self.saved()
        self.flush()
        self.store.checkpoint_file()
        self.text.commit()
        for exact in self.exact.values():
            exact.sync()
        entries = {}
        for (kind, collective_id), index in self.vectors.items():
            path = self._path(kind, collective_id)
            index.save(path)
            entries[path.name] = index.dim
        for stale in (self.dir / "vectors").glob("*.faiss"):
            if stale.name not in entries:
                stale.unlink()
        write_manifest(self.dir / "vectors", self.flushed_seq, entries)
        self.saved_seq = self.flushed_seq
        self.last_save = time.monotonic()

    def saved(self) -> bool:
        """Wait for a background save under way; whether the last one wrote its manifest
        (True also when there was none). Its error, if any, is logged, not raised: the
        files it left are what a crash during it would leave, and the next save writes
        them all again."""
        saving, self._saving = self._saving, None
        if saving is None:
            return True
        try:
            return saving.result()
        except Exception:
            log.exception("saving the indexes in the background failed; saved again later")
            return False

    def _start_save(self) -> None:
        """A save in two parts. Here, on the owner thread, what must reflect one moment:
        DuckDB's batch handed over (sequence S), the text index's commit taken (at S or
        past it: searches commit too; ``TextIndex.commit_behind``), the list of index
        files. On the saver thread: commit the text index, wait until DuckDB holds S,
        write each index (``VectorIndex.write``: under its
        ``_stable`` lock, so at S or past it, but for vectors pending then, which an open
        adds again from the rows), the exact vectors to the file, and the manifest with S
        last: it never claims more than the files hold. An open reconciles what the files
        hold past S with the rows (``_load_indexes``); DuckDB's write-ahead log is folded
        into its file on the flusher's thread (``Flusher.checkpoint_soon``)."""
        self._check_owner()
        if self._saving is not None:
            if not self._saving.done():
                return
            self.saved()
        self.hand_off()
        if self.flusher.error is not None:  # DuckDB refuses writes: saved once it takes them
            return
        seq = self.handed_seq
        text_commit = self.text.commit_behind()  # (run by the saver: TextIndex holds meanwhile)
        indexes = [
            (self._path(kind, collective_id), index)
            for (kind, collective_id), index in self.vectors.items()
        ]
        exacts = list(self.exact.values())
        self.flusher.checkpoint_soon(self.store.writer())
        self.last_save = time.monotonic()
        try:
            self._saving = _SAVER.submit(self._save_behind, seq, indexes, exacts, text_commit)
        except BaseException:  # (the saver is gone: the interpreter exits) committed here
            if text_commit is not None:
                text_commit()
            raise

    def _save_behind(
        self,
        seq: int,
        indexes: list[tuple[Path, VectorIndex]],
        exacts: list[ExactVectors],
        text_commit: Callable[[], None] | None = None,
    ) -> bool:
        """The saver thread's part of a background save (``_start_save``); False: not
        saved (DuckDB did not take sequence ``seq``)."""
        if text_commit is not None:  # first, and in any case (the engine holds its changes)
            text_commit()
        if not self.flusher.wait_written(seq):
            return False
        entries = {}
        for path, index in indexes:
            index.write(path)
            entries[path.name] = index.dim
        for exact in exacts:
            exact.sync(every_page=True)
        for stale in (self.dir / "vectors").glob("*.faiss"):
            if stale.name not in entries:
                stale.unlink(missing_ok=True)
        write_manifest(self.dir / "vectors", seq, entries)
        self.saved_seq = max(self.saved_seq, seq)
        return True

    def scrub(self, copy: Callable[[Path], None] | None = None) -> dict[str, float]:
        """Rewrite every file of this state so that what deletes forgot is in none of
        them: DuckDB into a fresh file put in place of the old one (a delete only marks
        rows, and freed blocks are not overwritten), the tantivy index emptied and filled
        again from the live rows in one commit (tantivy offers no forced merge), and the
        vector files saved (a removed vector is gone from what FAISS writes, and its copy
        in the exact file was overwritten). ``copy`` is handed the fresh DuckDB file
        before it takes the old one's place (the analysts' snapshot copies it:
        ``projections.snapshot``). Returns the seconds each took."""
        self._check_owner()
        took: dict[str, float] = {}
        start = time.perf_counter()
        self.saved()  # (its files are written again below)
        self.flush()
        self.store.rewrite(copy)
        took["duckdb"] = time.perf_counter() - start
        start = time.perf_counter()
        self.text.rewrite(self._text_documents())
        took["tantivy"] = time.perf_counter() - start
        start = time.perf_counter()
        self.save()
        took["vectors"] = time.perf_counter() - start
        self.store.owe_scrub(False)
        self.scrub_since = None
        return took

    def _text_documents(self) -> Iterator[Document]:
        """What the text index holds: every live experience and indexable insight."""
        memory = self.memory
        language = memory.text_language
        for (row_id,), row in memory.experiences.items():
            cid = row.collective_id
            if cid is not None and memory.live_experience(row_id) is not None:
                yield (
                    "experience", row_id, cid, row.content or "", language(row),
                    row.visibility, row.author_owner, row.author_agent,
                )  # fmt: skip
        for (row_id,), insight in memory.insights.items():
            cid = insight.collective_id
            if cid is not None and _indexable_insight(memory, insight):
                yield (
                    "insight", row_id, cid, insight.content or "", language(insight),
                    insight.visibility, insight.author_owner, insight.author_agent,
                )  # fmt: skip

    # -- keeping the indexes in step -------------------------------------------------------

    def embedding(self, row: ExperienceRow | InsightRow) -> bytes:
        """A row's embedding as bytes (a copy, when it is held in an exact-vectors file)."""
        return bytes(self.embedding_view(row.embedding))

    def embedding_view(self, embedding: bytes | int | None) -> bytes | memoryview:
        """An embedding's bytes: a view of its slot, when it is held in a file (``held``)."""
        if type(embedding) is int:
            vec_id, dim = held_at(embedding)
            return self._exact(dim).view(vec_id)
        return embedding or b""  # type: ignore[return-value]

    def _own_copy(self, row: ExperienceRow | InsightRow | None) -> None:
        """Give a row that stays its own copy of its embedding, before the exact-vectors
        file's copy is overwritten (it is, when a vector leaves its index)."""
        if row is not None and type(row.embedding) is int:
            row.embedding = self.embedding(row)

    def _exact(self, dim: int) -> ExactVectors:
        exact = self.exact.get(dim)
        if exact is None:
            exact = self.exact[dim] = ExactVectors(self.dir / "vectors" / f"exact-{dim}.f32", dim)
        return exact

    def _index(self, kind: str, collective_id: UUID, dim: int) -> VectorIndex:
        index = self.vectors.get((kind, collective_id))
        if index is None or index.dim != dim:
            index = VectorIndex(
                dim, self._exact(dim), self.settings.hnsw_threshold, self.settings.ef_search
            )
            self.vectors[(kind, collective_id)] = index
        return index

    def _sync(self, touched: Touched, text_owed: frozenset[UUID] = frozenset()) -> None:
        """Bring the indexes up for what ``touched`` names; ``text_owed``: rows put in the
        text index again even where the vector index holds them already (see
        ``_load_indexes``)."""
        memory = self.memory
        for collective_id in touched.collectives:
            now = (
                memory.collective_dimension(collective_id),
                memory.collective_language(collective_id),
            )
            if collective_id in self._live_collectives and (
                self._live_collectives[collective_id] == now
            ):
                continue  # a repeated create: nothing its members depend on changed
            self._live_collectives[collective_id] = now
            for kind in ("experience", "insight"):
                self._drop_index(kind, collective_id)
            self.text.remove_collective(collective_id)
            touched.experiences |= memory.experiences_of.get(collective_id, set())
            touched.insights |= memory.insights_of.get(collective_id, set())
        if touched.experiences:
            self._sync_rows("experience", touched.experiences, text_owed)
        if touched.insights:
            self._sync_rows("insight", touched.insights, text_owed)
        # no text commit here: a tantivy commit costs ~15 ms; searches commit first
        # (so they read every applied write) and save() commits with the manifest

    def _rows(self, kind: str) -> dict[tuple[Any, ...], ExperienceRow | InsightRow]:
        """The experience or insight rows (``kind``)."""
        memory = self.memory
        return memory.experiences if kind == "experience" else memory.insights  # type: ignore[return-value]

    def _drop_index(self, kind: str, collective_id: UUID) -> None:
        """Forget a collective's index and overwrite its vectors in the exact file; a
        row that stays (not deleted) keeps its own copy of its vector first."""
        index = self.vectors.pop((kind, collective_id), None)
        if index is None:
            return
        index.deferred.clear()  # (not built only to be dropped)
        index.wait()
        table = self._rows(kind)
        for row_id in index.keys.values():
            self._own_copy(table.get((row_id,)))
        index.exact.erase(index.members)

    def _sync_rows(
        self, kind: str, ids: set[UUID], text_owed: frozenset[UUID] = frozenset()
    ) -> None:
        adds: _Adds = {}
        for row_id in sorted(ids):  # one insertion order everywhere: ties rank alike
            try:
                self._sync_row(kind, row_id, adds, row_id in text_owed)
            except Exception:  # one row an index refuses must not stop the others
                log.exception("%s %s could not be indexed", kind, row_id)
        table = self._rows(kind)
        for (collective_id, dim), (vec_ids, vectors, keys) in adds.items():
            try:
                matrix = np.frombuffer(b"".join(vectors), dtype="<f4").reshape(len(vectors), dim)
                index = self._index(kind, collective_id, dim)
                index.add(vec_ids, matrix, keys, defer=self.defer_graphs)
            except Exception:  # the rows stay readable; `pulse rebuild` rebuilds the index
                log.exception("%d %s vectors of collective %s could not be indexed",
                              len(vec_ids), kind, collective_id)  # fmt: skip
                continue
            for vec_id, row_id in zip(vec_ids, keys, strict=True):
                row = table.get((row_id,))
                if row is not None and vec_id in index.members:
                    row.embedding = held(vec_id, dim)  # held once, in the file

    def _sync_row(self, kind: str, row_id: UUID, adds: _Adds, text_owed: bool = False) -> None:
        """One experience or insight into (or out of) its indexes; vectors to add are
        gathered in ``adds``, one FAISS call per collective. ``text_owed``: put in the
        text index even if the vector index holds it already."""
        memory = self.memory
        row: ExperienceRow | InsightRow | None
        if kind == "experience":
            row = memory.experiences.get((row_id,))
            live = memory.live_experience(row_id) is not None
            hidden = bool(row is not None and row.archived)
        else:
            row = memory.insights.get((row_id,))
            live = row is not None and _indexable_insight(memory, row)
            hidden = False
        collective_id = row.collective_id if row is not None else None
        if live and row is not None and collective_id is not None:
            dim = memory.collective_dimension(collective_id)
            assert dim is not None
            index = self._index(kind, collective_id, dim)
            vec_id = memory.vec_id(row_id, ExperienceRow if kind == "experience" else InsightRow)
            fresh = vec_id not in index.members or type(row.embedding) is not int
            if fresh:
                ids_, vecs, keys = adds.setdefault((collective_id, dim), ([], [], []))
                ids_.append(vec_id)
                vecs.append(self.embedding(row))
                keys.append(row_id)
            if fresh or text_owed:
                language = memory.text_language(row)
                self.text.put(
                    kind, row_id, collective_id, row.content or "", language,
                    row.visibility, row.author_owner, row.author_agent,
                )  # fmt: skip
            index.set_hidden(vec_id, hidden)
            return
        vec_id_or_none = memory.vec_ids.get(row_id)
        index_or_none = self.vectors.get((kind, collective_id)) if collective_id else None
        if index_or_none is not None and vec_id_or_none is not None:
            self._own_copy(row)  # removing it overwrites the file's copy
            index_or_none.remove([vec_id_or_none])
        self.text.remove(row_id)

    # -- persistence -----------------------------------------------------------------------

    def _path(self, kind: str, collective_id: UUID) -> Path:
        return self.dir / "vectors" / f"{kind}-{collective_id}.faiss"

    def _load_indexes(
        self, reading: dict[str, concurrent.futures.Future[Any]], by_vec_id: dict[int, Row]
    ) -> None:
        """The saved indexes (``reading``: their files, being read) checked against the
        rows (``by_vec_id``: those with a vector number, by it)."""
        memory = self.memory
        saved_seq, entries = read_manifest(self.dir / "vectors")
        self.saved_seq = saved_seq
        for name, dim in entries.items():
            kind, _, rest = name.partition("-")
            collective_id = UUID(rest.removesuffix(".faiss"))
            path = self.dir / "vectors" / name
            read = reading.get(name)
            if read is not None or path.exists():
                self.vectors[(kind, collective_id)] = VectorIndex.load(
                    path, self._exact(dim), self.settings.hnsw_threshold, self.settings.ef_search,
                    read=None if read is None else read.result(),
                )  # fmt: skip
                language = memory.collective_language(collective_id)
                self._live_collectives[collective_id] = (dim, language)
        # a file written by a background save may hold vectors of rows DuckDB never got
        # (applied past the manifest's sequence, then a crash): removed below, and their
        # numbers never given to another row (an index keeps a removed one's number)
        for index in self.vectors.values():
            if index.members:
                memory.next_vec_id = max(memory.next_vec_id, 1 + max(index.members))
        # one pass over each index: rows pointed at the file, and each vector checked
        # against its row (a vector whose row is unknown, dead or not indexable is stale)
        for (kind, _collective_id), index in self.vectors.items():
            dim, keys, gone = index.dim, index.keys, index.gone
            row_type, id_of = _KINDS[kind]
            stale = []
            # (the dimension of the rows' collective, asked once for each run of rows of
            # one collective object: ``live_experience`` without a look-up per row)
            last_collective: Any = _NOT_A_ROW
            live_dim: int | None = None
            for vec_id in index.members:
                row: Any = by_vec_id.get(vec_id)  # (an experience or insight row)
                if row is None:
                    row_id = None
                elif type(row) is row_type:
                    row_id = id_of(row)
                else:  # (a number of another kind's row: not this index's)
                    row_id, row = row.key()[0], None
                created = row is not None and row.create_event is not None and not row.deleted
                if created:
                    row.embedding = held(vec_id, dim)
                if vec_id in gone:
                    continue
                if row_id is None:
                    stale.append(vec_id)
                    continue
                keys[vec_id] = row_id
                if kind == "experience":
                    # live (``MemoryState.live_experience``): created, not deleted, in a
                    # live collective of the vector's dimension (its embedding is the
                    # slot just set, of this index's dimension)
                    if not created:
                        stale.append(vec_id)
                        continue
                    if row.collective_id is not last_collective:
                        last_collective = row.collective_id
                        live_dim = memory.collective_dimension(last_collective)
                    if live_dim != dim:
                        stale.append(vec_id)
                    elif row.archived:
                        index.set_hidden(vec_id, True)  # (an index opens with none hidden)
                elif row is None or not _indexable_insight(memory, row):
                    stale.append(vec_id)
            for vec_id in stale:  # removing them overwrites the file's copies
                found: Any = by_vec_id.get(vec_id)
                self._own_copy(found if type(found) is row_type else None)
            index.remove(stale)
        # one walk of every row: those in no saved index (behind it, or not live) read
        # their vectors from DuckDB; live ones among them, and rows that hold their bytes
        # already (dead letters hold them for good), are what the indexes lack
        unindexed: dict[str, set[UUID]] = {}
        for row_type, kind in ((ExperienceRow, "experience"), (InsightRow, "insight")):
            table = self._rows(kind)
            missing, holding = [], []
            for key, row in table.items():
                embedding = row.embedding
                if embedding is None:
                    if row.create_event is not None and not row.deleted:
                        missing.append(key[0])
                elif type(embedding) is bytes:
                    holding.append(key[0])
            for row_id, embedding in self.store.embeddings(row_type, missing).items():
                table[(row_id,)].embedding = embedding
                holding.append(row_id)
            if kind == "experience":
                unindexed[kind] = {i for i in holding if memory.live_experience(i) is not None}
            else:
                unindexed[kind] = {
                    i
                    for i in holding
                    if _indexable_insight(memory, table[(i,)])  # type: ignore[arg-type]
                }
        if saved_seq < self._seq or any(unindexed.values()):  # catch up from the rows
            changed = self.store.changed_since(saved_seq)
            # the text index was committed at the manifest's sequence, the vector files
            # written after it: a row changed since may be in a file and not in the text
            # index, so every changed row is put in the text index again
            self._sync(
                Touched(
                    changed["experience"] | unindexed["experience"],
                    changed["insight"] | unindexed["insight"],
                    changed["collective"],
                ),
                frozenset(changed["experience"] | changed["insight"]),
            )
            self.save()

    def checkpoint(self) -> tuple[int, int]:
        """(last applied stream sequence, events applied in all), DuckDB flushed first."""
        self.flush()
        return self.store.checkpoint()

    def live_dimension(self, collective_id: UUID) -> int | None:
        """The embedding dimension of a live collective; None if it is not live."""
        return self.memory.collective_dimension(collective_id)

    def digest(self, collective_id: UUID | None = None) -> str:
        """The hash of the logical state, or of one collective's (DuckDB is flushed first)."""
        self.flush()
        return self.store.digest(collective_id)

    def deletes_since(self, seq: int) -> list[tuple[int, str, UUID | None, UUID]]:
        """The deletes this projection applied past a sequence, from the history:
        (sequence, entity, collective, entity id), in stream order (what an edge host
        forgets from its own streams when it opens: ``sync.instance``)."""
        self._check_owner()
        self.flush()
        found = self.store.con.execute(
            "SELECT seq, entity, collective_id, entity_id FROM audit_rows WHERE seq > ? "
            "AND event_type IN ('collective.deleted', 'experience.deleted', "
            "'relation.deleted', 'insight.deleted', 'wisdom.deleted') ORDER BY seq",
            [seq],
        ).fetchall()
        return [(int(s), str(e), c, i) for s, e, c, i in found]

    def drop_history(self, collective_id: UUID, up_to: int) -> None:
        """Before a backfill runs again: the history rows the unfinished one wrote."""
        self._check_owner()
        self.flush()
        self.store.drop_history(collective_id, up_to)
        self.writes += 1
        self.reshaped += 1

    def close(self) -> None:
        try:
            self.save()  # (after any background save)
        finally:
            self.flusher.close()
        self.text.close()
        self.store.close()
        for exact in self.exact.values():
            exact.close()


def _give_back_freed_memory() -> None:
    """Return the C heaps' free pages to the system: glibc's and Arrow's pool (the
    columns an open read), which keep them otherwise."""
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


_NOT_A_ROW = object()  # (what no row's collective is)

# an index's kind: its rows' type, and their id
_KINDS: dict[str, tuple[type[Any], Callable[[Any], UUID]]] = {
    "experience": (ExperienceRow, attrgetter("experience_id")),
    "insight": (InsightRow, attrgetter("insight_id")),
}

# columns read from the vector files rather than DuckDB when a projection opens
_HELD_APART: dict[type, tuple[str, ...]] = {
    ExperienceRow: ("embedding",),
    InsightRow: ("embedding",),
}


def _indexable_insight(memory: MemoryState, row: InsightRow) -> bool:
    """An insight's vector belongs in its collective's index when it is created, not
    deleted, and fits a live collective (whether its sources are live is decided when
    it is read, as they may arrive later)."""
    if row.create_event is None or row.deleted:
        return False
    dim = memory.collective_dimension(row.collective_id)
    return dim is not None and vector_bytes(row.embedding) == 4 * dim


_UBIGINT_MAX = 2**64 - 1
_INTEGER_MAX = 2**31 - 1


def _fits_store(row: object) -> None:
    """Refuse a row DuckDB could not hold: the last guard for events handed to
    ``apply`` directly (the codec checks every event read from the log, and the engine
    every event a writer offers, against ``eventlog.limits``)."""
    if type(row) is ApplicationRow:  # the commonest row: its two numbers only
        if not (
            0 <= row.applications <= _UBIGINT_MAX // 2 and 0 <= row.last_hlc <= _UBIGINT_MAX // 2
        ):
            raise ValueError(
                f"applications / last_hlc: must be in 0..2**63-1, got {row.applications}, "
                f"{row.last_hlc}"
            )
        return
    for name in (
        "created_hlc",
        "ended_hlc",
        "last_hlc",
        "applications",
        "source_experience_count",
        "expires_ms",
        "valid_from_ms",
        "valid_to",
    ):
        value = getattr(row, name, None)
        if value is not None and not 0 <= value <= _UBIGINT_MAX // 2:
            raise ValueError(f"{name}: must be in 0..2**63-1, got {value}")
    dim = getattr(row, "embedding_dimension", None)
    if dim is not None and not 1 <= dim <= 4096:
        raise ValueError(f"embedding_dimension: must be in 1..4096, got {dim}")


# -- the state directory of a data directory, swapped atomically by projections.rebuild ---


def state_link(data_dir: Path) -> Path:
    return Path(data_dir) / "state"


@contextlib.contextmanager
def holding_state(data_dir: str | Path, doing: str) -> Iterator[None]:
    """Hold the current state of a data directory while the block runs, for ``doing``
    (a command, e.g. ``rebuild``): refused (StateInUse) while another process has it
    open, and kept from any other until the block ends (``store.holding_file``). A
    data directory without a state has nothing to hold."""
    link = state_link(Path(data_dir))
    database = link.resolve() / "state.duckdb" if link.exists() else None
    if database is None or not database.exists():
        yield
        return
    with holding_file(database, doing):
        yield


def state_dir(data_dir: str | Path) -> Path:
    """The current state directory of a data directory (created empty the first time)."""
    data_dir = Path(data_dir)
    link = state_link(data_dir)
    if not link.exists():
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        point_state(link, fresh_state_dir(data_dir))
    found = link.resolve()
    if found.stat().st_mode & 0o077:  # made by a version that left it open to others
        found.chmod(0o700)
    return found


def fresh_state_dir(data_dir: Path) -> Path:
    """A new state directory, readable by its owner only: it holds every memory in
    clear (DuckDB, the vector files, the full-text index)."""
    target = data_dir / f"state-{uuid7()}"
    target.mkdir(mode=0o700, parents=True)
    return target


def point_state(link: Path, target: Path) -> None:
    """Make ``link`` point at ``target`` in one atomic rename."""
    tmp = link.with_name(link.name + ".swap")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target.name)
    tmp.replace(link)


def _audited(seq: int, event: ev.Event) -> Audited:
    """The audit's row of an event the fold took in (its values already fit the store:
    ``_fits_store``, HLC included), with the event itself as JSON, its embedding left out
    (the history ``projections.past`` folds back). Reinforcements are kept apart, in the
    counts' history: they are most of a busy log, and a few numbers each."""
    tag, entity, key, in_collective = _AUDIT_OF[type(event)]
    if hasattr(event, "embedding"):  # (held in the rows and vector files already)
        event = msgspec.structs.replace(event, embedding=b"")
    elif isinstance(event, ev.TokenCreated):  # (a revocation wipes it from the token's row)
        event = msgspec.structs.replace(event, secret_sha256="")
    elif isinstance(event, ev.ThreadCheckpointed):  # (a framework's state: in its row only)
        event = msgspec.structs.replace(event, checkpoint=b"")
    elif isinstance(event, ev.ThreadWritten):
        event = msgspec.structs.replace(
            event, writes=tuple(msgspec.structs.replace(w, value=b"") for w in event.writes)
        )
    return (
        seq, tag, event.collective_id if in_collective else None,  # type: ignore[union-attr]
        entity, getattr(event, key), event.author_owner, event.author_agent,
        event.instance_id, event.hlc, _to_json(event).decode(),
    )  # fmt: skip


_to_json = msgspec.json.Encoder().encode


def _audit_of(event_type: type[ev.EventBase]) -> tuple[str, str, str, bool]:
    """What the audit takes of events of a type: tag, entity, the field of the entity's
    id (``collective_id`` for a collective's own events and activities), and whether it
    names a collective."""
    fields = event_type.__struct_fields__
    entity = next(
        (
            e
            for e in ("experience", "relation", "insight", "wisdom", "token", "session", "thread")
            if f"{e}_id" in fields
        ),
        "collective",
    )
    tag = str(event_type.__struct_config__.tag)
    return tag, entity, f"{entity}_id", "collective_id" in fields


_AUDIT_OF = {t: _audit_of(t) for t in ev.EVENT_TYPES}


def entity_of(event: ev.Event) -> tuple[str, UUID | None]:
    """The entity an event is about, and its id (for the writer that forgets a write that
    landed after a delete)."""
    _, entity, key, _ = _AUDIT_OF[type(event)]
    return entity, getattr(event, key)

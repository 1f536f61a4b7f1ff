"""The engine's memory: every folded row, and the indexes reads need, so that a read, a
filter, a ranking input or a write's reference check never pays a SQL round trip.

``MemoryState`` holds the join of every applied event (``projections.fold``) keyed like
the DuckDB base tables, plus what is derived from it: which collectives are live (and
their dimension), the experiences of each collective in recording order, the G-counter
totals of every experience, relations by their ends and by their (source, target, type)
triple, and the events that could not be applied. It also remembers which rows changed
since DuckDB was last written (``dirty``), so the store can write them in bulk.

This module is where Pulse defines what is *live*: ``experience_problem`` /
``live_experience``, ``relation_problem`` / ``live_relation``, ``insight_problem`` /
``live_insight``, ``collective_dimension``. Every read, the vector and text indexes and
the dead letters use these definitions; the analysts' SQL views in
``projections.schema`` state the same rules in SQL, and ``tests/test_engine.py`` checks
that the two agree on random histories.

Everything here is touched by the engine thread only (see ``projections.engine``).
"""

from __future__ import annotations

import bisect
import operator
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter, itemgetter
from typing import Any, TypeAlias, TypeVar
from uuid import UUID

from eventlog import events as ev
from eventlog.access import DEFAULT_VISIBILITY
from eventlog.languages import AUTO, ENGLISH, LANGUAGES, SIMPLE
from projections.crdt import NO_STAMP, GCounter
from projections.fold import (
    ROW_TYPES,
    ApplicationRow,
    CheckpointRow,
    CollectiveRow,
    ExperienceRow,
    FoldState,
    InsightRow,
    PendingWriteRow,
    RelationRow,
    Row,
    SessionRow,
    ThreadRow,
    TokenRow,
    WisdomRow,
    vector_bytes,
)
from projections.language import ENGLISH_AMONG_OTHERS, of_document
from projections.schema import MISPLACED

R = TypeVar("R")
DELETED_ACCESS_MAX = 100_000  # deleted experiences whose visibility a watch can still ask


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message the engine could not apply: kept aside, named by where it was and who
    wrote it (when that much could be read)."""

    seq: int
    subject: str
    reason: str
    instance_id: UUID | None = None
    # where the log holds it, in a log in partitions (``eventlog.partitions.position``):
    # ``seq`` is this host's number, which finds it again in no stream (None: one stream)
    position: int | None = None


# One event in the audit (the ``audit`` and ``history`` views): seq, type, collective,
# entity, entity id, author owner, author agent, instance, hlc, the event as JSON (its
# embedding left out: ``projections.past`` folds these back into rows as of a moment)
Audited: TypeAlias = tuple[
    int, str, UUID | None, str, UUID | None, str | None, str | None, UUID, int, str
]
# One reinforcement in the counts' history: seq, experience, instance, collective named,
# applications (the instance's total), hlc, author owner, author agent
Counted: TypeAlias = tuple[int, UUID, UUID, UUID | None, int, int, str | None, str | None]


@dataclass(slots=True)
class Touched:
    """What one applied batch changed, for the vector and text indexes to follow."""

    experiences: set[UUID]
    insights: set[UUID]
    collectives: set[UUID]

    @classmethod
    def nothing(cls) -> Touched:
        return cls(set(), set(), set())


class MemoryState:
    """All folded rows of a projection and their derived indexes (see the module doc)."""

    def __init__(self) -> None:
        self.fold = FoldState()
        self.collectives: dict[tuple[Any, ...], CollectiveRow] = self.fold.rows[CollectiveRow]  # type: ignore[assignment]
        self.experiences: dict[tuple[Any, ...], ExperienceRow] = self.fold.rows[ExperienceRow]  # type: ignore[assignment]
        self.applications: dict[tuple[Any, ...], ApplicationRow] = self.fold.rows[ApplicationRow]  # type: ignore[assignment]
        self.relations: dict[tuple[Any, ...], RelationRow] = self.fold.rows[RelationRow]  # type: ignore[assignment]
        self.insights: dict[tuple[Any, ...], InsightRow] = self.fold.rows[InsightRow]  # type: ignore[assignment]
        self.wisdom: dict[tuple[Any, ...], WisdomRow] = self.fold.rows[WisdomRow]  # type: ignore[assignment]
        # rows changed since DuckDB was last written, and experiences whose counts must go
        self.dirty: dict[type[Row], set[tuple[Any, ...]]] = {t: set() for t in ROW_TYPES}
        # (experience, collective named) whose counts go: named by a report of that
        # collective, where the experience's group in that collective is a tombstone
        self.forgotten_counts: set[tuple[UUID, UUID | None]] = set()
        self.vec_ids: dict[UUID, int] = {}  # experience / insight id -> local FAISS id
        self.next_vec_id = 1
        # the G-counters, apart for each collective the reports named: only the one of
        # the experience's own collective counts (``applications_of``)
        self.counted: dict[UUID, set[tuple[UUID, UUID | None]]] = {}  # -> (instance, named)
        self.counters: dict[tuple[UUID, UUID | None], GCounter] = {}  # (experience, named)
        self.last_reinforced: dict[tuple[UUID, UUID | None], int] = {}  # largest HLC of one
        self.order: dict[UUID, list[tuple[int, UUID]]] = {}  # collective -> (created, id)
        self.experiences_of: dict[UUID, set[UUID]] = {}  # collective -> experience ids
        self.insights_of: dict[UUID, set[UUID]] = {}
        self.relations_of: dict[UUID, set[UUID]] = {}
        self.by_source: dict[UUID, set[UUID]] = {}  # experience -> relations from it
        self.by_target: dict[UUID, set[UUID]] = {}
        self.triples: dict[tuple[Any, ...], set[UUID]] = {}  # created, undeleted relations
        self.rejected: dict[int, Rejected] = {}
        # collective -> a number that moves whenever it or one of its experiences changes
        # (what caches of a collective's experiences are checked against)
        self.versions: dict[UUID | None, int] = {}
        # collective -> experiences changed since a reader last took them (None: all)
        self.changes: dict[UUID | None, set[UUID] | None] = {}
        self.unflushed_rejected: list[Rejected] = []
        self.tokens: dict[tuple[Any, ...], TokenRow] = self.fold.rows[TokenRow]  # type: ignore[assignment]
        self.sessions: dict[tuple[Any, ...], SessionRow] = self.fold.rows[SessionRow]  # type: ignore[assignment]
        self.sessions_of: dict[UUID, set[UUID]] = {}  # collective -> session ids (deleted too)
        # threads (sync.threads): their checkpoints and pending writes, and tombstones. The
        # rows of a deleted thread, and the writes of a deleted checkpoint, are dropped
        # whichever arrives first (``_drop_gone``): DuckDB deletes what it held of them
        # when it writes the tombstone (``projections.store``)
        self.checkpoints: dict[tuple[Any, ...], CheckpointRow] = self.fold.rows[CheckpointRow]  # type: ignore[assignment]
        self.pending_writes: dict[tuple[Any, ...], PendingWriteRow]
        self.pending_writes = self.fold.rows[PendingWriteRow]  # type: ignore[assignment]
        self.threads: dict[tuple[Any, ...], ThreadRow] = self.fold.rows[ThreadRow]  # type: ignore[assignment]
        self.threads_of: dict[UUID, set[UUID]] = {}  # collective -> ids of threads held
        # (thread, collective) -> what its checkpoint of smallest create event says of it:
        # (that event, its name, author owner, author agent)
        self.thread_names: dict[tuple[UUID, UUID], tuple[UUID, str, str | None, str | None]] = {}
        # (thread, collective) -> the keys of its rows (checkpoints and writes, each key
        # telling which: 4 values or 6); a checkpoint's key -> its writes' keys
        self.parts_of: dict[tuple[UUID, UUID], set[tuple[Any, ...]]] = {}
        self.writes_of: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}
        self.unflushed_audit: list[Audited] = []
        self.unflushed_counts: list[Counted] = []
        # (experience, collective) of each delete naming another collective than the
        # experience's row: a stray's tombstone, kept in DuckDB (``load_strays``) so the
        # counts that collective's reports made go after a restart too (``_count``)
        self.stray_tombstones: set[tuple[UUID, UUID]] = set()
        self.unflushed_strays: list[tuple[UUID, UUID]] = []
        # who could see the experiences deleted last while live here: (collective,
        # visibility, author owner, author agent), so a watch tells a delete only to
        # those who could see the experience (memory only, never stored: a tombstone keeps
        # no more than its key and collective)
        self.deleted_access: OrderedDict[UUID, tuple[Any, ...]] = OrderedDict()

    # -- loading and merging ---------------------------------------------------------------

    def load(self, rows: Iterable[Row], vec_ids: dict[UUID, int]) -> None:
        """Rows read back from DuckDB on open (already merged: nothing becomes dirty).

        Experiences, most of the rows, take a path of their own (what ``_index`` does for
        a new row, in one pass): each collective's order is appended to and sorted once
        at the end, not kept sorted one insertion at a time."""
        experiences, members_of, versions = self.experiences, self.experiences_of, self.versions
        changes = self.changes
        orders: dict[UUID, list[tuple[int, UUID]]] = {}
        # what a run of experiences of one collective object adds to (rows read back
        # share one object per collective: a look-up per run, not three per row)
        last: Any = _NONE_YET
        members: set[UUID] = set()
        found: list[tuple[int, UUID]] | None = None
        for row in rows:
            if type(row) is not ExperienceRow or row.experience_id is None:
                self.fold.rows[type(row)][row.key()] = row
                self._index(row, None)
                continue
            eid, cid = row.experience_id, row.collective_id
            size = len(experiences)
            experiences[(eid,)] = row
            if len(experiences) == size or (changes and cid in changes):  # (not on an open)
                self._index(row, None)  # (it was there already, or changes are listed)
                continue
            if cid is not last:
                last = cid
                versions[cid] = versions.get(cid, 0) + 1
                if cid is not None:
                    members = members_of.setdefault(cid, set())
                    found = orders.get(cid)
            if cid is not None:
                members.add(eid)
                if row.created_hlc is not None:
                    if found is None:
                        found = orders[cid] = []
                    found.append((row.created_hlc, eid))
            if row.deleted:
                self._forget_counts(eid, cid)
        for cid, found in orders.items():
            held = self.order.get(cid)
            if held:
                found.extend(held)
            # by HLC alone (int comparisons, a quarter of the time), then by HLC and id
            # again only if two share an HLC (the order is of both)
            found.sort(key=_FIRST)
            hlcs = list(map(_FIRST, found))
            if any(map(operator.eq, hlcs, islice(hlcs, 1, None))):
                found.sort()
            self.order[cid] = found
        self.forgotten_counts.clear()  # DuckDB already holds no counts of deleted ones
        if self.vec_ids:
            self.vec_ids.update(vec_ids)
        else:  # (an open: taken as read, not copied)
            self.vec_ids = vec_ids
        self.next_vec_id = 1 + max(vec_ids.values(), default=0)

    def load_strays(self, tombstones: Iterable[tuple[UUID, UUID]]) -> None:
        """The stray tombstones DuckDB kept, back on their rows as the strays they were
        (a tombstone each: all a stray's delete leaves; ``Placed``)."""
        for eid, cid in tombstones:
            self.stray_tombstones.add((eid, cid))
            row = self.experiences.get((eid,))
            if row is None or row.collective_id == cid:
                continue  # (the row's own group now: its tombstone is the row's)
            if row.strays is None:
                row.strays = {}
            row.strays[cid] = ExperienceRow(experience_id=eid, collective_id=cid, deleted=True)

    def merge(self, delta: FoldState) -> Touched:
        """Join a folded batch into the state; returns what changed for the indexes."""
        touched = Touched.nothing()
        for row_type in ROW_TYPES:
            table = self.fold.rows[row_type]
            dirty = self.dirty[row_type]
            if row_type is ApplicationRow:
                self._merge_counts(table, dirty, delta.rows[row_type])  # type: ignore[arg-type]
                continue
            for key, row in delta.rows[row_type].items():
                current = table.get(key)
                before = _snapshot(current)
                if (
                    row_type is ExperienceRow
                    and current is not None
                    and row.deleted
                    and not current.deleted
                    and current.create_event is not None  # type: ignore[attr-defined]
                ):
                    self._remember_deleted(current)  # type: ignore[arg-type]
                if current is None:
                    table[key] = row
                    current = row
                else:
                    current.merge(row)
                dirty.add(key)
                self._index(current, before)
                if row_type is ExperienceRow:
                    touched.experiences.add(key[0])
                elif row_type is InsightRow:
                    touched.insights.add(key[0])
                elif row_type is CollectiveRow:
                    touched.collectives.add(key[0])
        return touched

    def _merge_counts(
        self,
        table: dict[tuple[Any, ...], ApplicationRow],
        dirty: set[tuple[Any, ...]],
        rows: dict[tuple[Any, ...], ApplicationRow],
    ) -> None:
        """``merge`` for application rows, the bulk of a busy log: what ``_index`` does
        for them, without its dispatch."""
        for key, row in rows.items():
            current = table.get(key)
            if current is None:
                table[key] = current = row
            else:
                current.merge(row)
            dirty.add(key)
            self._count(current)

    def _remember_deleted(self, row: ExperienceRow) -> None:
        held = self.deleted_access
        held[row.experience_id] = (
            row.collective_id,
            row.visibility,
            row.author_owner,
            row.author_agent,
        )
        while len(held) > DELETED_ACCESS_MAX:
            held.popitem(last=False)

    def _count(self, row: ApplicationRow) -> None:
        """Take one application row into the experience's counter; a deleted experience
        keeps no counts (the row goes, and DuckDB's rows of it at the next write).

        Deleted in the collective the report names: the experience's group there is a
        tombstone (``Placed``). The row's own tombstone is not enough: a delete naming
        another collective, arrived before the record, is the row's until the record
        comes, and the counts of the record's collective must wait for it (a tombstone
        stays one, so a group once deleted takes no counts again, whatever the order).
        A stray's tombstone outlives a restart (``load_strays``), so the counts of its
        collective go after one as before it."""
        eid = row.experience_id
        held = self.experiences.get((eid,))
        if (
            held is not None
            and (held.deleted or held.strays is not None)
            and _deleted_in(held, row.collective_id)
        ):
            key = (eid, row.instance_id, row.collective_id)
            self.applications.pop(key, None)
            self.dirty[ApplicationRow].discard(key)
            self._forget_counts(eid, row.collective_id)
            return
        counted = self.counted.get(eid)
        if counted is None:
            counted = self.counted[eid] = set()
        counted.add((row.instance_id, row.collective_id))
        named = (eid, row.collective_id)
        counter = self.counters.get(named)
        if counter is None:
            counter = self.counters[named] = GCounter()
        counter.merge_entry(row.instance_id, row.applications)
        if row.last_hlc > self.last_reinforced.get(named, -1):
            self.last_reinforced[named] = row.last_hlc

    def _index(self, row: Row, before: tuple[Any, ...] | None) -> None:
        """Keep the derived indexes of one row in step (``before``: its old snapshot)."""
        if isinstance(row, ExperienceRow):
            self._index_experience(row, before)
            self._changed(row.collective_id, row.experience_id)
            if before is not None and before[0] != row.collective_id:
                self._changed(before[0], row.experience_id)
        elif isinstance(row, ApplicationRow):
            self._count(row)
        elif isinstance(row, CollectiveRow):
            self._changed(row.collective_id, None)  # its members' liveness may have changed
        elif isinstance(row, RelationRow):
            self._index_relation(row, before)
        elif isinstance(row, InsightRow):
            if row.collective_id is not None:
                self.insights_of.setdefault(row.collective_id, set()).add(row.insight_id)
        elif isinstance(row, SessionRow):
            if row.collective_id is not None:
                self.sessions_of.setdefault(row.collective_id, set()).add(row.session_id)
        elif isinstance(row, (CheckpointRow, PendingWriteRow, ThreadRow)):
            self._index_thread(row)

    def _index_thread(self, row: CheckpointRow | PendingWriteRow | ThreadRow) -> None:
        """Keep a thread's rows findable, and drop what a tombstone has made gone: the
        rows of a deleted thread, the writes of a deleted checkpoint (order-free: the
        tombstones stay, and whatever arrives after one is dropped on arrival)."""
        thread = (row.thread_id, row.collective_id)
        if isinstance(row, ThreadRow):
            if row.deleted:
                for key in self.parts_of.pop(thread, set()):
                    self._drop(CheckpointRow if len(key) == 4 else PendingWriteRow, key)
                    self.writes_of.pop(key, None)
                held = self.threads_of.get(row.collective_id)
                if held is not None:
                    held.discard(row.thread_id)
                self.thread_names.pop(thread, None)
            return
        dead = self.threads.get(thread)
        if dead is not None and dead.deleted:
            self._drop(type(row), row.key())
            return
        key = row.key()
        parts = self.parts_of.setdefault(thread, set())
        if isinstance(row, CheckpointRow):
            if row.deleted:
                for write in self.writes_of.pop(key, set()):
                    self._drop(PendingWriteRow, write)
                    parts.discard(write)
            parts.add(key)
            self.threads_of.setdefault(row.collective_id, set()).add(row.thread_id)
            if row.create_event is not None and row.name is not None:
                named = self.thread_names.get(thread)
                if named is None or row.create_event < named[0]:
                    self.thread_names[thread] = (
                        row.create_event,
                        row.name,
                        row.author_owner,
                        row.author_agent,
                    )
            return
        checkpoint = self.checkpoints.get(key[:4])
        if checkpoint is not None and checkpoint.deleted:
            self._drop(PendingWriteRow, key)
            return
        parts.add(key)
        self.writes_of.setdefault(key[:4], set()).add(key)

    def _drop(self, row_type: type[Row], key: tuple[Any, ...]) -> None:
        """A row gone with its thread or checkpoint: out of memory, and not to be
        written (DuckDB deletes its copy with the tombstone)."""
        self.fold.rows[row_type].pop(key, None)
        self.dirty[row_type].discard(key)

    def _changed(self, collective_id: UUID | None, experience_id: UUID | None) -> None:
        """Note that an experience of a collective (None: the collective itself)
        changed: ``versions`` moves, and ``changes`` keeps which experiences."""
        self.versions[collective_id] = self.versions.get(collective_id, 0) + 1
        if collective_id in self.changes:
            held = self.changes[collective_id]
            if held is not None and experience_id is not None and len(held) < CHANGES_MAX:
                held.add(experience_id)
            else:
                self.changes[collective_id] = None  # too many, or all: start over

    def take_changes(self, collective_id: UUID) -> set[UUID] | None:
        """The experiences of a collective changed since the last call (None: every one
        may have; the first call, or too many to list), and start listing again."""
        found = self.changes.get(collective_id)
        self.changes[collective_id] = set()
        return found

    def _index_experience(self, row: ExperienceRow, before: tuple[Any, ...] | None) -> None:
        eid = row.experience_id
        if before is not None and before[0] is not None and before[1] is not None:
            old = self.order.get(before[0])
            if old is not None and (before[0], before[1]) != (row.collective_id, row.created_hlc):
                _discard(old, (before[1], eid))
        if row.collective_id is not None:
            self.experiences_of.setdefault(row.collective_id, set()).add(eid)
            if row.created_hlc is not None and (
                before is None or (before[0], before[1]) != (row.collective_id, row.created_hlc)
            ):
                bisect.insort(self.order.setdefault(row.collective_id, []), (row.created_hlc, eid))
        if row.deleted:
            self._forget_counts(eid, row.collective_id)
        if row.strays is not None:
            for cid, group in row.strays.items():
                if group.deleted and cid is not None:
                    self._forget_counts(eid, cid)
                    if (eid, cid) not in self.stray_tombstones:
                        self.stray_tombstones.add((eid, cid))
                        self.unflushed_strays.append((eid, cid))

    def _forget_counts(self, experience_id: UUID, collective_id: UUID | None) -> None:
        """The counts of an experience that reports naming a collective made go."""
        counted = self.counted.get(experience_id)
        if counted:
            for instance, named in [c for c in counted if c[1] == collective_id]:
                counted.discard((instance, named))
                self.applications.pop((experience_id, instance, named), None)
                self.dirty[ApplicationRow].discard((experience_id, instance, named))
            if not counted:
                del self.counted[experience_id]
        self.counters.pop((experience_id, collective_id), None)
        self.last_reinforced.pop((experience_id, collective_id), None)
        self.forgotten_counts.add((experience_id, collective_id))

    def _index_relation(self, row: RelationRow, before: tuple[Any, ...] | None) -> None:
        rid = row.relation_id
        if before is not None and before[2] is not None:
            old_triple = before[2]
            if old_triple != _triple(row):
                self.triples.get(old_triple, set()).discard(rid)
                self.by_source.get(old_triple[0], set()).discard(rid)
                self.by_target.get(old_triple[1], set()).discard(rid)
        if row.collective_id is not None:
            self.relations_of.setdefault(row.collective_id, set()).add(rid)
        triple = _triple(row)
        if triple is not None:
            self.triples.setdefault(triple, set()).add(rid)
            self.by_source.setdefault(triple[0], set()).add(rid)
            self.by_target.setdefault(triple[1], set()).add(rid)

    def vec_id(self, row_id: UUID, row_type: type[Row]) -> int:
        """The local FAISS id of an experience or insight (assigned on first need; a new
        one marks the row changed, so DuckDB stores it with the row)."""
        found = self.vec_ids.get(row_id)
        if found is None:
            found = self.vec_ids[row_id] = self.next_vec_id
            self.next_vec_id += 1
            self.dirty[row_type].add((row_id,))
        return found

    @staticmethod
    def _deleted(table: dict[tuple[Any, ...], Any], row_id: UUID) -> bool:
        row = table.get((row_id,))
        return row is not None and bool(row.deleted)

    def landed_dead(self, event: Any) -> str | None:
        """Whether an event (not a delete) landed after a tombstone of its collective
        ("collective") or of its own entity ("entity"): what a writer must forget.
        Tombstone rows are the record; no other set of deleted ids is kept."""
        if isinstance(event, _DELETES):
            return None
        collective_id = getattr(event, "collective_id", None)
        if collective_id is None:
            return None
        if self._deleted(self.collectives, collective_id):
            return "collective"
        for name, table in (
            ("experience_id", self.experiences),
            ("relation_id", self.relations),
            ("insight_id", self.insights),
            ("session_id", self.sessions),
        ):
            entity_id = getattr(event, name, None)
            if entity_id is not None:
                return "entity" if self._deleted(table, entity_id) else None
        thread_id = getattr(event, "thread_id", None)
        if thread_id is not None:
            row = self.threads.get((thread_id, collective_id))
            return "entity" if row is not None and row.deleted else None
        return None

    def misplaced(self, event: Any) -> str | None:
        """Why an event names another collective than its entity's (None: it does not, or
        the entity's collective is not settled yet): such an event changed nothing (see
        ``projections.fold.Placed``) and is a dead letter."""
        entity = _PLACED.get(type(event))
        if entity is None:
            return None
        name, table = entity
        entity_id = getattr(event, name)
        row = getattr(self, table).get((entity_id,))
        if row is None or row.collective_id == event.collective_id:
            return None
        if row.create_event is None and (not row.deleted or isinstance(event, _DELETES)):
            return None  # not settled; or deleted, where one more tombstone changes nothing
        kind = name[: -len("_id")]
        return (
            f"{MISPLACED}{kind} {entity_id} belongs to collective {row.collective_id}, "
            f"the event names {event.collective_id}"
        )

    def has_changes(self) -> bool:
        """Rows or counts changed since DuckDB was last written."""
        return (
            bool(self.forgotten_counts)
            or bool(self.unflushed_audit)
            or bool(self.unflushed_counts)
            or bool(self.unflushed_strays)
            or any(self.dirty.values())
        )

    def reject(self, rejected: Rejected) -> None:
        if rejected.seq not in self.rejected:
            self.rejected[rejected.seq] = rejected
            self.unflushed_rejected.append(rejected)

    def take_dirty(
        self,
    ) -> tuple[dict[type[Row], list[Row]], set[tuple[UUID, UUID | None]], list[Rejected]]:
        """The rows to write to DuckDB since the last write (and forget them as dirty)."""
        rows = {
            t: [self.fold.rows[t][k] for k in keys if k in self.fold.rows[t]]
            for t, keys in self.dirty.items()
            if keys
        }
        forgotten, rejected = self.forgotten_counts, self.unflushed_rejected
        self.dirty = {t: set() for t in ROW_TYPES}
        self.forgotten_counts, self.unflushed_rejected = set(), []
        return rows, forgotten, rejected

    def restore_dirty(
        self,
        rows: dict[type[Row], list[Row]],
        forgotten: set[tuple[UUID, UUID | None]],
        rejected: list[Rejected],
    ) -> None:
        """A DuckDB write failed: keep what it held for the next one."""
        for row_type, batch in rows.items():
            self.dirty[row_type].update(r.key() for r in batch)
        self.forgotten_counts |= forgotten
        self.unflushed_rejected = rejected + self.unflushed_rejected

    # -- what is live: the one definition ---------------------------------------------------

    def collective_dimension(self, collective_id: UUID | None) -> int | None:
        """The embedding dimension of a live collective; None when it is not live."""
        row = self.collectives.get((collective_id,))
        if row is None or row.create_event is None or row.deleted:
            return None
        return row.embedding_dimension

    def collective_language(self, collective_id: UUID | None) -> str:
        """The text analyzer of a collective: English when it names none (or is unknown
        here), ``simple`` when it names one this release does not have (a later one's),
        "auto" when each of its texts is analyzed in its own (``text_language``)."""
        row = self.collectives.get((collective_id,))
        language = (row.language if row is not None else None) or ENGLISH
        return language if language in LANGUAGES or language == AUTO else SIMPLE

    def text_language(self, row: ExperienceRow | InsightRow) -> str:
        """The analyzer of an experience's or an insight's text: its collective's, or in a
        collective of "auto" its own (``projections.language.of_document``)."""
        language = self.collective_language(row.collective_id)
        if language != AUTO:
            return language
        found = of_document(row.language, row.content or "")
        return ENGLISH_AMONG_OTHERS if found == ENGLISH else found

    def live_collective(self, collective_id: UUID) -> CollectiveRow | None:
        row = self.collectives.get((collective_id,))
        return row if row is not None and row.create_event is not None and not row.deleted else None

    def experience_problem(self, row: ExperienceRow) -> str | None:
        """Why a created, undeleted experience cannot be live (None: it can)."""
        return self._placement_problem(row.collective_id, row.embedding)

    def _placement_problem(
        self, collective_id: UUID | None, embedding: bytes | int | None
    ) -> str | None:
        """Why a vector-bearing row does not fit its collective (None: it does)."""
        collective = self.collectives.get((collective_id,))
        if collective is None or collective.create_event is None:
            return f"collective {collective_id} does not exist"
        dim = collective.embedding_dimension or 0
        if (size := vector_bytes(embedding)) != 4 * dim:
            return f"embedding has {size // 4} dimensions, the collective has {dim}"
        return None

    def live_experience(self, experience_id: UUID) -> ExperienceRow | None:
        """A live experience: created, not deleted, in a live collective, with an
        embedding of the collective's dimension. Archived ones are live (and hidden from
        searches unless asked for)."""
        row = self.experiences.get((experience_id,))
        if row is None or row.create_event is None or row.deleted:
            return None
        dim = self.collective_dimension(row.collective_id)
        if dim is None or vector_bytes(row.embedding) != 4 * dim:
            return None
        return row

    def exists_or_deleted(self, experience_id: UUID) -> bool:
        row = self.experiences.get((experience_id,))
        return row is not None and (row.create_event is not None or row.deleted)

    def relation_problem(self, row: RelationRow) -> str | None:
        """Why a created, undeleted relation breaks an invariant (None: it does not)."""
        if row.source_id == row.target_id:
            return "a relation cannot link an experience to itself"
        source = self.experiences.get((row.source_id,))
        if source is None or (source.create_event is None and not source.deleted):
            return f"source experience {row.source_id} does not exist"
        target = self.experiences.get((row.target_id,))
        if target is None or (target.create_event is None and not target.deleted):
            return f"target experience {row.target_id} does not exist"
        if source.collective_id != target.collective_id or (
            source.collective_id != row.collective_id
        ):
            return "relation across collectives"
        winner = self.triple_winner(_triple(row))
        if winner is not None and winner != row.relation_id:
            return f"(source, target, type) is already taken by relation {winner}"
        return None

    def triple_winner(self, triple: tuple[Any, ...] | None) -> UUID | None:
        """The relation that holds a (source, target, type) triple: the smallest id of
        the created, undeleted relations naming it."""
        if triple is None:
            return None
        holders = [
            rid
            for rid in self.triples.get(triple, ())
            if (r := self.relations.get((rid,))) is not None
            and r.create_event is not None
            and not r.deleted
        ]
        return min(holders) if holders else None

    def live_relation(self, relation_id: UUID) -> RelationRow | None:
        row = self.relations.get((relation_id,))
        if row is None or row.create_event is None or row.deleted:
            return None
        if self.relation_problem(row) is not None:
            return None
        if self.live_experience(row.source_id) is None:  # type: ignore[arg-type]
            return None
        if self.live_experience(row.target_id) is None:  # type: ignore[arg-type]
            return None
        return row

    def insight_problem(self, row: InsightRow) -> str | None:
        """Why a created, undeleted insight breaks an invariant (None: it does not)."""
        placement = self._placement_problem(row.collective_id, row.embedding)
        if placement is not None:
            return placement
        if not row.source_experiences:
            return "an insight needs at least one source"
        if not all(self.exists_or_deleted(s) for s in row.source_experiences):
            return "a source experience does not exist"
        return None

    def live_insight(self, insight_id: UUID) -> InsightRow | None:
        row = self.insights.get((insight_id,))
        if row is None or row.create_event is None or row.deleted:
            return None
        if self.insight_problem(row) is not None:
            return None
        if self.collective_dimension(row.collective_id) is None:
            return None
        return row

    # -- derived reads ---------------------------------------------------------------------

    def counter_of(self, experience_id: UUID) -> GCounter | None:
        """The G-counter of an experience: the reports that named its own collective."""
        row = self.experiences.get((experience_id,))
        return None if row is None else self.counters.get((experience_id, row.collective_id))

    def applications_of(self, experience_id: UUID) -> tuple[int, int | None]:
        """(G-counter total, HLC of the latest reinforcement or None)."""
        row = self.experiences.get((experience_id,))
        if row is None:
            return 0, None
        named = (experience_id, row.collective_id)
        counter = self.counters.get(named)
        return (counter.value if counter else 0), self.last_reinforced.get(named)

    def experiences_in_order(
        self, collective_id: UUID, *, newest_first: bool
    ) -> Iterator[ExperienceRow]:
        """The live experiences of a collective by (recording time, id)."""
        order = self.order.get(collective_id, [])
        for _, eid in reversed(order) if newest_first else order:
            row = self.live_experience(eid)
            if row is not None:
                yield row

    def live_experiences_of(self, collective_id: UUID) -> Iterator[ExperienceRow]:
        return _present(self.experiences_of.get(collective_id, ()), self.live_experience)

    def live_relations_of(self, collective_id: UUID) -> Iterator[RelationRow]:
        return _present(self.relations_of.get(collective_id, ()), self.live_relation)

    def live_insights_of(self, collective_id: UUID) -> Iterator[InsightRow]:
        return _present(self.insights_of.get(collective_id, ()), self.live_insight)

    def max_hlc(self) -> int:
        """The largest HLC of anything folded (a restarted clock starts past it)."""
        # one pass a column (a million experiences: 10 s a row at a time, 0.3 s so); a
        # stamp's first 8 bytes are its HLC, big-endian: the largest stamp has the largest
        best = 0
        for table in (self.collectives, self.experiences, self.relations, self.insights,
                      self.wisdom, self.sessions):  # fmt: skip
            rows = table.values()
            if rows and hasattr(next(iter(rows)), "created_hlc"):
                created = map(attrgetter("created_hlc"), rows)
                best = max(best, max(filter(None, created), default=0))
        best = max(best, max(map(attrgetter("last_hlc"), self.applications.values()), default=0))
        for table, row_type in ((self.experiences, ExperienceRow), (self.sessions, SessionRow)):
            for _, stamp in row_type._STAMPED:
                latest = max(map(attrgetter(stamp), table.values()), default=NO_STAMP)
                if latest:
                    best = max(best, int.from_bytes(latest[:8], "big"))
        return best

    def live_session(self, session_id: UUID) -> SessionRow | None:
        """A live session: created, not deleted, in a live collective (ended or not)."""
        row = self.sessions.get((session_id,))
        if row is None or row.create_event is None or row.deleted:
            return None
        if row.collective_id is None or self.live_collective(row.collective_id) is None:
            return None
        return row

    def live_sessions_of(self, collective_id: UUID) -> Iterator[SessionRow]:
        return _present(self.sessions_of.get(collective_id, ()), self.live_session)


_NONE_YET = object()  # (what no row's collective is)
_FIRST = itemgetter(0)


def _present(ids: Iterable[UUID], live: Callable[[UUID], R | None]) -> Iterator[R]:
    """The live rows of ``ids``."""
    for row_id in ids:
        row = live(row_id)
        if row is not None:
            yield row


CHANGES_MAX = 10_000  # changed experiences listed per collective before "all of them"

_PLACED: dict[type, tuple[str, str]] = {
    **{
        t: ("experience_id", "experiences")
        for t in (
            ev.ExperienceRecorded, ev.ExperienceUpdated, ev.ExperienceArchived,
            ev.ExperienceUnarchived, ev.ExperienceInvalidated, ev.ExperienceDeleted,
            ev.ExperienceReinforced,
        )
    },
    **{t: ("relation_id", "relations") for t in (ev.RelationStored, ev.RelationDeleted)},
    **{t: ("insight_id", "insights") for t in (ev.InsightStored, ev.InsightDeleted)},
    **{
        t: ("session_id", "sessions")
        for t in (ev.SessionStarted, ev.SessionUpdated, ev.SessionEnded, ev.SessionDeleted)
    },
}  # fmt: skip

_DELETES = (
    ev.CollectiveDeleted, ev.ExperienceDeleted, ev.RelationDeleted, ev.InsightDeleted,
    ev.WisdomDeleted, ev.SessionDeleted, ev.ThreadDeleted,
)  # fmt: skip


def _snapshot(row: Row | None) -> tuple[Any, ...] | None:
    """What the derived indexes key a row by, before a merge changes it."""
    if row is None:
        return None
    if isinstance(row, ExperienceRow):
        return (row.collective_id, row.created_hlc)
    if isinstance(row, RelationRow):
        return (row.collective_id, None, _triple(row))
    return ()


def _triple(row: RelationRow) -> tuple[Any, ...] | None:
    """What is unique among relations: (source, target, type), within one ``sharing``."""
    if row.source_id is None or row.target_id is None or row.relation_type is None:
        return None
    return (
        row.source_id, row.target_id, row.relation_type,
        sharing(row.visibility, row.author_owner, row.author_agent),
    )  # fmt: skip


def sharing(
    visibility: str | None, author_owner: str | None, author_agent: str | None
) -> tuple[str, str | None, str | None]:
    """Who shares a relation: everyone of one visibility, and for a private relation its
    author alone. A triple is unique within a sharing, so a relation never conflicts with
    (nor loses to) one its readers may not see: a team relation with a private one of
    another agent, an org relation with a team one a non-member cannot read."""
    if visibility == "private":
        return ("private", author_owner, author_agent)
    return (visibility or DEFAULT_VISIBILITY, None, None)


def _deleted_in(row: ExperienceRow, collective_id: UUID | None) -> bool:
    """Whether an experience's group in a collective is a tombstone (the row's own, or a
    stray's: see ``Placed``)."""
    if row.collective_id == collective_id:
        return row.deleted
    group = row.strays.get(collective_id) if row.strays is not None else None
    return group is not None and bool(group.deleted)


def _discard(order: list[tuple[int, UUID]], item: tuple[int, UUID]) -> None:
    at = bisect.bisect_left(order, item)
    if at < len(order) and order[at] == item:
        del order[at]

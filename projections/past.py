"""The memory as it was: every read ``as_of`` a stream sequence, exact.

The state as of sequence S is the fold of the events 1..S. A projection keeps the
history of every change it folded (``audit_rows.change``: each event but
reinforcements, as JSON without its embedding; ``count_history``: each reinforcement),
and an entity none of whose events came after S is folded already: its row now is its
row then. So the past is the present with the rows of the entities changed after S
folded again from their history up to S, by the same fold (``Past``): a recent moment
costs the few entities changed since, an old one at most every entity of the log, read
from DuckDB rather than from the network. The indexes are the present ones, searched
among what was live then (FAISS through a selector of the ids, tantivy's hits checked
against the past rows): what an experience holds that an index reads (its content and
embedding) is fixed at its creation.

Forgetting reaches into the past: a delete purges the entity's history with its events
on the log (all but the delete), so as of any moment before the delete the entity never
existed, as it never did for a host that replays the log up to S.

Times are turned into sequences by the writers' hybrid clocks: as of time T is as of the
last sequence written at or before T (``sequence_at``); a clock is within the clock
bound of the log's (``PULSE_CLOCK_AHEAD_MS``), so such a moment is that close to the
log's own.

Everything here runs on the engine thread (``projections.engine``), as queries do.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from uuid import UUID

import msgspec

from eventlog import events as ev
from eventlog.errors import ValidationError
from eventlog.limits import MILLIS_MAX
from projections.crdt import GCounter
from projections.fold import (
    ROW_TYPES,
    ApplicationRow,
    ExperienceRow,
    FoldState,
    Placed,
    Row,
    row_of,
)
from projections.projection import Projection
from projections.state import MemoryState

K = TypeVar("K")
V = TypeVar("V")

_decode = msgspec.json.Decoder(ev.Event).decode
PASTS_KEPT = 2  # past states a projection keeps (for the reads of one request)


class Overlay(Mapping[K, V], Generic[K, V]):
    """A mapping read through ``over`` first (a value of None: absent), then ``base``."""

    def __init__(self, base: Mapping[K, V], over: dict[K, V | None]) -> None:
        self.base, self.over = base, over

    def get(self, key: K, default: Any = None) -> Any:
        over = self.over
        if key in over:
            found = over[key]
            return default if found is None else found
        return self.base.get(key, default)

    def __getitem__(self, key: K) -> V:
        found = self.get(key, _MISSING)
        if found is _MISSING:
            raise KeyError(key)
        return found  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return self.get(key, _MISSING) is not _MISSING  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[K]:
        over = self.over
        for key in self.base:
            if key not in over:
                yield key
        for key, value in over.items():
            if value is not None:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)


_MISSING = object()
_LAST_UUID = UUID(int=(1 << 128) - 1)


class PastMemory(MemoryState):
    """A ``MemoryState`` as of a sequence, over the present one: its tables and counters
    read the past rows of what changed since, the present ones otherwise. The derived
    indexes (recording order, members of a collective, relation ends) are the present
    ones: each holds every entity that exists now, and what existed then and does not
    now was forgotten; every read checks a row through the tables, so an entity made
    since is absent. Read-only."""

    def __init__(  # no super().__init__(): nothing of its own to fold
        self,
        base: MemoryState,
        rows: dict[type[Row], dict[tuple[Any, ...], Row | None]],
        counters: dict[tuple[UUID, UUID | None], GCounter | None],
        last_reinforced: dict[tuple[UUID, UUID | None], int | None],
        seq: int,
        hlc_bound: Callable[[], int],
    ) -> None:
        tables = {t: Overlay(base.fold.rows[t], rows.get(t, {})) for t in ROW_TYPES}
        self.fold = FoldState(rows=tables)  # type: ignore[arg-type]
        for name, table in vars(base).items():  # the tables by their names
            if isinstance(table, dict):
                for row_type in ROW_TYPES:
                    if table is base.fold.rows[row_type]:
                        setattr(self, name, tables[row_type])
        self.counters = Overlay(base.counters, counters)  # type: ignore[assignment]
        self.last_reinforced = Overlay(base.last_reinforced, last_reinforced)  # type: ignore[assignment]
        for name, value in vars(base).items():  # the derived indexes: the present's
            if not hasattr(self, name):
                setattr(self, name, value)
        self.rejected = {s: r for s, r in base.rejected.items() if s <= seq}
        self.versions, self.changes = {}, {}
        self.dirty = {t: set() for t in ROW_TYPES}
        self.forgotten_counts, self.unflushed_rejected = set(), []
        self.unflushed_audit, self.unflushed_counts = [], []
        self.next_vec_id = base.next_vec_id
        self._hlc_bound = hlc_bound  # the largest HLC of an event up to the sequence
        self._bound: int | None = None

    def experiences_in_order(
        self, collective_id: UUID, *, newest_first: bool
    ) -> Iterator[ExperienceRow]:
        """As ``MemoryState``'s, past the experiences made since: none recorded by then
        has a later HLC than the latest event by then, so the order is cut there."""
        if self._bound is None:  # (a scan of the history: only when a read needs it)
            self._bound = self._hlc_bound()
        order = self.order.get(collective_id, [])
        cut = bisect.bisect_right(order, (self._bound, _LAST_UUID))
        positions = range(cut - 1, -1, -1) if newest_first else range(cut)
        for at in positions:
            row = self.live_experience(order[at][1])
            if row is not None:
                yield row


class Past:
    """A projection as of sequence ``as_of``, for the queries of ``projections.queries``
    (which take it where they take a ``Projection``): the past memory, the present
    indexes. Made by ``past``; read-only."""

    def __init__(
        self,
        base: Projection,
        as_of: int,
        memory: PastMemory,
        counts: tuple[list[UUID], list[ApplicationRow]] = ([], []),
    ) -> None:
        self.base, self.as_of, self.memory = base, as_of, memory
        # the experiences whose counts changed since, and their count rows as of then
        self.counts_changed, self.count_rows = counts
        self.vectors, self.text, self.settings = base.vectors, base.text, base.settings
        self.caches: dict[Any, Any] = {}
        self.changed_experiences = [
            k[0]
            for k in memory.fold.rows[ExperienceRow].over  # type: ignore[attr-defined]
        ]

    @property
    def seq(self) -> int:
        return self.as_of

    def live_dimension(self, collective_id: UUID) -> int | None:
        return self.memory.collective_dimension(collective_id)

    def sync_indexes(self) -> None:
        self.base.sync_indexes()

    def columns(self, collective_id: UUID) -> Any:
        """A collective's filter columns as of then: the present ones (``queries``), with
        the rows of the experiences changed since set to what they were."""
        from projections import queries

        key = ("filter columns", collective_id)
        found = self.caches.get(key)
        if found is None:
            found = self.caches[key] = queries._columns(self.base, collective_id).copy()
            rows = []
            for experience_id in self.changed_experiences:
                at = found.index_of.get(experience_id)
                if at is not None:
                    found.alive[at] = False
                row = self.memory.live_experience(experience_id)
                if row is not None and row.collective_id == collective_id:
                    rows.append(row)
            found.append(self, rows)
        return found


def past(p: Projection, as_of: int) -> Projection | Past:
    """The projection as of a stream sequence (itself when nothing was applied since)."""
    if as_of >= p.seq:
        return p
    key = ("past", as_of, p.seq)
    found: Past | None = p.caches.get(key)
    if found is None:  # (one made before an event was applied since is stale)
        kept = [k for k in p.caches if k[0] == "past"]
        for old in kept[: max(0, len(kept) + 1 - PASTS_KEPT)] + [k for k in kept if k[2] != p.seq]:
            p.caches.pop(old, None)
        found = p.caches[key] = _past(p, as_of)
    return found


def read_as_of(p: Projection, as_of: int | None, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(projection, ...)`` as of a sequence (None: now): what the API's reads run."""
    return fn(p if as_of is None else past(p, as_of), *args, **kwargs)


def history_from(p: Projection) -> int:
    """The first sequence the projection kept the history of (0: all of it; later for a
    projection made before the history was kept, until it is rebuilt)."""
    found = p.store.con.execute("SELECT value FROM meta WHERE key = 'history_from'").fetchone()
    return int(found[0]) if found else 0


def sequence_at(p: Projection, ms: int) -> int:
    """The last sequence written at or before ``ms`` (Unix ms, by the writers' hybrid
    clocks): what as of that time reads. 0 when nothing was."""
    p.flush()
    bound = (min(max(ms, 0), MILLIS_MAX) << ev.HLC_LOGICAL_BITS) | ev.HLC_LOGICAL_MAX
    found = p.store.con.execute(
        "SELECT max(seq) FROM (SELECT seq FROM audit_rows WHERE hlc <= $b "
        "UNION ALL SELECT seq FROM count_history WHERE hlc <= $b)",
        {"b": bound},
    ).fetchone()
    return int(found[0]) if found and found[0] is not None else 0


def _past(p: Projection, as_of: int) -> Past:
    start = history_from(p)
    if as_of < start:
        raise ValidationError(
            f"as_of: this host keeps the history from sequence {start} on (it was made "
            f"before Pulse kept one), got {as_of}; `pulse rebuild` replays the log to "
            "keep all of it"
        )
    p.flush()  # the history of everything applied is in DuckDB
    con = p.store.con
    base = p.memory
    key_of = {t.KEY[0].removesuffix("_id"): t for t in ROW_TYPES if len(t.KEY) == 1}
    rows: dict[type[Row], dict[tuple[Any, ...], Row | None]] = {t: {} for t in ROW_TYPES}
    for entity, entity_id in con.execute(
        "SELECT DISTINCT entity, entity_id FROM audit_rows WHERE seq > $s", {"s": as_of}
    ).fetchall():
        row_type = key_of.get(entity)
        if row_type is not None:
            rows[row_type][(entity_id,)] = None  # absent, unless its history says more
    folded = FoldState()
    for seq, change in con.execute(
        "SELECT seq, change FROM audit_rows WHERE seq <= $s AND entity_id IN "
        "(SELECT entity_id FROM audit_rows WHERE seq > $s) ORDER BY seq",
        {"s": as_of},
    ).fetchall():
        if change is None:  # written before the history kept the events themselves
            raise ValidationError(
                f"as_of: sequence {as_of} needs the history of an entity this host folded "
                f"before Pulse kept it (sequence {seq}); `pulse rebuild` replays the log "
                "to keep all of it"
            )
        event = _decode(change)
        row = row_of(event)
        if row is None:
            continue
        if isinstance(row, Placed) and row.create_event is not None:
            row.create_seq = seq  # as the projection stamped it (see fold.Placed)
        folded.add(row, owned=True)
    for row_type, table in folded.rows.items():
        wanted = rows[row_type]
        for key, row in table.items():
            if key not in wanted:
                continue  # (an event about another entity than the one it was filed under)
            if hasattr(row, "embedding") and getattr(row, "create_event", None) is not None:
                now = base.fold.rows[row_type].get(key)  # (the history holds no vectors)
                row.embedding = getattr(now, "embedding", None)
            wanted[key] = row
    counters: dict[tuple[UUID, UUID | None], GCounter | None] = {}
    last: dict[tuple[UUID, UUID | None], int | None] = {}
    changed = [
        r[0]
        for r in con.execute(
            "SELECT DISTINCT experience_id FROM count_history WHERE seq > $s", {"s": as_of}
        ).fetchall()
    ]
    for experience_id in changed:
        for _instance, named in base.counted.get(experience_id, ()):
            counters[(experience_id, named)] = None
            last[(experience_id, named)] = None
    entries = (
        con.execute(
            "SELECT experience_id, instance_id, collective_id, max(applications), max(hlc) "
            "FROM count_history WHERE seq <= $s AND experience_id IN "
            "(SELECT experience_id FROM count_history WHERE seq > $s) GROUP BY ALL",
            {"s": as_of},
        ).fetchall()
        if changed
        else []
    )
    for experience_id, instance_id, named, applications, hlc in entries:
        counter = counters.get((experience_id, named))
        if counter is None:
            counter = counters[(experience_id, named)] = GCounter()
        counter.merge_entry(instance_id, int(applications))
        held = last.get((experience_id, named))
        last[(experience_id, named)] = max(int(hlc), held or 0)
    count_rows = [ApplicationRow(e, i, int(n), int(h), c) for e, i, c, n, h in entries]

    def bound() -> int:
        found = p.store.con.execute(
            "SELECT max(hlc) FROM (SELECT hlc FROM audit_rows WHERE seq <= $s "
            "UNION ALL SELECT hlc FROM count_history WHERE seq <= $s)",
            {"s": as_of},
        ).fetchone()
        return int(found[0]) if found and found[0] is not None else -1

    memory = PastMemory(base, rows, counters, last, as_of, bound)
    return Past(p, as_of, memory, (changed, count_rows))


@dataclass(frozen=True, slots=True)
class PastTables:
    """What an SQL query as of a sequence reads in place of the present rows
    (``projections.analytics.past_views``): for each base table, the keys whose present
    rows are not the past ones, and the past rows (staged for DuckDB) to read instead."""

    seq: int
    gone: dict[str, tuple[str, list[UUID]]]  # table -> (key column, keys)
    rows: dict[str, tuple[dict[str, Any], str]]  # table -> (staged columns, their SELECT)


def sql_tables(p: Projection, as_of: int) -> PastTables | None:
    """The base tables as of a sequence, for SQL (None: the present ones)."""
    from projections.store import TABLE_OF

    found = past(p, as_of)
    if not isinstance(found, Past):
        return None
    gone: dict[str, tuple[str, list[UUID]]] = {}
    staged: dict[str, tuple[dict[str, Any], str]] = {}
    for row_type, table in TABLE_OF.items():
        if row_type is ApplicationRow:
            key, keys, rows = "experience_id", found.counts_changed, list(found.count_rows)
        else:
            over = found.memory.fold.rows[row_type].over  # type: ignore[attr-defined]
            key, keys = row_type.KEY[0], [k[0] for k in over]
            rows = [r for r in over.values() if r is not None]
        if keys:
            gone[table] = (key, keys)
        if rows:
            staged[table] = p.store.staged(row_type, rows, p.memory.vec_ids, 0)
    return PastTables(as_of, gone, staged)

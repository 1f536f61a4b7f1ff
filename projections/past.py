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
    rows_of,
)
from projections.projection import Projection
from projections.state import MemoryState
from projections.store import first

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
        by_table = {id(base.fold.rows[t]): tables[t] for t in ROW_TYPES}
        for name, value in vars(base).items():  # its tables overlaid, the rest shared
            setattr(self, name, by_table.get(id(value), value))
        self.fold = FoldState(rows=tables)  # type: ignore[arg-type]
        self.counters = Overlay(base.counters, counters)  # type: ignore[assignment]
        self.last_reinforced = Overlay(base.last_reinforced, last_reinforced)  # type: ignore[assignment]
        self.rejected = {s: r for s, r in base.rejected.items() if s <= seq}
        self.versions, self.changes = {}, {}
        self.dirty = {t: set() for t in ROW_TYPES}
        self.forgotten_counts, self.unflushed_rejected = set(), []
        self.unflushed_audit, self.unflushed_counts = [], []
        self.stray_tombstones, self.unflushed_strays = set(), []
        self._hlc_bound = hlc_bound  # the largest HLC of an event up to the sequence
        self._bound: int | None = None

    def hlc_bound(self) -> int:
        """The largest HLC of an event up to the sequence (-1: none); a scan of the
        history, made when a read first needs it."""
        if self._bound is None:
            self._bound = self._hlc_bound()
        return self._bound

    def experiences_in_order(
        self, collective_id: UUID, *, newest_first: bool
    ) -> Iterator[ExperienceRow]:
        """As ``MemoryState``'s, past the experiences made since: none recorded by then
        has a later HLC than the latest event by then, so the order is cut there."""
        order = self.order.get(collective_id, [])
        cut = bisect.bisect_right(order, (self.hlc_bound(), _LAST_UUID))
        positions = range(cut - 1, -1, -1) if newest_first else range(cut)
        for at in positions:
            row = self.live_experience(order[at][1])
            if row is not None:
                yield row


class Past:
    """A projection as of sequence ``as_of``, for the queries of ``projections.queries``
    (which take it where they take a ``Projection``): the past memory, the present
    indexes. Made by ``past``; read-only."""

    def __init__(self, base: Projection, as_of: int, memory: PastMemory) -> None:
        self.base, self.as_of, self.memory = base, as_of, memory
        self.built_at = base.seq  # the present it is the past of (``_refresh``)
        # the experiences whose counts changed since, and their count rows as of then
        self.counts_changed: set[UUID] = set()
        self.count_rows: dict[tuple[UUID, UUID, UUID | None], ApplicationRow] = {}
        self.vectors, self.text, self.settings = base.vectors, base.text, base.settings
        self.caches: dict[Any, Any] = {}
        self.changed_experiences: list[UUID] = []

    @property
    def seq(self) -> int:
        return self.as_of

    def moment_ms(self) -> int:
        """The time of the moment (Unix ms): of the latest event up to it, by its clock."""
        return ev.hlc_millis(max(self.memory.hlc_bound(), 0))

    def live_dimension(self, collective_id: UUID) -> int | None:
        return self.memory.collective_dimension(collective_id)

    def sync_indexes(self) -> None:
        self.base.sync_indexes()

    def embedding(self, row: Any) -> bytes:
        return self.base.embedding(row)  # (the rows' vectors are the present's, see _fold_changed)


def past(p: Projection, as_of: int) -> Projection | Past:
    """The projection as of a stream sequence (itself when nothing was applied since).

    A past state is kept (the last ``PASTS_KEPT``); when events applied since it was
    made, only the entities they changed are folded again, so reading one moment again
    and again on a busy host costs what changed in between, not the whole way back."""
    if as_of >= p.seq:
        return p
    key = ("past", as_of)
    found: Past | None = p.caches.get(key)
    if found is None:
        kept = [k for k in p.caches if k[0] == "past"]
        for old in kept[: max(0, len(kept) + 1 - PASTS_KEPT)]:
            p.caches.pop(old, None)
        found = p.caches[key] = _past(p, as_of)
    elif found.built_at != p.seq:
        _refresh(p, found)
    return found


def read_as_of(p: Projection, as_of: int | None, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(projection, ...)`` as of a sequence (None: now): what the API's reads run."""
    return fn(p if as_of is None else past(p, as_of), *args, **kwargs)


def moment_of(p: Projection, as_of: int) -> int | None:
    """The time of a sequence (Unix ms, the clock of its latest event); None: now."""
    found = past(p, as_of)
    return found.moment_ms() if isinstance(found, Past) else None


def history_from(p: Projection) -> int:
    """The first sequence the projection kept the history of (0: all of it; later for a
    projection made before the history was kept, until it is rebuilt)."""
    found = first(p.store.con.execute("SELECT value FROM meta WHERE key = 'history_from'"))
    return int(found[0]) if found else 0


def sequence_at(p: Projection, ms: int) -> int:
    """The last sequence written at or before ``ms`` (Unix ms, by the writers' hybrid
    clocks): what as of that time reads. 0 when nothing was."""
    p.flush()
    bound = (min(max(ms, 0), MILLIS_MAX) << ev.HLC_LOGICAL_BITS) | ev.HLC_LOGICAL_MAX
    found = first(p.store.con.execute(
        "SELECT max(seq) FROM (SELECT seq FROM audit_rows WHERE hlc <= $b "
        "UNION ALL SELECT seq FROM count_history WHERE hlc <= $b)",
        {"b": bound},
    ))  # fmt: skip
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

    def bound() -> int:
        found = first(p.store.con.execute(
            "SELECT max(hlc) FROM (SELECT hlc FROM audit_rows WHERE seq <= $s "
            "UNION ALL SELECT hlc FROM count_history WHERE seq <= $s)",
            {"s": as_of},
        ))  # fmt: skip
        return int(found[0]) if found and found[0] is not None else -1

    rows: dict[type[Row], dict[tuple[Any, ...], Row | None]] = {t: {} for t in ROW_TYPES}
    memory = PastMemory(p.memory, rows, {}, {}, as_of, bound)
    found = Past(p, as_of, memory)
    _fold_changed(p, found, as_of)
    return found


def _refresh(p: Projection, found: Past) -> None:
    """Bring a past state up to what the projection applied since it was made: the
    entities changed since are folded again as of its moment (one deleted since is
    absent now, its history forgotten with it)."""
    p.flush()
    _fold_changed(p, found, found.built_at)


def _fold_changed(p: Projection, found: Past, since: int) -> None:
    """Fold the entities with an event after ``since`` again, as of ``found.as_of``,
    from the history, into ``found``'s overlay."""
    con, base, as_of = p.store.con, p.memory, found.as_of
    memory = found.memory
    key_of = {t.KEY[0].removesuffix("_id"): t for t in ROW_TYPES if len(t.KEY) == 1}
    tables = memory.fold.rows
    for entity, entity_id in con.execute(
        "SELECT DISTINCT entity, entity_id FROM audit_rows WHERE seq > $s", {"s": since}
    ).fetchall():
        row_type = key_of.get(entity)
        if row_type is not None:  # absent, unless its history says more
            tables[row_type].over[(entity_id,)] = None  # type: ignore[attr-defined]
    folded = FoldState()
    for seq, change in con.execute(
        "SELECT seq, change FROM audit_rows WHERE seq <= $a AND entity_id IN "
        "(SELECT entity_id FROM audit_rows WHERE seq > $s) ORDER BY seq",
        {"a": as_of, "s": since},
    ).fetchall():
        if change is None:  # written before the history kept the events themselves
            raise ValidationError(
                f"as_of: sequence {as_of} needs the history of an entity this host folded "
                f"before Pulse kept it (sequence {seq}); `pulse rebuild` replays the log "
                "to keep all of it"
            )
        for row in rows_of(_decode(change)):
            if isinstance(row, Placed) and row.create_event is not None:
                row.create_seq = seq  # as the projection stamped it (see fold.Placed)
            folded.add(row, owned=True)
    for row_type, table in folded.rows.items():
        wanted = tables[row_type].over  # type: ignore[attr-defined]
        for key, row in table.items():
            if key not in wanted:
                continue  # (an event about another entity than the one it was filed under)
            if hasattr(row, "embedding") and getattr(row, "create_event", None) is not None:
                now = base.fold.rows[row_type].get(key)  # (the history holds no vectors)
                row.embedding = getattr(now, "embedding", None)
            wanted[key] = row
    changed = [
        r[0]
        for r in con.execute(
            "SELECT DISTINCT experience_id FROM count_history WHERE seq > $s", {"s": since}
        ).fetchall()
    ]
    counters = memory.counters.over  # type: ignore[attr-defined]
    last = memory.last_reinforced.over  # type: ignore[attr-defined]
    again = set(changed)  # (what an earlier fold held of them goes: forgotten since?)
    for held in (counters, last):
        for named_key in [k for k in held if k[0] in again]:
            held[named_key] = None
    found.count_rows = {k: r for k, r in found.count_rows.items() if k[0] not in again}
    found.counts_changed |= again
    for experience_id in changed:
        for _instance, named in base.counted.get(experience_id, ()):
            counters[(experience_id, named)] = None
            last[(experience_id, named)] = None
    entries = (
        con.execute(
            "SELECT experience_id, instance_id, collective_id, max(applications), max(hlc) "
            "FROM count_history WHERE seq <= $a AND experience_id IN "
            "(SELECT experience_id FROM count_history WHERE seq > $s) GROUP BY ALL",
            {"a": as_of, "s": since},
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
        found.count_rows[(experience_id, instance_id, named)] = ApplicationRow(
            experience_id, instance_id, int(applications), int(hlc), named
        )
    found.built_at = p.seq
    found.caches.clear()  # (the filter columns follow the present's, which moved)
    found.changed_experiences = [k[0] for k in tables[ExperienceRow].over]  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class PastTables:
    """What an SQL query as of a sequence reads in place of the present rows
    (``projections.analytics.past_views``): for each base table, the keys whose present
    rows are not the past ones, and the past rows (staged for DuckDB) to read instead."""

    seq: int
    moment_ms: int  # its time: the "now" of the views' ``valid``
    gone: dict[str, tuple[str, list[UUID]]]  # table -> (key column, keys)
    rows: dict[str, tuple[dict[str, Any], str]]  # table -> (staged columns, their SELECT)


def sql_tables(p: Projection, as_of: int, moment_ms: int | None = None) -> PastTables | None:
    """The base tables as of a sequence, for SQL (None: the present ones); ``moment_ms``:
    its time (default: the clock of its latest event)."""
    from projections.store import TABLE_OF

    found = past(p, as_of)
    if not isinstance(found, Past):
        return None
    moment = found.moment_ms() if moment_ms is None else moment_ms
    held: PastTables | None = found.caches.get(("sql", moment))  # (until it is refreshed)
    if held is not None:
        return held
    gone: dict[str, tuple[str, list[UUID]]] = {}
    staged: dict[str, tuple[dict[str, Any], str]] = {}
    for row_type, table in TABLE_OF.items():
        if row_type is ApplicationRow:
            key, keys = "experience_id", list(found.counts_changed)
            rows = list(found.count_rows.values())
        else:
            over = found.memory.fold.rows[row_type].over  # type: ignore[attr-defined]
            key, keys = row_type.KEY[0], [k[0] for k in over]
            rows = [r for r in over.values() if r is not None]
        if keys:
            gone[table] = (key, keys)
        if rows:
            staged[table] = p.store.staged(row_type, rows, p.memory.vec_ids, 0, p.embedding_view)
    made = found.caches[("sql", moment)] = PastTables(as_of, moment, gone, staged)
    return made

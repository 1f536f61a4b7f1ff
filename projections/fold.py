"""The order-free fold: events become rows of a join-semilattice.

Every row type has one ``merge`` (the join), and applying an event is merging the
partial row the event describes. Because the join is commutative, associative and
idempotent, any permutation of the same events with any duplicates folds to the same
rows; hosts that saw the same events agree whatever the order. The rules:

- create (insert if absent): the fields of the create with the smallest event id win
  (and of two with one event id, the earlier stamped: an idempotent call retried past
  the duplicate window), so even two different creates under one id (a buggy writer)
  resolve the same way everywhere; a retry of the same create changes nothing;
- field updates, archive / unarchive: last-writer-wins registers ordered by the stamp
  (HLC, instance id, event id); the create contributes its values with its own stamp;
- delete: a tombstone that wins and is never undone; a deleted row keeps only its key
  and the flag. Everything else (content, embedding, registers) is wiped, so a create or
  update that arrives after the delete cannot bring it back, and a host that saw the
  create before the delete holds the same row as one that never saw it (forgetting
  purges the create from the log, so a rebuild never sees it);
- the application counts of a deleted experience are dropped (``projections.store``
  enforces it after every batch, whichever arrived first, so this too is order-free).
  Deleting a collective is a tombstone for the collective and one for each entity in
  it (the writer appends them), so the fold needs no rule across rows for it;
- reinforce: a G-counter, one entry per instance holding the largest total it reported,
  and the largest HLC of a reinforcement.

The registers are ``projections.crdt.LWWRegister``s and an ``ApplicationRow`` is one
``projections.crdt.GCounter`` entry (joined by ``GCounter.join_entry``): the rows keep
each register as two columns (value and ``<name>_stamp``) and ``Row.merge`` joins them
with those types, so the laws tested on the types are the laws of the fold.

Invariants that need other rows (dimension of the collective, relation endpoints, a
relation triple taken twice) are not decided here, where the answer would depend on
what has arrived so far; they are evaluated on the folded state by the views in
``projections.schema``, which is why they are order-free too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar
from uuid import UUID

import msgspec

from eventlog import events as ev
from projections.crdt import NO_STAMP as NO_STAMP
from projections.crdt import GCounter, LWWRegister
from projections.crdt import Stamp as Stamp


def stamp_of(event: ev.EventBase) -> Stamp:
    hlc = min(max(event.hlc, 0), 2**64 - 1)
    return hlc.to_bytes(8, "big") + event.instance_id.bytes + event.event_id.bytes


R = TypeVar("R", bound="Row")
V = TypeVar("V")


@dataclass(slots=True)
class Row:
    """Base of the folded rows. Subclasses list their create fields and registers."""

    KEY: ClassVar[tuple[str, ...]]
    CREATE: ClassVar[tuple[str, ...]] = ()  # set by the winning create
    REGISTERS: ClassVar[tuple[str, ...]] = ()  # LWWRegisters: each with a "<name>_stamp" column
    MAXED: ClassVar[tuple[str, ...]] = ()  # G-counter entries: the largest value wins
    ANCHOR: ClassVar[tuple[str, ...]] = ()  # the smallest non-null wins; kept by a tombstone
    EARLIEST: ClassVar[tuple[str, ...]] = ()  # the smallest non-null wins; wiped by one
    # grow-only sets, as sorted tuples: the union, cut to its largest UNION_MAX values
    # (the largest k of a union is a join too); wiped by a tombstone
    UNIONED: ClassVar[tuple[str, ...]] = ()
    _STAMPED: ClassVar[tuple[tuple[str, str], ...]] = ()  # (register, its stamp column)

    def __init_subclass__(cls) -> None:  # no super(): slots=True makes a new class
        cls._STAMPED = tuple((name, f"{name}_stamp") for name in cls.REGISTERS)

    def key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in self.KEY)

    def merge(self: R, other: R) -> R:
        """The join of two rows with the same key (returns self, updated)."""
        return self._join(other)

    def _join(self: R, other: R) -> R:
        """``merge`` of two rows of the same collective (or of a type without one)."""
        for name in self.ANCHOR:
            theirs = getattr(other, name)
            if theirs is not None and (getattr(self, name) is None or theirs < getattr(self, name)):
                setattr(self, name, theirs)
        if self.CREATE:
            mine, theirs = getattr(self, "create_event"), getattr(other, "create_event")  # noqa: B009
            if theirs is not None and (
                mine is None
                or theirs < mine
                or (theirs == mine and other.created_hlc < self.created_hlc)  # type: ignore[attr-defined]
            ):  # (one event id twice: a call retried past the duplicate window, stamped anew)
                for name in ("create_event", *self.CREATE):
                    setattr(self, name, getattr(other, name))
        for name, stamp in self._STAMPED:
            written = getattr(other, stamp)
            if written == NO_STAMP:  # never written: the register's bottom changes nothing
                continue
            held = LWWRegister(getattr(self, name), getattr(self, stamp))
            kept = held.merge(LWWRegister(getattr(other, name), written))
            if kept is not held:
                setattr(self, name, kept.value)
                setattr(self, stamp, kept.stamp)
        for name in self.MAXED:
            setattr(self, name, GCounter.join_entry(getattr(self, name), getattr(other, name)))
        for name in self.EARLIEST:
            theirs = getattr(other, name)
            if theirs is not None and (getattr(self, name) is None or theirs < getattr(self, name)):
                setattr(self, name, theirs)
        for name in self.UNIONED:
            theirs = getattr(other, name)
            if theirs:
                mine = getattr(self, name)
                joined = tuple(sorted(set(mine or ()) | set(theirs)))[-UNION_MAX:]
                if joined != mine:
                    setattr(self, name, joined)
        if getattr(other, "deleted", False):
            self.deleted = True
        if getattr(self, "deleted", False):
            self._wipe()
        return self

    def _wipe(self) -> None:
        """Keep the key and the tombstone; everything else back to its default."""
        for f in dataclasses.fields(self):
            if f.name not in self.KEY and f.name not in self.ANCHOR and f.name not in _KEPT:
                setattr(self, f.name, f.default)

    def copy(self: R) -> R:
        return dataclasses.replace(self)


# A row's embedding is its bytes, or, once its vector is in an exact-vectors file, an int
# that says where: ``vec_id << HELD_BITS | dim`` (``held``). A memoryview of the slot cost
# 184 bytes a row (a tenth of an experience's raw bytes at a million); the int, 32.
HELD_BITS = 13  # dimensions up to 8191 (eventlog.limits.DIMENSION_MAX is 4096)
_DIM_MASK = (1 << HELD_BITS) - 1


def held(vec_id: int, dim: int) -> int:
    """The embedding of a row whose vector is slot ``vec_id`` of the ``dim`` file."""
    return vec_id << HELD_BITS | dim


def held_at(embedding: int) -> tuple[int, int]:
    """(vec_id, dim) of a held embedding."""
    return embedding >> HELD_BITS, embedding & _DIM_MASK


def vector_bytes(embedding: bytes | int | None) -> int:
    """The size of a row's embedding, held in a file or not."""
    if type(embedding) is int:
        return 4 * (embedding & _DIM_MASK)
    return len(embedding or b"")  # type: ignore[arg-type]


UNION_MAX = 64  # values a grow-only set keeps (the largest)
_KEPT = ("deleted", "strays")  # what a tombstone keeps besides its key and anchor


class Placed(Row):
    """A row of an entity that lives in one collective, fixed by its create event.

    Every event about the entity names the collective; one naming another (a buggy or
    forged writer) must change nothing, whatever order the events arrive in. So the row
    joins the partial rows of each named collective apart, and shows the group the
    entity belongs to: the one holding the first create on the stream (``create_seq``,
    the stream sequence the projection stamps on a create; a forger can only append
    after the entity's own create, and every host and replay reads the same sequence;
    without sequences, as in a fold of bare events, the smallest create event id);
    without a create, a tombstone's (a rebuild after forgetting sees only that), else
    the smallest collective id. The other groups are kept in ``strays`` (so a create
    arriving later finds its writes), read by nothing and never stored: a stray group is
    not live, and the engine reports each event that named another collective than the
    entity's as a dead letter. (Strays are held in memory only: a host that restarts
    between two such events, both before the entity's create, may show a different
    group than one that did not; forged events only, and neither group is live without
    its create. A stray's tombstone of an experience is the exception: the projection
    keeps it in DuckDB, ``projections.state.MemoryState.load_strays``, for the counts.)
    """

    __slots__ = ()
    EARLIEST = ("create_seq",)
    # declared by each subclass, as its own dataclass fields (the last two last)
    create_event: UUID | None
    collective_id: UUID | None
    create_seq: int | None
    strays: dict[UUID | None, Placed] | None

    def merge(self: P, other: P) -> P:
        if (
            other.collective_id == self.collective_id
            and self.strays is None
            and other.strays is None
        ):  # one collective, as every honest history: the plain join
            return self._join(other)
        groups: dict[UUID | None, Placed] = {}
        parts: list[Placed] = [self._alone(), *(self.strays or {}).values(),
                               other._alone(), *(other.strays or {}).values()]  # fmt: skip
        for part in parts:
            held = groups.get(part.collective_id)
            if held is None:
                groups[part.collective_id] = part.copy()
            else:
                held._join(part)
        main = min(groups.values(), key=_placement_rank)
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(main, f.name))
        self.strays = {c: g for c, g in groups.items() if g is not main} or None
        return self

    def _alone(self: P) -> P:
        """This row without its strays (a shallow copy when it has any)."""
        if self.strays is None:
            return self
        alone = dataclasses.replace(self)
        alone.strays = None
        return alone

    def copy(self: P) -> P:
        row = dataclasses.replace(self)
        if self.strays is not None:
            row.strays = {c: g.copy() for c, g in self.strays.items()}
        return row


P = TypeVar("P", bound=Placed)
_NO_UUID = UUID(int=0)


def _placement_rank(group: Placed) -> tuple[Any, ...]:
    collective = group.collective_id or _NO_UUID
    create = getattr(group, "create_event", None)
    if create is not None:  # a create of unknown sequence (read back from before it was
        # stamped, or a fold of bare events) counts as the earliest
        seq = -1 if group.create_seq is None else group.create_seq
        return (0, seq, create, getattr(group, "created_hlc", 0) or 0, collective)
    return (1 if getattr(group, "deleted", False) else 2, 0, collective)


@dataclass(slots=True)
class CollectiveRow(Row):
    KEY = ("collective_id",)
    CREATE = ("owner_id", "name", "embedding_dimension", "embedder", "created_hlc",
              "author_owner", "author_agent", "language", "on_duplicate",
              "duplicate_similarity")  # fmt: skip

    collective_id: UUID
    create_event: UUID | None = None
    owner_id: str | None = None
    name: str | None = None
    embedding_dimension: int | None = None
    embedder: str | None = None
    created_hlc: int | None = None
    deleted: bool = False
    author_owner: str | None = None  # the principal that created it
    author_agent: str | None = None
    language: str | None = None  # its text analyzer; None: English (projections.language)
    # what recording a duplicate does (eventlog.recorded.ON_DUPLICATE), and from what similarity;
    # None: keep (a collective of schema 4 or before)
    on_duplicate: str | None = None
    duplicate_similarity: float | None = None


@dataclass(slots=True)
class ExperienceRow(Placed):
    KEY = ("experience_id",)
    ANCHOR = ("collective_id",)
    CREATE = (
        "content", "embedding", "experience_type", "type_data",
        "source_agent", "source_task", "created_hlc", "visibility", "author_owner",
        "author_agent", "valid_from_ms", "language",
    )  # fmt: skip
    REGISTERS = (
        "importance", "confidence", "domain", "related_files", "archived", "valid_to",
        "invalid_reason",
    )  # fmt: skip
    UNIONED = ("invalidations",)

    experience_id: UUID
    create_event: UUID | None = None
    collective_id: UUID | None = None
    content: str | None = None
    embedding: bytes | int | None = None  # an int: held in the vectors file (``held``)
    experience_type: str | None = None  # the variant's tag, e.g. "Fact"
    type_data: str | None = None  # the variant as JSON
    source_agent: str | None = None
    source_task: str | None = None
    created_hlc: int | None = None
    importance: float | None = None
    importance_stamp: Stamp = NO_STAMP
    confidence: float | None = None
    confidence_stamp: Stamp = NO_STAMP
    domain: tuple[str, ...] | None = None
    domain_stamp: Stamp = NO_STAMP
    related_files: tuple[str, ...] | None = None
    related_files_stamp: Stamp = NO_STAMP
    archived: bool = False
    archived_stamp: Stamp = NO_STAMP
    deleted: bool = False
    visibility: str | None = None  # "private", "team" or "org" (eventlog.access)
    author_owner: str | None = None  # the principal that created it
    author_agent: str | None = None
    create_seq: int | None = None  # the stream sequence of its first create (see Placed)
    # validity: [valid_from_ms (None: its recording time), valid_to) in Unix ms; valid_to
    # and its reason are set together by an invalidation (one stamp: one register)
    valid_from_ms: int | None = None
    valid_to: int | None = None
    valid_to_stamp: Stamp = NO_STAMP
    invalid_reason: str | None = None
    invalid_reason_stamp: Stamp = NO_STAMP
    invalidations: tuple[int, ...] | None = None  # the HLCs of its invalidations
    # the language its content was detected in by its writer, in a collective of "auto";
    # None: none recorded (projections.language.of_document)
    language: str | None = None
    strays: dict[UUID | None, Placed] | None = None  # see Placed; never stored


@dataclass(slots=True)
class ApplicationRow(Row):
    """One G-counter entry: what an instance reported for an experience, apart for each
    collective the reports named (only the experience's own collective counts: see
    ``projections.state``), so a report naming another collective changes nothing."""

    KEY = ("experience_id", "instance_id", "collective_id")
    MAXED = ("applications", "last_hlc")

    experience_id: UUID
    instance_id: UUID
    applications: int = 0
    last_hlc: int = 0
    collective_id: UUID | None = None


@dataclass(slots=True)
class RelationRow(Placed):
    KEY = ("relation_id",)
    ANCHOR = ("collective_id",)
    CREATE = (
        "source_id", "target_id", "relation_type", "strength", "metadata",
        "created_hlc", "visibility", "author_owner", "author_agent",
    )  # fmt: skip

    relation_id: UUID
    create_event: UUID | None = None
    collective_id: UUID | None = None
    source_id: UUID | None = None
    target_id: UUID | None = None
    relation_type: str | None = None
    strength: float | None = None
    metadata: str | None = None
    created_hlc: int | None = None
    deleted: bool = False
    visibility: str | None = None  # "private", "team" or "org" (eventlog.access)
    author_owner: str | None = None  # the principal that created it
    author_agent: str | None = None
    create_seq: int | None = None  # the stream sequence of its first create (see Placed)
    strays: dict[UUID | None, Placed] | None = None  # see Placed; never stored


@dataclass(slots=True)
class InsightRow(Placed):
    KEY = ("insight_id",)
    ANCHOR = ("collective_id",)
    CREATE = (
        "content", "embedding", "source_experiences", "confidence", "domain",
        "created_hlc", "visibility", "author_owner", "author_agent", "language",
    )  # fmt: skip

    insight_id: UUID
    create_event: UUID | None = None
    collective_id: UUID | None = None
    content: str | None = None
    embedding: bytes | int | None = None  # an int: held in the vectors file (``held``)
    source_experiences: tuple[UUID, ...] | None = None
    confidence: float | None = None
    domain: tuple[str, ...] | None = None
    created_hlc: int | None = None
    deleted: bool = False
    visibility: str | None = None  # "private", "team" or "org" (eventlog.access)
    author_owner: str | None = None  # the principal that created it
    author_agent: str | None = None
    create_seq: int | None = None  # the stream sequence of its first create (see Placed)
    language: str | None = None  # as an experience's
    strays: dict[UUID | None, Placed] | None = None  # see Placed; never stored


@dataclass(slots=True)
class WisdomRow(Row):
    KEY = ("wisdom_id",)
    ANCHOR = ("owner_id",)
    CREATE = (
        "category", "pattern", "confidence", "embedding", "source_collectives",
        "source_experience_count", "applicable_domains", "created_hlc",
        "visibility", "author_owner", "author_agent",
    )  # fmt: skip

    wisdom_id: UUID
    create_event: UUID | None = None
    owner_id: str | None = None
    category: str | None = None
    pattern: str | None = None
    confidence: float | None = None
    embedding: bytes | None = None
    source_collectives: tuple[UUID, ...] | None = None
    source_experience_count: int | None = None
    applicable_domains: tuple[str, ...] | None = None
    created_hlc: int | None = None
    deleted: bool = False
    visibility: str | None = None  # "private", "team" or "org" (eventlog.access)
    author_owner: str | None = None  # the principal that created it
    author_agent: str | None = None


@dataclass(slots=True)
class TokenRow(Row):
    """An access token (``sync.access``); a revocation is its tombstone, which wipes
    only the secret's hash."""

    KEY = ("token_id",)
    CREATE = (
        "owner_id", "secret_sha256", "scope", "agent_id", "collectives", "expires_ms",
        "created_hlc", "author_owner", "author_agent",
    )  # fmt: skip

    token_id: UUID
    create_event: UUID | None = None
    owner_id: str | None = None
    secret_sha256: str | None = None
    scope: str | None = None
    agent_id: str | None = None
    collectives: tuple[UUID, ...] | None = None
    expires_ms: int | None = None
    created_hlc: int | None = None
    deleted: bool = False  # revoked
    author_owner: str | None = None
    author_agent: str | None = None

    def _wipe(self) -> None:
        """A revoked token keeps what it was (for the list and the audit of who had
        access), never its secret's hash."""
        self.secret_sha256 = None


@dataclass(slots=True)
class SessionRow(Placed):
    """An agent's session in a collective (``sync.sessions``). Each of its fields is a
    last-writer-wins register, so updates of different fields on different hosts all
    stay; ``ended_hlc`` is one too (the HLC of the end, None while open). A session is
    forgotten with its collective: a tombstone per session (``delete_collective``)."""

    KEY = ("session_id",)
    ANCHOR = ("collective_id",)
    CREATE = ("agent_id", "created_hlc", "author_owner", "author_agent")
    REGISTERS = ("summary", "todo", "changes", "bugs", "architecture", "ended_hlc")

    session_id: UUID
    create_event: UUID | None = None
    collective_id: UUID | None = None
    agent_id: str | None = None
    created_hlc: int | None = None
    summary: str | None = None
    summary_stamp: Stamp = NO_STAMP
    todo: str | None = None  # the items as JSON: [{"task", "priority", "note", "done"}, ...]
    todo_stamp: Stamp = NO_STAMP
    changes: tuple[str, ...] | None = None
    changes_stamp: Stamp = NO_STAMP
    bugs: tuple[str, ...] | None = None
    bugs_stamp: Stamp = NO_STAMP
    architecture: tuple[str, ...] | None = None
    architecture_stamp: Stamp = NO_STAMP
    ended_hlc: int | None = None
    ended_hlc_stamp: Stamp = NO_STAMP
    deleted: bool = False
    author_owner: str | None = None  # the principal that started it
    author_agent: str | None = None
    create_seq: int | None = None  # the stream sequence of its first create (see Placed)
    strays: dict[UUID | None, Placed] | None = None  # see Placed; never stored


@dataclass(slots=True)
class CheckpointRow(Row):
    """One checkpoint of a thread (``sync.threads``): the framework's state at a step,
    whole. The thread is an entity of its own (its id, its data key, its tombstone), but
    what it is, its name and its author, every one of its checkpoints carries (a row
    made by the first checkpoint would need an event to make two rows): the thread's
    live checkpoints are its rows whose thread is not deleted (``ThreadRow``). The
    collective is in the key, so an event naming another collective for the same
    thread (a forged one) makes a row of that collective, never one of this.
    ``deleted``: a tombstone for this checkpoint alone (a prune; the runs deleted)."""

    KEY = ("thread_id", "collective_id", "checkpoint_ns", "checkpoint_id")
    CREATE = (
        "name", "parent_checkpoint_id", "checkpoint_type", "checkpoint", "metadata", "run_id",
        "created_hlc", "author_owner", "author_agent",
    )  # fmt: skip

    thread_id: UUID
    collective_id: UUID
    checkpoint_ns: str
    checkpoint_id: str
    create_event: UUID | None = None
    name: str | None = None  # the framework's name of the thread
    parent_checkpoint_id: str | None = None
    checkpoint_type: str | None = None
    checkpoint: bytes | None = None
    metadata: str | None = None  # JSON text, as written
    run_id: str | None = None
    created_hlc: int | None = None
    deleted: bool = False
    author_owner: str | None = None  # the principal that wrote it
    author_agent: str | None = None


@dataclass(slots=True)
class PendingWriteRow(Row):
    """A pending write of a task after a checkpoint (``ev.ThreadWritten``). Its fields
    are registers set together by one write (one stamp): a special channel's (``idx``
    below 0: an error, an interrupt, a resume) takes the latest write, an ordinary one
    keeps the first (its stamp is the write's, inverted: ``first_wins``), as the
    framework's own savers do. A write is gone with its checkpoint or its thread."""

    KEY = ("thread_id", "collective_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx")
    REGISTERS = ("channel", "value_type", "value", "task_path")

    thread_id: UUID
    collective_id: UUID
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str | None = None
    channel_stamp: Stamp = NO_STAMP
    value_type: str | None = None
    value_type_stamp: Stamp = NO_STAMP
    value: bytes | None = None
    value_stamp: Stamp = NO_STAMP
    task_path: str | None = None
    task_path_stamp: Stamp = NO_STAMP


@dataclass(slots=True)
class ThreadRow(Row):
    """A thread's tombstone (``ev.ThreadDeleted``): every checkpoint and write of the
    thread in that collective is gone, whenever it arrives."""

    KEY = ("thread_id", "collective_id")

    thread_id: UUID
    collective_id: UUID
    deleted: bool = False


def first_wins(stamp: Stamp) -> Stamp:
    """A stamp under which the earliest write of a register wins (every byte inverted:
    the order reversed, still above ``NO_STAMP``)."""
    return bytes(255 - b for b in stamp)


def todo_json(items: tuple[ev.TodoItem, ...]) -> str:
    """A todo list as the row keeps it: JSON with every field, the same bytes on every
    host (the wire omits defaults; a reader of the row should not have to know them)."""
    return msgspec.json.encode(
        [{"task": t.task, "priority": t.priority, "note": t.note, "done": t.done} for t in items]
    ).decode()


ROW_TYPES: tuple[type[Row], ...] = (
    CollectiveRow, ExperienceRow, ApplicationRow, RelationRow, InsightRow, WisdomRow, TokenRow,
    SessionRow, CheckpointRow, PendingWriteRow, ThreadRow,
)  # fmt: skip


_STAMPED_EVENTS = (
    ev.ExperienceRecorded, ev.ExperienceUpdated, ev.ExperienceArchived, ev.ExperienceUnarchived,
    ev.ExperienceInvalidated,
)  # fmt: skip


def rows_of(event: ev.Event) -> list[Row]:
    """The partial rows an event describes: one, but a task's pending writes (a row
    each), and none for events not folded here (activities)."""
    if isinstance(event, ev.ThreadWritten):
        stamp = stamp_of(event)
        first = first_wins(stamp)
        return [
            PendingWriteRow(
                event.thread_id, event.collective_id, event.checkpoint_ns, event.checkpoint_id,
                event.task_id, w.idx, w.channel, s, w.value_type, s, w.value, s,
                event.task_path, s,
            )
            for w in event.writes
            for s in (stamp if w.idx < 0 else first,)
        ]  # fmt: skip
    row = row_of(event)
    return [] if row is None else [row]


def row_of(event: ev.Event) -> Row | None:
    """The partial row an event describes (None for events not folded here: activities;
    a task's pending writes, several rows: ``rows_of``)."""
    if isinstance(event, ev.ExperienceReinforced):  # most of a busy log: first, no stamp
        return ApplicationRow(
            event.experience_id, event.instance_id, max(event.applications, 0), event.hlc,
            event.collective_id,
        )  # fmt: skip
    s = stamp_of(event) if isinstance(event, _STAMPED_EVENTS) else NO_STAMP
    match event:
        case ev.CollectiveCreated():
            return CollectiveRow(
                event.collective_id, event.event_id, event.owner_id, event.name,
                event.embedding_dimension, event.embedder, event.hlc,
                author_owner=event.author_owner, author_agent=event.author_agent,
                language=event.language or None, on_duplicate=event.on_duplicate or None,
                duplicate_similarity=event.duplicate_similarity or None,
            )  # fmt: skip
        case ev.CollectiveDeleted():
            return CollectiveRow(event.collective_id, deleted=True)
        case ev.ExperienceRecorded():
            kind = event.experience_type
            return ExperienceRow(
                event.experience_id, event.event_id, shared(event.collective_id),
                event.content, event.embedding,
                type(kind).__struct_config__.tag,  # type: ignore[arg-type]
                shared(msgspec.json.encode(kind).decode()), shared(event.source_agent),
                shared(event.source_task), event.hlc, event.importance, s, event.confidence, s,
                shared(event.domain), s, shared(event.related_files), s,
                visibility=shared(event.visibility), author_owner=shared(event.author_owner),
                author_agent=shared(event.author_agent), valid_from_ms=event.valid_from_ms,
                language=shared(event.language) or None,
            )  # fmt: skip
        case ev.ExperienceUpdated():
            row = ExperienceRow(event.experience_id, collective_id=event.collective_id)
            for name in ("importance", "confidence", "domain", "related_files"):
                value = getattr(event, name)
                if value is not None:
                    setattr(row, name, value)
                    setattr(row, f"{name}_stamp", s)
            return row
        case ev.ExperienceArchived() | ev.ExperienceUnarchived():
            archived = isinstance(event, ev.ExperienceArchived)
            return ExperienceRow(
                event.experience_id, collective_id=event.collective_id, archived=archived,
                archived_stamp=s,
            )  # fmt: skip
        case ev.ExperienceInvalidated():
            closed = event.valid_to_ms is not None  # (None: valid again)
            return ExperienceRow(
                event.experience_id, collective_id=event.collective_id,
                valid_to=event.valid_to_ms, valid_to_stamp=s, invalid_reason=event.reason,
                invalid_reason_stamp=s, invalidations=(event.hlc,) if closed else None,
            )  # fmt: skip
        case ev.ExperienceDeleted():
            return ExperienceRow(
                event.experience_id, collective_id=event.collective_id, deleted=True
            )
        case ev.RelationStored():
            return RelationRow(
                event.relation_id, event.event_id, event.collective_id, event.source_id,
                event.target_id, event.relation_type, event.strength, event.metadata, event.hlc,
                visibility=event.visibility, author_owner=event.author_owner,
                author_agent=event.author_agent,
            )  # fmt: skip
        case ev.RelationDeleted():
            return RelationRow(event.relation_id, collective_id=event.collective_id, deleted=True)
        case ev.InsightStored():
            return InsightRow(
                event.insight_id, event.event_id, event.collective_id, event.content,
                event.embedding, event.source_experiences, event.confidence, event.domain,
                event.hlc, visibility=event.visibility, author_owner=event.author_owner,
                author_agent=event.author_agent, language=event.language or None,
            )  # fmt: skip
        case ev.InsightDeleted():
            return InsightRow(event.insight_id, collective_id=event.collective_id, deleted=True)
        case ev.WisdomStored():
            return WisdomRow(
                event.wisdom_id, event.event_id, event.owner_id, event.category, event.pattern,
                event.confidence, event.embedding, event.source_collectives,
                event.source_experience_count, event.applicable_domains, event.hlc,
                visibility=event.visibility, author_owner=event.author_owner,
                author_agent=event.author_agent,
            )  # fmt: skip
        case ev.WisdomDeleted():
            return WisdomRow(event.wisdom_id, owner_id=event.owner_id, deleted=True)
        case ev.TokenCreated():
            return TokenRow(
                event.token_id, event.event_id, event.owner_id, event.secret_sha256,
                event.scope, event.agent_id, event.collectives, event.expires_ms, event.hlc,
                author_owner=event.author_owner, author_agent=event.author_agent,
            )  # fmt: skip
        case ev.TokenRevoked():
            return TokenRow(event.token_id, deleted=True)
        case ev.SessionStarted():
            started = stamp_of(event)
            return SessionRow(
                event.session_id, event.event_id, event.collective_id, event.agent_id,
                event.hlc, event.summary, started, author_owner=event.author_owner,
                author_agent=event.author_agent,
            )  # fmt: skip
        case ev.SessionUpdated():
            changed = stamp_of(event)
            session = SessionRow(event.session_id, collective_id=event.collective_id)
            if event.todo is not None:
                session.todo, session.todo_stamp = todo_json(event.todo), changed
            for name in ("summary", "changes", "bugs", "architecture"):
                value = getattr(event, name)
                if value is not None:
                    setattr(session, name, value)
                    setattr(session, f"{name}_stamp", changed)
            return session
        case ev.SessionEnded():
            return SessionRow(
                event.session_id, collective_id=event.collective_id, ended_hlc=event.hlc,
                ended_hlc_stamp=stamp_of(event),
            )  # fmt: skip
        case ev.SessionDeleted():
            return SessionRow(event.session_id, collective_id=event.collective_id, deleted=True)
        case ev.ThreadCheckpointed():
            return CheckpointRow(
                event.thread_id, event.collective_id, event.checkpoint_ns, event.checkpoint_id,
                event.event_id, event.name, event.parent_checkpoint_id, event.checkpoint_type,
                event.checkpoint, event.metadata, event.run_id, event.hlc,
                author_owner=event.author_owner, author_agent=event.author_agent,
            )  # fmt: skip
        case ev.ThreadCheckpointDeleted():
            return CheckpointRow(
                event.thread_id, event.collective_id, event.checkpoint_ns, event.checkpoint_id,
                deleted=True,
            )  # fmt: skip
        case ev.ThreadDeleted():
            return ThreadRow(event.thread_id, event.collective_id, deleted=True)
        case ev.Sealed():  # still sealed when read: its key was destroyed (a delete), and
            return None  # it is forgotten as if purged (eventlog.sealing)
    return None  # activities live in their own stream, not in the projection


_SHARED: dict[Any, Any] = {}
SHARED_MAX = 4096  # distinct values ``shared`` holds before it starts over


def shared(value: V) -> V:
    """One object for equal values that many rows repeat (a collective's id, an
    agent's name, a visibility, a type's JSON): each event decodes its own copy, and a
    row keeps it for as long as the host runs (about 300 bytes a row). Values must be
    immutable and hashable; None passes through."""
    if value is None:
        return value
    found = _SHARED.get(value)
    if found is None:
        if len(_SHARED) >= SHARED_MAX:
            _SHARED.clear()
        found = _SHARED[value] = value
    elif type(found) is not type(value):  # (equal, of another type: 1 and True)
        return value
    return found


def _single_key(name: str) -> Any:
    def key(self: Row) -> tuple[Any, ...]:
        return (getattr(self, name),)

    return key


# The fold's hottest calls, written out for the row types (the generic ones loop over
# the class's field lists): a key, and the join of two application-count entries.
CollectiveRow.key = _single_key("collective_id")  # type: ignore[method-assign]
ExperienceRow.key = _single_key("experience_id")  # type: ignore[method-assign]
RelationRow.key = _single_key("relation_id")  # type: ignore[method-assign]
InsightRow.key = _single_key("insight_id")  # type: ignore[method-assign]
WisdomRow.key = _single_key("wisdom_id")  # type: ignore[method-assign]
TokenRow.key = _single_key("token_id")  # type: ignore[method-assign]
SessionRow.key = _single_key("session_id")  # type: ignore[method-assign]


def _application_key(self: ApplicationRow) -> tuple[Any, ...]:
    return (self.experience_id, self.instance_id, self.collective_id)


def _application_merge(self: ApplicationRow, other: ApplicationRow) -> ApplicationRow:
    if other.applications > self.applications:
        self.applications = other.applications
    if other.last_hlc > self.last_hlc:
        self.last_hlc = other.last_hlc
    return self


ApplicationRow.key = _application_key  # type: ignore[method-assign, assignment]
ApplicationRow.merge = _application_merge  # type: ignore[method-assign, assignment]


@dataclass(slots=True)
class FoldState:
    """Rows by type and key: the fold of some events (a batch, or a whole log in tests)."""

    rows: dict[type[Row], dict[tuple[Any, ...], Row]] = field(
        default_factory=lambda: {t: {} for t in ROW_TYPES}
    )

    def apply(self, event: ev.Event) -> None:
        for row in rows_of(event):
            self.add(row, owned=True)

    def add(self, row: Row, *, owned: bool = False) -> None:
        """Merge a row in; ``owned`` rows (fresh from ``row_of``) are kept, not copied."""
        table = self.rows[type(row)]
        key = row.key()
        existing = table.get(key)
        if existing is None:
            table[key] = row if owned else row.copy()
        else:
            existing.merge(row)

    def merge(self, other: FoldState) -> FoldState:
        for table in other.rows.values():
            for row in table.values():
                self.add(row)
        return self

    def __len__(self) -> int:
        return sum(len(t) for t in self.rows.values())

"""Every event Pulse writes: frozen, tagged msgspec Structs, one per fact of the data model.

Rules that keep old logs readable:
- never change or remove a field of a shipped event; only add fields *with defaults*;
- structs are encoded with ``omit_defaults``, so adding a defaulted field leaves the
  bytes of older events unchanged (the golden vectors in ``tests/golden`` check this);
- every change to what a release writes (a new field too, a new event type or variant)
  bumps ``eventlog.codec.SCHEMA_VERSION``, with an upcaster from the version before (the
  identity when old bodies read as they are): an older host then keeps the new events
  aside until it is upgraded, rather than folding them without what it does not know
  (msgspec would silently drop a field it does not know).

Timestamps are hybrid-logical-clock values packed in one int (see ``pack_hlc``); a
creation time is the wall-clock part of its create event's HLC. Embeddings travel as
raw little-endian float32 bytes (``pack_vector`` / ``unpack_vector``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Sequence, TypeAlias
from uuid import UUID

import msgspec

if TYPE_CHECKING:  # (numpy is imported where vectors are packed: `pulse --help` goes without)
    import numpy as np
    import numpy.typing as npt

# --- hybrid logical clock values ---------------------------------------------------------

HLC_LOGICAL_BITS = 16
HLC_LOGICAL_MAX = (1 << HLC_LOGICAL_BITS) - 1


def pack_hlc(wall_ms: int, logical: int = 0) -> int:
    """One sortable int from (wall-clock milliseconds, logical counter)."""
    if not 0 <= logical <= HLC_LOGICAL_MAX:
        raise ValueError(f"hlc logical counter must be in 0..{HLC_LOGICAL_MAX}, got {logical}")
    return (wall_ms << HLC_LOGICAL_BITS) | logical


def hlc_millis(hlc: int) -> int:
    """The wall-clock milliseconds part of a packed HLC value."""
    return hlc >> HLC_LOGICAL_BITS


def hlc_logical(hlc: int) -> int:
    """The logical-counter part of a packed HLC value."""
    return hlc & HLC_LOGICAL_MAX


# --- embeddings ---------------------------------------------------------------------------


def pack_vector(values: Sequence[float] | npt.ArrayLike) -> bytes:
    """Raw little-endian float32 bytes of a 1-D vector (the wire form of an embedding)."""
    import numpy as np

    array = np.asarray(values, dtype="<f4")
    if array.ndim != 1:
        raise ValueError(f"an embedding must be one-dimensional, got shape {array.shape}")
    return array.tobytes()


def unpack_vector(raw: bytes) -> npt.NDArray[np.float32]:
    """A read-only float32 array over the wire bytes of an embedding (no copy)."""
    import numpy as np

    return np.frombuffer(raw, dtype="<f4")


def _check_vector_bytes(field: str, raw: bytes) -> None:
    if len(raw) % 4:
        raise ValueError(f"{field}: {len(raw)} bytes is not a whole number of float32 values")


# --- experience types (a tagged union of its own) -----------------------------------------

Severity: TypeAlias = Literal["Low", "Medium", "High", "Critical"]
RelationType: TypeAlias = Literal[
    "Supports", "Contradicts", "Elaborates", "Supersedes", "Implies", "RelatedTo"
]
Visibility: TypeAlias = Literal["private", "team", "org"]  # who may see it (eventlog.access)
TokenScope: TypeAlias = Literal["read", "write", "admin"]
WisdomCategory: TypeAlias = Literal[
    "CodingStyle",
    "ArchitecturalPreference",
    "TechStackPreference",
    "QualityStandard",
    "WorkflowPreference",
]


class _Kind(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind"):
    """Base of the experience-type variants; the tag is the variant's name."""


class Difficulty(_Kind, frozen=True, tag="Difficulty"):
    description: str
    severity: Severity


class Solution(_Kind, frozen=True, tag="Solution"):
    approach: str
    worked: bool
    problem_ref: UUID | None = None


class ErrorPattern(_Kind, frozen=True, tag="ErrorPattern"):
    signature: str
    fix: str
    prevention: str


class SuccessPattern(_Kind, frozen=True, tag="SuccessPattern"):
    task_type: str
    approach: str
    quality: float


class UserPreference(_Kind, frozen=True, tag="UserPreference"):
    category: str
    preference: str
    strength: float


class ArchitecturalDecision(_Kind, frozen=True, tag="ArchitecturalDecision"):
    decision: str
    rationale: str


class TechInsight(_Kind, frozen=True, tag="TechInsight"):
    technology: str
    insight: str


class Fact(_Kind, frozen=True, tag="Fact"):
    statement: str
    source: str


class Generic(_Kind, frozen=True, tag="Generic"):
    category: str | None = None


ExperienceType: TypeAlias = (
    Difficulty
    | Solution
    | ErrorPattern
    | SuccessPattern
    | UserPreference
    | ArchitecturalDecision
    | TechInsight
    | Fact
    | Generic
)
EXPERIENCE_TYPES: tuple[type[_Kind], ...] = ExperienceType.__args__

# --- events -------------------------------------------------------------------------------


class EventBase(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """Fields every event carries: its identity, its writer and its causal time."""

    event_id: UUID  # UUIDv7; also the JetStream Nats-Msg-Id, so a retry is stored once
    instance_id: UUID  # the writing instance incarnation (owner of its counter entries)
    hlc: int  # hybrid logical clock, see pack_hlc
    # the principal that wrote it (``sync.access``): the owner it acted for and its agent
    # (None in events from before principals, and for an owner acting without an agent)
    author_owner: str | None = None
    author_agent: str | None = None


class CollectiveCreated(EventBase, frozen=True, tag="collective.created"):
    collective_id: UUID
    owner_id: str
    name: str
    embedding_dimension: int
    embedder: str = ""  # the text embedder the collective uses; "" = callers bring vectors
    # its text analyzer (limits.LANGUAGES), or "auto": each text's own (schema 5); ""
    # = English (schema < 3)
    language: str = ""
    # what recording an experience close to a live one (of the same type and visibility,
    # by the same owner) does (schema 5): "keep" ("" before: keep), "reinforce" or
    # "link"; close: a cosine similarity of at least ``duplicate_similarity`` (0: before)
    on_duplicate: str = ""
    duplicate_similarity: float = 0.0


class CollectiveDeleted(EventBase, frozen=True, tag="collective.deleted"):
    collective_id: UUID


class ExperienceRecorded(EventBase, frozen=True, tag="experience.recorded"):
    experience_id: UUID
    collective_id: UUID
    content: str
    embedding: bytes  # little-endian float32
    experience_type: ExperienceType
    importance: float
    confidence: float
    source_agent: str
    domain: tuple[str, ...] = ()
    related_files: tuple[str, ...] = ()
    source_task: str | None = None
    visibility: Visibility = "team"  # fixed by the create (eventlog.access)
    # when it became true (Unix ms); None: when it was recorded (the HLC's time)
    valid_from_ms: int | None = None
    # the language of its content, detected by the writer in a collective of "auto"
    # (projections.language.of_text); "": not detected (a fixed language, schema < 5)
    language: str = ""

    def __post_init__(self) -> None:
        _check_vector_bytes("embedding", self.embedding)

    @property
    def vector(self) -> npt.NDArray[np.float32]:
        return unpack_vector(self.embedding)


class ExperienceUpdated(EventBase, frozen=True, tag="experience.updated"):
    """Changes the fields that are not None; each is a last-writer-wins register."""

    experience_id: UUID
    collective_id: UUID
    importance: float | None = None
    confidence: float | None = None
    domain: tuple[str, ...] | None = None
    related_files: tuple[str, ...] | None = None


class ExperienceArchived(EventBase, frozen=True, tag="experience.archived"):
    experience_id: UUID
    collective_id: UUID


class ExperienceUnarchived(EventBase, frozen=True, tag="experience.unarchived"):
    experience_id: UUID
    collective_id: UUID


class ExperienceInvalidated(EventBase, frozen=True, tag="experience.invalidated"):
    """It stopped being true at ``valid_to_ms`` (Unix ms), for ``reason``: closes its
    validity interval (``valid_to_ms`` None: it is true again). ``valid_to_ms`` and
    ``reason`` are one last-writer-wins register (by the stamp); every invalidation is
    also remembered (how often it flips: its drift)."""

    experience_id: UUID
    collective_id: UUID
    reason: str
    valid_to_ms: int | None


class ExperienceDeleted(EventBase, frozen=True, tag="experience.deleted"):
    experience_id: UUID
    collective_id: UUID


class ExperienceReinforced(EventBase, frozen=True, tag="experience.reinforced"):
    """G-counter state: ``instance_id`` has now applied the experience ``applications``
    times in total. Never an increment, so redelivery cannot over-count."""

    experience_id: UUID
    collective_id: UUID
    applications: int


class RelationStored(EventBase, frozen=True, tag="relation.stored"):
    relation_id: UUID
    collective_id: UUID
    source_id: UUID
    target_id: UUID
    relation_type: RelationType
    strength: float
    metadata: str | None = None
    visibility: Visibility = "team"  # fixed by the create (eventlog.access)


class RelationDeleted(EventBase, frozen=True, tag="relation.deleted"):
    relation_id: UUID
    collective_id: UUID


class InsightStored(EventBase, frozen=True, tag="insight.stored"):
    insight_id: UUID
    collective_id: UUID
    content: str
    embedding: bytes  # little-endian float32
    source_experiences: tuple[UUID, ...]
    confidence: float
    domain: tuple[str, ...] = ()
    visibility: Visibility = "team"  # fixed by the create (eventlog.access)
    language: str = ""  # as an experience's (ExperienceRecorded.language)

    def __post_init__(self) -> None:
        _check_vector_bytes("embedding", self.embedding)

    @property
    def vector(self) -> npt.NDArray[np.float32]:
        return unpack_vector(self.embedding)


class InsightDeleted(EventBase, frozen=True, tag="insight.deleted"):
    insight_id: UUID
    collective_id: UUID


class ActivityRegistered(EventBase, frozen=True, tag="activity.registered"):
    collective_id: UUID
    agent_id: str
    task_description: str = ""
    working_on: tuple[str, ...] = ()


class ActivityHeartbeat(EventBase, frozen=True, tag="activity.heartbeat"):
    """Carries the whole activity, not just "alive": the activity stream keeps only the
    last message per agent, so a heartbeat replaces the registration it refreshes."""

    collective_id: UUID
    agent_id: str
    started_ms: int
    task_description: str = ""
    working_on: tuple[str, ...] = ()


class ActivityEnded(EventBase, frozen=True, tag="activity.ended"):
    collective_id: UUID
    agent_id: str


class WisdomStored(EventBase, frozen=True, tag="wisdom.stored"):
    wisdom_id: UUID
    owner_id: str
    category: WisdomCategory
    pattern: str
    confidence: float
    embedding: bytes  # little-endian float32
    source_collectives: tuple[UUID, ...] = ()
    source_experience_count: int = 0
    applicable_domains: tuple[str, ...] = ()
    visibility: Visibility = "team"  # fixed by the create (eventlog.access)

    def __post_init__(self) -> None:
        _check_vector_bytes("embedding", self.embedding)

    @property
    def vector(self) -> npt.NDArray[np.float32]:
        return unpack_vector(self.embedding)


class WisdomDeleted(EventBase, frozen=True, tag="wisdom.deleted"):
    wisdom_id: UUID
    owner_id: str


class TokenCreated(EventBase, frozen=True, tag="token.created"):
    """An access token (``sync.access``): only the SHA-256 of the secret is on the log."""

    token_id: UUID
    owner_id: str
    secret_sha256: str  # 64 hex digits
    scope: TokenScope
    agent_id: str | None = None  # None: the owner itself
    collectives: tuple[UUID, ...] = ()  # (): every collective of the owner
    expires_ms: int | None = None  # Unix ms; None: never


class TokenRevoked(EventBase, frozen=True, tag="token.revoked"):
    token_id: UUID


# --- sessions: an agent's working state in a collective, from its start to its end ---------

TodoPriority: TypeAlias = Literal["low", "medium", "high"]


class TodoItem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One item of a session's todo list."""

    task: str
    priority: TodoPriority = "medium"
    note: str = ""
    done: bool = False


class SessionStarted(EventBase, frozen=True, tag="session.started"):
    """An agent's session in a collective begins (its summary so far, maybe empty)."""

    session_id: UUID
    collective_id: UUID
    agent_id: str
    summary: str = ""


class SessionUpdated(EventBase, frozen=True, tag="session.updated"):
    """Replaces the fields that are not None; each is a last-writer-wins register (two
    hosts changing different fields at once both keep their change)."""

    session_id: UUID
    collective_id: UUID
    summary: str | None = None
    todo: tuple[TodoItem, ...] | None = None
    changes: tuple[str, ...] | None = None  # what changed, one short note each
    bugs: tuple[str, ...] | None = None  # known bugs, one short note each
    architecture: tuple[str, ...] | None = None  # architecture notes, one each


class SessionEnded(EventBase, frozen=True, tag="session.ended"):
    session_id: UUID
    collective_id: UUID


class SessionDeleted(EventBase, frozen=True, tag="session.deleted"):
    """A tombstone: a session is forgotten (``delete_session``, or with its collective)."""

    session_id: UUID
    collective_id: UUID


# --- threads: an agent framework's thread state (LangGraph's checkpoints) in a collective ----


class ThreadCheckpointed(EventBase, frozen=True, kw_only=True, tag="thread.checkpointed"):
    """One checkpoint of a thread, whole: the framework's serialized state at a step
    (``checkpoint``, tagged with its serializer's ``checkpoint_type``) and its metadata
    (JSON text). A thread is an entity like a session: ``thread_id`` is Pulse's id of it
    (one incarnation of the framework's ``name`` for it in the collective), its events are
    sealed with its data key, and deleting it forgets every checkpoint on disk. Each
    checkpoint stands alone (no value refers to another checkpoint's), so pruning or
    deleting some never breaks the others."""

    thread_id: UUID
    collective_id: UUID
    name: str  # the framework's thread id (LangGraph's ``thread_id``)
    checkpoint_ns: str = ""  # "" for the root graph, else a subgraph's namespace
    checkpoint_id: str  # the framework's; ordered: the latest of a namespace is the largest
    parent_checkpoint_id: str | None = None
    checkpoint_type: str  # the serializer's tag of ``checkpoint``
    checkpoint: bytes
    metadata: str = "{}"  # a JSON object
    run_id: str | None = None  # the run that made it (metadata's run_id), if any


class PendingWrite(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One pending write of a task. ``idx`` is its place among the task's writes; a
    negative one names a special channel (an error, an interrupt, a resume), which the
    latest write replaces, where an ordinary write, once made, stays as it was (a
    retried task writes the same again)."""

    idx: int
    channel: str
    value_type: str  # the serializer's tag of ``value``
    value: bytes = b""


class ThreadWritten(EventBase, frozen=True, kw_only=True, tag="thread.written"):
    """A task's pending writes, made after ``checkpoint_id``: one event, so they are
    stored together or not at all (the framework reads a task with writes as done)."""

    thread_id: UUID
    collective_id: UUID
    checkpoint_ns: str = ""
    checkpoint_id: str
    task_id: str
    task_path: str = ""
    writes: tuple[PendingWrite, ...]


class ThreadCheckpointDeleted(
    EventBase, frozen=True, kw_only=True, tag="thread.checkpoint_deleted"
):
    """A tombstone for one checkpoint of a thread and its pending writes (a prune, or
    the checkpoints of runs deleted); the thread and its other checkpoints stay."""

    thread_id: UUID
    collective_id: UUID
    checkpoint_ns: str = ""
    checkpoint_id: str


class ThreadDeleted(EventBase, frozen=True, tag="thread.deleted"):
    """A tombstone: a thread is forgotten, every checkpoint and write of it."""

    thread_id: UUID
    collective_id: UUID


class Sealed(EventBase, frozen=True, tag="sealed"):
    """An event whose body is encrypted with the data key of its entity (``eventlog.sealing``):
    what it says can be read only while that key exists, and deleting the entity destroys
    the key, so every copy of it (in any store, block or backup) is noise. In the clear:
    the common fields, which entity it belongs to (its subject, its purge and its key are
    known without the key) and the type of the event inside."""

    kind: str  # the tag of the event inside, e.g. "experience.recorded"
    entity: str  # experience, insight, relation, session, thread or wisdom
    entity_id: UUID
    box: bytes  # nonce (12 bytes) + AES-256-GCM ciphertext of the inner body + tag
    collective_id: UUID | None = None  # None for wisdom (per owner)


Event: TypeAlias = (
    CollectiveCreated
    | CollectiveDeleted
    | ExperienceRecorded
    | ExperienceUpdated
    | ExperienceArchived
    | ExperienceUnarchived
    | ExperienceInvalidated
    | ExperienceDeleted
    | ExperienceReinforced
    | RelationStored
    | RelationDeleted
    | InsightStored
    | InsightDeleted
    | ActivityRegistered
    | ActivityHeartbeat
    | ActivityEnded
    | WisdomStored
    | WisdomDeleted
    | TokenCreated
    | TokenRevoked
    | SessionStarted
    | SessionUpdated
    | SessionEnded
    | SessionDeleted
    | ThreadCheckpointed
    | ThreadWritten
    | ThreadCheckpointDeleted
    | ThreadDeleted
    | Sealed
)
EVENT_TYPES: tuple[type[EventBase], ...] = Event.__args__


def event_type_name(event: EventBase) -> str:
    """The tag of an event, e.g. ``"experience.recorded"``."""
    return str(type(event).__struct_config__.tag)


def event_type_name_of(event_type: type[EventBase]) -> str:
    """The tag of an event type."""
    return str(event_type.__struct_config__.tag)

"""The limits of Pulse's data model in one place, and ``check_ranges``: whether an event
read from the log keeps them.

Callers are held to these limits at the edges by the pydantic models of ``sync.models``,
which import the numbers from here. An event on the log may have been written by another
host (another version, a bug, a forged message), so the codec holds every event it reads
to the same limits (``eventlog.codec.decode_event`` runs ``check_ranges``; only the texts
of experience types, which the data model leaves open, get a looser bound on the log)
plus the ranges of the wire's integers, which no caller chooses. An event outside becomes an
undecodable entry (a dead letter) instead of reaching a projection that cannot store it
(a UBIGINT column, a FAISS index of a silly dimension) and stopping every host.

Lengths of names, tags and paths count characters (as pydantic's ``max_length`` does);
content, metadata and task descriptions count bytes of UTF-8 (as the data model says).
A refusal names the field, the limit and the value (``domain[3]: must be 1..100
characters, got 101``), the same text on every host.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from eventlog import events as ev

# -- the data model (DESIGN.md, the data-model table) ---------------------------------------

NAME_MAX = 256  # characters: owner_id, name, source_agent, agent_id (each 1..NAME_MAX)
DIMENSION_MAX = 4096  # embedding dimension of a collective (1..DIMENSION_MAX)
CONTENT_MAX_BYTES = 100 * 1024  # experience content, UTF-8 (1 byte..100 KB)
INSIGHT_MAX_BYTES = 50 * 1024  # insight content, UTF-8 (1 byte..50 KB)
METADATA_MAX_BYTES = 10 * 1024  # relation metadata, UTF-8 (0..10 KB)
TASK_MAX_BYTES = 1024  # an activity's task description, UTF-8 (0..1 KB)
DOMAIN_MAX, DOMAIN_TAG_MAX = 50, 100  # domain tags of an experience, insight or wisdom
FILES_MAX, FILE_PATH_MAX = 100, 500  # related files of an experience
WORKING_ON_MAX, WORKING_ON_ITEM_MAX = 100, 500  # what an activity is working on
SOURCES_MAX = 100  # source experiences of an insight (1..), source collectives of wisdom
TYPE_TEXT_MAX = 10_000  # each text field of an experience type (not in PulseDB: our cap)
# ... and the bound the codec holds a text field of an experience type on the log to. The
# data model sets none, so the log is looser than the API: such a text may be as long as
# an experience's content (writers and tools put the content in a Fact's statement).
TYPE_TEXT_LOG_MAX_BYTES = CONTENT_MAX_BYTES
PATTERN_MAX = 10_000  # a wisdom pattern (not in PulseDB: our cap)
EMBEDDER_NAME_MAX = 64  # the name of a collective's text embedder ("" = none)
# what a collective does with a duplicate (eventlog.recorded.ON_DUPLICATE): the
# characters of a choice in an event (a later release's too)
ON_DUPLICATE_NAME_MAX = 32
# the text analyzers a collective may name: eventlog.languages
LANGUAGE_NAME_MAX = 64  # the name of one, as an event may carry it
SOURCE_TASK_MAX = 1024  # characters of an experience's source_task
SOURCE_EXPERIENCE_COUNT_MAX = 2**32  # how many experiences a wisdom was distilled from
TOKEN_COLLECTIVES_MAX = 100  # collectives an access token may be limited to
# What is sealed (``eventlog.sealing``): entity -> the event types whose bodies are
# encrypted with its data key (every event that carries its text or its vector).
SEALED_KINDS: dict[str, tuple[str, ...]] = {
    "experience": ("experience.recorded", "experience.updated", "experience.invalidated"),
    "insight": ("insight.stored",),
    "relation": ("relation.stored",),
    "session": ("session.started", "session.updated"),
    "thread": ("thread.checkpointed", "thread.written"),
    "wisdom": ("wisdom.stored",),
}
SEALED_OVERHEAD = 12 + 16  # a sealed box's nonce and tag (AES-GCM)
SEALED_MAX_BYTES = 8 * 1024 * 1024  # no body comes near: the stream refuses large messages
REASON_MAX_BYTES = 1024  # why an experience stopped being true, UTF-8 (1 byte..1 KB)

# an agent's session (sync.sessions): a summary, a todo list and three lists of short notes
SESSION_SUMMARY_MAX_BYTES = 8 * 1024  # UTF-8 (0..8 KB): it is the text a resume searches by
SESSION_TODO_MAX = 100  # items of a session's todo list
TODO_TASK_MAX_BYTES = 1024  # a todo item's task, UTF-8 (1 byte..1 KB)
TODO_NOTE_MAX_BYTES = 1024  # a todo item's note, UTF-8 (0..1 KB)
SESSION_NOTES_MAX = 100  # notes in each of a session's changes, bugs and architecture
SESSION_NOTE_MAX_BYTES = 1024  # one such note, UTF-8 (1 byte..1 KB)

# a thread's checkpoints and pending writes (an agent framework's state: sync.threads)
THREAD_NAME_MAX_BYTES = 1024  # the framework's thread id, UTF-8 (1 byte..1 KB)
THREAD_KEY_MAX_BYTES = 1024  # a namespace, checkpoint id, task id, task path or channel
THREAD_TYPE_MAX = 64  # a serializer's tag (characters, 1..64)
# what one checkpoint (or one write) may hold: its event, sealed, fits nats-server's
# default max_payload (1 MB) with room for the rest of the event
THREAD_VALUE_MAX_BYTES = 896 * 1024  # a checkpoint's bytes and metadata; a task's writes
THREAD_METADATA_MAX_BYTES = 64 * 1024  # a checkpoint's metadata, JSON text
THREAD_WRITE_IDX_MIN, THREAD_WRITE_IDX_MAX = -16, 2**31 - 1  # a write's place
THREAD_WRITES_MAX = 1000  # pending writes of one task in one event

# -- the wire's integers ----------------------------------------------------------------------

# A packed HLC must fit a signed 64-bit integer: the projections store it in DuckDB and
# shift out its milliseconds as BIGINT, and other tools read it as int64.
HLC_MAX = 2**63 - 1
# Milliseconds since the epoch (an activity's start): the wall-clock part of any valid HLC.
MILLIS_MAX = HLC_MAX >> ev.HLC_LOGICAL_BITS  # 2**47-1, the year 6429
# One G-counter entry: "instance r has applied this experience n times". The projection
# sums the entries of an experience (one per instance that reinforced it, and instance ids
# are cheap: every incarnation has a fresh one) into a DuckDB UBIGINT (< 2**64), and the
# total is used as a float64 and a JSON number, exact only up to 2**53. At 2**32 per entry
# the sum stays exact up to 2**21 entries and stays a UBIGINT up to 2**32 entries (each
# one a stored message); at 2**62 per entry, four forged entries would overflow it. An
# honest instance publishes one event per application, so it never nears 2**32.
APPLICATIONS_MAX = 2**32


def _clock_ahead_ms() -> int:
    raw = os.environ.get("PULSE_CLOCK_AHEAD_MS", "60000")
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"PULSE_CLOCK_AHEAD_MS: must be a whole number of ms, got {raw!r}"
        ) from None
    if not 1_000 <= value <= 86_400_000:
        raise ValueError(f"PULSE_CLOCK_AHEAD_MS: must be in 1000..86400000, got {value}")
    return value


# How far an event's clock may be ahead of the time the log stored it. The time is the
# stream's own (JetStream stamps every message when it stores it), the same on every
# host and in every replay, so the verdict is too; a host whose wall clock runs further
# ahead than this cannot win every last-writer-wins field from then on: its events are
# dead letters, and its own writes raise. Every host of a deployment must use the same
# value (``PULSE_CLOCK_AHEAD_MS``, default 60 s).
CLOCK_AHEAD_MS = _clock_ahead_ms()


def check_clock(event: ev.Event, stored_ms: int) -> None:
    """Raise ``ValueError`` when ``event``'s clock is more than ``CLOCK_AHEAD_MS`` ahead
    of ``stored_ms``, the time the log stored it."""
    ahead = ev.hlc_millis(event.hlc) - stored_ms
    if ahead > CLOCK_AHEAD_MS:
        raise ValueError(
            f"hlc: must be at most {CLOCK_AHEAD_MS} ms ahead of the time the log stored the "
            f"event, got {ahead} ms ahead (the writer's clock runs fast)"
        )


def limit_text(value: int) -> str:
    """A limit as a person writes it: ``2**63-1`` rather than 9223372036854775807."""
    if value >= 1 << 20:
        if value & (value - 1) == 0:
            return f"2**{value.bit_length() - 1}"
        if value & (value + 1) == 0:
            return f"2**{value.bit_length()}-1"
    return str(value)


# -- checking an event ------------------------------------------------------------------------


def check_ranges(event: ev.Event) -> None:
    """Raise ``ValueError`` naming the first field of ``event`` that breaks a limit, the
    limit and the value, e.g. ``hlc: must be in 0..2**63-1, got -5``.

    Only limits an event can be checked against on its own; invariants that need the
    folded state (the collective's dimension, references that exist) are the fold's.
    """
    _integer("hlc", event.hlc, 0, HLC_MAX)
    if event.author_owner is not None:
        _chars("author_owner", event.author_owner, 1, NAME_MAX)
    if event.author_agent is not None:
        _chars("author_agent", event.author_agent, 1, NAME_MAX)
    match event:
        case ev.CollectiveCreated():
            _chars("owner_id", event.owner_id, 1, NAME_MAX)
            _chars("name", event.name, 1, NAME_MAX)
            _integer("embedding_dimension", event.embedding_dimension, 1, DIMENSION_MAX)
            _chars("embedder", event.embedder, 0, EMBEDDER_NAME_MAX)
            # a name this release does not know (a later one's) is not refused: the
            # projection analyzes such a collective as "simple" (projections.language)
            _chars("language", event.language, 0, LANGUAGE_NAME_MAX)
            # (as the language: a choice this release does not know reads as "keep")
            _chars("on_duplicate", event.on_duplicate, 0, ON_DUPLICATE_NAME_MAX)
            _score("duplicate_similarity", event.duplicate_similarity)
        case ev.ExperienceRecorded():
            _utf8("content", event.content, 1, CONTENT_MAX_BYTES)
            _embedding("embedding", event.embedding)
            _experience_type(event.experience_type)
            _score("importance", event.importance)
            _score("confidence", event.confidence)
            _chars("source_agent", event.source_agent, 1, NAME_MAX)
            _texts("domain", event.domain, DOMAIN_MAX, DOMAIN_TAG_MAX)
            _texts("related_files", event.related_files, FILES_MAX, FILE_PATH_MAX)
            if event.source_task is not None:
                _chars("source_task", event.source_task, 1, SOURCE_TASK_MAX)
            if event.valid_from_ms is not None:
                _integer("valid_from_ms", event.valid_from_ms, 0, MILLIS_MAX)
            _chars("language", event.language, 0, LANGUAGE_NAME_MAX)  # (as a collective's)
        case ev.ExperienceInvalidated():
            _utf8("reason", event.reason, 1, REASON_MAX_BYTES)
            if event.valid_to_ms is not None:
                _integer("valid_to_ms", event.valid_to_ms, 0, MILLIS_MAX)
        case ev.ExperienceUpdated():
            if event.importance is not None:
                _score("importance", event.importance)
            if event.confidence is not None:
                _score("confidence", event.confidence)
            if event.domain is not None:
                _texts("domain", event.domain, DOMAIN_MAX, DOMAIN_TAG_MAX)
            if event.related_files is not None:
                _texts("related_files", event.related_files, FILES_MAX, FILE_PATH_MAX)
        case ev.ExperienceReinforced():
            _integer("applications", event.applications, 0, APPLICATIONS_MAX)
        case ev.RelationStored():
            _score("strength", event.strength)
            if event.metadata is not None:
                _utf8("metadata", event.metadata, 0, METADATA_MAX_BYTES)
        case ev.InsightStored():
            _utf8("content", event.content, 1, INSIGHT_MAX_BYTES)
            _embedding("embedding", event.embedding)
            _count("source_experiences", len(event.source_experiences), 1, SOURCES_MAX)
            _score("confidence", event.confidence)
            _texts("domain", event.domain, DOMAIN_MAX, DOMAIN_TAG_MAX)
            _chars("language", event.language, 0, LANGUAGE_NAME_MAX)
        case ev.Sealed():
            kinds = SEALED_KINDS.get(event.entity)
            if kinds is None:
                known = sorted(SEALED_KINDS)
                raise ValueError(f"entity: must be one of {known}, got {event.entity!r}")
            if event.kind not in kinds:
                raise ValueError(
                    f"kind: a sealed {event.entity} event is one of {kinds}, got {event.kind!r}"
                )
            if (event.collective_id is None) != (event.entity == "wisdom"):
                raise ValueError(
                    "collective_id: a sealed event names its collective (none for wisdom)"
                )
            if not SEALED_OVERHEAD < len(event.box) <= SEALED_MAX_BYTES:
                raise ValueError(
                    f"box: must be {SEALED_OVERHEAD + 1}..{SEALED_MAX_BYTES} bytes, "
                    f"got {len(event.box)}"
                )
        case ev.ActivityRegistered() | ev.ActivityHeartbeat():
            _chars("agent_id", event.agent_id, 1, NAME_MAX)
            _utf8("task_description", event.task_description, 0, TASK_MAX_BYTES)
            _texts("working_on", event.working_on, WORKING_ON_MAX, WORKING_ON_ITEM_MAX)
            if isinstance(event, ev.ActivityHeartbeat):
                _integer("started_ms", event.started_ms, 0, MILLIS_MAX)
        case ev.ActivityEnded():
            _chars("agent_id", event.agent_id, 1, NAME_MAX)
        case ev.SessionStarted():
            _chars("agent_id", event.agent_id, 1, NAME_MAX)
            _utf8("summary", event.summary, 0, SESSION_SUMMARY_MAX_BYTES)
        case ev.SessionUpdated():
            if event.summary is not None:
                _utf8("summary", event.summary, 0, SESSION_SUMMARY_MAX_BYTES)
            if event.todo is not None:
                _count("todo", len(event.todo), 0, SESSION_TODO_MAX)
                for i, item in enumerate(event.todo):
                    _utf8(f"todo[{i}].task", item.task, 1, TODO_TASK_MAX_BYTES)
                    _utf8(f"todo[{i}].note", item.note, 0, TODO_NOTE_MAX_BYTES)
            for name in ("changes", "bugs", "architecture"):
                notes = getattr(event, name)
                if notes is not None:
                    _count(name, len(notes), 0, SESSION_NOTES_MAX)
                    for i, note in enumerate(notes):
                        _utf8(f"{name}[{i}]", note, 1, SESSION_NOTE_MAX_BYTES)
        case ev.ThreadCheckpointed():
            _utf8("name", event.name, 1, THREAD_NAME_MAX_BYTES)
            _thread_keys(event.checkpoint_ns, event.checkpoint_id)
            if event.parent_checkpoint_id is not None:
                _utf8("parent_checkpoint_id", event.parent_checkpoint_id, 1, THREAD_KEY_MAX_BYTES)
            _chars("checkpoint_type", event.checkpoint_type, 1, THREAD_TYPE_MAX)
            _utf8("metadata", event.metadata, 0, THREAD_METADATA_MAX_BYTES)
            _bytes("checkpoint and metadata", len(event.checkpoint) + len(event.metadata),
                   THREAD_VALUE_MAX_BYTES)  # fmt: skip
            if event.run_id is not None:
                _utf8("run_id", event.run_id, 1, THREAD_KEY_MAX_BYTES)
        case ev.ThreadWritten():
            _thread_keys(event.checkpoint_ns, event.checkpoint_id)
            _utf8("task_id", event.task_id, 1, THREAD_KEY_MAX_BYTES)
            _utf8("task_path", event.task_path, 0, THREAD_KEY_MAX_BYTES)
            _count("writes", len(event.writes), 1, THREAD_WRITES_MAX)
            for i, write in enumerate(event.writes):
                _integer(f"writes[{i}].idx", write.idx, THREAD_WRITE_IDX_MIN, THREAD_WRITE_IDX_MAX)
                _utf8(f"writes[{i}].channel", write.channel, 1, THREAD_KEY_MAX_BYTES)
                _chars(f"writes[{i}].value_type", write.value_type, 1, THREAD_TYPE_MAX)
            _bytes("writes' values", sum(len(w.value) for w in event.writes),
                   THREAD_VALUE_MAX_BYTES)  # fmt: skip
        case ev.ThreadCheckpointDeleted():
            _thread_keys(event.checkpoint_ns, event.checkpoint_id)
        case ev.WisdomStored():
            _chars("owner_id", event.owner_id, 1, NAME_MAX)
            _chars("pattern", event.pattern, 1, PATTERN_MAX)
            _score("confidence", event.confidence)
            _embedding("embedding", event.embedding)
            _count("source_collectives", len(event.source_collectives), 0, SOURCES_MAX)
            _integer(
                "source_experience_count",
                event.source_experience_count,
                0,
                SOURCE_EXPERIENCE_COUNT_MAX,
            )
            _texts("applicable_domains", event.applicable_domains, DOMAIN_MAX, DOMAIN_TAG_MAX)
        case ev.WisdomDeleted():
            _chars("owner_id", event.owner_id, 1, NAME_MAX)
        case ev.TokenCreated():
            _chars("owner_id", event.owner_id, 1, NAME_MAX)
            if event.agent_id is not None:
                _chars("agent_id", event.agent_id, 1, NAME_MAX)
            if len(event.secret_sha256) != 64 or not all(
                c in "0123456789abcdef" for c in event.secret_sha256
            ):
                raise ValueError("secret_sha256: must be 64 lowercase hex digits")
            _count("collectives", len(event.collectives), 0, TOKEN_COLLECTIVES_MAX)
            if event.expires_ms is not None:
                _integer("expires_ms", event.expires_ms, 0, MILLIS_MAX)


def _integer(field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValueError(f"{field}: must be in {low}..{limit_text(high)}, got {value}")


def _score(field: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{field}: must be a finite number in [0, 1], got {value!r}")


def _chars(field: str, value: str, low: int, high: int) -> None:
    if not low <= len(value) <= high:
        raise ValueError(f"{field}: must be {low}..{high} characters, got {len(value)}")


def _utf8(field: str, value: str, low: int, high: int) -> None:
    if low <= len(value) and 4 * len(value) <= high:
        return  # a code point is 1..4 bytes: within the limit whatever the text
    size = len(value.encode("utf-8", "surrogatepass"))
    if not low <= size <= high:
        raise ValueError(f"{field}: must be {low}..{high} bytes of UTF-8, got {size}")


def _thread_keys(namespace: str, checkpoint_id: str) -> None:
    _utf8("checkpoint_ns", namespace, 0, THREAD_KEY_MAX_BYTES)
    _utf8("checkpoint_id", checkpoint_id, 1, THREAD_KEY_MAX_BYTES)


def _bytes(field: str, size: int, high: int) -> None:
    if size > high:
        raise ValueError(f"{field}: must be 0..{high} bytes, got {size}")


def _count(field: str, count: int, low: int, high: int) -> None:
    if not low <= count <= high:
        raise ValueError(f"{field}: must hold {low}..{high} items, got {count}")


def _texts(field: str, values: Sequence[str], most: int, longest: int) -> None:
    """A list of at most ``most`` non-empty texts of at most ``longest`` characters."""
    _count(field, len(values), 0, most)
    for i, value in enumerate(values):
        _chars(f"{field}[{i}]", value, 1, longest)


def _embedding(field: str, raw: bytes) -> None:
    count, partial = divmod(len(raw), 4)
    if partial or not 1 <= count <= DIMENSION_MAX:
        raise ValueError(
            f"{field}: must hold 1..{DIMENSION_MAX} float32 values (4 bytes each), "
            f"got {len(raw)} bytes"
        )
    vector = ev.unpack_vector(raw)
    finite = np.isfinite(vector)
    if not finite.all():
        i = int(np.argmin(finite))
        raise ValueError(f"{field}[{i}]: must be a finite number, got {float(vector[i])!r}")


def _experience_type(kind: ev.ExperienceType) -> None:
    """Every text field of a variant is at most TYPE_TEXT_LOG_MAX_BYTES of UTF-8; its
    numbers (quality, strength) are scores in [0, 1]."""
    for name in kind.__struct_fields__:
        value = getattr(kind, name)
        if isinstance(value, str):
            _utf8(f"experience_type.{name}", value, 0, TYPE_TEXT_LOG_MAX_BYTES)
        elif isinstance(value, float):
            _score(f"experience_type.{name}", value)

"""The event log interface: what the rest of Pulse may ask of the log, whatever backs it.

Two backends implement it, ``JetStreamLog`` (NATS JetStream, the real thing) and
``MemoryLog`` (in-process, for tests and simulations), and one contract test module
(``tests/log_contract.py``) runs against both.

Sequences are stream sequences: 1, 2, 3, ... per stream, never reused. Durable events
live in the main stream; activity events (presence) in the activity stream, which keeps
only the last message per agent, so they never show up in ``read`` or ``tail``.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from types import TracebackType
from typing import AsyncGenerator, Callable, Sequence
from uuid import UUID

from eventlog.errors import ConflictError, DecodeError
from eventlog.events import Event
from eventlog.keys import KeyStore, MemoryKeyStore

EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
HDR_IDEMPOTENCY = "Pulse-Idempotency"  # the fingerprint of the idempotent call that wrote it


# an event this host wrote and has not read back yet, by its message id (its event id)
# and the subject it was stored on; taken (popped) by the tail that finds it
OwnEvents = Callable[[str, str], Event | None]


def key_conflict(subject: str) -> ConflictError:
    return ConflictError(
        "idempotency_key: already used for a call with other arguments (or another "
        "method); use a new key for a new call",
        subject=subject,
    )


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One stored message: its place in the stream and the event it holds.

    A message that cannot be decoded comes back with ``event=None`` and the
    ``DecodeError`` in ``error`` instead of raising, so a consumer can set it aside
    (the projections keep it as a dead letter) and keep going. ``stored_ms`` is the time
    the log stored it (the stream's clock; None where it is not known, e.g. an event a
    writer hands its own engine).
    """

    seq: int
    subject: str
    event: Event | None
    error: DecodeError | None = None
    stored_ms: int | None = None
    # a log in partitions (``eventlog.partitioned.LocalLog``): where the message is in it
    # (``eventlog.partitions.position``), while ``seq`` numbers what this host applies
    position: int | None = None


@dataclass(frozen=True, slots=True)
class ConsumerState:
    """A reader of the stream, as the log tracks it (``pulse status``)."""

    name: str
    filters: tuple[str, ...]  # the subjects it reads (empty: all)
    delivered_seq: int  # the last stream sequence it delivered
    pending: int  # messages on its subjects not delivered yet


@dataclass(frozen=True, slots=True)
class StreamState:
    """The main stream, as the log reports it (``pulse status``)."""

    name: str
    messages: int
    bytes: int
    first_seq: int
    last_seq: int
    replicas: int
    leader: str | None  # the server leading it (a cluster), None when not known
    consumers: tuple[ConsumerState, ...] = ()
    sources: tuple[dict[str, object], ...] = ()  # streams it sources (name, lag, active)
    # the durability of the servers it is placed on (eventlog.streams.durability_of);
    # None: placed by no durability, or on one server (which places nothing by tags)
    durability: str | None = None


class EventLog(abc.ABC):
    """An append-only, idempotent, subject-addressed log of Pulse events."""

    _key_store: KeyStore | None = None
    # the sequences are this host's own numbering (a log in partitions:
    # ``eventlog.partitioned.LocalLog``), so it is read only from where the host stands
    numbered_here: bool = False

    @abc.abstractmethod
    async def stream_state(self) -> StreamState:
        """The main stream's state: messages, sequences, replicas, its readers."""

    async def partition_states(self) -> list[StreamState]:
        """The state of each partition stream, a log in partitions' (``eventlog.partitions``:
        the main stream holds wisdom and tokens); none for a log of one stream."""
        return []

    @abc.abstractmethod
    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> int:
        """Store one event and return its stream sequence once it is durably stored.

        Idempotent by ``event.event_id``: appending the same event again returns the
        sequence it was first stored at. With ``expected_last_subject_seq``, the append
        succeeds only if the last message on the event's subject has that sequence
        (0: none yet), else raises ``ConflictError``. Raises ``LogUnavailable`` when the
        log cannot acknowledge in time, ``ValidationError`` when the event is too large.
        """

    @abc.abstractmethod
    async def append_batch(self, events: Sequence[Event], *, atomic: bool = False) -> list[int]:
        """Store several events (pipelined), returning their sequences in order.

        Not atomic: if it raises, some events may be stored. Retrying the same batch is
        safe because each event is idempotent by its id: it is stored once.

        With ``atomic``, up to 1,000 events are committed together (all or none) where
        the backend can: much faster on a log that syncs every write to disk, but such a
        batch is not deduplicated by event id, so a retry after a lost acknowledgement
        may store copies. Use it for events whose copies change nothing (every fold rule
        is idempotent by event id), e.g. fresh creates.
        """

    @abc.abstractmethod
    def read(
        self,
        from_seq: int = 1,
        *,
        batch_size: int = 1000,
        subjects: Sequence[str] | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        """Batches of stored events from ``from_seq`` up to the end as of the call."""

    @abc.abstractmethod
    def tail(
        self,
        from_seq: int = 1,
        *,
        subjects: Sequence[str] | None = None,
        own: OwnEvents | None = None,
    ) -> AsyncGenerator[LogEntry, None]:
        """Every event from ``from_seq`` on, then live ones as they are stored; never ends.

        Survives disconnects: after a reconnect it resumes after the last entry it gave.
        ``own``: the events this host wrote, by message id (``OwnEvents``): a backend
        that can tell a message's id before decoding it gives such an event back as it
        was written (checked against the time the log stored it), not decoded again.
        """

    async def tail_batches(
        self,
        from_seq: int = 1,
        *,
        subjects: Sequence[str] | None = None,
        own: OwnEvents | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        """``tail`` in lists, as a reader hands them on (here one entry each; a log that
        reads in batches gives what it read at once)."""
        async for entry in self.tail(from_seq, subjects=subjects, own=own):
            yield [entry]

    async def reached(self, subjects: Sequence[str] | None, timeout: float) -> int:
        """The sequence a host that read everything the log holds now on ``subjects``
        has applied (here, the last one: ``last_seq``; ``timeout`` bounds a log that
        must wait to say)."""
        return await self.last_seq(subjects)

    @abc.abstractmethod
    async def last_seq(self, subjects: Sequence[str] | None = None) -> int:
        """The sequence of the last message in the main stream (0 when empty); with
        ``subjects`` (filters, wildcards allowed), of the last one on any of them."""

    @abc.abstractmethod
    async def last_subject_seq(self, subject: str) -> int:
        """The sequence of the last message on one subject (0 when none): the value an
        optimistic writer passes as ``expected_last_subject_seq``."""

    @abc.abstractmethod
    async def latest_activities(self, collective_id: UUID | None = None) -> list[LogEntry]:
        """The last activity event of each agent (of one collective, or all) still kept."""

    @abc.abstractmethod
    async def append_keyed(self, event: Event, fingerprint: str) -> tuple[int, Event | None]:
        """Append one event of an idempotent call (its event id is derived from the
        caller's key), marked with ``fingerprint`` (what the call was asked to do).

        Returns ``(seq, None)`` when this append stored it, or ``(seq, first)`` when the
        log already held an event with this id within its duplicate window: ``first``
        is that event, stored at ``seq`` by an earlier call with the same key, and
        nothing new is stored. Raises ``ConflictError`` when that earlier call carried
        another fingerprint (the same key with other arguments)."""

    @abc.abstractmethod
    async def purge(self, subject: str, *, before_seq: int | None) -> None:
        """Remove every message on ``subject`` (wildcards allowed) with a sequence below
        ``before_seq``: forgetting. The message at ``before_seq`` (the tombstone) and
        anything written after it stay; ``None`` removes them all. Activity subjects are
        purged from the activity stream."""

    def kept_before(self, subject: str, before_seq: int) -> int:
        """``before_seq`` of a purge of ``subject`` as it may be kept to be done after a
        restart (an owed purge, ``sync.owed``): here, as it is."""
        return before_seq

    async def entry_at(self, seq: int, subject: str, position: int | None) -> LogEntry | None:
        """The message a host applied as ``seq`` on ``subject``, read again (a dead letter,
        after an upgrade: ``projections.engine``), or None when the log no longer holds it
        (forgotten since). ``position``: where the log holds it, in a log whose sequences
        are the host's own (``numbered_here``); unused here."""
        reading = self.read(seq, batch_size=1, subjects=[subject])
        async with contextlib.aclosing(reading) as batches:
            async for batch in batches:
                return batch[0] if batch and batch[0].seq == seq else None
        return None

    def follow_mark(self, collective_id: UUID, applied: int) -> int:
        """Where a collective this host starts to follow is caught up to from the log's
        past (``collective_history``), its later events coming by the tail: here, the
        sequence the host applied."""
        return applied

    async def collective_history(
        self, collective_id: UUID, up_to: int, *, batch_size: int = 1000
    ) -> AsyncGenerator[list[LogEntry], None]:
        """A collective's events up to ``up_to`` (a ``follow_mark``): what a host that
        starts to follow it folds from before what it applied."""
        from eventlog.subjects import collective_filter

        if up_to < 1:
            return
        reading = self.read(
            1, batch_size=batch_size, subjects=collective_filter([collective_id], wisdom=False)
        )
        async for batch in reading:
            due = [e for e in batch if e.seq <= up_to]
            if due:
                yield due
            if batch and batch[-1].seq >= up_to:
                await reading.aclose()
                return

    async def directory(
        self, after: dict[int, int], subjects: Sequence[str], *, live: bool
    ) -> AsyncGenerator[list[LogEntry], None]:
        """What this host reads beside its tail (the log's directory of collectives),
        after ``after`` (per partition, the last sequence read: here one, 0), each
        entry's ``seq`` the place to resume after; ``live``: then what comes."""
        if live:
            async for entry in self.tail(after.get(0, 0) + 1, subjects=subjects):
                yield [entry]
        else:
            async for batch in self.read(after.get(0, 0) + 1, subjects=subjects):
                yield batch

    async def purge_copy(self, subject: str, *, before_seq: int) -> None:
        """Forget this host's own copy of what another host's delete forgot (the
        tombstone at ``before_seq``). A log shared by every host has none: the deleting
        host purged it. A leaf's streams are its own (``eventlog.leaf``)."""
        return None

    def key_store(self) -> KeyStore:
        """Where the data keys of this log's sealed events live (``eventlog.keys``): apart
        from the log, shared by every host that reads it. Here, a dict kept with this log
        object (a ``MemoryLog`` shared by the instances of a simulation)."""
        store = self._key_store
        if store is None:
            store = self._key_store = MemoryKeyStore()
        return store

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections; the log's contents stay."""

    async def __aenter__(self) -> EventLog:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

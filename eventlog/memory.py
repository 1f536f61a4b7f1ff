"""In-process event log: the same contract as ``JetStreamLog`` with no server.

Messages go through the real codec, so tests on this backend exercise the wire format
too. Used for unit and property tests and for replica simulations; it keeps nothing on
disk and is shared only within one process.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass, field
from typing import AsyncGenerator, Callable, Mapping, Sequence
from uuid import UUID

from eventlog.codec import HDR_MSG_ID, decode_event, encode_event
from eventlog.errors import ConflictError, DecodeError, LogUnavailable, ValidationError
from eventlog.events import Event
from eventlog.log import (
    HDR_IDEMPOTENCY,
    EventLog,
    LogEntry,
    OwnEvents,
    StreamState,
    key_conflict,
)
from eventlog.streams import StreamSettings
from eventlog.subjects import PREFIX, is_activity_subject, subject_matches


@dataclass(frozen=True, slots=True)
class _Stored:
    seq: int
    subject: str
    headers: Mapping[str, str]
    payload: bytes
    stored_at: float = 0.0
    stored_ms: int = 0  # wall-clock time of the append, as JetStream stamps a message


@dataclass(slots=True)
class _Stream:
    messages: list[_Stored] = field(default_factory=list)  # ordered by seq
    last_seq: int = 0
    last_by_subject: dict[str, int] = field(default_factory=dict)


class MemoryLog(EventLog):
    """A ``EventLog`` held in memory. ``clock`` (seconds) drives dedup window and TTL."""

    def __init__(
        self,
        settings: StreamSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or StreamSettings()
        self._clock = clock
        self._main = _Stream()
        self._activity = _Stream()
        self._msg_ids: dict[str, tuple[float, int]] = {}  # msg id -> (stored at, seq)
        self._changed: asyncio.Condition | None = None
        self._closed = False

    # -- writing ---------------------------------------------------------------------------

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> int:
        wire = encode_event(event)
        return await self._store(
            wire.subject, wire.headers, wire.payload, expected=expected_last_subject_seq
        )

    async def append_batch(self, events: Sequence[Event], *, atomic: bool = False) -> list[int]:
        return [await self.append(event) for event in events]  # one process: all or none

    async def append_keyed(self, event: Event, fingerprint: str) -> tuple[int, Event | None]:
        wire = encode_event(event)
        before = self._msg_ids.get(wire.headers[HDR_MSG_ID])
        headers = {**wire.headers, HDR_IDEMPOTENCY: fingerprint}
        seq = await self._store(wire.subject, headers, wire.payload, expected=None)
        if before is None or before[1] != seq:
            return seq, None
        stream = self._activity if is_activity_subject(wire.subject) else self._main
        stored = next((m for m in stream.messages if m.seq == seq), None)
        if stored is None:  # purged (a delete) since: nothing to compare with
            return seq, event
        if stored.headers.get(HDR_IDEMPOTENCY) != fingerprint:
            raise key_conflict(wire.subject)
        entry = _entry(stored)
        return seq, entry.event if entry.event is not None else event

    async def append_raw(
        self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None
    ) -> int:
        """Store bytes as they are (for tests and tools that need a foreign message)."""
        return await self._store(subject, dict(headers or {}), payload, expected=None)

    async def _store(
        self, subject: str, headers: Mapping[str, str], payload: bytes, *, expected: int | None
    ) -> int:
        self._check_open()
        if subject.split(".")[0] != PREFIX:
            raise ValidationError(f"subject: {subject!r} is outside the {PREFIX}.> namespace")
        size = len(payload) + sum(len(k) + len(v) + 4 for k, v in headers.items())
        if size > self.settings.max_msg_size:
            raise ValidationError(
                f"event: encoded size {size} bytes exceeds the log's limit of "
                f"{self.settings.max_msg_size} bytes"
            )
        now = self._clock()
        msg_id = headers.get(HDR_MSG_ID)
        if msg_id is not None:  # dedup comes before the concurrency check, as in JetStream
            seen = self._msg_ids.get(msg_id)
            if seen is not None and now - seen[0] < self.settings.duplicate_window:
                return seen[1]
        stream = self._activity if is_activity_subject(subject) else self._main
        if expected is not None:
            actual = stream.last_by_subject.get(subject, 0)
            if actual != expected:
                raise ConflictError(
                    f"wrong last sequence for {subject}: expected {expected}, it is {actual}; "
                    "re-read and retry",
                    subject=subject,
                    expected=expected,
                )
        stream.last_seq += 1
        seq = stream.last_seq
        stored = _Stored(seq, subject, dict(headers), payload, now, time.time_ns() // 1_000_000)
        if stream is self._activity:  # max_msgs_per_subject = 1
            stream.messages = [m for m in stream.messages if m.subject != subject]
        stream.messages.append(stored)
        stream.last_by_subject[subject] = seq
        if msg_id is not None:
            self._msg_ids[msg_id] = (now, seq)
        await self._notify()
        return seq

    # -- reading ---------------------------------------------------------------------------

    async def read(
        self,
        from_seq: int = 1,
        *,
        batch_size: int = 1000,
        subjects: Sequence[str] | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        self._check_open()
        if batch_size < 1:
            raise ValidationError(f"batch_size: must be >= 1, got {batch_size}")
        end = self._main.last_seq
        batch: list[LogEntry] = []
        for stored in self._since(self._main, from_seq):
            if stored.seq > end:
                break
            if _selected(stored.subject, subjects):
                batch.append(_entry(stored))
                if len(batch) == batch_size:
                    yield batch
                    batch = []
        if batch:
            yield batch

    async def tail(
        self,
        from_seq: int = 1,
        *,
        subjects: Sequence[str] | None = None,
        own: OwnEvents | None = None,  # (decoded in memory: nothing to save)
    ) -> AsyncGenerator[LogEntry, None]:
        self._check_open()
        next_seq = from_seq
        while True:
            fresh = [m for m in self._since(self._main, next_seq)]
            for stored in fresh:
                next_seq = stored.seq + 1
                if _selected(stored.subject, subjects):
                    yield _entry(stored)
            changed = self._condition()
            async with changed:
                await changed.wait_for(
                    lambda n=next_seq: self._main.last_seq >= n or self._closed  # type: ignore[misc]
                )
            self._check_open()

    async def stream_state(self) -> StreamState:
        self._check_open()
        held = self._main.messages
        return StreamState(
            name=self.settings.name, messages=len(held),
            bytes=sum(len(m.payload) for m in held), first_seq=held[0].seq if held else 0,
            last_seq=self._main.last_seq, replicas=1, leader=None,
        )  # fmt: skip

    async def last_seq(self, subjects: Sequence[str] | None = None) -> int:
        self._check_open()
        if subjects is None:
            return self._main.last_seq
        for stored in reversed(self._main.messages):
            if _selected(stored.subject, subjects):
                return stored.seq
        return 0

    async def last_subject_seq(self, subject: str) -> int:
        self._check_open()
        stream = self._activity if is_activity_subject(subject) else self._main
        return stream.last_by_subject.get(subject, 0)

    async def latest_activities(self, collective_id: UUID | None = None) -> list[LogEntry]:
        self._check_open()
        now = self._clock()
        prefix = f"{PREFIX}.a.{collective_id}." if collective_id else f"{PREFIX}.a."
        return [
            _entry(m)
            for m in self._activity.messages
            if m.subject.startswith(prefix) and now - m.stored_at < self.settings.activity_ttl
        ]

    async def purge(self, subject: str, *, before_seq: int | None) -> None:
        self._check_open()
        if before_seq is not None and before_seq < 1:
            raise ValueError(f"before_seq: must be >= 1, got {before_seq}")
        stream = self._activity if is_activity_subject(subject) else self._main
        below = before_seq if before_seq is not None else stream.last_seq + 1
        stream.messages = [
            m
            for m in stream.messages
            if not (m.seq < below and subject_matches(subject, m.subject))
        ]
        stream.last_by_subject = {}
        for m in stream.messages:
            stream.last_by_subject[m.subject] = m.seq

    async def close(self) -> None:
        self._closed = True
        await self._notify()

    # -- helpers ---------------------------------------------------------------------------

    def _since(self, stream: _Stream, from_seq: int) -> list[_Stored]:
        start = bisect.bisect_left(stream.messages, from_seq, key=lambda m: m.seq)
        return stream.messages[start:]

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise LogUnavailable("the in-memory log is closed")


def _selected(subject: str, subjects: Sequence[str] | None) -> bool:
    return subjects is None or any(subject_matches(p, subject) for p in subjects)


def _entry(stored: _Stored) -> LogEntry:
    try:
        event = decode_event(
            stored.payload, stored.headers, subject=stored.subject, seq=stored.seq,
            stored_ms=stored.stored_ms,
        )  # fmt: skip
    except DecodeError as exc:
        return LogEntry(stored.seq, stored.subject, None, exc, stored.stored_ms)
    return LogEntry(stored.seq, stored.subject, event, None, stored.stored_ms)

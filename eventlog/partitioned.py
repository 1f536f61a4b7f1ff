"""A log in partitions on JetStream (``eventlog.partitions`` has the layout).

``PartitionedLog`` holds one ``JetStreamLog`` per stream of the layout, all on one
connection: the first (``PULSE``: wisdom, tokens, and the activity stream and key bucket
as in a log of one stream) and one per partition. What it adds to them is the routing
and the positions:

- a write goes to the partition of its collective (a batch is split by partition, the
  parts written at once), and comes back as a position (``partitions.position``);
- a read or a tail asks only the partitions that hold what its filters name, one
  consumer per partition (each the ``JetStreamLog``'s own, with its retries, back-off
  and recovery), all at once; their batches are handed on as they come, each in its
  partition's order, partitions interleaved as they arrive. A reader resumes from a
  sequence per partition (``partitions.Resume``), not from one number;
- a purge or a conditional write names a position; its partition must be the one the
  subject lies in.

A host runs on it through ``LocalLog`` (below). Why that layer: above the log, one
sequence is two things at once. It is where the projection resumes and the order it
applied things in (DuckDB's checkpoint, ``updated_seq`` for the indexes' catch-up, the
audit's history and ``as_of``, the analysts' snapshot's increments), and it is a
message's identity in the log (a writer's read-your-writes wait, what the engine kept
aside, a purge's tombstone, the create that places an entity, the dead letters read
again after an upgrade). Positions keep the second meaning but not the first: partitions
read at different speeds apply positions out of their numeric order. So a host numbers
what it applies itself (contiguous, as a log of one stream gives it, so the projection
stays as it is), each entry keeping its position beside it; the projection stores the
per-partition sequences it applied with its checkpoint (one transaction) and resumes the
partitions from them; a create is ranked by its position.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import OrderedDict, defaultdict
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any
from uuid import UUID

from nats.js import api

from eventlog.errors import LogUnavailable, ValidationError
from eventlog.events import Event
from eventlog.jetstream import JetStreamLog, _pull, cancelled
from eventlog.keys import KeyStore
from eventlog.leaf import out_name, out_source
from eventlog.log import EventLog, LogEntry, OwnEvents, StreamState
from eventlog.partitions import (
    METADATA_KEY,
    SEQ_BITS,
    TARGET_KEY,
    Layout,
    Resume,
    bucket_token,
    check_partitions,
    part_of,
    position,
    resume_from,
    seq_of,
)
from eventlog.streams import StreamSettings, durability_of, ensure_streams, partitions_of
from eventlog.subjects import collective_filter, is_activity_subject, subject_for, with_bucket


class PartitionedLog:
    """The streams of a log in partitions, written and read as one (module docstring)."""

    def __init__(self, parts: Sequence[JetStreamLog], layout: Layout) -> None:
        if len(parts) != layout.partitions + 1:
            raise ValidationError(
                f"parts: a layout of {layout.partitions} partitions has "
                f"{layout.partitions + 1} streams, got {len(parts)}"
            )
        self.parts = list(parts)
        self.layout = layout

    @classmethod
    async def connect(
        cls,
        servers: str | Sequence[str],
        settings: StreamSettings,
        *,
        connect_timeout: float = 5.0,
        create_streams: bool = True,
        update_streams: bool = True,
        **options: Any,
    ) -> PartitionedLog:
        """Connect and make sure every stream of the layout exists (the options are
        ``JetStreamLog.connect``'s). Raises ``ValidationError`` when the log there has
        another number of partitions than ``settings``."""
        layout = Layout(settings.partitions, settings.name)
        first = await JetStreamLog.connect(
            servers, settings, connect_timeout=connect_timeout,
            create_streams=create_streams, update_streams=update_streams, **options,
        )  # fmt: skip
        try:
            parts = [first]
            for part in layout.parts[1:]:
                child = JetStreamLog(
                    first.nc, settings.partition(part), owns_connection=False,
                    append_timeout=first.append_timeout, read_timeout=first.read_timeout,
                )  # fmt: skip
                child.servers, child.credentials, child.tls_ca = (
                    first.servers,
                    first.credentials,
                    first.tls_ca,
                )
                parts.append(child)
            if create_streams:

                async def made(child: JetStreamLog) -> None:
                    await child._retry(
                        lambda: ensure_streams(child.admin, child.settings, update=update_streams),
                        connect_timeout,
                    )

                await asyncio.gather(*(made(child) for child in parts[1:]))
        except BaseException:
            await first.close()
            raise
        return cls(parts, layout)

    # -- where an event goes ----------------------------------------------------------------

    def _stored(self, subjects: Sequence[str] | None) -> list[str] | None:
        """Filters as the partitions store their subjects (a collective's bucket in)."""
        return None if subjects is None else [with_bucket(s) for s in subjects]

    def part_of_event(self, event: Event) -> int:
        """The partition an event is written to (0: wisdom, tokens, activities)."""
        subject = subject_for(event)
        if is_activity_subject(subject):
            return 0
        part = self.layout.part_of_subject(subject)
        assert part is not None  # (an event's subject names its collective)
        return part

    def _seq_in(self, part: int, pos: int, field: str) -> int:
        if pos == 0:
            return 0  # (nothing yet: the same in every partition)
        if part_of(pos) != part:
            raise ValidationError(
                f"{field}: position {pos} is in partition {part_of(pos)}, and the subject "
                f"is in partition {part}"
            )
        return seq_of(pos)

    # -- writing ----------------------------------------------------------------------------

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> int:
        """``EventLog.append``, returning a position; ``expected_last_subject_seq`` is a
        position too (0: nothing on the subject yet)."""
        part = self.part_of_event(event)
        expected = expected_last_subject_seq
        if expected is not None:
            expected = self._seq_in(part, expected, "expected_last_subject_seq")
        seq = await self.parts[part].append(event, expected_last_subject_seq=expected)
        return position(part, seq)

    async def append_keyed(self, event: Event, fingerprint: str) -> tuple[int, Event | None]:
        part = self.part_of_event(event)
        seq, first = await self.parts[part].append_keyed(event, fingerprint)
        return position(part, seq), first

    async def append_batch(self, events: Sequence[Event], *, atomic: bool = False) -> list[int]:
        """``EventLog.append_batch``: each partition's share written at once, in parallel
        (``atomic``: each share one atomic batch; a batch across partitions is not
        atomic as a whole). Positions in the order of ``events``."""
        shares: dict[int, list[int]] = defaultdict(list)
        for i, event in enumerate(events):
            shares[self.part_of_event(event)].append(i)
        results = await asyncio.gather(*(
            self.parts[part].append_batch([events[i] for i in held], atomic=atomic)
            for part, held in shares.items()
        ))  # fmt: skip
        out = [0] * len(events)
        for (part, held), seqs in zip(shares.items(), results, strict=True):
            for i, seq in zip(held, seqs, strict=True):
                out[i] = position(part, seq)
        return out

    async def purge(self, subject: str, *, before_seq: int | None) -> None:
        """``EventLog.purge`` with ``before_seq`` a position (or None)."""
        if is_activity_subject(subject):
            await self.parts[0].purge(subject, before_seq=before_seq)
            return
        subject = with_bucket(subject)
        part = self.layout.part_of_subject(subject)
        if part is None:
            raise ValidationError(f"subject: {subject!r} spans partitions; purge one collective")
        before = None if before_seq is None else self._seq_in(part, before_seq, "before_seq")
        if before == 0:
            raise ValidationError("before_seq: must be a position >= 1")
        await self.parts[part].purge(subject, before_seq=before)

    # -- reading ----------------------------------------------------------------------------

    def _batches(
        self,
        from_seq: int | Resume,
        subjects: Sequence[str] | None,
        *,
        live: bool,
        batch_size: int = 1000,
        own: OwnEvents | None = None,
    ) -> AsyncGenerator[tuple[int, list[LogEntry]], None]:
        """(partition, its batch as its stream numbers it) from every partition the
        filters reach, read at once: up to each one's end as of the call, or on
        (``live``)."""
        reach = self.layout.split(self._stored(subjects))
        start = resume_from(from_seq, reach)
        return _fan_in({
            part: self.parts[part].tail_batches(start[part], subjects=filters, own=own)
            if live
            else self.parts[part].read(start[part], batch_size=batch_size, subjects=filters)
            for part, filters in reach.items()
        })  # fmt: skip

    async def read(
        self,
        from_seq: int | Resume = 1,
        *,
        batch_size: int = 1000,
        subjects: Sequence[str] | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        """The stored events the filters name, up to the end of each partition as of the
        call: every partition that holds any read at once, each in its order."""
        async for part, batch in self._batches(
            from_seq, subjects, live=False, batch_size=batch_size
        ):
            yield _positioned(part, batch)

    async def tail(
        self,
        from_seq: int | Resume = 1,
        *,
        subjects: Sequence[str] | None = None,
        own: OwnEvents | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        """``EventLog.tail``, in lists (what one partition's consumer held at a time):
        one consumer per partition the filters reach, never ending."""
        async for part, batch in self._batches(from_seq, subjects, live=True, own=own):
            yield _positioned(part, batch)

    async def last_positions(self, subjects: Sequence[str] | None = None) -> dict[int, int]:
        """Per partition the filters reach, the sequence of its last message on them (0:
        none): what a reader that resumed from them has read once it holds these."""
        reach = self.layout.split(self._stored(subjects))
        # (its last message, not the stream's last sequence: a raise purges what moved,
        # which may be a stream's last messages, and no reader takes a purged one)
        found = await asyncio.gather(
            *(self.parts[part].last_seq(filters or [">"]) for part, filters in reach.items())
        )
        return dict(zip(reach, found, strict=True))

    async def last_subject_seq(self, subject: str) -> int:
        """The position of the last message on one subject (0: none)."""
        subject = with_bucket(subject)
        part = self.layout.part_of_subject(subject)
        if part is None:
            raise ValidationError(f"subject: {subject!r} is not one subject")
        seq = await self.parts[part].last_subject_seq(subject)
        return position(part, seq) if seq else 0

    async def latest_activities(self, collective_id: UUID | None = None) -> list[LogEntry]:
        return await self.parts[0].latest_activities(collective_id)

    async def stream_states(self) -> list[StreamState]:
        """Each stream's state, partition 0 first."""
        return list(await asyncio.gather(*(part.stream_state() for part in self.parts)))

    def key_store(self) -> KeyStore:
        return self.parts[0].key_store()

    async def close(self) -> None:
        await self.parts[0].close()  # (the others share its connection)


async def _fan_in(
    sources: dict[int, AsyncGenerator[list[LogEntry], None]],
) -> AsyncGenerator[tuple[int, list[LogEntry]], None]:
    """(partition, batch) of several partitions' readers as they come; the first failure
    of any is raised, and every reader is closed at the end (its consumer deleted)."""
    queue: asyncio.Queue[tuple[int, list[LogEntry] | None, BaseException | None]]
    queue = asyncio.Queue(maxsize=2 * max(1, len(sources)))

    async def pump(part: int, source: AsyncGenerator[list[LogEntry], None]) -> None:
        try:
            async for batch in source:
                await queue.put((part, batch, None))
        except Exception as exc:  # (handed on: the reader raises it)
            await queue.put((part, None, exc))
        else:
            await queue.put((part, None, None))

    tasks = [asyncio.create_task(pump(part, source)) for part, source in sources.items()]
    try:
        left = len(tasks)
        while left:
            part, batch, failure = await queue.get()
            if failure is not None:
                raise failure
            if batch is None:
                left -= 1
                continue
            yield part, batch
    finally:
        await cancelled(tasks)  # (cancelled again until each ends: see there)
        for source in sources.values():
            with contextlib.suppress(Exception):
                await source.aclose()


def _positioned(part: int, batch: list[LogEntry]) -> list[LogEntry]:
    """A partition's batch with positions for sequences (the first's are the same)."""
    if not part:
        return batch
    return [replace(e, seq=position(part, e.seq)) for e in batch]


REMEMBERED = 100_000  # positions of what this host numbered last, kept for its writers
_BELOW = 1 << 53  # a collective's past is numbered its position less this: all below 1


class LocalLog(EventLog):
    """A log in partitions as one host reads it: an ``EventLog`` whose sequences are this
    host's own, 1, 2, 3, ... in the order it takes messages from the partitions.

    Above the log, a sequence is where a projection resumes and the order it applied
    things in (its checkpoint, its indexes' catch-up, its audit); positions of several
    partitions cannot be that, as partitions are read at different speeds. So this log
    numbers what it hands out, and each entry carries its position
    (``LogEntry.position``): the projection keeps the last sequence of each partition it
    applied with its checkpoint, and ``begin`` resumes every partition from there.

    A write returns the number this host gave the written event when its tail brought it
    back (the writer waits for that anyway); a conditional write and ``last_subject_seq``
    speak in positions. What a host reads beside its tail is not numbered: the directory
    of collectives (by position) and the past of a collective it starts to follow (its
    position less 2**53: below anything it numbers). What it does not do yet: read
    a dead letter again by its number, or purge by a number it has forgotten (it
    remembers the last ``REMEMBERED``; a purge owed across a restart keeps a position).
    """

    numbered_here = True

    def __init__(self, partitioned: PartitionedLog) -> None:
        self.partitioned = partitioned
        first = partitioned.parts[0]
        self.settings = first.settings
        self.append_timeout = first.append_timeout
        self._next = 1  # the number the next message taken gets
        self._resume: dict[int, int] = {p: 0 for p in partitioned.layout.parts}
        self._local_of: OrderedDict[int, int] = OrderedDict()  # position -> number
        self._position_of: OrderedDict[int, int] = OrderedDict()  # number -> position
        self._waiting: dict[int, list[asyncio.Future[int]]] = defaultdict(list)
        self._moved = asyncio.Event()  # set whenever messages are taken

    @classmethod
    async def connect(
        cls, servers: str | Sequence[str], settings: StreamSettings | None, **options: Any
    ) -> LocalLog:
        """``PartitionedLog.connect``, as this host numbers it."""
        if settings is None or settings.partitions < 2:
            raise ValidationError("partitions: a log in partitions has 2 or more")
        return cls(await PartitionedLog.connect(servers, settings, **options))

    def begin(self, applied: int, positions: Mapping[int, int]) -> None:
        """Resume after ``applied`` (the host's last number applied), each partition
        after its sequence in ``positions`` (what the projection stored with it)."""
        unknown = sorted(set(positions) - set(self._resume))
        if unknown:
            raise ValidationError(
                f"partitions: this host's state read partitions {unknown}, which the log's "
                f"{self.partitioned.layout.partitions} do not have; start on a new data "
                "directory"
            )
        self._next = applied + 1
        self._resume = {p: int(positions.get(p, 0)) for p in self._resume}

    async def entry_at(self, seq: int, subject: str, position: int | None) -> LogEntry | None:
        """``EventLog.entry_at``: read again where the log holds it (``position``), and
        given the number this host gave it then (None: a message kept aside before its
        position was, or forgotten since)."""
        if position is None:
            return None
        part, at = part_of(position), seq_of(position)
        if part not in self._resume:
            return None
        reading = self.partitioned.parts[part].read(at, batch_size=1, subjects=[subject])
        async with contextlib.aclosing(reading) as batches:
            async for batch in batches:
                if batch and batch[0].seq == at:
                    return replace(batch[0], seq=seq, position=position)
                return None
        return None

    async def from_now(self) -> int:
        """Number from what the partitions store from now on (``pulse tail --new``): the
        sequence a tail starts from then."""
        self.begin(self._next - 1, await self.partitioned.last_positions())
        return self._next

    def _taken(self, part: int, batch: Sequence[LogEntry]) -> list[LogEntry]:
        """Number what partition ``part`` gave (in its order, by its stream's sequences),
        skipping what was handed out already, and wake the writers waiting for it."""
        out: list[LogEntry] = []
        local_of, position_of = self._local_of, self._position_of
        last = self._resume.get(part, 0)
        for entry in batch:
            seq = entry.seq
            if seq <= last:
                continue
            last = seq
            pos = position(part, seq)
            number = self._next
            self._next = number + 1
            out.append(LogEntry(number, entry.subject, entry.event, entry.error,
                                entry.stored_ms, position=pos))  # fmt: skip
            local_of[pos] = number
            position_of[number] = pos
            for future in self._waiting.pop(pos, ()):
                if not future.done():
                    future.set_result(number)
        self._resume[part] = last
        while len(local_of) > REMEMBERED:
            local_of.popitem(last=False)
        while len(position_of) > REMEMBERED:
            position_of.popitem(last=False)
        self._moved.set()
        self._moved = asyncio.Event()
        return out

    async def _number_of(self, event: Event, pos: int) -> int:
        """The number this host gives the message at ``pos`` (once its tail took it);
        0 for what it took before it remembers, and for an activity (not numbered)."""
        if is_activity_subject(subject_for(event)):
            return pos
        found = self._local_of.get(pos)
        if found is not None:
            return found
        if seq_of(pos) <= self._resume.get(part_of(pos), 0):
            return 0  # (taken long ago: nothing to wait for)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting[pos].append(future)
        try:
            async with asyncio.timeout(max(60.0, 2 * self.append_timeout)):  # (as a
                return await future  # writer waits for its write to apply: wait_applied)
        except TimeoutError:
            raise LogUnavailable(
                f"stored at position {pos} (partition {part_of(pos)}, sequence "
                f"{seq_of(pos)}), but this host's tail did not bring it back in time"
            ) from None
        finally:
            held = self._waiting.get(pos)
            if held is not None and future in held:
                held.remove(future)
                if not held:
                    del self._waiting[pos]

    def _check_start(self, from_seq: int) -> None:
        """A read or tail goes on from ``from_seq``: the next number, or one handed out
        but not applied (a tail stopped with a batch on its way: replication starts
        again after what the engine applied), whose partitions are then read again from
        there and numbered anew."""
        if from_seq > self._next or from_seq < 1:
            raise ValidationError(
                f"from_seq: a log in partitions is read by this host from where it stands "
                f"({self._next}), not from {from_seq}"
            )
        if from_seq == self._next:
            return
        rewound: dict[int, int] = {}
        for number in range(from_seq, self._next):
            pos = self._position_of.get(number)
            if pos is None:
                raise ValidationError(
                    f"from_seq: this host no longer knows where its message {number} is in "
                    "the partitions"
                )
            part, seq = part_of(pos), seq_of(pos)
            rewound[part] = min(rewound.get(part, seq), seq)
        for number in range(from_seq, self._next):
            self._local_of.pop(self._position_of.pop(number), None)
        for part, seq in rewound.items():
            self._resume[part] = min(self._resume[part], seq - 1)
        self._next = from_seq

    def follow_mark(self, collective_id: UUID, applied: int) -> int:
        """The sequence of the collective's partition this host took up to: its events
        up to there are its past (``collective_history``), the tail brings the rest."""
        return self._resume.get(self.partitioned.layout.part_of_collective(collective_id), 0)

    async def collective_history(
        self, collective_id: UUID, up_to: int, *, batch_size: int = 1000
    ) -> AsyncGenerator[list[LogEntry], None]:
        """The collective's events in its partition up to sequence ``up_to``, not
        numbered: each entry's ``seq`` is its position less 2**53 (below anything this
        host numbers, in the partition's order, and one of its own), ``position`` its
        position."""
        if up_to < 1:
            return
        part = self.partitioned.layout.part_of_collective(collective_id)
        subjects = collective_filter([collective_id], wisdom=False)
        reading = self.partitioned.parts[part].read(1, batch_size=batch_size, subjects=subjects)
        async with contextlib.aclosing(reading) as batches:
            async for batch in batches:
                due = [
                    LogEntry(position(part, e.seq) - _BELOW, e.subject, e.event, e.error,
                             e.stored_ms, position=position(part, e.seq))
                    for e in batch if e.seq <= up_to
                ]  # fmt: skip
                if due:
                    yield due
                if batch and batch[-1].seq >= up_to:
                    return

    async def directory(
        self, after: dict[int, int], subjects: Sequence[str], *, live: bool
    ) -> AsyncGenerator[list[LogEntry], None]:
        """The partitions' directory entries after ``after`` (per partition), not
        numbered: each entry's ``seq`` is its position."""
        start = {p: s + 1 for p, s in after.items()}
        if live:
            reading = self.partitioned.tail(start, subjects=subjects)
        else:
            reading = self.partitioned.read(start, subjects=subjects)
        async with contextlib.aclosing(reading) as batches:
            async for batch in batches:
                yield batch

    # -- EventLog -----------------------------------------------------------------------------

    async def stream_state(self) -> StreamState:
        return await self.partitioned.parts[0].stream_state()

    async def partition_states(self) -> list[StreamState]:
        return (await self.partitioned.stream_states())[1:]

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> int:
        pos = await self.partitioned.append(
            event, expected_last_subject_seq=expected_last_subject_seq
        )
        return await self._number_of(event, pos)

    async def append_keyed(self, event: Event, fingerprint: str) -> tuple[int, Event | None]:
        pos, first = await self.partitioned.append_keyed(event, fingerprint)
        return await self._number_of(event, pos), first

    async def append_batch(self, events: Sequence[Event], *, atomic: bool = False) -> list[int]:
        stored = await self.partitioned.append_batch(events, atomic=atomic)
        return list(
            await asyncio.gather(
                *(self._number_of(e, p) for e, p in zip(events, stored, strict=True))
            )
        )

    async def read(
        self,
        from_seq: int = 1,
        *,
        batch_size: int = 1000,
        subjects: Sequence[str] | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        """What the partitions hold past what this host took: its catch-up."""
        async for batch in self._numbered(from_seq, subjects, live=False, batch_size=batch_size):
            yield batch

    async def tail(
        self,
        from_seq: int = 1,
        *,
        subjects: Sequence[str] | None = None,
        own: OwnEvents | None = None,
    ) -> AsyncGenerator[LogEntry, None]:
        async for batch in self.tail_batches(from_seq, subjects=subjects, own=own):
            for entry in batch:
                yield entry

    async def tail_batches(
        self,
        from_seq: int = 1,
        *,
        subjects: Sequence[str] | None = None,
        own: OwnEvents | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        async for batch in self._numbered(from_seq, subjects, live=True, own=own):
            yield batch

    async def _numbered(
        self, from_seq: int, subjects: Sequence[str] | None, **reading: Any
    ) -> AsyncGenerator[list[LogEntry], None]:
        """The partitions from where this host stands, what it had not taken numbered."""
        self._check_start(from_seq)
        start = {p: s + 1 for p, s in self._resume.items()}
        async for part, batch in self.partitioned._batches(start, subjects, **reading):
            taken = self._taken(part, batch)
            if taken:
                yield taken

    async def last_seq(self, subjects: Sequence[str] | None = None) -> int:
        """What this host's number will be once it took everything the partitions hold
        now on ``subjects``: an estimate (a purge leaves gaps it never numbers; ``reached``
        waits for the real one)."""
        ends = await self.partitioned.last_positions(subjects)
        ahead = sum(max(0, end - self._resume.get(p, 0)) for p, end in ends.items())
        return self._next - 1 + ahead

    async def reached(self, subjects: Sequence[str] | None, timeout: float) -> int:
        """Wait until this host took everything the partitions hold now on ``subjects``
        (its tail running); its number then."""
        ends = await self.partitioned.last_positions(subjects)
        try:
            async with asyncio.timeout(timeout):
                while any(self._resume.get(p, 0) < end for p, end in ends.items()):
                    await self._moved.wait()
        except TimeoutError:
            behind = {p: e for p, e in ends.items() if self._resume.get(p, 0) < e}
            raise LogUnavailable(
                f"this host did not reach the partitions' ends {behind} within {timeout:g} s "
                f"(it is at {self._resume})"
            ) from None
        return self._next - 1

    async def last_subject_seq(self, subject: str) -> int:
        """The position of the last message on ``subject`` (0: none), what a conditional
        write passes as ``expected_last_subject_seq``."""
        return await self.partitioned.last_subject_seq(subject)

    async def latest_activities(self, collective_id: UUID | None = None) -> list[LogEntry]:
        return await self.partitioned.latest_activities(collective_id)

    async def purge(self, subject: str, *, before_seq: int | None) -> None:
        """``EventLog.purge``, ``before_seq`` one of this host's numbers (or a position,
        as ``kept_before`` gives one: 2**48 and more)."""
        if before_seq is None or is_activity_subject(subject):
            await self.partitioned.purge(subject, before_seq=before_seq)
            return
        await self.partitioned.purge(subject, before_seq=self.kept_before(subject, before_seq))

    def kept_before(self, subject: str, before_seq: int) -> int:
        """The position before which a purge of ``subject`` "before this host's message
        ``before_seq``" removes: that message's, when it is in the subject's partition (a
        tombstone); else the one after the message before it (``seq + 1``: up to and
        including a write). A position, so a purge owed across a restart (when the
        numbers are given anew) still names the same place."""
        if before_seq >= 1 << SEQ_BITS:
            return before_seq  # (a position already)
        part = self.partitioned.layout.part_of_subject(with_bucket(subject))
        at = self._position_of.get(before_seq)
        if at is not None and part_of(at) == part:
            return at
        just = self._position_of.get(before_seq - 1)
        if just is not None and part_of(just) == part:
            return just + 1
        raise LogUnavailable(
            f"before_seq: this host does not know where its message {before_seq} is in "
            f"partition {part} (it remembers its last {REMEMBERED:,}); delete the entity "
            "again to forget it"
        )

    def key_store(self) -> KeyStore:
        return self.partitioned.key_store()

    async def close(self) -> None:
        await self.partitioned.close()


# -- raising the number of partitions ----------------------------------------------------------

# headers a copy does not carry (JetStream refuses a client's publish that carries
# Nats-Stream-Source, which a message sourced from an edge host's outbox has)
_NOT_COPIED = ("Nats-Expected-", "Status", "Description", "Nats-Stream-Source")
_COPIES_WAIT = 30.0  # seconds a window of copies may wait for its acknowledgements
_PREFIX_MOVING = "pulse.moving"  # a placeholder subject while a stream's buckets move


async def raise_partitions(
    first: JetStreamLog,
    to: int,
    *,
    progress: Callable[[int, int], None] | None = None,
    drop_edges: bool = False,
) -> dict[str, int]:
    """Spread the log whose first stream ``first`` reads over ``to`` partitions (more
    than it has; from one stream too). Every host is stopped first: a bucket's subjects
    leave one stream before another takes them.

    1. The streams give up the subjects that move (the first stream, from one stream:
       every collective's);
    2. each partition stream of ``to`` is made, or set to its buckets;
    3. each moving message is published again on its subject (with its bucket, from one
       stream), headers and body as they were: JetStream stores it in its new stream,
       where it gets a new sequence;
    4. what moved is purged from where it was;
    5. the first stream's metadata says ``to``: hosts of the new number open from here.

    Edge hosts (``eventlog.leaf``) go on through a raise from N >= 2: each partition's
    source of an edge host's outbox is set to its new buckets in step 1, and the new
    partitions source it in step 2 (an edge host adds the new partitions to what it
    sources when it next looks: subjects do not change). A source set anew starts from
    the outbox's first message: copies the duplicate window no longer remembers are
    stored twice, and folded once. From one stream, edge hosts write subjects without
    their bucket: the raise is refused while they send to the log, unless
    ``drop_edges`` (each has sent what it holds and stopped; made again on partitions).

    Interrupted, it is run again and goes on (a message copied twice is folded once: the
    fold is idempotent by event id). Returns what it did: from, to, copied, edges."""
    js, name = first.admin, first.settings.name
    info = await first._retry(lambda: js.stream_info(name), first.read_timeout)
    held = partitions_of(info)
    check_partitions(to, "to")
    if to <= held or to < 2:
        raise ValidationError(
            f"to: the log {name} is in {held} partition(s); raise it to more (2..31), not {to}"
        )
    moving_to = (info.config.metadata or {}).get(TARGET_KEY)
    if moving_to is not None and moving_to != str(to):
        raise ValidationError(
            f"to: the log {name} is being spread over {moving_to} partitions (a repartition "
            f"was interrupted); run it again with --to {moving_to} to finish it first"
        )
    old = Layout(held, name) if held > 1 else None
    readers = 0
    edges: dict[str, None] = {}  # the edge hosts sending to the log (their domain's API)
    for stream in [name, *([] if old is None else [old.stream(p) for p in old.parts[1:]])]:
        stream_info = await js.stream_info(stream)
        readers += int(stream_info.state.consumer_count or 0)
        edges.update(dict.fromkeys(_edges_of(stream_info.config, first.settings)))
    if edges and old is None and not drop_edges:
        raise ValidationError(
            f"partitions: {len(edges)} edge host(s) send to the log {name} "
            f"({', '.join(edges)}), writing subjects of a log of one stream, which a log in "
            "partitions refuses: let each send what it holds (`pulse status` on it: 0 "
            "events not at the hub) and stop it, run this again with --drop-edges, and "
            f"make them again on new data directories with --partitions {to}"
        )
    if readers:
        raise ValidationError(
            f"partitions: {readers} consumer(s) read the log {name}: stop every host first "
            "(a host's consumers go a minute after it stops)"
        )
    new = Layout(to, name)
    if moving_to is None:  # (said first: a run again must go to the same number)
        await js.update_stream(dataclasses.replace(
            info.config, metadata={**_own_metadata(info.config), TARGET_KEY: str(to)}
        ))  # fmt: skip
        info = await js.stream_info(name)
    target = dataclasses.replace(
        first.settings, partitions=to, part=0, replicas=int(info.config.num_replicas or 1),
        durability=durability_of(info.config.placement),
    )  # fmt: skip
    # 1. the subjects that move leave their streams (their messages stay, to be copied)
    if old is None:  # (and the edge hosts' sources, if any, dropped: see above)
        kept = [s for s in info.config.sources or [] if _edge_of_source(s, first.settings) is None]
        await js.update_stream(
            dataclasses.replace(info.config, subjects=new.subjects(0), sources=kept or None)
        )
        sources = {0: name}
    else:
        sources = {}
        for part in old.parts[1:]:
            stream = old.stream(part)
            held_info = await js.stream_info(stream)
            keep = [s for s in old.subjects(part) if s in new.subjects(part)]
            placeholder = [f"{_PREFIX_MOVING}.{stream}"]  # (a stream keeps a subject)
            refiltered = [  # (an edge host's outbox: to this stream's buckets of ``to``)
                out_source(first.settings, to, part, external=s.external)
                if _edge_of_source(s, first.settings) is not None else s
                for s in held_info.config.sources or []
            ]  # fmt: skip
            await js.update_stream(
                dataclasses.replace(
                    held_info.config, subjects=keep or placeholder, sources=refiltered or None
                )
            )
            sources[part] = stream
    # 2. the partitions of the new number, each with its buckets
    for part in new.parts[1:]:
        await ensure_streams(js, target.partition(part), update=True)
        if old is not None and edges:  # each edge host's outbox, filtered to its buckets
            config = (await js.stream_info(new.stream(part))).config
            have = set(_edges_of(config, first.settings))
            more = [
                out_source(first.settings, to, part, external=api.ExternalStream(api=edge))
                for edge in edges if edge not in have
            ]  # fmt: skip
            if more:
                await js.update_stream(
                    dataclasses.replace(config, sources=[*(config.sources or []), *more])
                )
    # 3. every message that moves, published again where it belongs now
    total = 0
    for stream in sources.values():
        total += int((await js.stream_info(stream)).state.messages or 0)
    copied = 0
    for part, stream in sources.items():
        window: list[asyncio.Future[Any]] = []
        reading = _pull(first, stream, 1, None, 1000, live=False, decode=lambda m, s, w: m)
        async with contextlib.aclosing(reading) as batches:
            async for batch in batches:
                for msg in batch:
                    subject = msg.subject
                    if not subject.startswith("pulse.c."):
                        continue  # (wisdom and tokens stay in the first stream)
                    stored = with_bucket(subject)
                    goes = new.part_of_subject(stored)
                    if goes == part:
                        continue  # (its bucket stays in this stream)
                    headers = {
                        k: v for k, v in (msg.headers or {}).items()
                        if not k.startswith(_NOT_COPIED)
                    }  # fmt: skip
                    window.append(await first.js.publish_async(stored, msg.data, headers=headers))
                    if len(window) >= 256:
                        copied += await _acknowledged_copies(window, new)
                        if progress is not None:
                            progress(copied, total)
        copied += await _acknowledged_copies(window, new)
        if progress is not None:
            progress(copied, total)
    # 4. what moved goes from where it was
    if old is None:
        await js.purge_stream(name, subject="pulse.c.>")
    else:
        for part in old.parts[1:]:
            for bucket in old.buckets(part):
                if new.part_of_bucket(bucket) != part:
                    await js.purge_stream(
                        old.stream(part), subject=f"pulse.c.*.{bucket_token(bucket)}.>"
                    )
    # 5. the first stream says the new number
    latest = await js.stream_info(name)
    metadata = _own_metadata(latest.config)
    metadata.pop(TARGET_KEY, None)
    metadata[METADATA_KEY] = str(to)
    await js.update_stream(
        dataclasses.replace(latest.config, subjects=new.subjects(0), metadata=metadata,
                            description=target.main_config().description)
    )  # fmt: skip
    return {"from": held, "to": to, "copied": copied, "edges": len(edges)}


def _edge_of_source(source: api.StreamSource, settings: StreamSettings) -> str | None:
    """The edge host (its domain's API) whose outbox ``source`` is (``eventlog.leaf``);
    None: not an edge host's."""
    if source.name != out_name(settings) or source.external is None:
        return None
    return str(source.external.api)


def _edges_of(config: api.StreamConfig, settings: StreamSettings) -> list[str]:
    """The edge hosts whose outbox ``config``'s stream sources: their domain's API."""
    found = (_edge_of_source(s, settings) for s in config.sources or [])
    return [edge for edge in found if edge is not None]


async def _acknowledged_copies(window: list[asyncio.Future[Any]], layout: Layout) -> int:
    """Wait for the copies' acknowledgements; each must be in its partition's stream."""
    try:
        async with asyncio.timeout(_COPIES_WAIT):
            acks = await asyncio.gather(*window)
    except TimeoutError:
        raise LogUnavailable(
            f"partitions: {len(window)} copies were not acknowledged within "
            f"{_COPIES_WAIT:g}s; run the raise again (it goes on where it stopped)"
        ) from None
    window.clear()
    streams = {layout.stream(p) for p in layout.parts[1:]}
    wrong = [a.stream for a in acks if a.stream not in streams]
    if wrong:
        raise ValidationError(
            f"partitions: a copy was stored in {wrong[0]}, not in a partition of {layout.base}"
        )
    return len(acks)


def _own_metadata(config: Any) -> dict[str, str]:
    """A stream's metadata but the server's own (``_nats.*``: not to be set by a client)."""
    return {k: v for k, v in (config.metadata or {}).items() if not k.startswith("_nats")}

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

This is the log layer of a deployment in partitions. A host does not run on it yet:
``pulse`` makes logs of one stream, and this class serves the benchmarks
(``ops.bench.durability``) and the tests of the layout on real servers. What a host
needs first, and why it is not a small change: above the log, one sequence is two
things at once. It is where the projection resumes and the order it applied things in
(DuckDB's checkpoint, ``updated_seq`` for the indexes' catch-up, the audit's history
and ``as_of``, the analysts' snapshot's increments), and it is a message's identity in
the log (a writer's read-your-writes wait, what the engine kept aside, a purge's
tombstone, the create that places an entity, the dead letters read again after an
upgrade). Positions keep the second meaning but not the first: partitions read at
different speeds apply positions out of their numeric order. The plan: a host numbers
what it applies itself (an apply sequence, contiguous, as a log of one stream gives
today, so the projection stays as it is), each entry keeping its position beside it;
the projection stores the per-partition sequences it applied with its checkpoint (one
transaction) and resumes the partitions from them; the identities move to positions
(the writer waits for a position to be applied, a create is ranked by its position's
time and place, a dead letter keeps its position).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncGenerator, Sequence
from typing import Any
from uuid import UUID

from eventlog.errors import ValidationError
from eventlog.events import Event
from eventlog.jetstream import JetStreamLog
from eventlog.keys import KeyStore
from eventlog.log import LogEntry, OwnEvents, StreamState
from eventlog.partitions import Layout, Resume, part_of, position, resume_from, seq_of
from eventlog.streams import StreamSettings, ensure_streams
from eventlog.subjects import is_activity_subject, subject_for


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
        part = self.layout.part_of_subject(subject)
        if part is None:
            raise ValidationError(f"subject: {subject!r} spans partitions; purge one collective")
        before = None if before_seq is None else self._seq_in(part, before_seq, "before_seq")
        if before == 0:
            raise ValidationError("before_seq: must be a position >= 1")
        await self.parts[part].purge(subject, before_seq=before)

    # -- reading ----------------------------------------------------------------------------

    async def read(
        self,
        from_seq: int | Resume = 1,
        *,
        batch_size: int = 1000,
        subjects: Sequence[str] | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        """The stored events the filters name, up to the end of each partition as of the
        call: every partition that holds any read at once, each in its order."""
        reach = self.layout.split(subjects)
        start = resume_from(from_seq, reach)
        readers = {
            part: self.parts[part].read(start[part], batch_size=batch_size, subjects=filters)
            for part, filters in reach.items()
        }
        async for batch in _fan_in(readers):
            yield batch

    async def tail(
        self,
        from_seq: int | Resume = 1,
        *,
        subjects: Sequence[str] | None = None,
        own: OwnEvents | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        """``EventLog.tail``, in lists (what one partition's consumer held at a time):
        one consumer per partition the filters reach, never ending."""
        reach = self.layout.split(subjects)
        start = resume_from(from_seq, reach)
        tails = {
            part: self.parts[part].tail_batches(start[part], subjects=filters, own=own)
            for part, filters in reach.items()
        }
        async for batch in _fan_in(tails):
            yield batch

    async def last_positions(self, subjects: Sequence[str] | None = None) -> dict[int, int]:
        """Per partition the filters reach, the sequence of its last message on them (0:
        none): what a reader that resumed from them has read once it holds these."""
        reach = self.layout.split(subjects)
        found = await asyncio.gather(
            *(self.parts[part].last_seq(filters) for part, filters in reach.items())
        )
        return dict(zip(reach, found, strict=True))

    async def last_subject_seq(self, subject: str) -> int:
        """The position of the last message on one subject (0: none)."""
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
) -> AsyncGenerator[list[LogEntry], None]:
    """The batches of several partitions' readers as they come, their sequences made
    positions; the first failure of any is raised, and every reader is closed at the
    end (its consumer deleted)."""
    queue: asyncio.Queue[tuple[int, list[LogEntry] | None, BaseException | None]]
    queue = asyncio.Queue(maxsize=2 * max(1, len(sources)))

    async def pump(part: int, source: AsyncGenerator[list[LogEntry], None]) -> None:
        try:
            async for batch in source:
                if part:
                    batch = [
                        LogEntry(position(part, e.seq), e.subject, e.event, e.error, e.stored_ms)
                        for e in batch
                    ]
                await queue.put((part, batch, None))
        except Exception as exc:  # (handed on: the reader raises it)
            await queue.put((part, None, exc))
        else:
            await queue.put((part, None, None))

    tasks = [asyncio.create_task(pump(part, source)) for part, source in sources.items()]
    try:
        left = len(tasks)
        while left:
            _, batch, failure = await queue.get()
            if failure is not None:
                raise failure
            if batch is None:
                left -= 1
                continue
            yield batch
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for source in sources.values():
            with contextlib.suppress(Exception):
                await source.aclose()

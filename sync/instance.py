"""The instance: one host's member of the shared memory.

``PulseDB.open(data_dir, nats_url=None)`` owns a data directory (the projection, the
clock, the identity of this incarnation), connects to the log (an embedded nats-server
unless a URL is given), catches up, and keeps a replication loop running: it tails the
log from the checkpoint and folds every batch into the projection, whichever host wrote
it. A write is validated against the local state, appended to the log, and returns once
the local projection has applied it (read-your-writes); ``sync()`` waits until the local
state has caught up with the whole stream.

Identity: every incarnation (every ``open``) takes a fresh UUIDv7 as its instance id and
owns only the G-counter entries written under it. A restarted instance, a data directory
copied to a second host, or one restored from an old backup therefore never shares an
entry with anyone: the counts the log holds are never lost and never counted twice. (A
persisted id would be shared by two copies of a directory, and max-merge would silently
drop one copy's increments.) The cost is one G-counter entry per incarnation that
reinforced an experience.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Literal
from uuid import UUID

import msgspec
import numpy as np
import numpy.typing as npt

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog import events as ev
from eventlog.errors import LogUnavailable, NotFoundError, PulseError, ValidationError
from eventlog.ids import uuid7
from eventlog.log import EventLog, LogEntry
from projections import queries
from projections.projection import Projection, ProjectionSettings, open_projection
from sync.hlc import HybridClock

log = logging.getLogger("pulse.instance")

ChangeKind = Literal["created", "updated", "archived", "unarchived", "deleted"]
_CHANGE_OF: dict[type, ChangeKind] = {
    ev.ExperienceRecorded: "created",
    ev.ExperienceUpdated: "updated",
    ev.ExperienceReinforced: "updated",
    ev.ExperienceArchived: "archived",
    ev.ExperienceUnarchived: "unarchived",
    ev.ExperienceDeleted: "deleted",
}


class ExperienceChange(msgspec.Struct, frozen=True, kw_only=True):
    """One applied change to an experience, as ``watch_experiences`` yields it."""

    kind: ChangeKind
    experience_id: UUID
    collective_id: UUID
    seq: int  # stream sequence of the event
    instance_id: UUID  # the incarnation that wrote it


class ExperienceWatch:
    """An async iterator of ``ExperienceChange``, registered when created."""

    def __init__(self, watchers: set[asyncio.Queue[ExperienceChange | None]]) -> None:
        self._watchers = watchers
        self._queue: asyncio.Queue[ExperienceChange | None] = asyncio.Queue()
        watchers.add(self._queue)

    def __aiter__(self) -> ExperienceWatch:
        return self

    async def __anext__(self) -> ExperienceChange:
        change = await self._queue.get()
        if change is None:
            self.close()
            raise StopAsyncIteration
        return change

    def close(self) -> None:
        self._watchers.discard(self._queue)


class PulseDB:
    """One instance; see the module docstring. Use ``await PulseDB.open(...)``."""

    def __init__(
        self,
        data_dir: Path,
        log: EventLog,
        projection: Projection,
        server: EmbeddedNats | None,
        *,
        batch_size: int = 1000,
    ) -> None:
        self.data_dir = data_dir
        self.log = log
        self.projection = projection
        self.server = server
        self.instance_id = uuid7()
        self.clock = HybridClock(state_file=data_dir / "clock.json")
        self.clock.observe(projection.store.max_hlc())
        self._batch_size = batch_size
        self._applied = projection.seq
        self._progress = asyncio.Condition()
        self._watchers: set[asyncio.Queue[ExperienceChange | None]] = set()
        self._own: dict[UUID, int] = {}  # this incarnation's acknowledged totals
        # one announcement in flight per experience (two concurrent calls must not both
        # announce the same total); different experiences go in parallel
        self._reinforce_locks: dict[UUID, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._failure: BaseException | None = None
        self._closed = False
        self._owns_log = True
        self._loop_task: asyncio.Task[None] | None = None
        (data_dir / "identity.json").write_text(
            json.dumps(
                {
                    "instance_id": str(self.instance_id),
                    "pid": os.getpid(),
                    "started_ms": int(time.time() * 1000),
                }
            )  # fmt: skip
        )

    @classmethod
    async def open(
        cls,
        data_dir: str | os.PathLike[str],
        nats_url: str | Sequence[str] | None = None,
        *,
        stream_settings: StreamSettings | None = None,
        projection_settings: ProjectionSettings | None = None,
        append_timeout: float = 10.0,
    ) -> PulseDB:
        """Open (or create) an instance on ``data_dir``; embedded NATS unless ``nats_url``."""
        directory = Path(data_dir)
        directory.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
        server = None
        if nats_url is None:
            server = EmbeddedNats(directory)
            urls: list[str] = [server.start()]
        elif isinstance(nats_url, str):
            urls = [u.strip() for u in nats_url.split(",") if u.strip()]
        else:
            urls = list(nats_url)
        try:
            jetstream = await JetStreamLog.connect(
                urls,
                stream_settings,
                append_timeout=append_timeout,
                connect_timeout=30,
                update_streams=False,  # create if missing; never reconfigure a deployment
            )
        except BaseException:
            if server is not None:
                server.stop()
            raise
        try:
            return await cls.attach(directory, jetstream, projection_settings, server=server)
        except BaseException:
            await jetstream.close()
            if server is not None:
                server.stop()
            raise

    @classmethod
    async def attach(
        cls,
        data_dir: str | os.PathLike[str],
        log: EventLog,
        projection_settings: ProjectionSettings | None = None,
        *,
        server: EmbeddedNats | None = None,
        owns_log: bool = True,
    ) -> PulseDB:
        """An instance on an already open log (any backend; ``MemoryLog`` in simulations).
        When it closes, it closes the log if it ``owns_log``, and stops ``server``."""
        directory = Path(data_dir)
        projection = open_projection(directory, projection_settings)
        try:
            await projection.catch_up(log)
        except BaseException:
            projection.close()
            raise
        db = cls(directory, log, projection, server)
        db._owns_log = owns_log
        db._loop_task = asyncio.create_task(db._replicate(), name="pulse-replication")
        return db

    async def close(self) -> None:
        """Stop replicating, save the indexes, close the log (the data stays)."""
        if self._closed:
            return
        self._closed = True
        if self._loop_task is not None:
            for _ in range(40):  # as in _replicate: cancel until it takes
                self._loop_task.cancel()
                done, _ = await asyncio.wait({self._loop_task}, timeout=0.25)
                if done:
                    break
        for queue in self._watchers:
            queue.put_nowait(None)
        self.projection.close()
        if self._owns_log:
            await self.log.close()
        if self.server is not None:
            self.server.stop()

    async def __aenter__(self) -> PulseDB:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the replication loop --------------------------------------------------------------

    async def _replicate(self) -> None:
        queue: asyncio.Queue[LogEntry] = asyncio.Queue(maxsize=4 * self._batch_size)

        async def pump() -> None:
            async for entry in self.log.tail(self.projection.seq + 1):
                await queue.put(entry)

        pump_task = asyncio.create_task(pump(), name="pulse-tail")
        last_save = time.monotonic()
        getter: asyncio.Future[LogEntry] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait(
                    {getter, pump_task}, return_when=asyncio.FIRST_COMPLETED
                )
                if pump_task in done:
                    getter.cancel()
                    pump_task.result()  # raises what stopped the tail
                    raise LogUnavailable("the log tail ended")
                batch = [getter.result()]
                while len(batch) < self._batch_size and not queue.empty():
                    batch.append(queue.get_nowait())
                self._apply(batch)
                if time.monotonic() - last_save > 30:
                    self.projection.save()
                    last_save = time.monotonic()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # keep the reason; waiters raise it
            log.exception("replication stopped")
            self._failure = exc
            async with self._progress:
                self._progress.notify_all()
        finally:
            if getter is not None:
                getter.cancel()
            # Cancel until it takes: on Python 3.11, asyncio.wait_for inside nats-py can
            # swallow a cancellation that lands as its own wait completes.
            for _ in range(20):
                pump_task.cancel()
                done, _ = await asyncio.wait({pump_task}, timeout=0.25)
                if done:
                    break

    def _apply(self, batch: list[LogEntry]) -> None:
        self.projection.apply(batch)
        for entry in batch:
            event = entry.event
            if event is None:
                continue
            self.clock.observe(event.hlc)
            kind = _CHANGE_OF.get(type(event))
            if kind is not None and self._watchers:
                change = ExperienceChange(
                    kind=kind,
                    experience_id=event.experience_id,  # type: ignore[union-attr]
                    collective_id=event.collective_id,  # type: ignore[union-attr]
                    seq=entry.seq,
                    instance_id=event.instance_id,
                )
                for watcher in self._watchers:
                    watcher.put_nowait(change)
        self._applied = self.projection.seq
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._progress:
            self._progress.notify_all()

    async def _wait_applied(self, seq: int, timeout: float = 60.0) -> None:
        def reached() -> bool:
            return self._applied >= seq or self._failure is not None or self._closed

        async with self._progress:
            async with asyncio.timeout(timeout):  # not wait_for: see eventlog.jetstream._pull
                await self._progress.wait_for(reached)
        if self._failure is not None:
            raise PulseError(f"replication stopped: {self._failure!r}") from self._failure
        if self._applied < seq:
            raise PulseError("the instance is closed")

    async def sync(self, timeout: float = 60.0) -> int:
        """Wait until the local state has applied everything the stream holds now."""
        target = await self.log.last_seq()
        await self._wait_applied(target, timeout)
        return target

    async def _write(self, event: ev.Event) -> int:
        if self._closed:
            raise PulseError("the instance is closed")
        seq = await self.log.append(event)
        await self._wait_applied(seq)
        return seq

    def _common(self) -> dict[str, object]:
        return {"event_id": uuid7(), "instance_id": self.instance_id, "hlc": self.clock.now()}

    # -- collectives -----------------------------------------------------------------------

    async def create_collective(
        self, owner_id: str, name: str, embedding_dimension: int, *, embedder: str = ""
    ) -> UUID:
        _text("owner_id", owner_id, 256)
        _text("name", name, 256)
        if not 1 <= embedding_dimension <= 4096:
            raise ValidationError(
                f"embedding_dimension: must be 1..4096, got {embedding_dimension}"
            )
        collective_id = uuid7()
        await self._write(
            ev.CollectiveCreated(
                **self._common(), collective_id=collective_id, owner_id=owner_id, name=name,  # type: ignore[arg-type]
                embedding_dimension=embedding_dimension, embedder=embedder,
            )
        )  # fmt: skip
        return collective_id

    # -- experiences -----------------------------------------------------------------------

    async def record_experience(
        self,
        collective_id: UUID,
        content: str,
        embedding: Sequence[float] | npt.NDArray[np.float32],
        *,
        experience_type: ev.ExperienceType | None = None,
        importance: float = 0.5,
        confidence: float = 0.5,
        domain: Sequence[str] = (),
        related_files: Sequence[str] = (),
        source_agent: str = "agent",
        source_task: str | None = None,
    ) -> UUID:
        dimension = self.projection.live_dimension(collective_id)
        if dimension is None:
            raise NotFoundError(f"collective_id: no collective {collective_id}")
        if not 1 <= len(content.encode()) <= 100 * 1024:
            raise ValidationError(
                f"content: must be 1 byte to 100 KB, got {len(content.encode())} bytes"
            )
        vector = np.asarray(embedding, dtype=np.float32)
        if vector.ndim != 1 or len(vector) != dimension:
            raise ValidationError(
                f"embedding: {vector.size} values, the collective's dimension is {dimension}"
            )
        if not np.isfinite(vector).all():
            raise ValidationError("embedding: every value must be a finite float")
        _score("importance", importance)
        _score("confidence", confidence)
        _text("source_agent", source_agent, 256)
        experience_id = uuid7()
        await self._write(
            ev.ExperienceRecorded(
                **self._common(), experience_id=experience_id, collective_id=collective_id,  # type: ignore[arg-type]
                content=content, embedding=ev.pack_vector(vector),
                experience_type=experience_type or ev.Generic(), importance=importance,
                confidence=confidence, source_agent=source_agent, domain=tuple(domain),
                related_files=tuple(related_files), source_task=source_task,
            )
        )  # fmt: skip
        return experience_id

    def _collective_of(self, experience_id: UUID) -> UUID:
        """The collective of a live experience; NotFoundError when there is none."""
        found = queries.live_collective_of(self.projection, experience_id)
        if found is None:
            raise NotFoundError(f"experience_id: no experience {experience_id}")
        return found

    async def get_experience(self, experience_id: UUID) -> queries.Experience | None:
        return queries.get_experience(self.projection, experience_id)

    async def get_recent_experiences(
        self, collective_id: UUID, limit: int = 20, flt: queries.ExperienceFilter = queries.ANY_LIVE
    ) -> list[queries.Experience]:
        return queries.recent_experiences(self.projection, collective_id, limit, flt)

    async def search_similar(
        self,
        collective_id: UUID,
        query: Sequence[float] | npt.NDArray[np.float32],
        k: int = 10,
        flt: queries.ExperienceFilter = queries.ANY_LIVE,
    ) -> list[queries.ScoredExperience]:
        return queries.similar_experiences(self.projection, collective_id, query, k, flt)

    async def reinforce_experience(self, experience_id: UUID) -> int:
        """Count one more application by this instance; returns the total across instances.

        Publishes this incarnation's new total (never "+1"). If the append fails, the
        total is not advanced, and the next call announces the same total again: an
        announcement that was stored after all is subsumed, never counted twice.
        """
        collective_id = self._collective_of(experience_id)
        async with self._reinforce_locks[experience_id]:
            total = self._own.get(experience_id, 0) + 1
            await self._write(
                ev.ExperienceReinforced(
                    **self._common(), experience_id=experience_id,  # type: ignore[arg-type]
                    collective_id=collective_id, applications=total,
                )
            )  # fmt: skip
            self._own[experience_id] = total
        found = self.projection.store.con.execute(
            "SELECT coalesce(sum(applications), 0) FROM application_rows WHERE experience_id = ?",
            [experience_id],
        ).fetchone()
        return int(found[0]) if found else 0

    async def archive_experience(self, experience_id: UUID) -> None:
        await self._lifecycle(ev.ExperienceArchived, experience_id)

    async def unarchive_experience(self, experience_id: UUID) -> None:
        await self._lifecycle(ev.ExperienceUnarchived, experience_id)

    async def delete_experience(self, experience_id: UUID) -> None:
        await self._lifecycle(ev.ExperienceDeleted, experience_id)

    async def _lifecycle(
        self,
        kind: type[ev.ExperienceArchived | ev.ExperienceUnarchived | ev.ExperienceDeleted],
        experience_id: UUID,
    ) -> None:
        collective_id = self._collective_of(experience_id)
        await self._write(
            kind(**self._common(), experience_id=experience_id,  # type: ignore[arg-type]
                 collective_id=collective_id)
        )  # fmt: skip

    async def update_experience(
        self,
        experience_id: UUID,
        *,
        importance: float | None = None,
        confidence: float | None = None,
        domain: Sequence[str] | None = None,
        related_files: Sequence[str] | None = None,
    ) -> None:
        collective_id = self._collective_of(experience_id)
        if importance is not None:
            _score("importance", importance)
        if confidence is not None:
            _score("confidence", confidence)
        await self._write(
            ev.ExperienceUpdated(
                **self._common(), experience_id=experience_id,  # type: ignore[arg-type]
                collective_id=collective_id, importance=importance,
                confidence=confidence, domain=None if domain is None else tuple(domain),
                related_files=None if related_files is None else tuple(related_files),
            )
        )  # fmt: skip

    def watch_experiences(self) -> ExperienceWatch:
        """Changes to experiences as this instance applies them, whichever host wrote them,
        from the moment of this call. Iterate it with ``async for``; it ends when the
        instance closes (or call ``close()`` on it)."""
        return ExperienceWatch(self._watchers)

    async def digest(self) -> str:
        return self.projection.digest()


def _text(field: str, value: str, limit: int) -> None:
    if not 1 <= len(value) <= limit:
        raise ValidationError(f"{field}: must be 1..{limit} characters, got {len(value)}")


def _score(field: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValidationError(f"{field}: must be a finite number in [0, 1], got {value}")

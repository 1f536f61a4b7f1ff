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
import contextlib
import json
import logging
import math
import os
import time
import typing
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

import msgspec
import numpy as np
import numpy.typing as npt

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings, subjects
from eventlog import events as ev
from eventlog.errors import (
    ConflictError,
    LogUnavailable,
    NotFoundError,
    PulseError,
    ValidationError,
)
from eventlog.ids import uuid7
from eventlog.log import EventLog, LogEntry
from projections import queries
from projections.projection import Projection, ProjectionSettings, open_projection
from sync import analytics, embedders, models
from sync.analytics import SqlResult
from sync.hlc import HybridClock
from sync.models import validated

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
    """An async iterator of ``ExperienceChange``, registered when created.

    It holds at most ``limit`` changes its reader has not taken yet; a reader that falls
    further behind is dropped (its next read raises ``PulseError``: watch again and
    re-read what changed), so a stalled reader cannot make the instance hold every
    change in memory."""

    def __init__(self, watchers: set[ExperienceWatch], limit: int = 10_000) -> None:
        self._watchers = watchers
        self._queue: asyncio.Queue[ExperienceChange | None] = asyncio.Queue(maxsize=limit)
        self._overflowed = False
        self._ended = False
        watchers.add(self)

    def offer(self, change: ExperienceChange) -> None:
        try:
            self._queue.put_nowait(change)
        except asyncio.QueueFull:
            self._overflowed = True
            self.close()

    def end(self) -> None:
        """The instance closed: the iteration stops once what is queued is read."""
        self._ended = True
        self.close()
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    def __aiter__(self) -> ExperienceWatch:
        return self

    async def __anext__(self) -> ExperienceChange:
        if self._overflowed and self._queue.empty():
            raise PulseError(
                f"watch: the reader fell more than {self._queue.maxsize} changes behind; "
                "watch again and re-read"
            )
        if self._ended and self._queue.empty():
            raise StopAsyncIteration
        change = await self._queue.get()
        if change is None:
            self.close()
            raise StopAsyncIteration
        return change

    def close(self) -> None:
        self._watchers.discard(self)


@dataclass(frozen=True, slots=True)
class InstanceSettings:
    """How an instance recalls: energy weighting of search results, and activity staleness."""

    energy_weight: float = 0.2  # 0: pure relevance; 1: relevance x energy
    half_life_days: float = 30.0  # energy halves this long after the last reinforcement
    boost_every: float = 5.0  # this many applications halve the distance of importance to 1
    stale_after: float = 300.0  # seconds without a heartbeat before an agent is not active

    def __post_init__(self) -> None:
        if not (math.isfinite(self.energy_weight) and 0 <= self.energy_weight <= 1):
            raise ValidationError(f"energy_weight: must be in [0, 1], got {self.energy_weight}")
        for name in ("half_life_days", "boost_every", "stale_after"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValidationError(f"{name}: must be a finite number > 0, got {value}")


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
        settings: InstanceSettings | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log = log
        self.projection = projection
        self.server = server
        self.instance_id = uuid7()
        self.clock = HybridClock(state_file=data_dir / "clock.json")
        self.clock.observe(projection.store.max_hlc())
        self._batch_size = batch_size
        self.settings = settings or InstanceSettings()
        self._applied = projection.seq
        self._progress = asyncio.Condition()
        self._watchers: set[ExperienceWatch] = set()
        self._own: dict[UUID, int] = {}  # this incarnation's acknowledged totals
        # one announcement in flight per experience (two concurrent calls must not both
        # announce the same total); different experiences go in parallel
        self._reinforce_locks: dict[UUID, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._failure: BaseException | None = None
        self.events_applied = 0  # by the replication loop since open (a metric)
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
        settings: InstanceSettings | None = None,
        progress: Callable[[int, int], None] | None = None,
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
            return await cls.attach(
                directory, jetstream, projection_settings, server=server, settings=settings,
                progress=progress,
            )  # fmt: skip
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
        settings: InstanceSettings | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> PulseDB:
        """An instance on an already open log (any backend; ``MemoryLog`` in simulations).
        When it closes, it closes the log if it ``owns_log``, and stops ``server``."""
        directory = Path(data_dir)
        projection = open_projection(directory, projection_settings)
        try:
            await projection.catch_up(log, progress=progress)
        except BaseException:
            projection.close()
            raise
        db = cls(directory, log, projection, server, settings=settings)
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
        for watch in list(self._watchers):
            watch.end()
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
                for watcher in list(self._watchers):
                    watcher.offer(change)
        self._applied = self.projection.seq
        self.events_applied += len(batch)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._progress:
            self._progress.notify_all()

    async def _wait_applied(self, seq: int, timeout: float = 60.0) -> None:
        def reached() -> bool:
            return self._applied >= seq or self._failure is not None or self._closed

        try:
            async with self._progress:
                async with asyncio.timeout(timeout):  # not wait_for: see jetstream._pull
                    await self._progress.wait_for(reached)
        except TimeoutError:
            raise LogUnavailable(
                f"the local state did not reach stream sequence {seq} within {timeout:g} s "
                f"(it is at {self._applied})"
            ) from None
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
        await self._forget_if_deleted(event, seq)
        return seq

    async def _forget_if_deleted(self, event: ev.Event, seq: int) -> None:
        """A write checked against a state that did not have a concurrent delete yet lands
        after the tombstone: it must not keep deleted content in the log. Forget it (and
        say so); every host's fold already ignores it."""
        if isinstance(event, DELETES):
            return
        collective_id = getattr(event, "collective_id", None)
        if collective_id is None:
            return
        entity, entity_id = _entity_of(event)
        deleted = self.projection.store.deleted  # every tombstone applied here
        collective_gone, entity_gone = collective_id in deleted, entity_id in deleted
        if collective_gone:
            await self.log.purge(subjects.subject_for(event), before_seq=seq + 1)
            raise NotFoundError(f"collective_id: collective {collective_id} was deleted")
        if entity_gone:
            await self._delete(entity, entity_id)  # a new tombstone, purging the write
            raise NotFoundError(f"{entity}_id: {entity} {entity_id} was deleted")

    def _common(self) -> dict[str, Any]:
        return {"event_id": uuid7(), "instance_id": self.instance_id, "hlc": self.clock.now()}

    # -- helpers of the public API ---------------------------------------------------------

    def _collective(self, collective_id: UUID) -> queries.Collective:
        found = queries.get_collective(self.projection, _uuid("collective_id", collective_id))
        if found is None:
            raise NotFoundError(f"collective_id: no collective {collective_id}")
        return found

    async def _vector(
        self,
        collective: queries.Collective,
        text: str | None,
        given: npt.NDArray[np.float32] | None,
        embedder: str | None,
        *,
        field: str = "embedding",
        query: bool = False,
    ) -> npt.NDArray[np.float32]:
        """The vector to store or search with: the caller's, checked against the collective
        (dimension, embedder), or the collective's embedder applied to ``text``."""
        if given is None:
            if not collective.embedder:
                raise ValidationError(
                    f"{field}: required, collective {collective.name!r} has no embedder "
                    "(create a collective with an embedder, e.g. 'hash', to send text only)"
                )
            if not text:
                raise ValidationError(f"{field}: give a vector or a text to embed")
            model = embedders.embedder(collective.embedder, collective.embedding_dimension)
            if query:
                made = await asyncio.to_thread(model.embed_query, text)
            else:
                made = (await asyncio.to_thread(model.embed_documents, [text]))[0]
            return np.asarray(made, dtype=np.float32)
        if collective.embedder and embedder != collective.embedder:
            raise ValidationError(
                f"embedder: collective {collective.name!r} embeds with {collective.embedder!r}; "
                f"a vector from {repr(embedder) if embedder else 'an unnamed model'} is "
                f"refused (send text only, or a vector made with embedder="
                f"{collective.embedder!r})"
            )
        if len(given) != collective.embedding_dimension:
            raise ValidationError(
                f"{field}: {len(given)} values, collective {collective.name!r} has dimension "
                f"{collective.embedding_dimension} (fixed at creation)"
            )
        return given

    def _filter(self, flt: Any) -> queries.ExperienceFilter:
        if flt is None:
            return queries.ANY_LIVE
        if isinstance(flt, queries.ExperienceFilter):
            return flt
        model = flt if isinstance(flt, models.FilterIn) else validated(models.FilterIn, **flt)
        return queries.ExperienceFilter(
            domains=tuple(model.domains) if model.domains is not None else None,
            experience_types=(
                tuple(model.experience_types) if model.experience_types is not None else None
            ),
            min_importance=model.min_importance,
            min_confidence=model.min_confidence,
            since_ms=model.since_ms,
            include_archived=model.include_archived,
        )

    def _weighted(
        self, hits: list[queries.ScoredExperience], weight: float | None, k: int
    ) -> list[queries.ScoredExperience]:
        """Order by relevance weighted by energy: relevance x (1 - w + w x energy)."""
        w = self.settings.energy_weight if weight is None else weight
        now = int(time.time() * 1000)
        out = []
        for hit in hits:
            e = queries.energy_of(hit.experience, now, **self._energy_settings)
            out.append(queries.ScoredExperience(hit.experience, hit.score * (1 - w + w * e),
                                                hit.score, e))  # fmt: skip
        out.sort(key=lambda h: -h.score)
        return out[:k]

    @property
    def _energy_settings(self) -> dict[str, float]:
        return {
            "half_life_days": self.settings.half_life_days,
            "boost_every": self.settings.boost_every,
        }

    async def _tombstone(self, event: ev.Event, forget: str) -> None:
        """Append a tombstone, wait until it is applied here, then purge everything before
        it on ``forget`` (a subject, wildcards allowed) from the stream: forgetting."""
        seq = await self._write(event)
        await self.log.purge(forget, before_seq=seq)

    # -- collectives -----------------------------------------------------------------------

    async def create_collective(
        self,
        owner_id: str,
        name: str,
        embedding_dimension: int | None = None,
        *,
        embedder: str | None = None,
    ) -> UUID:
        """A new collective. Its embedding dimension is fixed for good; with an
        ``embedder`` ("hash", or "e5-small" with the model extra) text alone can be
        recorded and searched, and the dimension defaults to the embedder's."""
        spec = validated(
            models.CollectiveIn, owner_id=owner_id, name=name,
            embedding_dimension=embedding_dimension, embedder=embedder,
        )  # fmt: skip
        dimension = spec.embedding_dimension
        if spec.embedder is not None:
            dimension = dimension or embedders.default_dimension(spec.embedder)
            embedders.embedder(spec.embedder, dimension)  # refuses a dimension it cannot make
        assert dimension is not None
        collective_id = uuid7()
        await self._write(
            ev.CollectiveCreated(
                **self._common(), collective_id=collective_id, owner_id=spec.owner_id,
                name=spec.name, embedding_dimension=dimension, embedder=spec.embedder or "",
            )
        )  # fmt: skip
        return collective_id

    async def get_collective(self, collective_id: UUID) -> queries.Collective | None:
        return queries.get_collective(self.projection, _uuid("collective_id", collective_id))

    async def list_collectives(self, owner_id: str | None = None) -> list[queries.Collective]:
        """Every live collective, or those of one owner; oldest first."""
        return queries.list_collectives(self.projection, owner_id)

    async def get_collective_stats(self, collective_id: UUID) -> queries.CollectiveStats:
        stats = queries.collective_stats(self.projection, _uuid("collective_id", collective_id))
        if stats is None:
            raise NotFoundError(f"collective_id: no collective {collective_id}")
        return stats

    async def delete_collective(self, collective_id: UUID) -> None:
        """Delete a collective and forget everything in it: a tombstone for the collective
        and one for every experience, relation and insight in it, then everything before
        the collective's tombstone is purged from the stream (and its agents' activities).
        Every host wipes those rows and drops them from its indexes; the stream keeps the
        tombstones only. Repeating it is harmless (and finishes forgetting if an earlier
        call was interrupted)."""
        cid = _uuid("collective_id", collective_id)
        if queries.anchor_of(self.projection, "collective", cid) is None:
            raise NotFoundError(f"collective_id: no collective {collective_id}")
        seq = await self._write(ev.CollectiveDeleted(**self._common(), collective_id=cid))
        tombstones: list[ev.Event] = [
            DELETES_OF[entity](**self._common(), collective_id=cid, **{f"{entity}_id": row[0]})
            for entity in ("experience", "relation", "insight")
            for row in self.projection.store.con.execute(
                f"SELECT {entity}_id FROM {entity}_rows WHERE collective_id = ?", [cid]
            ).fetchall()
        ]  # after the collective's tombstone, so the purge below keeps them
        last = seq
        for start in range(0, len(tombstones), 1000):
            last = (await self.log.append_batch(tombstones[start : start + 1000]))[-1]
        await self._wait_applied(last)
        await self.log.purge(f"{subjects.PREFIX}.c.{cid}.>", before_seq=seq)
        await self.log.purge(f"{subjects.PREFIX}.a.{cid}.>", before_seq=None)  # its presence

    # -- experiences -----------------------------------------------------------------------

    async def record_experience(
        self,
        collective_id: UUID,
        content: str,
        embedding: Sequence[float] | npt.NDArray[np.float32] | None = None,
        *,
        embedder: str | None = None,
        experience_type: ev.ExperienceType | dict[str, Any] | None = None,
        importance: float = 0.5,
        confidence: float = 0.5,
        domain: Sequence[str] = (),
        related_files: Sequence[str] = (),
        source_agent: str = "agent",
        source_task: str | None = None,
    ) -> UUID:
        """Record what an agent learned. ``embedding`` may be left out when the collective
        has an embedder (the content is embedded). Returns the new experience's id once
        this host has applied it."""
        fields: dict[str, Any] = {
            "collective_id": collective_id, "content": content, "embedding": embedding,
            "embedder": embedder, "importance": importance, "confidence": confidence,
            "domain": list(domain), "related_files": list(related_files),
            "source_agent": source_agent, "source_task": source_task,
        }  # fmt: skip
        if experience_type is not None:
            fields["experience_type"] = experience_type
        spec = validated(models.ExperienceIn, **fields)
        collective = self._collective(spec.collective_id)
        vector = await self._vector(collective, spec.content, spec.embedding, spec.embedder)
        experience_id = uuid7()
        await self._write(
            ev.ExperienceRecorded(
                **self._common(), experience_id=experience_id,
                collective_id=spec.collective_id, content=spec.content,
                embedding=ev.pack_vector(vector),
                experience_type=models.to_event_type(spec.experience_type),
                importance=spec.importance, confidence=spec.confidence,
                source_agent=spec.source_agent, domain=tuple(spec.domain),
                related_files=tuple(spec.related_files), source_task=spec.source_task,
            )
        )  # fmt: skip
        return experience_id

    def _collective_of(self, experience_id: UUID, field: str = "experience_id") -> UUID:
        """The collective of a live experience; NotFoundError when there is none."""
        found = queries.live_collective_of(self.projection, _uuid(field, experience_id))
        if found is None:
            raise NotFoundError(f"{field}: no experience {experience_id}")
        return found

    async def get_experience(self, experience_id: UUID) -> queries.Experience | None:
        return queries.get_experience(self.projection, _uuid("experience_id", experience_id))

    async def get_recent_experiences(
        self, collective_id: UUID, limit: int = 20, flt: Any = None, *, offset: int = 0
    ) -> list[queries.Experience]:
        """The newest experiences of a collective (filtered), newest first."""
        _limit("limit", limit)
        if offset < 0:
            raise ValidationError(f"offset: must be >= 0, got {offset}")
        return queries.recent_experiences(
            self.projection, self._collective(collective_id).collective_id, limit,
            self._filter(flt), offset=offset,
        )  # fmt: skip

    async def list_experiences(
        self, collective_id: UUID, *, limit: int = 100, offset: int = 0, flt: Any = None
    ) -> list[queries.Experience]:
        """One page of a collective's experiences, oldest first (stable paging by offset)."""
        _limit("limit", limit)
        if offset < 0:
            raise ValidationError(f"offset: must be >= 0, got {offset}")
        return queries.recent_experiences(
            self.projection, self._collective(collective_id).collective_id, limit,
            self._filter(flt), offset=offset, newest_first=False,
        )  # fmt: skip

    async def update_experience(self, experience_id: UUID, **changes: Any) -> None:
        """Change importance, confidence, domain and/or related_files (last writer wins,
        per field). Content, embedding and timestamp are immutable."""
        spec = validated(models.ExperienceUpdateIn, **changes)
        experience_id = _uuid("experience_id", experience_id)
        collective_id = self._collective_of(experience_id)
        await self._write(
            ev.ExperienceUpdated(
                **self._common(), experience_id=experience_id,
                collective_id=collective_id, importance=spec.importance,
                confidence=spec.confidence,
                domain=None if spec.domain is None else tuple(spec.domain),
                related_files=None if spec.related_files is None else tuple(spec.related_files),
            )
        )  # fmt: skip

    async def archive_experience(self, experience_id: UUID) -> None:
        """Hide from searches (unless asked for); reversible."""
        await self._lifecycle(ev.ExperienceArchived, experience_id)

    async def unarchive_experience(self, experience_id: UUID) -> None:
        await self._lifecycle(ev.ExperienceUnarchived, experience_id)

    async def _lifecycle(
        self, kind: type[ev.ExperienceArchived | ev.ExperienceUnarchived], experience_id: UUID
    ) -> None:
        experience_id = _uuid("experience_id", experience_id)
        collective_id = self._collective_of(experience_id)
        await self._write(
            kind(**self._common(), experience_id=experience_id,
                 collective_id=collective_id)
        )  # fmt: skip

    async def delete_experience(self, experience_id: UUID) -> None:
        """Delete and forget: the content and embedding leave every host's state and
        indexes and the stream itself (only the tombstone stays). Repeating it is
        harmless and finishes forgetting if an earlier call was interrupted."""
        await self._delete("experience", experience_id)

    async def _delete(self, entity: str, entity_id: Any) -> None:
        """Tombstone an entity that exists or was deleted here, and forget it."""
        key = _uuid(f"{entity}_id", entity_id)
        anchor = queries.anchor_of(self.projection, entity, key)
        if anchor is None:
            raise NotFoundError(f"{entity}_id: no {entity} {entity_id}")
        anchor_field = "owner_id" if entity == "wisdom" else "collective_id"
        event = DELETES_OF[entity](**self._common(), **{f"{entity}_id": key, anchor_field: anchor})
        await self._tombstone(event, subjects.subject_for(event))

    async def reinforce_experience(self, experience_id: UUID) -> int:
        """Count one more application by this instance; returns the total across instances.

        Publishes this incarnation's new total (never "+1"). If the append fails, the
        total is not advanced, and the next call announces the same total again: an
        announcement that was stored after all is subsumed, never counted twice.
        """
        experience_id = _uuid("experience_id", experience_id)
        collective_id = self._collective_of(experience_id)
        async with self._reinforce_locks[experience_id]:
            total = self._own.get(experience_id, 0) + 1
            await self._write(
                ev.ExperienceReinforced(
                    **self._common(), experience_id=experience_id,
                    collective_id=collective_id, applications=total,
                )
            )  # fmt: skip
            self._own[experience_id] = total
        found = self.projection.store.con.execute(
            "SELECT coalesce(sum(applications), 0) FROM application_rows WHERE experience_id = ?",
            [experience_id],
        ).fetchone()
        return int(found[0]) if found else 0

    # -- search ----------------------------------------------------------------------------

    async def search_similar(
        self,
        collective_id: UUID,
        query: str | Sequence[float] | npt.NDArray[np.float32],
        k: int = 10,
        flt: Any = None,
        *,
        embedder: str | None = None,
        energy_weight: float | None = None,
    ) -> list[queries.ScoredExperience]:
        """The k experiences nearest in meaning to ``query`` (a vector, or a text when the
        collective has an embedder), filtered, weighted by energy."""
        text, vector = (query, None) if isinstance(query, str) else (None, query)
        spec = validated(
            models.SearchIn, collective_id=collective_id, text=text, embedding=vector, k=k,
            energy_weight=energy_weight,
        )  # fmt: skip
        collective = self._collective(spec.collective_id)
        q = await self._vector(
            collective, spec.text, spec.embedding, embedder, field="query", query=True
        )
        hits = queries.similar_experiences(
            self.projection, collective.collective_id, q, self._pool(spec.k, spec.energy_weight),
            self._filter(flt),
        )  # fmt: skip
        return self._weighted(hits, spec.energy_weight, spec.k)

    def _pool(self, k: int, energy_weight: float | None) -> int:
        """How many candidates to fetch so that re-weighting by energy can reorder them."""
        w = self.settings.energy_weight if energy_weight is None else energy_weight
        return k if w == 0 else min(max(4 * k, 50), models.K_MAX * 4)

    async def search_text(
        self,
        collective_id: UUID,
        text: str,
        k: int = 10,
        flt: Any = None,
        *,
        energy_weight: float | None = None,
    ) -> list[queries.ScoredExperience]:
        """BM25 full-text matches of ``text``, filtered, weighted by energy."""
        spec = validated(
            models.SearchIn, collective_id=collective_id, text=text, k=k,
            energy_weight=energy_weight,
        )  # fmt: skip
        if not (spec.text or "").strip():
            raise ValidationError("text: must contain at least one word")
        collective = self._collective(spec.collective_id)
        hits = queries.search_text(
            self.projection, collective.collective_id, spec.text or "",
            self._pool(spec.k, spec.energy_weight), self._filter(flt),
        )  # fmt: skip
        return self._weighted(hits, spec.energy_weight, spec.k)

    async def search_hybrid(
        self,
        collective_id: UUID,
        text: str,
        embedding: Sequence[float] | npt.NDArray[np.float32] | None = None,
        k: int = 10,
        flt: Any = None,
        *,
        embedder: str | None = None,
        vector_weight: float = 1.0,
        text_weight: float = 1.0,
        energy_weight: float | None = None,
    ) -> list[queries.ScoredExperience]:
        """Meaning and words together: the vector and BM25 rankings fused by Reciprocal
        Rank Fusion (score = sum of weight / (60 + rank)), then weighted by energy.
        ``embedding`` may be left out when the collective has an embedder."""
        spec = validated(
            models.SearchIn, collective_id=collective_id, text=text, embedding=embedding, k=k,
            vector_weight=vector_weight, text_weight=text_weight, energy_weight=energy_weight,
        )  # fmt: skip
        if not (spec.text or "").strip():
            raise ValidationError("text: must contain at least one word")
        collective = self._collective(spec.collective_id)
        q = await self._vector(
            collective, spec.text, spec.embedding, embedder, field="embedding", query=True
        )
        return self._hybrid(collective.collective_id, spec, q, self._filter(flt))

    def _hybrid(
        self,
        collective_id: UUID,
        spec: models.SearchIn,
        q: npt.NDArray[np.float32],
        flt: queries.ExperienceFilter,
    ) -> list[queries.ScoredExperience]:
        hits = queries.hybrid_experiences(
            self.projection, collective_id, spec.text or "", q, max(4 * spec.k, 50), flt,
            vector_weight=spec.vector_weight, text_weight=spec.text_weight, rrf_k=RRF_K,
        )  # fmt: skip
        return self._weighted(hits, spec.energy_weight, spec.k)

    async def list_cold_experiences(
        self, collective_id: UUID, threshold: float = 0.1, limit: int = 100, flt: Any = None
    ) -> list[queries.ScoredExperience]:
        """Experiences whose energy (see ``projections.queries.energy``) is below
        ``threshold``, coldest first: candidates to archive or forget."""
        if not (math.isfinite(threshold) and 0.0 <= threshold <= 1.0):
            raise ValidationError(f"threshold: must be a finite number in [0, 1], got {threshold}")
        _limit("limit", limit)
        return queries.cold_experiences(
            self.projection, self._collective(collective_id).collective_id, threshold, limit,
            int(time.time() * 1000), self._filter(flt), **self._energy_settings,
        )  # fmt: skip

    async def get_context_candidates(
        self, request: models.ContextIn | dict[str, Any] | None = None, **fields: Any
    ) -> Context:
        """Everything an agent needs before a task, in one call: experiences similar to the
        task (hybrid when there is text, by vector otherwise), the most recent ones,
        similar insights, the relations among all of these, and who is active. Each part
        can be switched off; the filter applies throughout."""
        if isinstance(request, models.ContextIn):
            spec = request
        else:
            spec = validated(models.ContextIn, **{**(request or {}), **fields})
        collective = self._collective(spec.collective_id)
        cid = collective.collective_id
        flt = self._filter(spec.filter)
        q: npt.NDArray[np.float32] | None = None
        if spec.embedding is not None or spec.text:
            q = await self._vector(collective, spec.text, spec.embedding, spec.embedder, query=True)
        similar: list[queries.ScoredExperience] = []
        if spec.similar and q is not None:
            if spec.text and spec.text.strip():
                similar = self._hybrid(cid, spec, q, flt)
            else:
                hits = queries.similar_experiences(
                    self.projection, cid, q, self._pool(spec.k, spec.energy_weight), flt
                )
                similar = self._weighted(hits, spec.energy_weight, spec.k)
        recent = (
            queries.recent_experiences(self.projection, cid, spec.recent, flt)
            if spec.recent
            else []
        )
        insights = (
            queries.similar_insights(self.projection, cid, q, spec.insights)
            if spec.insights and q is not None
            else []
        )
        relations: list[queries.Relation] = []
        if spec.relations:
            ids = {h.experience.experience_id for h in similar} | {e.experience_id for e in recent}
            relations = queries.relations_among(self.projection, sorted(ids))
        agents = await self.get_active_agents(cid) if spec.active_agents else []
        return Context(
            collective_id=cid, similar=similar, recent=recent, insights=insights,
            relations=relations, active_agents=agents,
        )  # fmt: skip

    # -- relations -------------------------------------------------------------------------

    async def store_relation(
        self,
        source_id: UUID,
        target_id: UUID,
        relation_type: str,
        *,
        strength: float = 0.5,
        metadata: str | None = None,
    ) -> UUID:
        """Link two experiences of one collective. A (source, target, type) triple is
        unique: storing it again raises ``ConflictError`` naming the existing relation.
        (Two hosts racing on one triple both succeed; the fold keeps the smaller id and
        lists the other under dead_letters.)"""
        spec = validated(
            models.RelationIn, source_id=source_id, target_id=target_id,
            relation_type=relation_type, strength=strength, metadata=metadata,
        )  # fmt: skip
        source_collective = self._collective_of(spec.source_id, "source_id")
        target_collective = self._collective_of(spec.target_id, "target_id")
        if source_collective != target_collective:
            raise ValidationError(
                f"target_id: is in collective {target_collective}, source_id in "
                f"{source_collective}; relations stay within one collective"
            )
        taken = queries.relation_taken(
            self.projection, spec.source_id, spec.target_id, spec.relation_type
        )
        if taken is not None:
            raise ConflictError(
                f"relation: ({spec.source_id}, {spec.target_id}, {spec.relation_type}) "
                f"already exists as relation {taken}; a triple is unique"
            )
        relation_id = uuid7()
        await self._write(
            ev.RelationStored(
                **self._common(), relation_id=relation_id,
                collective_id=source_collective, source_id=spec.source_id,
                target_id=spec.target_id, relation_type=spec.relation_type,
                strength=spec.strength, metadata=spec.metadata,
            )
        )  # fmt: skip
        return relation_id

    async def get_related_experiences(
        self,
        experience_id: UUID,
        direction: Literal["outgoing", "incoming", "both"] = "both",
        relation_types: Sequence[str] | None = None,
        *,
        min_strength: float | None = None,
    ) -> list[queries.RelatedExperience]:
        """Experiences linked to this one (outgoing, incoming or both), optionally only
        some relation types and at least some strength."""
        if direction not in ("outgoing", "incoming", "both"):
            raise ValidationError(
                f"direction: must be 'outgoing', 'incoming' or 'both', got {direction!r}"
            )
        if relation_types is not None:
            known = set(typing.get_args(ev.RelationType))
            unknown = [t for t in relation_types if t not in known]
            if unknown:
                raise ValidationError(
                    f"relation_types: unknown {unknown}; known: {', '.join(sorted(known))}"
                )
        if min_strength is not None and not (
            math.isfinite(min_strength) and 0 <= min_strength <= 1
        ):
            raise ValidationError(f"min_strength: must be in [0, 1], got {min_strength}")
        experience_id = _uuid("experience_id", experience_id)
        self._collective_of(experience_id)
        related = queries.related_experiences(
            self.projection, experience_id, direction, relation_types
        )
        if min_strength is not None:
            related = [r for r in related if r.relation.strength >= min_strength]
        return related

    async def delete_relation(self, relation_id: UUID) -> None:
        """Delete a relation and forget it (idempotent, as every delete)."""
        await self._delete("relation", relation_id)

    # -- insights --------------------------------------------------------------------------

    async def store_insight(
        self,
        collective_id: UUID,
        content: str,
        embedding: Sequence[float] | npt.NDArray[np.float32] | None = None,
        *,
        source_experiences: Sequence[UUID],
        confidence: float = 0.5,
        domain: Sequence[str] = (),
        embedder: str | None = None,
    ) -> UUID:
        """A distilled insight, derived from 1..100 live experiences of the collective."""
        spec = validated(
            models.InsightIn, collective_id=collective_id, content=content,
            embedding=embedding, embedder=embedder,
            source_experiences=list(source_experiences), confidence=confidence,
            domain=list(domain),
        )  # fmt: skip
        collective = self._collective(spec.collective_id)
        for source in spec.source_experiences:
            if queries.live_collective_of(self.projection, source) != spec.collective_id:
                raise NotFoundError(
                    f"source_experiences: no experience {source} in collective {collective.name!r}"
                )
        vector = await self._vector(collective, spec.content, spec.embedding, spec.embedder)
        insight_id = uuid7()
        await self._write(
            ev.InsightStored(
                **self._common(), insight_id=insight_id,
                collective_id=spec.collective_id, content=spec.content,
                embedding=ev.pack_vector(vector),
                source_experiences=tuple(spec.source_experiences),
                confidence=spec.confidence, domain=tuple(spec.domain),
            )
        )  # fmt: skip
        return insight_id

    async def get_insight(self, insight_id: UUID) -> queries.Insight | None:
        return queries.get_insight(self.projection, _uuid("insight_id", insight_id))

    async def get_insights(
        self,
        collective_id: UUID,
        query: str | Sequence[float] | npt.NDArray[np.float32],
        k: int = 10,
        *,
        embedder: str | None = None,
    ) -> list[queries.ScoredInsight]:
        """The k insights nearest to ``query`` (a vector, or text with an embedder)."""
        text, vector = (query, None) if isinstance(query, str) else (None, query)
        spec = validated(
            models.SearchIn, collective_id=collective_id, text=text, embedding=vector, k=k
        )
        collective = self._collective(spec.collective_id)
        q = await self._vector(
            collective, spec.text, spec.embedding, embedder, field="query", query=True
        )
        return queries.similar_insights(self.projection, collective.collective_id, q, spec.k)

    async def delete_insight(self, insight_id: UUID) -> None:
        """Delete an insight and forget it (idempotent, as every delete)."""
        await self._delete("insight", insight_id)

    # -- activities: presence in PULSE_ACTIVITY (last message per agent, with a TTL) --------

    async def register_activity(
        self,
        collective_id: UUID,
        agent_id: str,
        task_description: str = "",
        working_on: Sequence[str] = (),
    ) -> Activity:
        """Say what an agent is working on (replaces its previous activity)."""
        spec = validated(
            models.ActivityIn, collective_id=collective_id, agent_id=agent_id,
            task_description=task_description, working_on=list(working_on),
        )  # fmt: skip
        self._collective(spec.collective_id)
        event = ev.ActivityRegistered(
            **self._common(), collective_id=spec.collective_id, agent_id=spec.agent_id,
            task_description=spec.task_description, working_on=tuple(spec.working_on),
        )  # fmt: skip
        await self._append_activity(event)
        return _activity(event, ev.hlc_millis(event.hlc))

    async def update_heartbeat(
        self,
        collective_id: UUID,
        agent_id: str,
        *,
        task_description: str | None = None,
        working_on: Sequence[str] | None = None,
    ) -> Activity:
        """Keep an agent's activity alive (optionally changing what it works on)."""
        collective_id = self._collective(collective_id).collective_id
        current = await self._current_activity(collective_id, agent_id)
        if current is None:
            raise NotFoundError(
                f"agent_id: {agent_id!r} has no activity in collective {collective_id}; "
                "register_activity first"
            )
        spec = validated(
            models.ActivityIn, collective_id=collective_id, agent_id=agent_id,
            task_description=(
                current.task_description if task_description is None else task_description
            ),
            working_on=list(current.working_on if working_on is None else working_on),
        )  # fmt: skip
        event = ev.ActivityHeartbeat(
            **self._common(), collective_id=spec.collective_id, agent_id=spec.agent_id,
            started_ms=current.started_ms, task_description=spec.task_description,
            working_on=tuple(spec.working_on),
        )  # fmt: skip
        await self._append_activity(event)
        return _activity(event, current.started_ms)

    async def end_activity(self, collective_id: UUID, agent_id: str) -> None:
        """The agent stopped; it leaves the active agents at once."""
        spec = validated(models.ActivityIn, collective_id=collective_id, agent_id=agent_id)
        self._collective(spec.collective_id)
        await self._append_activity(
            ev.ActivityEnded(**self._common(), collective_id=spec.collective_id,
                             agent_id=spec.agent_id)
        )  # fmt: skip

    async def get_active_agents(
        self, collective_id: UUID, *, stale_after: float | None = None
    ) -> list[Activity]:
        """Agents of a collective whose last heartbeat is within ``stale_after`` seconds
        (default: the instance's setting, 5 minutes), most recent first."""
        window = self.settings.stale_after if stale_after is None else stale_after
        if not (math.isfinite(window) and window > 0):
            raise ValidationError(f"stale_after: must be > 0 seconds, got {stale_after}")
        cid = self._collective(collective_id).collective_id
        now_ms = int(time.time() * 1000)
        active = [
            a for a in await self._activities(cid) if now_ms - a.last_heartbeat_ms <= window * 1000
        ]
        active.sort(key=lambda a: (-a.last_heartbeat_ms, a.agent_id))
        return active

    async def _activities(self, collective_id: UUID | None) -> list[Activity]:
        """The last registration or heartbeat of every agent that has not ended."""
        found = []
        for entry in await self.log.latest_activities(collective_id):
            event = entry.event
            if isinstance(event, ev.ActivityHeartbeat):
                found.append(_activity(event, event.started_ms))
            elif isinstance(event, ev.ActivityRegistered):
                found.append(_activity(event, ev.hlc_millis(event.hlc)))
        return found

    async def _current_activity(self, collective_id: UUID, agent_id: str) -> Activity | None:
        for activity in await self._activities(_uuid("collective_id", collective_id)):
            if activity.agent_id == agent_id:
                return activity
        return None

    async def _append_activity(self, event: ev.Event) -> None:
        if self._closed:
            raise PulseError("the instance is closed")
        await self.log.append(event)

    # -- wisdom: per owner, across collectives ---------------------------------------------

    async def store_wisdom(
        self,
        owner_id: str,
        category: str,
        pattern: str,
        embedding: Sequence[float] | npt.NDArray[np.float32],
        *,
        confidence: float = 0.5,
        source_collectives: Sequence[UUID] = (),
        source_experience_count: int = 0,
        applicable_domains: Sequence[str] = (),
    ) -> UUID:
        """A pattern learned across an owner's collectives. All of one owner's wisdom
        shares one embedding dimension (the first stored sets it)."""
        spec = validated(
            models.WisdomIn, owner_id=owner_id, category=category, pattern=pattern,
            embedding=embedding, confidence=confidence,
            source_collectives=list(source_collectives),
            source_experience_count=source_experience_count,
            applicable_domains=list(applicable_domains),
        )  # fmt: skip
        for source in spec.source_collectives:
            found = queries.get_collective(self.projection, source)
            if found is None or found.owner_id != spec.owner_id:
                raise NotFoundError(
                    f"source_collectives: no collective {source} owned by {spec.owner_id!r}"
                )
        existing = queries.wisdom_of(self.projection, spec.owner_id)
        if existing and len(ev.unpack_vector(existing[0].embedding)) != len(spec.embedding):
            raise ValidationError(
                f"embedding: {len(spec.embedding)} values, the wisdom of {spec.owner_id!r} "
                f"has dimension {len(ev.unpack_vector(existing[0].embedding))}"
            )
        wisdom_id = uuid7()
        await self._write(
            ev.WisdomStored(
                **self._common(), wisdom_id=wisdom_id, owner_id=spec.owner_id,
                category=spec.category, pattern=spec.pattern, confidence=spec.confidence,
                embedding=ev.pack_vector(spec.embedding),
                source_collectives=tuple(spec.source_collectives),
                source_experience_count=spec.source_experience_count,
                applicable_domains=tuple(spec.applicable_domains),
            )
        )  # fmt: skip
        return wisdom_id

    async def get_wisdom(
        self,
        owner_id: str,
        query: Sequence[float] | npt.NDArray[np.float32] | None = None,
        k: int = 10,
    ) -> list[queries.ScoredWisdom]:
        """An owner's wisdom: nearest to ``query`` first, or all (oldest first, score 1)."""
        _text("owner_id", owner_id, models.NAME_MAX)
        _limit("k", k)
        if query is None:
            return [
                queries.ScoredWisdom(w, 1.0) for w in queries.wisdom_of(self.projection, owner_id)
            ][:k]
        vector = validated(models.SearchIn, collective_id=uuid7(), embedding=query).embedding
        assert vector is not None
        return queries.similar_wisdom(self.projection, owner_id, vector, k)

    async def delete_wisdom(self, wisdom_id: UUID) -> None:
        """Delete wisdom and forget it (idempotent, as every delete)."""
        await self._delete("wisdom", wisdom_id)

    # -- analytics -------------------------------------------------------------------------

    async def sql(self, query: str, *, limit: int = 10_000) -> SqlResult:
        """Run one read-only SQL query over the current state (DuckDB).

        The views are the analysts' contract: collectives, experiences, applications,
        relations, insights, insight_sources, wisdom, dead_letters, and activities (the
        latest activity of every agent, read from the activity stream for this query).
        Anything but a query is refused: the state changes only through events.
        """
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query: give one SQL query")
        _limit_rows(limit)
        analytics.check_read_only(query)
        live = {c.collective_id for c in queries.list_collectives(self.projection)}
        activities = [a for a in await self._activities(None) if a.collective_id in live]
        return await asyncio.to_thread(
            analytics.run, self.projection.store.con, query, activities, limit
        )

    # -- changes, state ----------------------------------------------------------------------

    def watch_experiences(self) -> ExperienceWatch:
        """Changes to experiences as this instance applies them, whichever host wrote them,
        from the moment of this call. Iterate it with ``async for``; it ends when the
        instance closes (or call ``close()`` on it)."""
        return ExperienceWatch(self._watchers)

    async def digest(self) -> str:
        """A hash of the logical state: equal on hosts that applied the same events."""
        return self.projection.digest()

    async def dead_letters(self) -> list[queries.DeadLetter]:
        """Events kept aside because they break an invariant of the folded state."""
        return queries.dead_letters(self.projection)


RRF_K = 60  # the usual Reciprocal Rank Fusion constant

DELETES = (ev.CollectiveDeleted, ev.ExperienceDeleted, ev.RelationDeleted, ev.InsightDeleted,
           ev.WisdomDeleted)  # fmt: skip
DELETES_OF: dict[str, Any] = {
    "experience": ev.ExperienceDeleted,
    "relation": ev.RelationDeleted,
    "insight": ev.InsightDeleted,
    "wisdom": ev.WisdomDeleted,
}


def _entity_of(event: ev.Event) -> tuple[str, UUID | None]:
    """The entity an event is about, and its id."""
    for entity in ("experience", "relation", "insight", "wisdom"):
        found = getattr(event, f"{entity}_id", None)
        if found is not None:
            return entity, found
    return "collective", getattr(event, "collective_id", None)


class Activity(msgspec.Struct, frozen=True, kw_only=True):
    collective_id: UUID
    agent_id: str
    task_description: str
    working_on: tuple[str, ...]
    started_ms: int
    last_heartbeat_ms: int


def _activity(event: ev.ActivityRegistered | ev.ActivityHeartbeat, started_ms: int) -> Activity:
    return Activity(
        collective_id=event.collective_id, agent_id=event.agent_id,
        task_description=event.task_description, working_on=event.working_on,
        started_ms=started_ms, last_heartbeat_ms=ev.hlc_millis(event.hlc),
    )  # fmt: skip


class Context(msgspec.Struct, frozen=True, kw_only=True):
    """What ``get_context_candidates`` returns; a switched-off part is empty."""

    collective_id: UUID
    similar: list[queries.ScoredExperience]
    recent: list[queries.Experience]
    insights: list[queries.ScoredInsight]
    relations: list[queries.Relation]
    active_agents: list[Activity]


def _uuid(field: str, value: Any) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise ValidationError(f"{field}: not a UUID: {value!r}") from None


def _limit_rows(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise ValidationError(f"limit: must be an integer in 1..1000000, got {value!r}")


def _limit(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= models.K_MAX:
        raise ValidationError(f"{field}: must be an integer in 1..{models.K_MAX}, got {value!r}")


def _text(field: str, value: str, limit: int) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= limit:
        raise ValidationError(f"{field}: must be 1..{limit} characters, got {value!r:.60}")

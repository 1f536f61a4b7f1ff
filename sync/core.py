"""What every part of an instance stands on: replication from the log into the engine,
waiting for a sequence to be applied (read-your-writes), and the write path.

Replication: a tail of the log from the engine's applied sequence hands every entry to
the projection engine (``projections.engine``) as it arrives; the engine applies
whatever has queued up as one batch and reports each batch back. Those reports advance
the applied sequence on the loop, wake the writers waiting for their own sequence,
feed the clock and the watchers. Nothing here calls DuckDB, FAISS or tantivy: reads go
to the engine thread with ``_read`` and are awaited.

The write path: validate against the local state, append to the log (acknowledged by
JetStream, or raise), wait until this host has applied the event, and forget a write
that landed after a concurrent delete.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import heapq
import itertools
import json
import logging
import math
import os
import time
import typing
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

import msgspec
import numpy as np
import numpy.typing as npt

from eventlog import EmbeddedNats, codec, subjects
from eventlog import events as ev
from eventlog.codec import encode_body
from eventlog.errors import (
    ConflictError,
    Forbidden,
    LogUnavailable,
    NotFollowed,
    NotFoundError,
    PulseError,
    ValidationError,
)
from eventlog.ids import uuid7
from eventlog.keys import Keyring
from eventlog.limits import CLOCK_AHEAD_MS
from eventlog.log import EventLog, LogEntry, key_conflict
from eventlog.sealing import SEALED_ENTITY, Sealer, tombstone_name, tombstone_scope
from projections import past, queries
from projections.engine import Applied, Engine
from projections.projection import entity_of
from projections.scope import Scope
from sync import access, embedders, idempotency, models
from sync.access import Principal, Viewer
from sync.hlc import MAX_AHEAD_MS, HybridClock, wall_ms
from sync.owed import OwedPurges
from sync.watch import ExperienceWatch, change_of

log = logging.getLogger("pulse.instance")

T = TypeVar("T")
P = ParamSpec("P")

# the stream sequence the reads of the call in progress answer as of (None: now)
_AS_OF: contextvars.ContextVar[int | None] = contextvars.ContextVar("pulse_as_of", default=None)
# ... and its time (Unix ms): what "true now" means in them
_AS_OF_MS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "pulse_as_of_ms", default=None
)


def as_of_read(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """A read that takes ``as_of`` (a stream sequence, or a time: Unix ms as a string of
    digits is a sequence, so a time is an ISO 8601 text or a ``datetime``): the method
    runs with every ``_read`` answered from the state as of then (``projections.past``).
    The method lists ``as_of`` in its signature (the HTTP API and the docs read it) and
    leaves it to this wrapper."""

    @functools.wraps(method)
    async def read(self: InstanceCore, *args: Any, as_of: Any = None, **kwargs: Any) -> T:
        async with self._at(as_of):
            return await method(self, *args, **kwargs)  # type: ignore[arg-type]

    return typing.cast(Callable[P, Awaitable[T]], read)


DELETES = (ev.CollectiveDeleted, ev.ExperienceDeleted, ev.RelationDeleted, ev.InsightDeleted,
           ev.WisdomDeleted, ev.SessionDeleted)  # fmt: skip
DELETES_OF: dict[str, Any] = {
    "experience": ev.ExperienceDeleted,
    "relation": ev.RelationDeleted,
    "insight": ev.InsightDeleted,
    "wisdom": ev.WisdomDeleted,
    "session": ev.SessionDeleted,
}
WRITTEN_MAX = 20_000  # own sealed writes remembered for the tail
BACKLOG_LIMIT = 50_000  # entries handed to the engine and not applied: the tail waits
KNOWN_MAX = 100_000  # remembered reference checks before the memo starts over
KEPT_ASIDE_MAX = 10_000  # recent dead letters remembered for the writers waiting on them


@dataclass(frozen=True, slots=True)
class InstanceSettings:
    """How an instance recalls: energy weighting of search results, and activity staleness."""

    energy_weight: float = 0.2  # 0: pure relevance; 1: relevance x energy
    half_life_days: float = 30.0  # energy halves this long after the last reinforcement
    boost_every: float = 5.0  # this many applications halve the distance of importance to 1
    stale_after: float = 300.0  # seconds without a heartbeat before an agent is not active
    # a search's score of an unstable experience (invalidated often) is multiplied by this
    unstable_weight: float = 0.5

    def __post_init__(self) -> None:
        if not (math.isfinite(self.energy_weight) and 0 <= self.energy_weight <= 1):
            raise ValidationError(f"energy_weight: must be in [0, 1], got {self.energy_weight}")
        if not (math.isfinite(self.unstable_weight) and 0 <= self.unstable_weight <= 1):
            raise ValidationError(f"unstable_weight: must be in [0, 1], got {self.unstable_weight}")
        for name in ("half_life_days", "boost_every", "stale_after"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValidationError(f"{name}: must be a finite number > 0, got {value}")


class InstanceCore:
    """The shared state of an instance's parts (see the module docstring)."""

    def __init__(
        self,
        data_dir: Path,
        log_: EventLog,
        engine: Engine,
        server: EmbeddedNats | None,
        *,
        max_hlc: int,
        settings: InstanceSettings | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log = log_
        self.engine = engine
        # seals what this host writes and opens what it reads (eventlog.sealing): the one
        # its engine caught up with, holding the keys it read
        self.sealer = engine.sealer or Sealer(Keyring(log_.key_store()))
        engine.sealer = self.sealer
        self.server = server
        self.instance_id = uuid7()
        self.clock = HybridClock(state_file=data_dir / "clock.json")
        self.clock.observe(max_hlc)
        self.owed = OwedPurges(data_dir / "owed-purges.json")
        self.settings = settings or InstanceSettings()
        self._loop = asyncio.get_running_loop()
        self._applied = engine.seq
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # a heap by seq
        self._tickets = itertools.count()
        self._watchers: set[ExperienceWatch] = set()
        # recent sequences of writes that landed after a tombstone of their collective or
        # entity (the engine tells) -> which: such a write is forgotten again
        self._landed_dead: dict[int, str] = {}
        self._kept_aside: dict[int, str] = {}  # recent sequences kept aside -> why
        # the latest time the stream stored a message this instance read (0: none yet): an
        # event's clock close enough to it is within the bound of any later one
        # (``_within_clock_bound``)
        self._log_ms = 0
        # answers of reference checks (collective by id, collective of an experience),
        # dropped whenever a collective changes or anything is deleted; a read that
        # began before such a change is not kept (the generation moved on)
        self._known: dict[tuple[str, UUID], Any] = {}
        self._generation = 0
        # this incarnation's acknowledged totals of the experiences it reinforced last, least
        # recently first (at most ``sync.experiences.OWN_MAX``; a miss reads the projection)
        self._own: OrderedDict[UUID, int] = OrderedDict()
        # the last idempotent calls served here: key -> (fingerprint, result) (sync.idempotency)
        self._idempotent: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        # one announcement in flight per experience (two concurrent calls must not both
        # announce the same total); different experiences go in parallel. An entry is
        # (lock, calls holding or waiting for it) and goes when the last of them is done.
        self._reinforce_locks: dict[UUID, tuple[asyncio.Lock, int]] = {}
        self._failure: BaseException | None = None
        self._closed = False
        self._owns_log = True
        self._loop_task: asyncio.Task[None] | None = None
        # who calls act for unless a call says otherwise (``acting_as``), and the access
        # tokens known here (read again when a batch applies a token event)
        self.principal = Principal.operator()
        self.access = access.Registry()
        self._tokens_stale = False
        self._token_reader: asyncio.Task[None] | None = None
        # what this host follows (None: every collective; ``sync.following``), the
        # directory of collectives it resolves references with, and the last sequence the
        # replication loop handed to the engine
        self.scope: Scope | None = None
        self._directory: Any = None  # a sync.following.Directory on a partial host
        self._directory_task: asyncio.Task[None] | None = None
        self._follow_lock = asyncio.Lock()
        self._submitted_seq = engine.seq
        # what this instance wrote sealed, by event id, until its tail brings it back (then
        # it is handed over as written, not decrypted again); the oldest go first
        self._own_sealed: dict[UUID, ev.Event] = {}
        self.backfilled = 0  # events of collectives followed later, read since open
        self._purging: set[asyncio.Future[None]] = set()  # copies forgotten (a leaf's)
        self._owed_lock = asyncio.Lock()  # one pass over the owed purges at a time
        engine.subscribe(self._on_applied)
        (data_dir / "identity.json").write_text(
            json.dumps(
                {
                    "instance_id": str(self.instance_id),
                    "pid": os.getpid(),
                    "started_ms": int(time.time() * 1000),
                }
            )  # fmt: skip
        )

    @property
    def applied_seq(self) -> int:
        """The last stream sequence this instance has applied."""
        return self._applied

    @property
    def events_applied(self) -> int:
        """Events the engine applied since open (a metric)."""
        return self.engine.events_applied

    # -- replication -----------------------------------------------------------------------

    def _filters(self) -> list[str] | None:
        """The subjects this host reads (None: all of them)."""
        return None if self.scope is None else self.scope.filters()

    def _start_replication(self, from_seq: int | None = None) -> None:
        """Tail the log from ``from_seq`` (default: past what the engine applied)."""
        self._loop_task = asyncio.create_task(self._replicate(from_seq), name="pulse-replication")

    async def _stop_replication(self) -> None:
        if self._loop_task is not None:
            for _ in range(40):  # cancel until it takes (see eventlog.jetstream)
                self._loop_task.cancel()
                done, _ = await asyncio.wait({self._loop_task}, timeout=0.25)
                if done:
                    break
            self._loop_task = None

    def _forget_known(self) -> None:
        """Drop the remembered reference checks (what they answered may have changed)."""
        self._known.clear()
        self._generation += 1

    async def _replicate(self, from_seq: int | None = None) -> None:
        try:
            start = self.engine.seq + 1 if from_seq is None else from_seq
            tail = self.log.tail(start, subjects=self._filters())
            async for entry in tail:
                if entry.stored_ms is not None and entry.stored_ms > self._log_ms:
                    self._log_ms = entry.stored_ms  # (the writer's own events come back too)
                if entry.seq <= self.engine.seq:
                    continue  # a writer here handed it over already: no need to wake the engine
                if isinstance(entry.event, ev.Sealed):
                    entry = await self._opened(entry)
                self.engine.submit((entry,))
                self._submitted_seq = submitted = entry.seq
                if self.engine.backlog > BACKLOG_LIMIT:  # let the engine catch its breath
                    await self._wait_applied(submitted - BACKLOG_LIMIT // 2, timeout=600)
            raise LogUnavailable("the log tail ended")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # keep the reason; waiters raise it
            log.exception("replication stopped")
            self._failure = exc
            self._wake_all()

    async def _opened(self, entry: LogEntry) -> LogEntry:
        """A sealed entry of the tail, opened: a write of this instance comes back as the
        event it wrote (no decryption); another host's is opened with its key."""
        assert entry.event is not None
        own = self._own_sealed.pop(entry.event.event_id, None)
        if own is not None:
            return LogEntry(entry.seq, entry.subject, own, None, entry.stored_ms)
        (opened,) = await self.sealer.open((entry,))
        return opened

    def _sealed_writing(self, events: Sequence[ev.Event]) -> None:
        """Remember what this instance is about to write sealed, by event id, for its
        tail (``_opened``): the tail may bring an event back before its append returns."""
        written = self._own_sealed
        for event in events:
            if ev.event_type_name(event) in SEALED_ENTITY:
                written[event.event_id] = event
        while len(written) > WRITTEN_MAX:
            del written[next(iter(written))]

    def _on_applied(self, applied: Applied) -> None:
        """Called on the engine thread after every batch: hand the news to the loop."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._applied_on_loop, applied)

    def _applied_on_loop(self, applied: Applied) -> None:
        self._applied = max(self._applied, applied.seq)
        if applied.kept_aside:
            self._kept_aside.update(applied.kept_aside)
            while len(self._kept_aside) > KEPT_ASIDE_MAX:
                del self._kept_aside[next(iter(self._kept_aside))]
        if applied.landed_dead:
            self._landed_dead.update(applied.landed_dead)
            while len(self._landed_dead) > KEPT_ASIDE_MAX:
                del self._landed_dead[next(iter(self._landed_dead))]
        latest = 0
        trusted = ev.pack_hlc(wall_ms() + MAX_AHEAD_MS, ev.HLC_LOGICAL_MAX)
        for entry in applied.entries:
            event = entry.event
            if event is None or entry.seq in applied.kept_aside:
                continue  # a dead letter changes nothing here either
            if latest < event.hlc <= trusted:  # the clock takes in none further ahead
                latest = event.hlc
            if isinstance(event, (*DELETES, ev.CollectiveCreated)):
                self._forget_known()
                self.sealer.forget(event)
                if isinstance(event, DELETES) and event.instance_id != self.instance_id:
                    self._purge_copy(event, entry.seq)
            elif isinstance(event, (ev.TokenCreated, ev.TokenRevoked)):
                self._tokens_stale = True
            if self._watchers:
                change = change_of(entry)
                if change is not None:
                    for watcher in list(self._watchers):
                        watcher.offer(change)
        if latest:
            self.clock.observe(latest)
        if self._tokens_stale and self._token_reader is None:
            self._token_reader = asyncio.ensure_future(self._read_tokens())
        while self._waiters and self._waiters[0][0] <= self._applied:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    def _purge_copy(self, event: ev.Event, seq: int) -> None:
        """Another host deleted: forget this host's own copy of the log's messages too,
        where it has one (a leaf's streams: ``EventLog.purge_copy``), in the background;
        a failure is logged (its next delete of the subject, or a rebuild, redoes it)."""
        if type(self.log).purge_copy is EventLog.purge_copy:
            return  # one shared stream: the deleting host purged it
        if isinstance(event, ev.CollectiveDeleted):
            subject = f"{subjects.PREFIX}.c.{event.collective_id}.>"
        else:
            subject = subjects.subject_for(event)
        name, prefix = tombstone_scope(event) or (None, None)
        keys = functools.partial(self.sealer.keyring.destroy_copies, name, prefix=prefix)

        async def purge() -> None:
            try:
                await self.log.purge_copy(subject, before_seq=seq)
                await keys()
            except Exception:
                log.warning("forgetting this host's copy of %s failed", subject, exc_info=True)

        task = asyncio.ensure_future(purge())
        self._purging.add(task)
        task.add_done_callback(self._purging.discard)

    async def _read_tokens(self) -> None:
        """Read the tokens again until no token event applied meanwhile."""
        try:
            while self._tokens_stale and not self._closed:
                self._tokens_stale = False
                self.access.replace(await self._read(queries.tokens))
        except Exception:  # the engine closed under it, or failed: its waiters will hear
            log.debug("reading the access tokens failed", exc_info=True)
        finally:
            self._token_reader = None

    async def _load_tokens(self) -> None:
        """Bring the registry up to what is applied now (the token writers wait on it)."""
        self._tokens_stale = False
        self.access.replace(await self._read(queries.tokens))

    # -- who acts ----------------------------------------------------------------------------

    def _me(self) -> Principal:
        """The principal of the call in progress (``acting_as``), else the instance's."""
        return access.ACTING.get() or self.principal

    def principal_of(self, token: str) -> Principal:
        """The principal of an access token (Unauthorized when it is not a live one)."""
        return self.access.resolve(token)

    async def _readable(self, collective_id: Any) -> tuple[queries.Collective, Viewer | None]:
        """A collective the caller may read, and the filter of what it sees in it (None:
        everything). One that holds nothing it may see does not exist for it."""
        collective = await self._collective(collective_id)
        viewer = access.viewer_of(self._me(), collective.owner_id, collective.collective_id)
        if viewer is not None and not viewer.member:
            if not await self._read(queries.shows_anything, collective.collective_id, viewer):
                raise self._missing(f"collective_id: no collective {collective_id}")
        return collective, viewer

    async def _writable(self, collective_id: Any) -> queries.Collective:
        """A collective the caller may write to: a member with a write scope."""
        collective = await self._collective(collective_id)
        me = self._me()
        if not me.member(collective.owner_id, collective.collective_id):
            viewer = access.viewer_of(me, collective.owner_id, collective.collective_id)
            assert viewer is not None
            if await self._read(queries.shows_anything, collective.collective_id, viewer):
                raise Forbidden(
                    f"collective_id: {me.describe()} is not a member of collective "
                    f"{collective.name!r}"
                )
            raise self._missing(f"collective_id: no collective {collective_id}")
        me.need_write()
        return collective

    async def _entity(
        self, entity: str, entity_id: Any, *, write: bool, field: str | None = None
    ) -> UUID | None:
        """Check the caller may see (and with ``write``, change) a live experience,
        relation, insight or wisdom; returns its collective (None for wisdom). One it may
        not see does not exist for it. ``field``: the argument named in errors."""
        field = field or f"{entity}_id"
        key = uuid_of(field, entity_id)
        me = self._me()
        if me.admin and entity == "experience":
            return await self._collective_of(key, field)  # (remembered: the hot path)
        facts = await self._read(queries.access_of, entity, key)
        if facts is None:
            if entity == "wisdom":  # (every host holds every wisdom)
                raise NotFoundError(f"{field}: no {entity} {entity_id}")
            raise self._missing(f"{field}: no {entity} {entity_id}")
        if entity == "wisdom":
            member = me.admin or facts.owner_id == me.owner
            visible = me.sees_wisdom(
                facts.visibility, facts.owner_id, facts.author_owner, facts.author_agent
            )
        else:
            member = me.member(facts.owner_id, facts.collective_id)
            visible = me.sees(facts.visibility, member, facts.author_owner, facts.author_agent)
        if not visible:  # (as one that never existed here)
            if entity == "wisdom":
                raise NotFoundError(f"{field}: no {entity} {entity_id}")
            raise self._missing(f"{field}: no {entity} {entity_id}")
        if write:
            if not member:
                raise Forbidden(f"{field}: {me.describe()} may not change {entity} {key}")
            me.need_write()
        return facts.collective_id

    def _wake_all(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    async def _wait_applied(self, seq: int, timeout: float = 60.0) -> None:
        if self._applied < seq and self._failure is None and not self._closed:
            future: asyncio.Future[None] = self._loop.create_future()
            heapq.heappush(self._waiters, (seq, next(self._tickets), future))
            try:
                async with asyncio.timeout(timeout):  # not wait_for: see jetstream._pull
                    await future
            except TimeoutError:
                raise LogUnavailable(
                    f"the local state did not reach stream sequence {seq} within "
                    f"{timeout:g} s (it is at {self._applied})"
                ) from None
        if self._failure is not None:
            raise PulseError(f"replication stopped: {self._failure!r}") from self._failure
        if self._applied < seq:
            raise PulseError("the instance is closed")

    async def sync(self, timeout: float = 60.0) -> int:
        """Wait until the local state has applied everything the stream holds now (and
        the access tokens here are read again from it); returns that stream sequence to
        an admin, 0 to any other caller (a sequence counts every host's writes, those it
        may not see among them)."""
        target = await self.log.last_seq(self._filters())
        await self._wait_applied(target, timeout)
        if self._token_reader is not None:
            await asyncio.shield(self._token_reader)
        if self._tokens_stale:
            await self._load_tokens()
        return target if self._me().admin else 0

    # -- reads: on the engine thread -------------------------------------------------------

    async def _read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a read (``fn(projection, *args, **kwargs)``, e.g. a ``projections.queries``
        function) on the engine thread and await it; as of a moment inside ``_at``."""
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        as_of = _AS_OF.get()
        if as_of is not None:
            return await self.engine.run(past.read_as_of, as_of, fn, *args)
        return await self.engine.run(fn, *args)

    @contextlib.asynccontextmanager
    async def _at(self, as_of: Any) -> AsyncIterator[int | None]:
        """Reads inside answer as of ``as_of`` (None: now); yields the sequence."""
        found = None if as_of is None else await self._as_of_seq(as_of)
        if found is None:
            yield None
            return
        seq, ms = found
        if ms is None:  # a sequence: the time of its latest event
            ms = await self.engine.run(past.moment_of, seq)
        token, token_ms = _AS_OF.set(seq), _AS_OF_MS.set(ms)
        try:
            yield seq
        finally:
            _AS_OF.reset(token)
            _AS_OF_MS.reset(token_ms)

    async def _as_of_seq(self, as_of: Any) -> tuple[int, int | None] | None:
        """The stream sequence of a moment, and its time when a time was given (None:
        now). A sequence this host has not applied yet is waited for; one past the end
        of the log is refused. A time is the last sequence written at or before it
        (``projections.past.sequence_at``), once this host has applied what the log
        holds."""
        kind, value = models.as_of_value(as_of)
        if kind == "seq":
            if not self._me().admin:  # (what is at a sequence tells how many came before)
                raise Forbidden(
                    f"as_of: a stream sequence counts every host's writes, those "
                    f"{self._me().describe()} may not see among them; give a time (ISO 8601)"
                )
            if value > self._applied:
                last = await self.log.last_seq()
                if value > last:
                    raise ValidationError(
                        f"as_of: sequence {value} is past the end of the log (it holds "
                        f"up to {last})"
                    )
                # (a host that follows some collectives waits for the last of their
                # events up to there: it never applies the others)
                if self.scope is not None:
                    await self._wait_applied(min(value, await self.log.last_seq(self._filters())))
                else:
                    await self._wait_applied(value)
            return value, None
        if value >= wall_ms():
            return None  # now, or a moment still to come: the state now
        await self.sync()
        return await self.engine.run(past.sequence_at, value), value

    # -- the write path --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PulseError("the instance is closed")

    async def _write(self, event: ev.Event) -> int:
        self._check_open()
        call = idempotency.CURRENT.get()
        first = None
        if call is None:  # what the log holds: its text encrypted (a new entity's key is
            # made here, and stored as the event is appended)
            (wire,), fresh = await self.sealer.seal_fresh((event,))
            self._sealed_writing((event,))
            seq = await self._with_keys(fresh, self.log.append(wire))
        else:  # a retry within the duplicate window finds the first copy: nothing new
            wire = await self.sealer.seal(event)
            seq, first = await self.log.append_keyed(wire, call.fingerprint)
        if first is None and self._within_clock_bound((event,)):
            self.engine.offer((LogEntry(seq, subjects.subject_for(event), event),))
        await self._wait_applied(seq)
        self._check_not_kept_aside(seq)
        await self._forget_if_deleted(event, seq)
        return seq

    async def _with_keys(self, keys: dict[str, bytes], appending: Awaitable[T]) -> T:
        """Await an append while the data keys its events were sealed with are stored
        (at once: a reader that gets an event first waits for its key). Once appended,
        the keys must be stored too: asked again within the key store's budget, then
        the write fails (and its events stay unreadable: a dead letter on every host,
        this one too, as nothing was offered)."""
        if not keys:
            return await appending
        store = self.sealer.keyring.store
        storing = asyncio.ensure_future(store.put_fresh(keys))
        await asyncio.sleep(0)  # its publish goes out first: the key usually reaches a
        try:  # reader before the event does
            done = await appending
        except BaseException:
            await asyncio.gather(storing, return_exceptions=True)  # (harmless: unused)
            raise
        try:
            await storing
        except Exception:
            try:
                await store.put_fresh(keys)
            except Exception as exc:
                for name in keys:
                    self.sealer.keyring.forget(name)
                raise LogUnavailable(
                    f"the event was stored but the key store did not take its data key "
                    f"({exc!r}); it cannot be read"
                ) from exc
        return done

    def _within_clock_bound(self, events: Sequence[ev.Event]) -> bool:
        """Whether every host will read these events as this one would: their clocks are
        within the bound of a time the stream already reached, so of the time it stored
        them. Only then may a writer hand its engine its own events (the fast path of
        read-your-writes); otherwise they come back through the tail, stamped with the
        stream's time, and are judged as every host judges them (a host whose clock runs
        too fast sees its write kept aside and raise). Half the bound is kept in reserve:
        the stream's time is its leader's clock, and after a leader change it may stand
        behind what this host saw (cluster nodes' clocks differ by far less)."""
        bound = self._log_ms + CLOCK_AHEAD_MS // 2
        return all(ev.hlc_millis(e.hlc) <= bound for e in events)

    def _check_not_kept_aside(self, *seqs: int) -> None:
        """A write stored but set aside by the fold (as every host will) is not a success."""
        for seq in seqs:
            reason = self._kept_aside.get(seq)
            if reason is not None:
                raise PulseError(
                    f"the event stored at sequence {seq} was kept aside as a dead letter "
                    f"by every host: {reason}"
                )

    async def _write_many(self, events: Sequence[ev.Event], *, atomic: bool = False) -> list[int]:
        """Append events as one batch (``atomic``: committed together, see
        ``EventLog.append_batch``); return their sequences once applied here."""
        self._check_open()
        call = idempotency.CURRENT.get()
        if call is not None:  # one by one, each deduplicated (see sync.idempotency)
            wires = await self.sealer.seal_many(events)
            stored = await asyncio.gather(
                *(self.log.append_keyed(e, call.fingerprint) for e in wires)
            )
            seqs, fresh = [s for s, _ in stored], all(first is None for _, first in stored)
        else:
            wires, keys = await self.sealer.seal_fresh(events)
            self._sealed_writing(events)
            seqs = await self._with_keys(keys, self.log.append_batch(wires, atomic=atomic))
            fresh = True
        if (
            fresh
            and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            and self._within_clock_bound(events)
        ):  # contiguous, and certain to be read alike: offer them
            self.engine.offer(
                [LogEntry(s, subjects.subject_for(e), e) for s, e in zip(seqs, events, strict=True)]
            )
        await self._wait_applied(max(seqs))
        self._check_not_kept_aside(*seqs)
        refusals = [await self._forget(event, seq) for event, seq in zip(events, seqs, strict=True)]
        refused = [r for r in refusals if r is not None]
        if refused:  # every one of them forgotten first, then the caller hears of it
            more = f" (and {len(refused) - 1} more of the batch)" if len(refused) > 1 else ""
            raise NotFoundError(refused[0] + more)
        return seqs

    async def _forget_if_deleted(self, event: ev.Event, seq: int) -> None:
        """A write checked against a state that did not have a concurrent delete yet lands
        after the tombstone: it must not keep deleted content in the log. Forget it (and
        say so); every host's fold already ignores it."""
        refusal = await self._forget(event, seq)
        if refusal is not None:
            raise NotFoundError(refusal)

    async def _forget(self, event: ev.Event, seq: int) -> str | None:
        """Forget ``event`` if it landed after a tombstone of its collective or entity;
        returns why (for the caller's error), or None when it stands."""
        landed = self._landed_dead.pop(seq, None)
        if landed is None:
            return None
        collective_id = getattr(event, "collective_id", None)
        entity, entity_id = entity_of(event)
        if landed == "collective":
            subject = subjects.subject_for(event)
            token = self.owed.owe({"purge": subject, "before_seq": seq + 1})
            await self.log.purge(subject, before_seq=seq + 1)
            self.owed.paid(token)
            return f"collective_id: collective {collective_id} was deleted"
        await self._delete(entity, entity_id)  # a new tombstone, purging the write
        return f"{entity}_id: {entity} {entity_id} was deleted"

    def _common(self) -> dict[str, Any]:
        me = self._me()
        return {"event_id": self._new_id(), "instance_id": self.instance_id,
                "hlc": self.clock.now(), "author_owner": me.owner,
                "author_agent": me.agent}  # fmt: skip

    def _new_id(self) -> UUID:
        """A new id for an event or entity: random, or derived from the idempotency key
        of the call in progress (``sync.idempotency``)."""
        call = idempotency.CURRENT.get()
        return uuid7() if call is None else call.next_id()

    def _remember(self, key: str, fingerprint: str, result: Any) -> None:
        self._idempotent[key] = (fingerprint, result)
        self._idempotent.move_to_end(key)
        while len(self._idempotent) > idempotency.REMEMBERED:
            self._idempotent.popitem(last=False)

    @staticmethod
    def _key_conflict() -> ConflictError:
        return key_conflict("")

    async def _tombstone(self, event: ev.Event, forget: str, token: str | None = None) -> None:
        """Append a tombstone, wait until it is applied here, then purge everything before
        it on ``forget`` (a subject, wildcards allowed) from the stream: forgetting. The
        purge is recorded as owed before the tombstone is appended (``sync.owed``);
        ``token``: the record of an owed purge this finishes."""
        if token is None:
            token = self.owed.owe(
                {"tombstone": encode_body(event).hex(), "schema": codec.SCHEMA_VERSION,
                 "forget": forget}
            )  # fmt: skip
        seq = await self._write(event)
        name = tombstone_name(event)
        try:
            if name is not None:  # every copy of its sealed events is noise from here on
                await self.sealer.keyring.destroy(name)
        finally:  # (an edge host's offline delete: its own copies go even so; owed: the hub's)
            await self.log.purge(forget, before_seq=seq)
        self.owed.paid(token)

    async def _delete(self, entity: str, entity_id: Any) -> None:
        """Tombstone an entity that exists or was deleted here, and forget it."""
        key = uuid_of(f"{entity}_id", entity_id)
        anchor = await self._read(queries.anchor_of, entity, key)
        if anchor is None:
            raise NotFoundError(f"{entity}_id: no {entity} {entity_id}")
        anchor_field = "owner_id" if entity == "wisdom" else "collective_id"
        event = DELETES_OF[entity](**self._common(), **{f"{entity}_id": key, anchor_field: anchor})
        await self._tombstone(event, subjects.subject_for(event))

    # -- checks shared by the parts ---------------------------------------------------------

    async def _known_or_read(self, kind: str, key: UUID, fn: Callable[..., T]) -> T | None:
        """``fn(projection, key)``, remembered while nothing that could change it applies."""
        if _AS_OF.get() is not None:  # (what is remembered is the present)
            return await self._read(fn, key)
        found = self._known.get((kind, key))
        if found is None:
            generation = self._generation
            found = await self._read(fn, key)
            if found is not None and generation == self._generation:
                if len(self._known) >= KNOWN_MAX:
                    self._known.clear()
                self._known[(kind, key)] = found
        return found

    async def _collective(self, collective_id: Any) -> queries.Collective:
        key = uuid_of("collective_id", collective_id)
        found = await self._known_or_read("collective", key, queries.get_collective)
        if found is None:
            known = self._directory.collectives.get(key) if self.scope is not None else None
            if known is not None and self._me().member(known[0], key):
                raise self._not_followed(key)  # it exists: elsewhere (sync.following)
            # (to others, whether it exists elsewhere would tell what they may not see)
            raise self._missing(f"collective_id: no collective {collective_id}")
        return found

    def _not_followed(self, collective_id: UUID) -> NotFollowed:
        """A collective this host does not follow (a partial host: ``sync.following``)."""
        assert self.scope is not None
        return NotFollowed(
            f"collective_id: collective {collective_id} is not followed by this host (it "
            f"follows {self.scope.describe()})"
        )

    async def _collective_of(self, experience_id: Any, field: str = "experience_id") -> UUID:
        """The collective of a live experience; NotFoundError when there is none."""
        key = uuid_of(field, experience_id)
        found = await self._known_or_read("experience", key, queries.live_collective_of)
        if found is None:
            raise self._missing(f"{field}: no experience {experience_id}")
        return found

    async def _admit_collective(self, collective_id: UUID, owner_id: str, name: str) -> None:
        """Before this host creates a collective (``sync.following`` refuses one outside
        what it follows)."""

    def _missing(self, message: str) -> NotFoundError:
        """What is not found here; on a host that follows some collectives, the message
        says which (what it looked for may be in another)."""
        if self.scope is None:
            return NotFoundError(message)
        return NotFoundError(
            f"{message} in the collectives this host follows ({self.scope.describe()})"
        )

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
            if collective.embedder and not text:
                raise ValidationError(f"{field}: give a vector or a text to embed")
            return (await self._embed(collective, [text or ""], field=field, query=query))[0]
        check_vector(collective, given, embedder, field)
        return given

    async def _embed(
        self,
        collective: queries.Collective,
        texts: Sequence[str],
        *,
        field: str = "embedding",
        query: bool = False,
    ) -> list[npt.NDArray[np.float32]]:
        """The collective's embedder applied to texts, off the loop (one call for all)."""
        if not collective.embedder:
            raise ValidationError(
                f"{field}: required, collective {collective.name!r} has no embedder "
                "(create a collective with an embedder, e.g. 'hash', to send text only)"
            )
        model = embedders.embedder(collective.embedder, collective.embedding_dimension)
        inline = sum(map(len, texts)) <= getattr(model, "inline_chars", 0)
        if query:
            made = [
                model.embed_query(texts[0])
                if inline
                else await asyncio.to_thread(model.embed_query, texts[0])
            ]
        elif inline:
            made = list(model.embed_documents(list(texts)))
        else:
            made = list(await asyncio.to_thread(model.embed_documents, list(texts)))
        return [np.asarray(m, dtype=np.float32) for m in made]

    def _filter(self, flt: Any, viewer: Viewer | None = None) -> queries.ExperienceFilter:
        """The filter of a read, and with ``viewer`` what the caller may see."""
        found = self._given_filter(flt)
        moment = _AS_OF_MS.get()
        if moment is not None and found.at_ms is None:  # as of a moment: "true then"
            found = msgspec.structs.replace(found, at_ms=moment)
        return found if viewer is None else msgspec.structs.replace(found, viewer=viewer)

    @staticmethod
    def _moment() -> int | None:
        """The time of the moment the reads in progress answer as of (None: now)."""
        return _AS_OF_MS.get()

    def _given_filter(self, flt: Any) -> queries.ExperienceFilter:
        if flt is None:
            return queries.ANY_LIVE
        if isinstance(flt, queries.ExperienceFilter):
            return flt
        model = (
            flt if isinstance(flt, models.FilterIn) else models.validated(models.FilterIn, **flt)
        )
        return queries.ExperienceFilter(
            domains=tuple(model.domains) if model.domains is not None else None,
            experience_types=(
                tuple(model.experience_types) if model.experience_types is not None else None
            ),
            min_importance=model.min_importance,
            min_confidence=model.min_confidence,
            since_ms=model.since_ms,
            include_archived=model.include_archived,
            include_invalid=model.include_invalid,
            valid_at_ms=model.valid_at,
        )

    @property
    def _energy_settings(self) -> dict[str, float]:
        return {
            "half_life_days": self.settings.half_life_days,
            "boost_every": self.settings.boost_every,
        }


def check_vector(
    collective: queries.Collective,
    given: npt.NDArray[np.float32],
    embedder: str | None,
    field: str = "embedding",
) -> None:
    """A caller's vector must come from the collective's embedder and fit its dimension."""
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


def uuid_of(field: str, value: Any) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise ValidationError(f"{field}: not a UUID: {value!r}") from None


def check_rows_limit(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise ValidationError(f"limit: must be an integer in 1..1000000, got {value!r}")


def check_limit(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= models.K_MAX:
        raise ValidationError(f"{field}: must be an integer in 1..{models.K_MAX}, got {value!r}")


def check_text(field: str, value: str, limit: int) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= limit:
        raise ValidationError(f"{field}: must be 1..{limit} characters, got {value!r:.60}")

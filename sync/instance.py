"""The instance: one host's member of the shared memory, and the facade of its API.

``PulseDB.open(data_dir, nats_url=None)`` owns a data directory (the projection, the
clock, the identity of this incarnation), connects to the log (an embedded nats-server
unless a URL is given), starts the projection engine (``projections.engine``: one
thread owning DuckDB, FAISS and tantivy), catches up, and keeps a replication loop
running that hands every event from every host to the engine. A write is validated
against the local state, appended to the log, and returns once the engine has applied
it (read-your-writes); ``sync()`` waits until the local state has caught up with the
whole stream.

The instance is built by composition, wired in one place (``PulseDB.__init__``):

- ``sync.replication.Replication``: the tail, the applied sequence, its waiters;
- ``sync.reading.Reader``: reads on the engine thread, as of now or a past moment;
- ``sync.gate.Gate``: who acts, and what it may see and change;
- ``sync.writer.Writer``: the write path (append, read-your-writes, idempotency,
  tombstones);
- the domain services, each with its own state and the collaborators it is given:
  ``sync.experiences.Experiences`` (collectives and experiences), ``sync.recall.Recall``,
  ``sync.links.Links`` (relations and insights), ``sync.forgetting.Forgetting``,
  ``sync.sessions.Sessions``, ``sync.presence.Presence``, ``sync.wisdom.Wisdom``,
  ``sync.tokens.Tokens``, ``sync.following.Following``, ``sync.watch.Watching`` and
  ``sync.host.Host`` (sync, status, digest, dead letters, SQL).

``PulseDB`` itself only opens, closes, exports and answers ``health()``; every operation
of the API (``sync.api.OPERATIONS``) is a ``Delegate`` to the service that implements
it. The delegates are spelled out below, one typed line each, rather than generated
from the declaration in a loop: a loop would hide every method from mypy (and from the
editors), while a descriptor keeps the implementation's own signature, annotations and
docstring for ``inspect``, ``typing.get_type_hints`` and ``help()``. A test holds the
two to each other: the facade's delegates are exactly the declared operations.

Every call acts for a principal (``sync.access``): the one given to ``open``, or the
one of ``acting_as``; the local operator by default.

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
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload
from uuid import UUID

import msgspec

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog.errors import PulseError, Unauthorized, ValidationError
from eventlog.ids import uuid7
from eventlog.keys import Keyring
from eventlog.leaf import LeafLog
from eventlog.log import EventLog
from eventlog.partitioned import LocalLog
from eventlog.sealing import Sealer
from projections import queries
from projections.engine import Engine
from projections.projection import Projection, ProjectionSettings, state_dir
from projections.scope import Scope
from projections.snapshot import SnapshotStatus
from sync import access
from sync.access import Principal
from sync.core import InstanceSettings
from sync.experiences import Experiences
from sync.following import Following, open_scope
from sync.forgetting import Forgetting
from sync.gate import Acting, Gate
from sync.hlc import HybridClock
from sync.host import CollectiveStatus, Host, HostStatus
from sync.links import Links
from sync.owed import OwedPurges
from sync.presence import Activity, Presence
from sync.reading import Reader
from sync.recall import Context, Recall
from sync.replication import Replication
from sync.sessions import ResumedSession, Sessions
from sync.threads import Threads
from sync.tokens import NewToken, Token, Tokens
from sync.watch import ExperienceChange, ExperienceWatch, Watching
from sync.wisdom import Wisdom
from sync.writer import Writer

__all__ = [
    "Activity",
    "CollectiveStatus",
    "Context",
    "ExperienceChange",
    "ExperienceWatch",
    "Health",
    "HostStatus",
    "InstanceSettings",
    "NewToken",
    "Principal",
    "PulseDB",
    "ResumedSession",
    "Token",
]


_log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


class Delegate(Generic[P, R]):
    """An operation of the facade: ``method`` of the service in attribute ``service``.
    On the class it is the implementation itself (its signature, annotations and
    docstring); on an instance, the service's bound method."""

    def __init__(self, service: str, method: Callable[Concatenate[Any, P], Awaitable[R]]) -> None:
        self.service, self.method = service, method
        self.__doc__ = method.__doc__
        self.__wrapped__ = method

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.method.__name__:
            raise TypeError(f"{name}: delegates to {self.method.__qualname__}")
        self.name = name

    @overload
    def __get__(
        self, instance: None, owner: type | None = None
    ) -> Callable[Concatenate[Any, P], Awaitable[R]]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> Callable[P, Awaitable[R]]: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> Any:
        if instance is None:
            return self.method
        found: Callable[P, Awaitable[R]] = getattr(getattr(instance, self.service), self.name)
        return found


class Health(msgspec.Struct, frozen=True, kw_only=True):
    """What ``PulseDB.health`` answers (``/health``): what this host knows of itself
    without asking the log."""

    nats_connected: bool  # the log's connection (True for a log without one)
    replicating: bool  # False: the replication loop stopped
    failure: str | None  # why it stopped (None: it did not)
    applied_seq: int  # the last stream sequence this host applied
    instance_id: UUID
    snapshot: SnapshotStatus | None  # the analysts' copy (``projections.snapshot``)
    # why DuckDB refuses the state's writes (None: it does not); the engine keeps what
    # it could not write and tries again, and the log holds everything past DuckDB
    duckdb_writer_error: str | None = None


class PulseDB:
    """One instance; see the module docstring. Use ``await PulseDB.open(...)``."""

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
        """Wire the parts of an instance (``attach`` opens one; see the module docstring)."""
        self.data_dir, self.log, self.engine, self.server = data_dir, log_, engine, server
        # seals what this host writes and opens what it reads (eventlog.sealing): the one
        # its engine caught up with, holding the keys it read
        self.sealer = engine.sealer or Sealer(Keyring(log_.key_store()))
        engine.sealer = self.sealer
        self.instance_id = uuid7()
        self.clock = HybridClock(state_file=data_dir / "clock.json")
        self.clock.observe(max_hlc)
        self.owed = OwedPurges(data_dir / "owed-purges.json")
        self.settings = settings or InstanceSettings()
        self._owns_log = True
        # the machinery
        self.acting = acting = Acting()
        self.replication = replication = Replication(
            log_, engine, self.sealer, self.clock, self.instance_id, self._filters
        )
        self.reads = reads = Reader(engine, log_, replication, acting.me, self._sync, self._partial)
        self.gate = gate = Gate(reads, acting, self._scope, self._known)
        self.writer = writer = Writer(
            log_, engine, self.sealer, self.clock, self.instance_id, replication, reads,
            self.owed, acting.me,
        )  # fmt: skip
        # the domain services
        self.follower = following = Following(replication, engine, log_, gate)
        self.tokens = tokens = Tokens(reads, gate, writer)
        self.presence = presence = Presence(gate, writer, log_, self.settings)
        self.experiences = Experiences(reads, gate, writer, following)
        self.recall = recall = Recall(reads, gate, self.settings, presence)
        self.links = Links(reads, gate, writer)
        self.sessions = Sessions(reads, gate, writer, recall)
        self.threads = Threads(reads, gate, writer)
        self.wisdom = Wisdom(reads, gate, writer)
        self.forgetting = Forgetting(reads, gate, writer, log_, engine, self._sync)
        self.watching = watching = Watching(reads, gate)
        self.host = Host(
            log_, engine, replication, reads, gate, following, tokens, presence, self.instance_id
        )
        replication.listen(gate.applied)
        replication.listen(self.threads.applied)
        replication.listen(tokens.applied, tokens.after_batch)
        replication.listen(watching.applied)
        (data_dir / "identity.json").write_text(
            json.dumps(
                {
                    "instance_id": str(self.instance_id),
                    "pid": os.getpid(),
                    "started_ms": int(time.time() * 1000),
                }
            )  # fmt: skip
        )

    # (what the parts are given of each other, late bound: following sets its scope on open)
    def _filters(self) -> list[str] | None:
        return self.follower.filters()

    def _scope(self) -> Scope | None:
        return self.follower.scope

    def _partial(self) -> bool:
        return self.follower.scope is not None

    def _known(self) -> dict[UUID, tuple[str, str]]:
        return self.follower.known()

    async def _sync(self) -> int:
        return await self.host.sync()

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
        nats_credentials: str | os.PathLike[str] | None = None,
        nats_ca: str | os.PathLike[str] | None = None,
        principal: Principal | str | None = None,
        collectives: Sequence[str | UUID] | str | None = None,
        leaf_of: str | None = None,
        hub_domain: str = "hub",
        leaf_ca: str | os.PathLike[str] | None = None,
    ) -> PulseDB:
        """Open (or create) an instance on ``data_dir``; embedded NATS unless ``nats_url``.
        ``leaf_of``: an edge host: its embedded NATS runs as a leaf node of the hub at that
        leafnode URL (``nats-leaf://leaf:PASSWORD@hub:7422``; ``leaf_ca``: the CA of its
        TLS), whose JetStream domain is ``hub_domain``; it takes writes while the link is
        down and converges when it returns (``eventlog.leaf``).
        ``collectives``: follow only these (ids, names, ``owner:<owner id>``; see
        ``sync.following``); None: what the data directory followed before (every
        collective, for a new one).
        With ``nats_url``: ``nats_credentials`` (a credentials file, default
        ``$PULSE_NATS_CREDS``) and ``nats_ca`` (the servers' CA, default ``$PULSE_NATS_CA``).
        ``principal``: who every call acts for (a ``Principal``, or an access token:
        ``sync.access``); None is the local operator, who may do anything."""
        directory = Path(data_dir)
        await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
        server = None
        if leaf_of is not None and nats_url is not None:
            raise ValidationError(
                "leaf_of: a leaf host runs its own embedded NATS server; give leaf_of or "
                "nats_url, not both"
            )
        remembered = EmbeddedNats.remembered_leaf(directory) if nats_url is None else None
        if leaf_of is None and remembered is not None:  # a leaf's data directory stays one
            leaf_of, leaf_ca = (
                str(remembered["leaf_of"]),
                leaf_ca or remembered.get("leaf_ca"),
            )
        connecting: Awaitable[EventLog]
        partitioned = stream_settings is not None and stream_settings.partitions > 1
        if leaf_of is not None:
            server = EmbeddedNats(directory, leaf_of=leaf_of, leaf_ca=leaf_ca)
            await asyncio.to_thread(server.start)
            connecting = LeafLog.open_leaf(
                server, stream_settings, hub_domain=hub_domain, append_timeout=append_timeout
            )
        else:
            if nats_url is None:
                server = EmbeddedNats(directory)
                urls: list[str] = [await asyncio.to_thread(server.start)]
            elif isinstance(nats_url, str):
                urls = [u.strip() for u in nats_url.split(",") if u.strip()]
            else:
                urls = list(nats_url)
            if server is None:  # the embedded server's credentials are in its URL
                nats_credentials = nats_credentials or os.environ.get("PULSE_NATS_CREDS") or None
                nats_ca = nats_ca or os.environ.get("PULSE_NATS_CA") or None
            connect = LocalLog.connect if partitioned else JetStreamLog.connect
            connecting = connect(
                urls,
                stream_settings,
                append_timeout=append_timeout,
                connect_timeout=30,
                update_streams=False,  # create if missing; never reconfigure a deployment
                credentials=nats_credentials,
                tls_ca=nats_ca,
            )
        try:
            log_ = await connecting
        except BaseException:
            if server is not None:
                await asyncio.to_thread(server.stop)
            raise
        try:
            return await cls.attach(
                directory, log_, projection_settings, server=server, settings=settings,
                progress=progress, principal=principal, collectives=collectives,
            )  # fmt: skip
        except BaseException:
            await log_.close()
            if server is not None:
                await asyncio.to_thread(server.stop)
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
        principal: Principal | str | None = None,
        collectives: Sequence[str | UUID] | str | None = None,
    ) -> PulseDB:
        """An instance on an already open log (any backend; ``MemoryLog`` in simulations).
        When it closes, it closes the log if it ``owns_log``, and stops ``server``.
        ``collectives``: as ``open``."""
        directory = Path(data_dir)
        if collectives is not None and isinstance(log, LeafLog):
            raise ValidationError(
                "collectives: an edge host follows every collective (its stream sources the "
                "hub's whole stream); follow some on a host that is not an edge host"
            )
        state = await asyncio.to_thread(state_dir, directory)
        engine = await Engine.start(state, projection_settings)
        try:
            if isinstance(log, LocalLog) or engine.seq > 0:
                await _same_kind_of_log(log, engine)
            scope, known, unfinished = await open_scope(state, collectives, log, engine)
            await engine.catch_up(
                log, progress=progress, subjects=None if scope is None else scope.filters()
            )
            max_hlc = await engine.run(queries.max_hlc)
        except BaseException:
            await engine.close()
            raise
        db = cls(directory, log, engine, server, max_hlc=max_hlc, settings=settings)
        db._owns_log = owns_log
        db.follower.scope, db.follower.directory = scope, known
        try:
            await db.sealer.keyring.follow()  # other hosts' new keys, as they are made
        except PulseError:  # (only quicker reads: without it, a reader asks the store)
            _log.warning("not following the key store's new keys", exc_info=True)
        except BaseException:
            await db.close()
            raise
        db.replication.start()
        try:
            await db.follower.start(unfinished)
            await db.tokens.load()
            if principal is not None:
                db.principal = db._principal_from(principal)
        except BaseException:
            await db.close()
            raise
        forgetting = db.forgetting
        if isinstance(log, LeafLog):  # a delete made offline owes the hub its purge
            log.on_link_up = forgetting.finish_owed_purges
            try:
                await forgetting.forget_copies(state)
            except BaseException:
                await db.close()
                raise
        if db.owed.pending():  # deletes a crash interrupted: forget what they still owe
            try:
                finished = await forgetting.finish_owed_purges()
            except BaseException:
                await db.close()
                raise
            _log.info("finished %d owed purge(s) of deletes a crash interrupted", finished)
        return db

    async def close(self) -> None:
        """Stop replicating, flush, save the indexes, close the log (the data stays)."""
        replication = self.replication
        if replication.closed:
            return
        replication.closed = True
        await self.follower.stop()
        await replication.stop()
        await self.sealer.keyring.unfollow()
        await self.sealer.keyring.stop_making()
        replication.wake_all()
        self.watching.end_all()
        await self.engine.close()
        self.clock.close()
        if self._owns_log:
            await self.log.close()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)

    async def __aenter__(self) -> PulseDB:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- who acts ---------------------------------------------------------------------------

    def _principal_from(self, who: Principal | str) -> Principal:
        if isinstance(who, Principal):
            return who
        if isinstance(who, str):
            return self.tokens.principal_of(who)
        raise Unauthorized(f"principal: a Principal or an access token, got {type(who).__name__}")

    @contextlib.contextmanager
    def acting_as(self, who: Principal | str) -> Iterator[Principal]:
        """Calls made inside (in this task and the tasks it starts) act for ``who``, a
        ``Principal`` or an access token (Unauthorized when it is not a live one)::

            with db.acting_as(token):
                hits = await db.search_text(cid, "retry")
        """
        with access.acting(self._principal_from(who)) as principal:
            yield principal

    # -- what the instance is -------------------------------------------------------------

    @property
    def applied_seq(self) -> int:
        """The last stream sequence this instance has applied."""
        return self.replication.applied

    @property
    def events_applied(self) -> int:
        """Events the engine applied since open (a metric)."""
        return self.engine.events_applied

    @property
    def backfilled(self) -> int:
        """Events of collectives followed later, read since open (``sync.following``)."""
        return self.follower.backfilled

    @property
    def principal(self) -> Principal:
        """Who calls act for unless a call says otherwise (``acting_as``)."""
        return self.acting.principal

    @principal.setter
    def principal(self, who: Principal) -> None:
        self.acting.principal = who

    @property
    def access(self) -> access.Registry:
        """The access tokens this host knows (``sync.tokens``)."""
        return self.tokens.access

    @property
    def scope(self) -> Scope | None:
        """What this host follows (None: every collective; ``sync.following``)."""
        return self.follower.scope

    @property
    def following(self) -> tuple[str, ...] | None:
        """The references this host follows (None: every collective)."""
        return self.follower.following

    def subjects_read(self) -> list[str] | None:
        """The subjects this host reads from the log (None: all of them): what its lag
        is measured against."""
        return self.follower.subjects_read()

    def followed(self) -> list[UUID]:
        """The collectives this host follows now (empty on a host that follows all)."""
        return self.follower.followed()

    def principal_of(self, token: str) -> Principal:
        """The principal of an access token (Unauthorized when it is not a live one)."""
        return self.tokens.principal_of(token)

    def health(self) -> Health:
        """Whether this host is connected and replicating, and how far it applied (for
        ``/health`` and probes; ``status`` is the admins' whole picture, and asks the
        log)."""
        failure = self.replication.failure
        return Health(
            nats_connected=bool(getattr(getattr(self.log, "nc", None), "is_connected", True)),
            replicating=failure is None, failure=None if failure is None else repr(failure),
            applied_seq=self.applied_seq, instance_id=self.instance_id,
            snapshot=self.engine.snapshot_status(),
            duckdb_writer_error=self.engine.writer_failure(),
        )  # fmt: skip

    async def last_seq(self) -> int:
        """The last sequence in the log of what this host reads (``subjects_read``):
        what its lag is measured against (``/health``, ``/metrics``)."""
        return await self.log.last_seq(self.follower.filters())

    def watch_experiences(self) -> ExperienceWatch:
        """See ``sync.watch.Watching.watch_experiences``."""
        return self.watching.watch_experiences()

    watch_experiences.__doc__ = Watching.watch_experiences.__doc__

    # -- the operations of the API (sync.api.OPERATIONS), by service ---------------------

    create_collective = Delegate("experiences", Experiences.create_collective)
    get_collective = Delegate("experiences", Experiences.get_collective)
    list_collectives = Delegate("experiences", Experiences.list_collectives)
    find_collective = Delegate("experiences", Experiences.find_collective)
    get_collective_stats = Delegate("experiences", Experiences.get_collective_stats)
    record_experience = Delegate("experiences", Experiences.record_experience)
    record_experiences = Delegate("experiences", Experiences.record_experiences)
    get_experience = Delegate("experiences", Experiences.get_experience)
    get_recent_experiences = Delegate("experiences", Experiences.get_recent_experiences)
    list_experiences = Delegate("experiences", Experiences.list_experiences)
    update_experience = Delegate("experiences", Experiences.update_experience)
    invalidate_experience = Delegate("experiences", Experiences.invalidate_experience)
    revalidate_experience = Delegate("experiences", Experiences.revalidate_experience)
    archive_experience = Delegate("experiences", Experiences.archive_experience)
    unarchive_experience = Delegate("experiences", Experiences.unarchive_experience)
    reinforce_experience = Delegate("experiences", Experiences.reinforce_experience)

    search_similar = Delegate("recall", Recall.search_similar)
    search_text = Delegate("recall", Recall.search_text)
    search_hybrid = Delegate("recall", Recall.search_hybrid)
    list_cold_experiences = Delegate("recall", Recall.list_cold_experiences)
    get_context_candidates = Delegate("recall", Recall.get_context_candidates)

    store_relation = Delegate("links", Links.store_relation)
    get_related_experiences = Delegate("links", Links.get_related_experiences)
    store_insight = Delegate("links", Links.store_insight)
    get_insight = Delegate("links", Links.get_insight)
    get_insights = Delegate("links", Links.get_insights)

    store_wisdom = Delegate("wisdom", Wisdom.store_wisdom)
    get_wisdom = Delegate("wisdom", Wisdom.get_wisdom)

    register_activity = Delegate("presence", Presence.register_activity)
    update_heartbeat = Delegate("presence", Presence.update_heartbeat)
    end_activity = Delegate("presence", Presence.end_activity)
    get_active_agents = Delegate("presence", Presence.get_active_agents)

    start_session = Delegate("sessions", Sessions.start_session)
    update_session = Delegate("sessions", Sessions.update_session)
    end_session = Delegate("sessions", Sessions.end_session)
    delete_session = Delegate("sessions", Sessions.delete_session)
    get_session = Delegate("sessions", Sessions.get_session)
    list_sessions = Delegate("sessions", Sessions.list_sessions)
    resume_session = Delegate("sessions", Sessions.resume_session)

    put_checkpoint = Delegate("threads", Threads.put_checkpoint)
    put_pending_writes = Delegate("threads", Threads.put_pending_writes)
    get_checkpoint = Delegate("threads", Threads.get_checkpoint)
    list_checkpoints = Delegate("threads", Threads.list_checkpoints)
    list_threads = Delegate("threads", Threads.list_threads)
    copy_thread = Delegate("threads", Threads.copy_thread)
    prune_threads = Delegate("threads", Threads.prune_threads)
    delete_checkpoints_of_runs = Delegate("threads", Threads.delete_checkpoints_of_runs)
    delete_thread = Delegate("threads", Threads.delete_thread)

    delete_collective = Delegate("forgetting", Forgetting.delete_collective)
    delete_experience = Delegate("forgetting", Forgetting.delete_experience)
    delete_relation = Delegate("forgetting", Forgetting.delete_relation)
    delete_insight = Delegate("forgetting", Forgetting.delete_insight)
    delete_wisdom = Delegate("forgetting", Forgetting.delete_wisdom)
    compact = Delegate("forgetting", Forgetting.compact)
    rotate_keys = Delegate("forgetting", Forgetting.rotate_keys)

    create_token = Delegate("tokens", Tokens.create_token)
    list_tokens = Delegate("tokens", Tokens.list_tokens)
    revoke_token = Delegate("tokens", Tokens.revoke_token)
    whoami = Delegate("tokens", Tokens.whoami)

    follow = Delegate("follower", Following.follow)

    sync = Delegate("host", Host.sync)
    status = Delegate("host", Host.status)
    digest = Delegate("host", Host.digest)
    dead_letters = Delegate("host", Host.dead_letters)
    sql = Delegate("host", Host.sql)

    async def export(self, directory: str | os.PathLike[str]) -> dict[str, int]:
        """Write every view of ``sql`` as a Parquet file in ``directory`` (plus the
        activities); returns the number of rows per file. Admins only: a file holds every
        row."""
        self.gate.me().need_admin("exporting")
        target = Path(directory)
        await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
        activities = []
        for c in await self.reads.read(queries.list_collectives):  # every one: no pages here
            activities.extend(await self.presence.active(c.collective_id, stale_after=1e9))
        return await self.engine.export(target, activities)


def _positions(projection: Projection) -> dict[int, int]:
    return dict(projection.positions)


async def _same_kind_of_log(log_: EventLog, engine: Engine) -> None:
    """A state built from a log of one stream is not resumed on a log in partitions, nor
    the other way round (their sequences mean other things); a host on partitions
    resumes each partition from where its state stands."""
    positions = await engine.run(_positions)
    if isinstance(log_, LocalLog):
        if engine.seq > 0 and not positions:
            raise ValidationError(
                "partitions: this data directory's state was built from a log of one "
                "stream; build it again from the log in partitions (`pulse --partitions N "
                "rebuild`), or start on a new data directory"
            )
        log_.begin(engine.seq, positions)
    elif positions:
        raise ValidationError(
            "partitions: this data directory's state was built from a log in partitions; "
            "open it with the deployment's --partitions"
        )

"""The instance: one host's member of the shared memory, and the facade of its API.

``PulseDB.open(data_dir, nats_url=None)`` owns a data directory (the projection, the
clock, the identity of this incarnation), connects to the log (an embedded nats-server
unless a URL is given), starts the projection engine (``projections.engine``: one
thread owning DuckDB, FAISS and tantivy), catches up, and keeps a replication loop
running that hands every event from every host to the engine. A write is validated
against the local state, appended to the log, and returns once the engine has applied
it (read-your-writes); ``sync()`` waits until the local state has caught up with the
whole stream.

The API is assembled from parts along the seams of the domain, each its own module:
``sync.core`` (replication, read-your-writes, the write path), ``sync.experiences``
(collectives and experiences, batch writes), ``sync.recall`` (search and context),
``sync.links`` (relations and insights), ``sync.forgetting`` (deletes that forget),
``sync.presence`` (activities), ``sync.sessions`` (agents' sessions),
``sync.wisdom``, ``sync.watch`` (changes as they are applied), ``sync.tokens`` (access
tokens). This class only opens, closes and answers about the state as a whole. Every
call acts for a principal (``sync.access``): the one given to ``open``, or the one of
``acting_as``; the local operator by default.

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
import functools
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from uuid import UUID

import msgspec

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings, subjects
from eventlog.errors import NotFoundError, PulseError, Unauthorized, ValidationError
from eventlog.keys import collective_prefix, key_name
from eventlog.leaf import LeafLog, LeafStatus
from eventlog.log import EventLog, StreamState
from eventlog.subjects import collective_filter
from projections import analytics, queries
from projections.analytics import SqlResult
from projections.engine import Engine
from projections.projection import Projection, ProjectionSettings, state_dir
from projections.snapshot import SnapshotStatus
from sync import access, models
from sync.access import Principal
from sync.core import InstanceCore, InstanceSettings, check_rows_limit, uuid_of
from sync.experiences import Collectives, Experiences
from sync.following import Following, open_scope
from sync.forgetting import Forgetting
from sync.links import Links
from sync.presence import Activity
from sync.recall import Context, Recall
from sync.sessions import ResumedSession, Sessions
from sync.tokens import NewToken, Token, Tokens
from sync.watch import ExperienceChange, ExperienceWatch
from sync.wisdom import WisdomPart

__all__ = [
    "Activity",
    "Context",
    "ExperienceChange",
    "ExperienceWatch",
    "HostStatus",
    "InstanceSettings",
    "NewToken",
    "Principal",
    "PulseDB",
    "ResumedSession",
    "Token",
]


_log = logging.getLogger(__name__)


class CollectiveStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A collective a host follows, in ``PulseDB.status``: the last sequence of its
    events in the log, and how many sequences the host is behind it (0: caught up);
    ``catching_up``: its earlier events are still being read (followed just now)."""

    collective_id: UUID
    name: str | None
    last_seq: int
    lag: int
    catching_up: bool


class HostStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What ``PulseDB.status`` answers (``pulse status``)."""

    instance_id: UUID
    applied_seq: int  # the last stream sequence this host applied
    events_applied: int  # since it opened
    backlog: int  # entries handed to the engine, not applied yet
    last_seq: int  # the last sequence in the log on what it reads
    lag: int  # last_seq - applied_seq
    following: tuple[str, ...] | None  # None: every collective
    collectives: tuple[CollectiveStatus, ...]  # those it follows (partial hosts)
    dead_letters: int
    stream: StreamState
    replicating: bool  # False: the replication loop stopped (see the log)
    leaf: LeafStatus | None = None  # an edge host (``open(leaf_of=...)``): its link
    snapshot: SnapshotStatus | None = None  # the analysts' copy (``projections.snapshot``)


class PulseDB(
    Collectives, Experiences, Sessions, Recall, Links, WisdomPart, Forgetting, Tokens,
    Following, InstanceCore,
):  # fmt: skip
    """One instance; see the module docstring. Use ``await PulseDB.open(...)``."""

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
            leaf_of, leaf_ca = str(remembered["leaf_of"]), leaf_ca or remembered.get("leaf_ca")
        connecting: Awaitable[EventLog]
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
            connecting = JetStreamLog.connect(
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
            scope, known, unfinished = await open_scope(state, collectives, log, engine)
            await engine.catch_up(
                log, progress=progress, subjects=None if scope is None else scope.filters()
            )
            max_hlc = await engine.run(queries.max_hlc)
        except BaseException:
            await engine.close()
            raise
        db = cls(
            directory, log, engine, server, max_hlc=max_hlc, settings=settings,
        )  # fmt: skip
        db._owns_log = owns_log
        db.scope, db._directory = scope, known
        try:
            await db.sealer.keyring.follow()  # other hosts' new keys, as they are made
        except PulseError:  # (only quicker reads: without it, a reader asks the store)
            _log.warning("not following the key store's new keys", exc_info=True)
        except BaseException:
            await db.close()
            raise
        db._start_replication()
        try:
            if scope is not None:  # the collectives it starts following, or did not finish
                pending = set(scope.pending())
                await db._backfill(pending & unfinished, restart=True)
                await db._backfill(pending - unfinished)
                db._directory_task = asyncio.create_task(
                    db._watch_directory(), name="pulse-directory"
                )
            await db._load_tokens()
            if principal is not None:
                db.principal = db._principal_from(principal)
        except BaseException:
            await db.close()
            raise
        if isinstance(log, LeafLog):  # a delete made offline owes the hub its purge
            log.on_link_up = db._finish_owed_purges
            try:
                await db._forget_copies(state)
            except BaseException:
                await db.close()
                raise
        if db.owed.pending():  # deletes a crash interrupted: forget what they still owe
            try:
                finished = await db._finish_owed_purges()
            except BaseException:
                await db.close()
                raise
            _log.info("finished %d owed purge(s) of deletes a crash interrupted", finished)
        return db

    async def _forget_copies(self, state: Path) -> None:
        """An edge host that opens forgets, in its own streams, what the deletes it applied
        since it last opened forgot: those that came while it was away were applied by
        the catch-up, before the tail's listener (``sync.core._purge_copy``) runs."""
        mark = state / "copies-forgotten.json"
        since = 0
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            since = int(json.loads(mark.read_text())["through"])
        through = self.engine.seq
        keyring = self.sealer.keyring
        for seq, entity, cid, key in await self.engine.run(Projection.deletes_since, since):
            if entity == "collective":
                subject = f"{subjects.PREFIX}.c.{cid}.>"
                keys = functools.partial(keyring.destroy_copies, prefix=collective_prefix(key))
            elif entity == "wisdom":
                subject = subjects.wisdom_subject(key)
                keys = functools.partial(keyring.destroy_copies, key_name(entity, key, None))
            else:
                assert cid is not None
                subject = subjects.collective_subject(cid, entity, key)
                keys = functools.partial(keyring.destroy_copies, key_name(entity, key, cid))
            try:
                await self.log.purge_copy(subject, before_seq=seq)
                await keys()
            except Exception:  # a failure leaves the mark where it was: done again next time
                _log.warning("forgetting this host's copy of %s failed", subject, exc_info=True)
                return
        await asyncio.to_thread(mark.write_text, json.dumps({"through": through}))

    async def close(self) -> None:
        """Stop replicating, flush, save the indexes, close the log (the data stays)."""
        if self._closed:
            return
        self._closed = True
        if self._directory_task is not None:
            self._directory_task.cancel()
            await asyncio.wait({self._directory_task}, timeout=5)
        await self._stop_replication()
        await self.sealer.keyring.unfollow()
        self._wake_all()
        for watch in list(self._watchers):
            watch.end()
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
            return self.principal_of(who)
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

    # -- the state as a whole ---------------------------------------------------------------

    def watch_experiences(self) -> ExperienceWatch:
        """Changes to experiences as this instance applies them, whichever host wrote them,
        from the moment of this call, those the caller may see (a delete: of an experience
        it could see while this host held it). Iterate it with ``async for``; it ends when
        the instance closes (or call ``close()`` on it). A change's ``seq`` is its stream
        sequence for admins and 0 for any other caller (sequences count every host's
        writes, those it may not see among them)."""
        me = self._me()
        if me.admin:
            return ExperienceWatch(self._watchers)

        async def admit(change: ExperienceChange) -> bool:
            if change.kind == "deleted":  # to those who could see it (unknown here: no one)
                facts = await self._read(queries.deleted_access, change.experience_id)
                return facts is not None and me.sees(
                    facts.visibility, me.member(facts.owner_id, facts.collective_id),
                    facts.author_owner, facts.author_agent,
                )  # fmt: skip
            with access.acting(me):
                try:
                    await self._entity("experience", change.experience_id, write=False)
                except NotFoundError:
                    return False
                return True

        return ExperienceWatch(self._watchers, admit=admit, sequences=False)

    async def digest(self, collective_id: UUID | None = None) -> str:
        """A hash of the logical state: equal on hosts that applied the same events. With
        ``collective_id``, of that collective's rows only: equal on every host that
        follows it, whatever else each follows (``sync.following``). Admins only: it
        hashes every row, those a caller may not see among them (any change to them
        would change it)."""
        self._me().need_admin("reading the digest")
        if collective_id is not None:
            collective_id = uuid_of("collective_id", collective_id)
            if self.scope is not None and collective_id not in self.scope.collectives:
                raise self._not_followed(collective_id)
        return await self.engine.digest(collective_id)

    async def status(self) -> HostStatus:
        """This host and the log: the stream (messages, sequences, replicas, its readers),
        what the host applied and how far behind it is, each collective it follows
        (partial hosts: the last sequence of its events in the log, and its lag), and
        the dead letters it keeps. Admins only."""
        self._me().need_admin("reading the status")
        stream = await self.log.stream_state()
        filters = self._filters()
        last = stream.last_seq if filters is None else await self.log.last_seq(filters)
        applied = self._applied
        collectives = []
        if self.scope is not None:
            names = {c.collective_id: c.name for c in await self._read(queries.list_collectives)}
            for cid in self.followed():
                at = await self.log.last_seq(collective_filter([cid], wisdom=False))
                backfill = self.scope.collectives.get(cid, 0)
                known = self._directory.collectives.get(cid) if self._directory else None
                collectives.append(
                    CollectiveStatus(
                        collective_id=cid, name=names.get(cid) or (known[1] if known else None),
                        last_seq=at, lag=max(0, at - applied),
                        catching_up=backfill > 0,
                    )
                )  # fmt: skip
        return HostStatus(
            instance_id=self.instance_id, applied_seq=applied, events_applied=self.events_applied,
            backlog=self.engine.backlog, last_seq=last, lag=max(0, last - applied),
            following=self.following, collectives=tuple(collectives),
            dead_letters=len(await self._read(queries.dead_letters)), stream=stream,
            replicating=self._failure is None,
            leaf=await self.log.leaf_status() if isinstance(self.log, LeafLog) else None,
            snapshot=self.engine.snapshot_status(),
        )  # fmt: skip

    async def dead_letters(
        self, *, limit: int = models.PAGE_DEFAULT, after: str | None = None
    ) -> models.Page[queries.DeadLetter]:
        """Events kept aside: those that break an invariant of the folded state, and
        messages that could not be applied (unreadable, or a value out of range). One
        page of at most ``limit`` (1..1000, default 100), by entity, sequence and id; the
        page's ``next`` is the cursor of the rest (``after=``), None on the last page."""
        self._me().need_admin("reading the dead letters")
        models.check_page_limit(limit)
        key = models.from_cursor("dead_letters", after, (str, int, str))
        found, last = await self._read(queries.dead_letters_page, limit, key)
        return models.Page(found, None if last is None else models.cursor("dead_letters", last))

    async def sql(self, query: str, *, limit: int = 10_000, as_of: models.AsOf = None) -> SqlResult:
        """Run one read-only SQL query over the current state (DuckDB).

        The views are the analysts' contract: collectives, experiences, applications,
        relations, insights, insight_sources, wisdom, tokens, audit, dead_letters, sessions,
        and activities (the latest activity of every agent, read from the activity stream for
        this query). Anything but a query is refused: the state changes only through
        events. DuckDB is flushed first; ``SqlResult.seq`` is the stream sequence the
        answer reflects. The query runs on its own thread, so a long one holds up neither
        the loop nor the engine.

        An admin (or the local operator) reads every table and view. Any other principal
        reads those views only, by their names alone, each holding what it may see
        (``sync.access``; tokens and dead letters hold nothing for it): a base table, a
        qualified name, SHOW TABLES or EXPLAIN is Forbidden (``projections.analytics``).

        It runs in a sandbox (``projections.analytics``): the state's tables and views
        only (no files, URLs, extensions or settings: a ValidationError says what was
        refused), at most ``$PULSE_SQL_TIME_LIMIT`` seconds (10; then QueryTimedOut),
        within ``$PULSE_SQL_MEMORY_LIMIT`` and ``$PULSE_SQL_TEMP_LIMIT`` (2GB, 1GB; then
        QueryOutOfMemory). The answer stops at ``limit`` rows or ``$PULSE_SQL_MAX_BYTES``
        of JSON (16 MiB), whichever comes first: ``truncated`` and ``truncated_by`` say
        so. Cancelling the awaiting task interrupts the query. A query longer than
        ``$PULSE_SQL_MAX_QUERY_BYTES`` (256 KiB) is QueryTooLarge; one whose parse tree has
        more than ``$PULSE_SQL_MAX_NODES`` nodes (10,000) or ``$PULSE_SQL_MAX_DEPTH``
        levels (400) is QueryTooComplex. A query in the way of forgetting (the rewrite of
        the files after a delete) is cancelled: QueryCancelled, retry.

        The query runs in a worker process over the analysts' snapshot, brought up to
        date first (``projections.sqlworker``: the time limit then covers parsing and
        planning, and the memory limit is the process's); without a snapshot
        (``snapshot_interval=None``), on a cursor of the engine's DuckDB. The
        ``SqlResult.seq`` of a principal that is not an admin is 0 (the stream's sequence
        counts events it may not see).

        ``as_of`` (a stream sequence, or a time): every table and view as it was then
        (``projections.past``; ``SqlResult.seq`` is that sequence); the activities are
        the present ones.
        """
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query: give one SQL query")
        check_rows_limit(limit)
        limits = self.engine.limits()
        analytics.check_read_only(query, limits)
        me = self._me()
        live = {c.collective_id for c in await self._read(queries.list_collectives)}
        activities = [a for a in await self._activities(None) if a.collective_id in live]
        moment = None if as_of is None else await self._as_of_seq(as_of)
        return await self.engine.sql(query, activities, limit, None if me.admin else me, moment)

    async def export(self, directory: str | os.PathLike[str]) -> dict[str, int]:
        """Write every view of ``sql`` as a Parquet file in ``directory`` (plus the
        activities); returns the number of rows per file. Admins only: a file holds every
        row."""
        self._me().need_admin("exporting")
        target = Path(directory)
        await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
        activities = []
        for c in await self._read(queries.list_collectives):  # every one: no pages here
            activities.extend(await self._active(c.collective_id, stale_after=1e9))
        return await self.engine.export(target, activities)

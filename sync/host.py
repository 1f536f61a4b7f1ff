"""The host as a whole: waiting until it caught up with the log, its digest and status,
the dead letters it keeps, and SQL over (and an export of) its state.

SQL and the export run in the engine (``projections.engine``: a worker process over the
analysts' snapshot, or a cursor of its DuckDB); nothing here sees a DuckDB connection.
"""

from __future__ import annotations

from uuid import UUID

import msgspec

from eventlog.errors import ValidationError
from eventlog.leaf import LeafLog, LeafStatus
from eventlog.log import EventLog, StreamState
from eventlog.subjects import collective_filter
from projections import analytics, queries
from projections.analytics import SqlResult
from projections.engine import Engine
from projections.snapshot import SnapshotStatus
from sync import models
from sync.core import check_rows_limit, uuid_of
from sync.following import Following
from sync.gate import Gate
from sync.presence import Presence
from sync.reading import Reader
from sync.replication import Replication
from sync.tokens import Tokens


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
    # a log in partitions: each partition stream (``stream`` holds wisdom and tokens)
    partitions: tuple[StreamState, ...] = ()


class Host:
    """This host and its state as a whole (see the module docstring)."""

    def __init__(
        self,
        log_: EventLog,
        engine: Engine,
        replication: Replication,
        reads: Reader,
        gate: Gate,
        following: Following,
        tokens: Tokens,
        presence: Presence,
        instance_id: UUID,
    ) -> None:
        self.log, self.engine, self.replication = log_, engine, replication
        self.reads, self.gate, self.following = reads, gate, following
        self.tokens, self.presence, self.instance_id = tokens, presence, instance_id

    async def sync(self, timeout: float = 60.0) -> int:
        """Wait until the local state has applied everything the stream holds now (and
        the access tokens here are read again from it); returns that stream sequence to
        an admin, 0 to any other caller (a sequence counts every host's writes, those it
        may not see among them)."""
        target = await self.replication.caught_up(timeout)
        await self.tokens.caught_up()
        return target if self.gate.me().admin else 0

    async def digest(self, collective_id: UUID | None = None) -> str:
        """A hash of the logical state: equal on hosts that applied the same events. With
        ``collective_id``, of that collective's rows only: equal on every host that
        follows it, whatever else each follows (``sync.following``). Admins only: it
        hashes every row, those a caller may not see among them (any change to them
        would change it)."""
        self.gate.me().need_admin("reading the digest")
        if collective_id is not None:
            collective_id = uuid_of("collective_id", collective_id)
            if (
                self.following.scope is not None
                and collective_id not in self.following.scope.collectives
            ):
                raise self.gate.not_followed(collective_id)
        return await self.engine.digest(collective_id)

    async def status(self) -> HostStatus:
        """This host and the log: the stream (messages, sequences, replicas, its readers),
        what the host applied and how far behind it is, each collective it follows
        (partial hosts: the last sequence of its events in the log, and its lag), and
        the dead letters it keeps. Admins only."""
        self.gate.me().need_admin("reading the status")
        stream = await self.log.stream_state()
        filters = self.following.filters()
        last = stream.last_seq
        if filters is not None or self.log.numbered_here:  # (the latter: the host's numbers)
            last = await self.log.last_seq(filters)
        applied = self.replication.applied
        collectives = []
        if self.following.scope is not None:
            names = {
                c.collective_id: c.name for c in await self.reads.read(queries.list_collectives)
            }
            for cid in self.following.followed():
                at = await self.log.last_seq(collective_filter([cid], wisdom=False))
                backfill = self.following.scope.collectives.get(cid, 0)
                known = (
                    self.following.directory.collectives.get(cid)
                    if self.following.directory
                    else None
                )
                collectives.append(
                    CollectiveStatus(
                        collective_id=cid, name=names.get(cid) or (known[1] if known else None),
                        last_seq=at, lag=max(0, at - applied),
                        catching_up=backfill > 0,
                    )
                )  # fmt: skip
        return HostStatus(
            instance_id=self.instance_id, applied_seq=applied,
            events_applied=self.engine.events_applied,
            backlog=self.engine.backlog, last_seq=last, lag=max(0, last - applied),
            following=self.following.following, collectives=tuple(collectives),
            dead_letters=len(await self.reads.read(queries.dead_letters)), stream=stream,
            replicating=self.replication.failure is None,
            leaf=await self.log.leaf_status() if isinstance(self.log, LeafLog) else None,
            snapshot=self.engine.snapshot_status(),
            partitions=tuple(await self.log.partition_states()),
        )  # fmt: skip

    async def dead_letters(
        self, *, limit: int = models.PAGE_DEFAULT, after: str | None = None
    ) -> models.Page[queries.DeadLetter]:
        """Events kept aside: those that break an invariant of the folded state, and
        messages that could not be applied (unreadable, or a value out of range). One
        page of at most ``limit`` (1..1000, default 100), by entity, sequence and id; the
        page's ``next`` is the cursor of the rest (``after=``), None on the last page."""
        self.gate.me().need_admin("reading the dead letters")
        models.check_page_limit(limit)
        key = models.from_cursor("dead_letters", after, (str, int, str))
        found, last = await self.reads.read(queries.dead_letters_page, limit, key)
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
        analytics.check_read_only(query, self.engine.limits())
        me = self.gate.me()
        live = {c.collective_id for c in await self.reads.read(queries.list_collectives)}
        activities = [a for a in await self.presence.activities(None) if a.collective_id in live]
        moment = None if as_of is None else await self.reads.as_of_seq(as_of)
        return await self.engine.sql(
            query, activities, limit, viewer=None if me.admin else me, show_seq=me.admin,
            moment=moment,
        )  # fmt: skip

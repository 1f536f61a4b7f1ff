"""Hosts that follow only some collectives (partial replication).

``PulseDB.open(..., collectives=[...])`` (``pulse up --follow C1,C2``) makes a host that
reads only those collectives' subjects from the log, plus every wisdom and access-token
event: its memory, disk and catch-up time grow with what it follows, not with the whole
organisation. A reference is a collective id, a collective name (every owner's of that
name: ``projections.naming``), one owner's as ``owner/name``, or ``owner:<owner id>``
(every collective of that owner, now and later). What the host follows is kept in its
state (``projections.scope``), so it follows the same after a restart without being told
again; more references may be given later (the new collectives are caught up without
replaying the others), but none taken away: a host does not forget what it holds on
request (start one on a new data directory instead).

To resolve names and owners, and to hear of collectives created later that its references
match, a partial host reads the log's *directory*: the subject of every collective's own
events (``projections.scope.DIRECTORY_SUBJECT``), one create (and maybe one delete) per
collective. What it learns there stays out of its projection: its state and digest cover
only what it follows. A request about a collective it does not follow is a
``NotFollowed`` error that names what it follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from uuid import UUID

from eventlog import events as ev
from eventlog.errors import PulseError, ValidationError
from eventlog.jetstream import cancelled
from eventlog.log import EventLog, LogEntry
from eventlog.partitions import part_of, seq_of
from projections.engine import Engine
from projections.scope import DIRECTORY_SUBJECT, OWNER, Scope, matches, parse_refs
from sync.gate import Gate
from sync.replication import Replication

log = logging.getLogger(__name__)


class Directory:
    """Every collective the log names (id -> owner, name), read from the directory subject."""

    def __init__(self) -> None:
        self.collectives: dict[UUID, tuple[str, str]] = {}
        # per partition (a log of one stream: 0), the last directory entry read
        self.read_to: dict[int, int] = {}

    def take(self, entry: LogEntry) -> UUID | None:
        """Learn from one entry; the id of a collective it announces."""
        part, seq = part_of(entry.seq), seq_of(entry.seq)
        if seq > self.read_to.get(part, 0):
            self.read_to[part] = seq
        event = entry.event
        if isinstance(event, ev.CollectiveCreated):
            self.collectives[event.collective_id] = (event.owner_id, event.name)
            return event.collective_id
        return None

    def matching(self, refs: Sequence[str]) -> set[UUID]:
        """The collectives the references stand for, among those known."""
        found = {UUID(r) for r in refs if _is_id(r)}  # an id stands for itself, known or not
        for cid, (owner, name) in self.collectives.items():
            if matches(tuple(refs), cid, owner, name):
                found.add(cid)
        return found

    async def read(self, log_: EventLog) -> None:
        """Everything the directory holds now."""
        async for batch in log_.directory(self.read_to, [DIRECTORY_SUBJECT], live=False):
            for entry in batch:
                self.take(entry)


def _is_id(ref: str) -> bool:
    try:
        UUID(ref)
    except ValueError:
        return False
    return True


async def open_scope(
    state: Path, given: object, log_: EventLog, engine: Engine
) -> tuple[Scope | None, Directory | None, set[UUID]]:
    """The scope a host opens with (None: it follows every collective), the directory it
    resolved it with, and the collectives whose earlier backfill did not finish. Refuses
    what would make the state lie: a state built following every collective told to
    follow some, or a scope told to drop collectives it holds."""
    kept = await asyncio.to_thread(Scope.load, state)
    if given is None and kept is None:
        return None, None, set()
    directory = Directory()
    await directory.read(log_)
    if given is None:
        assert kept is not None
        scope, refs = kept, kept.refs
    else:
        refs = parse_refs(given)
        if kept is None:
            if engine.seq > 0:
                raise ValidationError(
                    "collectives: this data directory's state follows every collective; a "
                    "host that follows some starts on a new data directory"
                )
            scope = Scope(refs)
        else:
            dropped = [r for r in kept.refs if r not in refs]
            if dropped:
                raise ValidationError(
                    f"collectives: this host follows {kept.describe()}; it cannot stop "
                    f"following {', '.join(dropped)} (give them too, or start on a new data "
                    "directory)"
                )
            scope = kept
            scope.refs = refs
    unfinished = set(scope.pending())
    for cid in directory.matching(scope.refs):  # new: backfilled up to here
        scope.collectives.setdefault(cid, log_.follow_mark(cid, engine.seq))
    missing = [
        r for r in scope.refs
        if not r.startswith(OWNER) and not _is_id(r) and not directory.matching([r])
    ]  # fmt: skip
    if missing:
        log.warning("no collective is named %s yet: followed once one is", ", ".join(missing))
    await asyncio.to_thread(scope.save, state)
    return scope, directory, unfinished


class Following:
    """What this host follows, and the part of the API that follows more collectives
    (see the module docstring). ``scope`` is None on a host that follows every
    collective; ``directory`` the collectives the log names (a partial host's)."""

    def __init__(
        self, replication: Replication, engine: Engine, log_: EventLog, gate: Gate
    ) -> None:
        self.replication, self.engine, self.log, self.gate = (
            replication,
            engine,
            log_,
            gate,
        )
        self.scope: Scope | None = None
        self.directory: Directory | None = None
        self._directory_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.backfilled = 0  # events of collectives followed later, read since open

    def filters(self) -> list[str] | None:
        """The subjects this host reads (None: all of them)."""
        return None if self.scope is None else self.scope.filters()

    def known(self) -> dict[UUID, tuple[str, str]]:
        """The collectives the log's directory names (none on a host that follows all)."""
        return {} if self.directory is None else self.directory.collectives

    async def start(self, unfinished: set[UUID]) -> None:
        """Once replication runs: backfill what the host starts following (restarting
        those whose backfill did not finish), then watch the directory."""
        if self.scope is None:
            return
        pending = set(self.scope.pending())
        await self._backfill(pending & unfinished, restart=True)
        await self._backfill(pending - unfinished)
        self._directory_task = asyncio.create_task(self._watch_directory(), name="pulse-directory")

    async def stop(self) -> None:
        if self._directory_task is not None:  # (it reads the log: cancelled until it ends)
            await cancelled({self._directory_task}, within=5)

    @property
    def following(self) -> tuple[str, ...] | None:
        """The references this host follows (None: every collective)."""
        return None if self.scope is None else self.scope.refs

    def subjects_read(self) -> list[str] | None:
        """The subjects this host reads from the log (None: all of them): what its lag
        is measured against (``/health``, ``/metrics``)."""
        return self.filters()

    def followed(self) -> list[UUID]:
        """The collectives this host follows now (empty on a host that follows all)."""
        return [] if self.scope is None else sorted(self.scope.collectives, key=str)

    async def follow(self, collectives: Sequence[str | UUID]) -> list[UUID]:
        """Follow more collectives (ids, names, ``owner:<owner id>``): each one new is
        caught up from the log (its own subjects only) while the host goes on. Returns
        every collective followed now (empty: the host follows every collective, and
        this changes nothing). Admins only."""
        self.gate.me().need_admin("following collectives")
        refs = parse_refs(collectives if isinstance(collectives, str) else list(collectives))
        if self.scope is None:
            return []
        assert self.directory is not None
        await self.directory.read(self.log)
        self.scope.refs = tuple(dict.fromkeys((*self.scope.refs, *refs)))
        await self._follow_ids(self.directory.matching(refs))
        return self.followed()

    # -- the machinery ------------------------------------------------------------------------

    async def _follow_ids(self, ids: set[UUID]) -> None:
        """Start following collectives: the tail goes on from what is applied with their
        subjects added, and their events up to there are backfilled."""
        assert self.scope is not None
        async with self._lock:
            new = ids - set(self.scope.collectives)
            state = self.engine.directory
            if not new:
                await asyncio.to_thread(self.scope.save, state)
                return
            await self.replication.stop()
            try:
                await self.replication.wait_applied(self.replication.submitted, timeout=600)
            except BaseException:  # (replication goes on as it was: nothing changed yet)
                if not self.replication.closed:
                    self.replication.start()
                raise
            at = self.engine.seq
            for cid in new:
                self.scope.collectives[cid] = self.log.follow_mark(cid, at)
            await asyncio.to_thread(self.scope.save, state)
            if self.replication.closed:  # (closed meanwhile: the backfill is done on the next open)
                return
            self.replication.start(at + 1)  # (what comes after ``at``; before: backfilled)
            await self._backfill(new)

    async def _backfill(self, ids: set[UUID], *, restart: bool = False) -> None:
        assert self.scope is not None
        state = self.engine.directory
        for cid in sorted(ids, key=str):
            up_to = self.scope.collectives.get(cid, 0)
            count = await self.engine.backfill(self.log, cid, up_to, restart=restart)
            self.backfilled += count
            self.scope.collectives[cid] = 0
            await asyncio.to_thread(self.scope.save, state)
            log.info("following collective %s: %d earlier events caught up", cid, count)
        self.gate.forget()

    async def _watch_directory(self) -> None:
        """Hear of collectives created later; follow those the references match. A
        failure (the log unreachable during a backfill, say) is logged, and the watch
        starts again a moment later, finishing the backfills left pending."""
        assert self.scope is not None and self.directory is not None
        directory = self.directory
        pause = 0.5
        while not self.replication.closed:
            try:
                if self.scope.pending():  # (one that failed: done again, not doubled)
                    async with self._lock:
                        await self._backfill(set(self.scope.pending()), restart=True)
                async with contextlib.aclosing(
                    self.log.directory(directory.read_to, [DIRECTORY_SUBJECT], live=True)
                ) as batches:
                    async for batch in batches:
                        pause = 0.5
                        for entry in batch:
                            cid = directory.take(entry)
                            if cid is None or cid in self.scope.collectives:
                                continue
                            owner, name = directory.collectives[cid]
                            if matches(self.scope.refs, cid, owner, name):
                                await self._follow_ids({cid})
            except asyncio.CancelledError:
                raise
            except PulseError as exc:
                log.warning("the directory watch failed (%s); again in %.1f s", exc, pause)
                await asyncio.sleep(pause)  # (a back-off between attempts, not a wait)
                pause = min(pause * 2, 30.0)

    async def admit(self, collective_id: UUID, owner_id: str, name: str) -> None:
        """Before this host creates a collective: one its references stand for is
        followed first (so it reads its own write); any other is refused."""
        if self.scope is None:
            return
        if not matches(self.scope.refs, collective_id, owner_id, name):
            raise ValidationError(
                f"name: this host follows only {self.scope.describe()}; a collective it "
                f"creates must be one of those (follow {name!r} or {OWNER}{owner_id} first, "
                "or create it on a host that follows it)"
            )
        await self._follow_ids({collective_id})

"""The access gate: who the call in progress acts for, and whether it may read or change
the collective or entity it names (``sync.access`` has the rules and the principals).

Every domain service asks the gate before it reads or writes: ``readable`` (a collective
and the filter of what the caller sees in it), ``writable`` (a collective it may write
to), ``entity`` (an experience, relation, insight or wisdom it may see or change). What
the caller may not see does not exist for it (NotFoundError, as for what was never
made); on a host that follows some collectives (``sync.following``), one it does not
follow is ``NotFollowed`` to those who may know of it.

The answers of reference checks (a collective by id, the collective of an experience)
are remembered while nothing that could change them is applied (``forget``: the
replication tells of every create and delete).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

from eventlog import events as ev
from eventlog.errors import Forbidden, NotFollowed, NotFoundError, ValidationError
from eventlog.log import LogEntry
from projections import queries
from projections.scope import Scope
from sync import access
from sync.access import Principal, Viewer
from sync.reading import Reader
from sync.replication import DELETES

T = TypeVar("T")

KNOWN_MAX = 100_000  # remembered reference checks before the memo starts over


class Acting:
    """Who calls act for: the one of ``access.acting`` (``PulseDB.acting_as``), else the
    instance's own principal (the local operator unless ``open`` was given another)."""

    def __init__(self) -> None:
        self.principal = Principal.operator()

    def me(self) -> Principal:
        """The principal of the call in progress."""
        return access.ACTING.get() or self.principal


class Gate:
    """The access checks of every domain service (see the module docstring).
    ``scope``: what this host follows now (None: every collective); ``known``: the
    collectives the log's directory names, id -> (owner, name), on a partial host."""

    def __init__(
        self,
        reader: Reader,
        acting: Acting,
        scope: Callable[[], Scope | None],
        known: Callable[[], dict[UUID, tuple[str, str]]],
    ) -> None:
        self.reader, self.acting = reader, acting
        self._scope, self._known_collectives = scope, known
        self._known: dict[tuple[str, UUID], Any] = {}
        self._generation = 0

    def me(self) -> Principal:
        return self.acting.me()

    # -- remembered reference checks ------------------------------------------------------

    def applied(self, entry: LogEntry) -> None:
        """A replication listener: a create or a delete may change what is remembered."""
        if isinstance(entry.event, (*DELETES, ev.CollectiveCreated)):
            self.forget()

    def forget(self) -> None:
        """Drop the remembered reference checks (what they answered may have changed)."""
        self._known.clear()
        self._generation += 1

    async def _known_or_read(self, kind: str, key: UUID, fn: Callable[..., T]) -> T | None:
        """``fn(projection, key)``, remembered while nothing that could change it applies."""
        if self.reader.as_of() is not None:  # (what is remembered is the present)
            return await self.reader.read(fn, key)
        found = self._known.get((kind, key))
        if found is None:
            generation = self._generation
            found = await self.reader.read(fn, key)
            if found is not None and generation == self._generation:
                if len(self._known) >= KNOWN_MAX:
                    self._known.clear()
                self._known[(kind, key)] = found
        return found

    # -- collectives ------------------------------------------------------------------------

    async def collective(self, collective_id: Any) -> queries.Collective:
        """A live collective (whoever asks; ``readable`` checks the caller)."""
        key = uuid_of("collective_id", collective_id)
        found = await self._known_or_read("collective", key, queries.get_collective)
        if found is None:
            known = self._known_collectives().get(key) if self._scope() is not None else None
            if known is not None and self.me().member(known[0], key):
                raise self.not_followed(key)  # it exists: elsewhere (sync.following)
            # (to others, whether it exists elsewhere would tell what they may not see)
            raise self.missing(f"collective_id: no collective {collective_id}")
        return found

    def not_followed(self, collective_id: UUID) -> NotFollowed:
        """A collective this host does not follow (a partial host: ``sync.following``)."""
        scope = self._scope()
        assert scope is not None
        return NotFollowed(
            f"collective_id: collective {collective_id} is not followed by this host (it "
            f"follows {scope.describe()})"
        )

    async def collective_of(self, experience_id: Any, field: str = "experience_id") -> UUID:
        """The collective of a live experience; NotFoundError when there is none."""
        key = uuid_of(field, experience_id)
        found = await self._known_or_read("experience", key, queries.live_collective_of)
        if found is None:
            raise self.missing(f"{field}: no experience {experience_id}")
        return found

    def missing(self, message: str) -> NotFoundError:
        """What is not found here; on a host that follows some collectives, the message
        says which (what it looked for may be in another)."""
        scope = self._scope()
        if scope is None:
            return NotFoundError(message)
        return NotFoundError(f"{message} in the collectives this host follows ({scope.describe()})")

    async def readable(self, collective_id: Any) -> tuple[queries.Collective, Viewer | None]:
        """A collective the caller may read, and the filter of what it sees in it (None:
        everything). One that holds nothing it may see does not exist for it."""
        collective = await self.collective(collective_id)
        viewer = access.viewer_of(self.me(), collective.owner_id, collective.collective_id)
        if viewer is not None and not viewer.member:
            if not await self.reader.read(queries.shows_anything, collective.collective_id, viewer):
                raise self.missing(f"collective_id: no collective {collective_id}")
        return collective, viewer

    async def writable(self, collective_id: Any) -> queries.Collective:
        """A collective the caller may write to: a member with a write scope."""
        collective = await self.collective(collective_id)
        me = self.me()
        if not me.member(collective.owner_id, collective.collective_id):
            viewer = access.viewer_of(me, collective.owner_id, collective.collective_id)
            assert viewer is not None
            if await self.reader.read(queries.shows_anything, collective.collective_id, viewer):
                raise Forbidden(
                    f"collective_id: {me.describe()} is not a member of collective "
                    f"{collective.name!r}"
                )
            raise self.missing(f"collective_id: no collective {collective_id}")
        me.need_write()
        return collective

    # -- entities ---------------------------------------------------------------------------

    async def entity(
        self, entity: str, entity_id: Any, *, write: bool, field: str | None = None
    ) -> UUID | None:
        """Check the caller may see (and with ``write``, change) a live experience,
        relation, insight or wisdom; returns its collective (None for wisdom). One it may
        not see does not exist for it. ``field``: the argument named in errors."""
        field = field or f"{entity}_id"
        key = uuid_of(field, entity_id)
        me = self.me()
        if me.admin and entity == "experience":
            return await self.collective_of(key, field)  # (remembered: the hot path)
        facts = await self.reader.read(queries.access_of, entity, key)
        if facts is None:
            if entity == "wisdom":  # (every host holds every wisdom)
                raise NotFoundError(f"{field}: no {entity} {entity_id}")
            raise self.missing(f"{field}: no {entity} {entity_id}")
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
            raise self.missing(f"{field}: no {entity} {entity_id}")
        if write:
            if not member:
                raise Forbidden(f"{field}: {me.describe()} may not change {entity} {key}")
            me.need_write()
        return facts.collective_id

    async def acts_for(self, collective_id: Any, agent_id: str) -> queries.Collective:
        """A collective the caller may write to, for an agent it may speak for: a token
        of an agent speaks for that agent only."""
        collective = await self.writable(collective_id)
        me = self.me()
        if me.agent is not None and not me.admin and agent_id != me.agent:
            raise Forbidden(
                f"agent_id: {me.describe()} may speak for agent {me.agent!r} only, "
                f"got {agent_id!r:.60}"
            )
        return collective


def uuid_of(field: str, value: Any) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise ValidationError(f"{field}: not a UUID: {value!r}") from None

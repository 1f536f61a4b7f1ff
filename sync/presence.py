"""Presence: which agents are working on what, in the activity stream (last message
per agent, with a TTL). Activities are never folded into the projection."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from uuid import UUID

import msgspec

from eventlog import events as ev
from eventlog.errors import NotFoundError, ValidationError
from eventlog.log import EventLog
from sync import models
from sync.core import InstanceSettings, uuid_of
from sync.gate import Gate
from sync.idempotency import idempotent
from sync.models import validated
from sync.writer import Writer


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


class Presence:
    """Which agents work on what (see the module docstring)."""

    def __init__(
        self, gate: Gate, writer: Writer, log_: EventLog, settings: InstanceSettings
    ) -> None:
        self.gate, self.writer, self.log, self.settings = gate, writer, log_, settings

    @idempotent
    async def register_activity(
        self,
        collective_id: UUID,
        agent_id: str,
        task_description: str = "",
        working_on: Sequence[str] = (),
        *,
        idempotency_key: str | None = None,
    ) -> Activity:
        """Say what an agent is working on (replaces its previous activity)."""
        spec = validated(
            models.ActivityIn, collective_id=collective_id, agent_id=agent_id,
            task_description=task_description, working_on=list(working_on),
        )  # fmt: skip
        await self.gate.acts_for(spec.collective_id, spec.agent_id)
        event = ev.ActivityRegistered(
            **self.writer.common(), collective_id=spec.collective_id, agent_id=spec.agent_id,
            task_description=spec.task_description, working_on=tuple(spec.working_on),
        )  # fmt: skip
        await self.writer.append_unfolded(event)
        return _activity(event, ev.hlc_millis(event.hlc))

    @idempotent
    async def update_heartbeat(
        self,
        collective_id: UUID,
        agent_id: str,
        *,
        task_description: str | None = None,
        working_on: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> Activity:
        """Keep an agent's activity alive (optionally changing what it works on)."""
        collective_id = (await self.gate.acts_for(collective_id, agent_id)).collective_id
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
            **self.writer.common(), collective_id=spec.collective_id, agent_id=spec.agent_id,
            started_ms=current.started_ms, task_description=spec.task_description,
            working_on=tuple(spec.working_on),
        )  # fmt: skip
        await self.writer.append_unfolded(event)
        return _activity(event, current.started_ms)

    @idempotent
    async def end_activity(
        self, collective_id: UUID, agent_id: str, *, idempotency_key: str | None = None
    ) -> None:
        """The agent stopped; it leaves the active agents at once."""
        spec = validated(models.ActivityIn, collective_id=collective_id, agent_id=agent_id)
        await self.gate.acts_for(spec.collective_id, spec.agent_id)
        await self.writer.append_unfolded(
            ev.ActivityEnded(**self.writer.common(), collective_id=spec.collective_id,
                             agent_id=spec.agent_id)
        )  # fmt: skip

    async def get_active_agents(
        self,
        collective_id: UUID,
        *,
        stale_after: float | None = None,
        limit: int = models.PAGE_DEFAULT,
        after: str | None = None,
    ) -> models.Page[Activity]:
        """Agents of a collective whose last heartbeat is within ``stale_after`` seconds
        (default: the instance's setting, 5 minutes), most recent first: one page of at
        most ``limit`` (1..1000, default 100); the page's ``next`` is the cursor of the
        rest (``after=``), None on the last page. (The cursor is the last heartbeat and
        agent listed: an agent that beats again while a caller pages moves to the front,
        so that walk does not list it twice.)"""
        models.check_page_limit(limit)
        key = models.from_cursor("active_agents", after, (int, str))
        _, viewer = await self.gate.readable(collective_id)
        if viewer is not None and not viewer.member:
            return models.Page([])  # activities are the members' (they have no visibility)
        active = await self.active(collective_id, stale_after)
        if key is not None:
            beat, agent = key
            active = [a for a in active if (-a.last_heartbeat_ms, a.agent_id) > (-beat, agent)]
        if len(active) <= limit:
            return models.Page(active)
        last = active[limit - 1]
        return models.Page(
            active[:limit],
            models.cursor("active_agents", (last.last_heartbeat_ms, last.agent_id)),
        )

    async def active(self, collective_id: UUID, stale_after: float | None) -> list[Activity]:
        """Every active agent of a collective, most recent first (see get_active_agents)."""
        window = self.settings.stale_after if stale_after is None else stale_after
        if not (math.isfinite(window) and window > 0):
            raise ValidationError(f"stale_after: must be > 0 seconds, got {stale_after}")
        cid = (await self.gate.collective(collective_id)).collective_id
        now_ms = int(time.time() * 1000)
        active = [
            a for a in await self.activities(cid) if now_ms - a.last_heartbeat_ms <= window * 1000
        ]
        active.sort(key=lambda a: (-a.last_heartbeat_ms, a.agent_id))
        return active

    async def activities(self, collective_id: UUID | None) -> list[Activity]:
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
        for activity in await self.activities(uuid_of("collective_id", collective_id)):
            if activity.agent_id == agent_id:
                return activity
        return None

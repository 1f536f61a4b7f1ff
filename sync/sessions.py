"""Sessions: an agent's working state in a collective, from its start to its end.

A session belongs to a collective and an agent. It holds a summary, a todo list (task,
priority, note, done), and short notes of what changed, known bugs and architecture
decisions. Every one of those fields is a last-writer-wins register of the fold
(``projections.fold.SessionRow``): two hosts that change different fields of one session
at the same time both keep their change, and every host converges to the same session.

An agent calls ``resume_session`` when it starts (its latest open session, with the
context for its summary) or ``start_session`` when it has none; ``update_session`` as
it goes; ``end_session`` (with its final notes) when it stops. Sessions are the members'
of their collective (they have no visibility of their own): a principal that is not a
member sees none. A token of an agent acts for that agent's sessions only.

A session is an entity like an experience: its start and updates are sealed with its own
data key (``eventlog.sealing``), and ``delete_session`` forgets it as
``delete_experience`` forgets an experience (``sync.forgetting``): a tombstone that wins,
its key destroyed, its subject purged, its rows and history rows scrubbed from every host's
files. So a summary that held what must not be kept, and every summary it replaced (the
``history`` view), can be forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal
from uuid import UUID

import msgspec

from eventlog import events as ev
from eventlog.errors import ConflictError, Forbidden, NotFoundError, ValidationError
from projections import queries
from sync import models
from sync.core import check_limit, check_text, uuid_of
from sync.gate import Gate
from sync.idempotency import idempotent
from sync.models import validated
from sync.reading import Reader
from sync.recall import Context, Recall
from sync.writer import Writer


def _ended(found: queries.Session) -> ConflictError:
    return ConflictError(
        f"session_id: session {found.session_id} has ended; it takes no more changes "
        "(start a new session)"
    )


class ResumedSession(msgspec.Struct, frozen=True, kw_only=True):
    """What ``resume_session`` returns: the session, and the context to resume it with.
    ``context_by``: "summary" (what is similar to its summary, as
    ``get_context_candidates`` finds it for a task) or "recent" (the most recent
    experiences: the collective has no embedder, or the session no summary yet)."""

    session: queries.Session
    context: Context
    context_by: Literal["summary", "recent"]


class Sessions:
    """Agents' sessions (see the module docstring); ``recall`` finds the context a
    resumed session comes with."""

    def __init__(self, reads: Reader, gate: Gate, writer: Writer, recall: Recall) -> None:
        self.reads, self.gate, self.writer, self.recall = reads, gate, writer, recall

    @idempotent
    async def start_session(
        self,
        collective_id: UUID,
        agent_id: str,
        summary: str = "",
        *,
        idempotency_key: str | None = None,
    ) -> queries.Session:
        """Start a session of an agent in a collective (summary: 0..8 KB of UTF-8);
        returns it. Needs write access; a token of an agent starts its own sessions only."""
        spec = validated(
            models.SessionIn, collective_id=collective_id, agent_id=agent_id, summary=summary
        )
        await self.gate.acts_for(spec.collective_id, spec.agent_id)
        session_id = self.writer.new_id()
        await self.writer.write(
            ev.SessionStarted(
                **self.writer.common(), session_id=session_id, collective_id=spec.collective_id,
                agent_id=spec.agent_id, summary=spec.summary,
            )
        )  # fmt: skip
        return await self._written(session_id)

    @idempotent
    async def update_session(
        self,
        session_id: UUID,
        *,
        summary: str | None = None,
        todo: Sequence[models.TodoIn | Mapping[str, Any]] | None = None,
        changes: Sequence[str] | None = None,
        bugs: Sequence[str] | None = None,
        architecture: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> queries.Session:
        """Replace the fields given (the others stay): ``summary`` (0..8 KB), ``todo``
        (≤100 items of task 1 byte..1 KB, priority low / medium / high, note ≤1 KB, done),
        ``changes``, ``bugs``, ``architecture`` (each ≤100 notes of 1 byte..1 KB). Each
        field is replaced as a whole, last writer wins, so concurrent updates of different
        fields on different hosts all stay. An ended session takes no more changes
        (ConflictError). Returns the session."""
        spec = self._changes(summary, todo, changes, bugs, architecture)
        if not spec.given:
            raise ValidationError(
                "update: give at least one of summary, todo, changes, bugs, architecture"
            )
        found = await self._session_for(session_id, write=True)
        if found.ended:
            raise _ended(found)
        await self.writer.write(self._updated(found, spec))
        return await self._written(found.session_id)

    @idempotent
    async def end_session(
        self,
        session_id: UUID,
        *,
        summary: str | None = None,
        todo: Sequence[models.TodoIn | Mapping[str, Any]] | None = None,
        changes: Sequence[str] | None = None,
        bugs: Sequence[str] | None = None,
        architecture: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> queries.Session:
        """End a session, with its final fields if given (as ``update_session``, in the
        same atomic write); returns it. Ending an ended session again without fields
        changes nothing; with fields it is a ConflictError."""
        spec = self._changes(summary, todo, changes, bugs, architecture)
        found = await self._session_for(session_id, write=True)
        if found.ended:
            if spec.given:
                raise _ended(found)
            return found
        ended = ev.SessionEnded(
            **self.writer.common(), session_id=found.session_id, collective_id=found.collective_id
        )
        if spec.given:
            await self.writer.write_many([self._updated(found, spec), ended], atomic=True)
        else:
            await self.writer.write(ended)
        return await self._written(found.session_id)

    @idempotent
    async def delete_session(self, session_id: UUID, *, idempotency_key: str | None = None) -> None:
        """Delete a session and forget it, as an experience is forgotten: its summary,
        todo and notes, and every summary and note it had before (its history), leave
        every host's state, files and the stream, where only the tombstone stays. Every
        event of the session was sealed with its own data key, which the delete destroys,
        so a copy of one (a backup, another store) is noise. Who may: whoever may change
        it (a member of its collective with a write scope; a token of an agent, that
        agent's sessions). Repeating it is harmless and finishes forgetting if an earlier
        call was interrupted."""
        key = uuid_of("session_id", session_id)
        if await self.reads.read(queries.get_session, key) is not None:
            await self._session_for(key, write=True)
        else:  # deleted here already (or never seen): finishing it is a member's
            anchor = await self.reads.read(queries.anchor_of, "session", key)
            collective = await self.reads.read(queries.get_collective, anchor) if anchor else None
            me = self.gate.me()
            if not me.admin and (collective is None or not me.member(collective.owner_id, anchor)):
                raise NotFoundError(f"session_id: no session {session_id}")
            me.need_write()
        await self.writer.delete("session", key)

    async def get_session(self, session_id: UUID) -> queries.Session | None:
        """The session (ended or not), or None: also when the caller is not a member of
        its collective."""
        try:
            return await self._session_for(session_id, write=False)
        except NotFoundError:
            return None

    async def list_sessions(
        self,
        collective_id: UUID,
        *,
        agent_id: str | None = None,
        open_only: bool = False,
        limit: int = models.PAGE_DEFAULT,
        after: str | None = None,
    ) -> models.Page[queries.Session]:
        """The sessions of a collective (of one agent; only the open ones), oldest first
        (by start, then id): one page of at most ``limit`` (1..1000, default 100); the
        page's ``next`` is the cursor of the rest (``after=``), None on the last page. A
        caller that is not a member of the collective sees none."""
        models.check_page_limit(limit)
        key = models.from_cursor("sessions", after, (int, UUID))
        if agent_id is not None:
            check_text("agent_id", agent_id, models.NAME_MAX)
        collective, viewer = await self.gate.readable(collective_id)
        if viewer is not None and not viewer.member:
            return models.Page([])  # sessions are the members' (they have no visibility)
        found, last = await self.reads.read(
            queries.sessions_page, collective.collective_id, agent_id, open_only, limit, key
        )
        return models.Page(found, None if last is None else models.cursor("sessions", last))

    async def resume_session(
        self, collective_id: UUID, agent_id: str, *, k: int = 5
    ) -> ResumedSession | None:
        """The agent's latest open session in the collective (the one started last), with
        the context to resume it: the ``k`` experiences most similar to its summary, the
        recent ones, similar insights, the relations among them and the active agents
        (``get_context_candidates`` with the summary as the task). When the summary cannot
        be embedded (the collective has no embedder, or the summary is empty) the context
        holds the ``k`` most recent experiences instead (``context_by`` says which). None
        when the agent has no open session there (or the caller is not a member)."""
        check_limit("k", k)
        check_text("agent_id", agent_id, models.NAME_MAX)
        collective, viewer = await self.gate.readable(collective_id)
        if viewer is not None and not viewer.member:
            return None
        cid = collective.collective_id
        found = await self.reads.read(queries.latest_open_session, cid, agent_id)
        if found is None:
            return None
        if collective.embedder and found.summary.strip():
            context = await self.recall.get_context_candidates(
                collective_id=cid, text=found.summary, k=k
            )
            return ResumedSession(session=found, context=context, context_by="summary")
        context = await self.recall.get_context_candidates(
            collective_id=cid, similar=False, recent=k, insights=0
        )
        return ResumedSession(session=found, context=context, context_by="recent")

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _changes(
        summary: str | None,
        todo: Sequence[Any] | None,
        changes: Sequence[str] | None,
        bugs: Sequence[str] | None,
        architecture: Sequence[str] | None,
    ) -> models.SessionUpdateIn:
        def listed(value: Sequence[Any] | None) -> Any:
            """A list of the items (a text stays a text: the model refuses it)."""
            if value is None or isinstance(value, (str, bytes)):
                return value
            return list(value)

        return validated(
            models.SessionUpdateIn, summary=summary, todo=listed(todo), changes=listed(changes),
            bugs=listed(bugs), architecture=listed(architecture),
        )  # fmt: skip

    def _updated(self, found: queries.Session, spec: models.SessionUpdateIn) -> ev.SessionUpdated:
        todo = None
        if spec.todo is not None:
            todo = tuple(
                ev.TodoItem(task=t.task, priority=t.priority, note=t.note, done=t.done)
                for t in spec.todo
            )
        return ev.SessionUpdated(
            **self.writer.common(), session_id=found.session_id, collective_id=found.collective_id,
            summary=spec.summary, todo=todo,
            changes=None if spec.changes is None else tuple(spec.changes),
            bugs=None if spec.bugs is None else tuple(spec.bugs),
            architecture=None if spec.architecture is None else tuple(spec.architecture),
        )  # fmt: skip

    async def _session_for(self, session_id: Any, *, write: bool) -> queries.Session:
        """A live session the caller may read (a member of its collective), and with
        ``write`` change (a write scope; a token of an agent: that agent's session). One
        it may not read does not exist for it."""
        key = uuid_of("session_id", session_id)
        found = await self.reads.read(queries.get_session, key)
        missing = NotFoundError(f"session_id: no session {session_id}")
        if found is None:
            raise missing
        collective = await self.gate.collective(found.collective_id)
        me = self.gate.me()
        if not me.member(collective.owner_id, collective.collective_id):
            raise missing
        if write:
            me.need_write()
            if me.agent is not None and not me.admin and found.agent_id != me.agent:
                raise Forbidden(
                    f"session_id: {me.describe()} may speak for agent {me.agent!r} only; "
                    f"session {found.session_id} is agent {found.agent_id!r}'s"
                )
        return found

    async def _written(self, session_id: UUID) -> queries.Session:
        """A session this call just wrote (applied here: read-your-writes)."""
        found = await self.reads.read(queries.get_session, session_id)
        if found is None:  # its collective was deleted meanwhile
            raise NotFoundError(f"session_id: no session {session_id}")
        return found

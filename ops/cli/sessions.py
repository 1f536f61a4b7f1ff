"""`pulse session ...`: an agent's working state from the start of a session to its end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventlog.errors import NotFoundError, ValidationError
from ops.cli.arguments import IN_COLLECTIVE, collective_of, every_page
from ops.cli.declare import Arg, Command, arg
from ops.cli.output import context_text, indent, plain, session_text

if TYPE_CHECKING:
    from projections import queries


def session_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The fields a `pulse session update` or `end` replaces."""
    if args.todo is not None and args.task:
        raise ValidationError("todo: give --todo or --task, not both")
    changes: dict[str, Any] = {name: [] for name in args.clear or ()}
    if args.todo is not None:
        text = Path(args.todo[1:]).read_text() if args.todo.startswith("@") else args.todo
        try:
            changes["todo"] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"todo: not a JSON list of items ({exc.msg})") from None
    if args.task:
        changes["todo"] = [{"task": task} for task in args.task]
    for name, given in (("summary", args.summary), ("changes", args.change),
                        ("bugs", args.bug), ("architecture", args.architecture)):  # fmt: skip
        if given is not None:
            changes[name] = given
    return changes


async def session_start(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Start an agent's session in a collective; prints its id.

    A session holds the agent's working state (summary, todo list, changes, bugs and
    architecture notes) from its start to its end; every host sees it. An agent with an
    open session resumes it instead (`pulse session resume`).

    example:
      S=$(pulse session start agent-7 -c demo --summary "harden the NATS publisher")
    """
    c = await collective_of(db, args.collective)
    s = await db.start_session(
        c.collective_id, args.agent, args.summary, idempotency_key=args.idempotency_key
    )
    return plain(s), str(s.session_id)


async def session_update(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Replace some fields of an open session (the others stay as they are).

    Each field is replaced as a whole (last writer wins): --todo or --task replace the
    todo list, --change, --bug and --architecture the notes of that kind. Updates of
    different fields on different hosts at the same time all stay.

    example:
      pulse session update $S --task "retry on timeout" --task "dedup by message id"
      pulse session update $S --todo '[{"task": "retry on timeout", "priority": "high", "done": true}]' --bug "acks lost on failover"
    """  # noqa: E501
    s = await db.update_session(
        args.session_id, idempotency_key=args.idempotency_key, **session_changes(args)
    )
    return plain(s), session_text(s)


async def session_end(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """End a session, with its final fields if given (as `pulse session update`).

    example:
      pulse session end $S --summary "publisher retries with the same id" --change "jetstream.py: retries"
    """  # noqa: E501
    s = await db.end_session(
        args.session_id, idempotency_key=args.idempotency_key, **session_changes(args)
    )
    return plain(s), session_text(s)


async def session_get(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Show one session (ended ones too).

    example:
      pulse session get $S --json
    """
    s = await db.get_session(args.session_id)
    if s is None:
        raise NotFoundError(f"session_id: no session {args.session_id}")
    return plain(s), session_text(s)


async def session_delete(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete a session and forget it: its summary, todo and notes, and every summary it
    had before, gone from every host, the log and rebuilds.

    example:
      pulse session delete $S
    """
    await db.delete_session(args.session_id, idempotency_key=args.idempotency_key)
    return {"deleted": str(args.session_id)}, f"deleted session {args.session_id}"


async def session_list(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """List the sessions of a collective, oldest first.

    example:
      pulse session list -c demo --agent agent-7 --open
    """
    c = await collective_of(db, args.collective)
    found: list[queries.Session] = await every_page(
        db.list_sessions, c.collective_id, agent_id=args.agent, open_only=args.open
    )
    return plain(found), "\n".join(session_text(s) for s in found) or "no sessions"


async def session_resume(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """The agent's latest open session, with the context to resume it.

    The context is what `pulse context` gives for the session's summary; when the
    collective has no embedder (or the summary is empty), the most recent experiences.
    Exits 1 when the agent has no open session there (start one).

    example:
      pulse session resume agent-7 -c demo
    """
    c = await collective_of(db, args.collective)
    found = await db.resume_session(c.collective_id, args.agent, k=args.k)
    if found is None:
        raise NotFoundError(
            f"agent_id: {args.agent!r} has no open session in collective {c.name!r} "
            "(pulse session start)"
        )
    text = f"{session_text(found.session)}\ncontext (by {found.context_by}):\n"
    return plain(found), text + indent(context_text(found.context))


_AGENT = arg("agent", help="agent id (1..256 characters)")
_SESSION = arg("session_id", help="session id")
_FIELDS: tuple[Arg, ...] = (
    arg("session_id", help="session id (see `pulse session list`)"),
    arg("--summary", help="replace the summary (≤8 KB)"),
    arg("--todo", metavar="JSON",
        help='replace the todo list: a JSON list (or @file) of {"task", "priority": '
        'low|medium|high, "note", "done"}, ≤100 items'),
    arg("--task", action="append", metavar="TASK",
        help="replace the todo list with these tasks (repeatable; priority medium)"),
    arg("--change", action="append", metavar="NOTE",
        help="replace the changes: what changed, one note each (repeatable, ≤100 of ≤1 KB)"),
    arg("--bug", action="append", metavar="NOTE",
        help="replace the known bugs, one note each (repeatable, ≤100 of ≤1 KB)"),
    arg("--architecture", action="append", metavar="NOTE",
        help="replace the architecture notes (repeatable, ≤100 of ≤1 KB)"),
    arg("--clear", action="append", choices=("todo", "changes", "bugs", "architecture"),
        help="empty this list (repeatable)"),
)  # fmt: skip

COMMANDS = (
    Command(
        "start", "session", session_start,
        arguments=(
            _AGENT, IN_COLLECTIVE,
            arg("--summary", default="", help="what the session is about (≤8 KB)"),
        ),
        operations=("find_collective", "start_session"), writes=True,
    ),
    Command("update", "session", session_update, arguments=_FIELDS,
            operations=("update_session",), writes=True),
    Command("end", "session", session_end, arguments=_FIELDS,
            operations=("end_session",), writes=True),
    Command("get", "session", session_get, arguments=(_SESSION,), operations=("get_session",)),
    Command("delete", "session", session_delete, arguments=(_SESSION,),
            operations=("delete_session",), writes=True),
    Command(
        "list", "session", session_list,
        arguments=(
            IN_COLLECTIVE,
            arg("--agent", help="only this agent's sessions"),
            arg("--open", action="store_true", help="only the sessions not ended"),
        ),
        operations=("find_collective", "list_sessions"),
    ),
    Command(
        "resume", "session", session_resume,
        arguments=(
            _AGENT, IN_COLLECTIVE,
            arg("-k", type=int, default=5, help="experiences for its summary (default 5)"),
        ),
        operations=("find_collective", "resume_session"),
    ),
)  # fmt: skip

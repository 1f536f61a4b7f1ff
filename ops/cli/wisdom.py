"""`pulse wisdom ...`: patterns learned across an owner's collectives."""

from __future__ import annotations

import argparse
from typing import Any

from ops.cli.arguments import collective_of, vector, visibility
from ops.cli.declare import Command, arg
from ops.cli.output import clip, plain


async def wisdom_add(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Store wisdom for an owner (across their collectives); prints its id.

    example:
      pulse wisdom add "Prefer small functions" --owner me --category CodingStyle --embedding '[1, 0]'
    """  # noqa: E501
    sources = [(await collective_of(db, s, args.owner)).collective_id for s in args.source]
    wid = await db.store_wisdom(
        args.owner, args.category, args.pattern, vector(args.embedding) or [],
        confidence=args.confidence, source_collectives=sources, applicable_domains=args.domain,
        visibility=args.visibility, idempotency_key=args.idempotency_key,
    )  # fmt: skip
    return {"wisdom_id": str(wid)}, str(wid)


async def wisdom_list(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """An owner's wisdom, nearest to --embedding first (or oldest first).

    example:
      pulse wisdom list --owner me --embedding '[1, 0]' --json
    """
    found = await db.get_wisdom(
        args.owner, vector(args.embedding, "query"), args.k, as_of=args.as_of
    )
    text = "\n".join(
        f"{s.score:.4f}  {s.wisdom.wisdom_id}  {s.wisdom.category}  {clip(s.wisdom.pattern, 50)}"
        for s in found
    )
    return plain(found), text or "no wisdom"


async def wisdom_delete(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete wisdom (and forget it).

    example:
      pulse wisdom delete 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.delete_wisdom(args.wisdom_id, idempotency_key=args.idempotency_key)
    return {"deleted": str(args.wisdom_id)}, f"deleted wisdom {args.wisdom_id}"


COMMANDS = (
    Command(
        "add", "wisdom", wisdom_add,
        arguments=(
            arg("pattern", help="the learned pattern"),
            arg("--owner", required=True, help="owner id"),
            arg("--category", required=True,
                help="CodingStyle, ArchitecturalPreference, TechStackPreference, "
                "QualityStandard or WorkflowPreference"),
            arg("--embedding", required=True, help="JSON list of floats or @file"),
            arg("--confidence", type=float, default=0.5, help="0..1 (default 0.5)"),
            arg("--source", action="append", default=[],
                help="a source collective of the owner: its id or name (another owner's: "
                "owner/name)"),
            arg("--domain", action="append", default=[], help="an applicable domain"),
            visibility(team="every principal of the owner"),
        ),
        operations=("find_collective", "store_wisdom"), writes=True,
    ),
    Command(
        "list", "wisdom", wisdom_list,
        arguments=(
            arg("--owner", required=True, help="owner id"),
            arg("--embedding", help="nearest to this vector first (JSON or @file)"),
            arg("-k", type=int, default=10, help="how many (default 10)"),
        ),
        operations=("get_wisdom",), reads=True,
    ),
    Command(
        "delete", "wisdom", wisdom_delete, arguments=(arg("wisdom_id", help="wisdom id"),),
        operations=("delete_wisdom",), writes=True,
    ),
)  # fmt: skip

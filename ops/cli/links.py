"""`pulse relate`, `unrelate` and `related`: relations between experiences."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any
from uuid import UUID

from ops.cli.arguments import AN_EXPERIENCE, every_page, visibility
from ops.cli.declare import Command, arg
from ops.cli.output import clip, plain

if TYPE_CHECKING:
    from projections import queries


async def relate(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Link two experiences of one collective; prints the relation's id.

    example:
      pulse relate $A Supports $B --strength 0.9
      pulse relate $NEW Supersedes $OLD --invalidate
    """
    rid = await db.store_relation(
        args.source_id, args.target_id, args.relation_type, strength=args.strength,
        metadata=args.metadata, visibility=args.visibility, invalidate=args.invalidate,
        idempotency_key=args.idempotency_key,
    )  # fmt: skip
    return {"relation_id": str(rid)}, str(rid)


async def unrelate(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete a relation (and forget it).

    example:
      pulse unrelate 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.delete_relation(args.relation_id, idempotency_key=args.idempotency_key)
    return {"deleted": str(args.relation_id)}, f"deleted relation {args.relation_id}"


async def related(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Experiences linked to one, by direction, type and strength.

    example:
      pulse related $A
      pulse related $A --direction outgoing --type Supports --json
    """
    found: list[queries.RelatedExperience] = await every_page(
        db.get_related_experiences, args.experience_id, args.direction, args.types,
        min_strength=args.min_strength, as_of=args.as_of,
    )  # fmt: skip
    text = "\n".join(
        f"{r.relation.relation_type} ({r.relation.strength:.2f})  "
        f"{'->' if r.relation.source_id == UUID(str(args.experience_id)) else '<-'}  "
        f"{r.experience.experience_id}  {clip(r.experience.content, 50)}"
        for r in found
    )
    return plain(found), text or "no related experiences"


COMMANDS = (
    Command(
        "relate", None, relate,
        arguments=(
            arg("source_id", help="experience the relation starts from"),
            arg("relation_type",
                help="Supports, Contradicts, Elaborates, Supersedes, Implies or RelatedTo"),
            arg("target_id", help="experience it points to (same collective)"),
            arg("--strength", type=float, default=0.5, help="0..1 (default 0.5)"),
            arg("--metadata", help="free text or JSON, ≤10 KB"),
            arg("--invalidate", action="store_true",
                help="Supersedes / Contradicts: the target stops being true now, in the "
                "same write"),
            visibility(),
        ),
        operations=("store_relation",), writes=True,
    ),
    Command(
        "unrelate", None, unrelate, arguments=(arg("relation_id", help="relation id"),),
        operations=("delete_relation",), writes=True,
    ),
    Command(
        "related", None, related,
        arguments=(
            AN_EXPERIENCE,
            arg("--direction", choices=("outgoing", "incoming", "both"), default="both",
                help="links from it, to it, or both (default both)"),
            arg("--type", dest="types", action="append", help="only this type (repeatable)"),
            arg("--min-strength", type=float, help="only at least this strong"),
        ),
        operations=("get_related_experiences",), reads=True,
    ),
)  # fmt: skip

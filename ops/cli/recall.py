"""`pulse search`, `pulse context` and `pulse insight ...`: finding what the collective
knows, by meaning, by words or both, and the insights distilled from it."""

from __future__ import annotations

import argparse
from typing import Any

from ops.cli.arguments import (
    FILTER,
    IN_COLLECTIVE,
    collective_of,
    search_filter,
    vector,
    visibility,
)  # fmt: skip
from ops.cli.declare import Command, arg
from ops.cli.output import clip, context_text, hit_lines, plain


async def search(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Search a collective by meaning, by words, or both (hybrid, the default).

    Hybrid fuses the vector and the BM25 rankings by Reciprocal Rank Fusion; every
    mode weights results by energy. Prints score, id and the start of the content.

    example:
      pulse search -c demo "nats timeout"
      pulse search -c demo "nats timeout" --mode text -k 3 --json
      pulse search -c vectors --mode similar --embedding '[0.1, 0.2, 0.3]'
    """
    as_of = args.as_of
    c = await collective_of(db, args.collective, as_of=as_of)
    flt, weight = search_filter(args), args.energy_weight
    given = vector(args.embedding, "query")
    if args.mode == "text":
        hits = await db.search_text(
            c.collective_id, args.query, args.k, flt, energy_weight=weight, as_of=as_of
        )
    elif args.mode == "similar":
        query: Any = given if given is not None else args.query
        hits = await db.search_similar(
            c.collective_id, query, args.k, flt, energy_weight=weight, as_of=as_of
        )
    else:
        hits = await db.search_hybrid(
            c.collective_id, args.query, given, args.k, flt, energy_weight=weight, as_of=as_of
        )
    return plain(hits), hit_lines(hits)


async def context(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Everything to know before a task, in one call.

    Similar experiences (hybrid), recent ones, similar insights, the relations among
    them and the active agents; each part can be switched off, filters apply to all.

    example:
      pulse context -c demo "make publishing to NATS robust"
      pulse context -c demo "fix the flaky test" --recent 0 --no-agents --json
    """
    c = await collective_of(db, args.collective, as_of=args.as_of)
    found = await db.get_context_candidates(
        collective_id=c.collective_id, text=args.task, k=args.k, recent=args.recent,
        insights=args.insights, similar=not args.no_similar, relations=not args.no_relations,
        active_agents=not args.no_agents, filter=search_filter(args) or {}, as_of=args.as_of,
    )  # fmt: skip
    return plain(found), context_text(found)


async def insight_add(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Store an insight distilled from experiences; prints its id.

    example:
      pulse insight add -c demo "Timeouts come from slow disks" --source $A --source $B
    """
    c = await collective_of(db, args.collective)
    iid = await db.store_insight(
        c.collective_id, args.content, vector(args.embedding), source_experiences=args.source,
        confidence=args.confidence, domain=args.domain, visibility=args.visibility,
        idempotency_key=args.idempotency_key,
    )  # fmt: skip
    return {"insight_id": str(iid)}, str(iid)


async def insight_search(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Insights nearest in meaning to a text (or a vector).

    example:
      pulse insight search -c demo "disk latency"
    """
    c = await collective_of(db, args.collective, as_of=args.as_of)
    given = vector(args.embedding, "query")
    found = await db.get_insights(
        c.collective_id, given if given is not None else args.query, args.k, as_of=args.as_of
    )
    text = "\n".join(
        f"{s.score:.4f}  {s.insight.insight_id}  {clip(s.insight.content, 60)}" for s in found
    )
    return plain(found), text or "no insights"


async def insight_delete(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Delete an insight (and forget it).

    example:
      pulse insight delete 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    await db.delete_insight(args.insight_id, idempotency_key=args.idempotency_key)
    return {"deleted": str(args.insight_id)}, f"deleted insight {args.insight_id}"


COMMANDS = (
    Command(
        "search", None, search,
        arguments=(
            arg("query", nargs="?", default="", help="the text to look for"),
            IN_COLLECTIVE,
            arg("--mode", choices=("similar", "text", "hybrid"), default="hybrid",
                help="by meaning (vector), by words (BM25) or both fused (default hybrid)"),
            arg("--embedding",
                help="query vector as JSON or @file (default: embed the text)"),
            arg("-k", type=int, default=10, help="how many (1..1000, default 10)"),
            arg("--energy-weight", type=float,
                help="0..1: how much energy reorders results"),
            *FILTER,
        ),
        operations=("find_collective", "search_hybrid", "search_text", "search_similar"),
        reads=True,
    ),
    Command(
        "context", None, context,
        arguments=(
            arg("task", help="what the agent is about to do"),
            IN_COLLECTIVE,
            arg("-k", type=int, default=5, help="similar experiences (default 5)"),
            arg("--recent", type=int, default=5, help="recent experiences (default 5, 0: off)"),
            arg("--insights", type=int, default=3, help="insights (default 3, 0: off)"),
            arg("--no-similar", action="store_true", help="leave out similar experiences"),
            arg("--no-relations", action="store_true", help="leave out relations"),
            arg("--no-agents", action="store_true", help="leave out active agents"),
            *FILTER,
        ),
        operations=("find_collective", "get_context_candidates"), reads=True,
    ),
    Command(
        "add", "insight", insight_add,
        arguments=(
            arg("content", help="the insight (≤50 KB)"),
            IN_COLLECTIVE,
            arg("--source", action="append", required=True,
                help="source experience id (1..100)"),
            arg("--embedding",
                help="JSON list of floats or @file (default: embed the text)"),
            arg("--confidence", type=float, default=0.5, help="0..1 (default 0.5)"),
            arg("--domain", action="append", default=[], help="a tag (repeatable)"),
            visibility(),
        ),
        operations=("find_collective", "store_insight"), writes=True,
    ),
    Command(
        "search", "insight", insight_search,
        arguments=(
            arg("query", nargs="?", default="", help="text to look for"),
            IN_COLLECTIVE,
            arg("--embedding", help="query vector as JSON or @file"),
            arg("-k", type=int, default=10, help="how many (default 10)"),
        ),
        operations=("find_collective", "get_insights"), reads=True,
    ),
    Command(
        "delete", "insight", insight_delete, arguments=(arg("insight_id", help="insight id"),),
        operations=("delete_insight",), writes=True,
    ),
)  # fmt: skip

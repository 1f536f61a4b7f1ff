"""`pulse status`, `pulse sql` and `pulse tail`: what this host, its state and its log
hold, for operators and analysts."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any
from uuid import UUID

from eventlog.errors import ValidationError
from ops.cli.declare import Command, arg, positive
from ops.cli.output import plain, table
from ops.cli.running import wait_for_signal

if TYPE_CHECKING:
    from eventlog.events import Event
    from eventlog.log import LogEntry


async def sql(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
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
    result = await db.sql(args.query, limit=args.limit, as_of=args.as_of)
    records = [dict(zip(result.columns, row, strict=True)) for row in result.rows]
    text = table(result.columns, result.rows)
    if result.truncated_by == "bytes":
        text += "\n(stopped at the size limit of a result, $PULSE_SQL_MAX_BYTES)"
    elif result.truncated:
        text += f"\n(stopped at --limit {args.limit})"
    return records, text


async def status(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """The state of this host and of the log it follows.

    The stream (messages, sequences, replicas, the server leading it, the streams it
    sources, and its readers: each consumer's position and what it has pending; on a log
    in partitions, each partition stream's messages, sequences and consumers), this
    host (the sequence it applied, how far behind the log it is, the engine's backlog,
    dead letters), the analysts' snapshot (its path, the sequence it holds, how long its
    oldest missing change has waited, and the bound on that wait), and on a host that
    follows some collectives (`pulse up --follow`), each of them with the last sequence
    of its events and the host's lag. On an edge
    host (`pulse up --leaf-of`), its link to the hub: up or down, the hub and its round
    trip, this host's events the hub does not hold yet (exact while the link is up, "at
    least" while it is down), the hub's events not sourced here yet, and what keeps it
    from sending to the hub if anything does. Admins only.
    While `pulse up` serves the data directory, it answers.

    example:
      pulse status
      pulse status --json
    """
    found = await db.status()
    record = plain(found)
    stream = found.stream
    lines = [
        f"stream    {stream.name}: {stream.messages:,} messages ({stream.bytes:,} bytes), "
        f"sequences {stream.first_seq:,}..{stream.last_seq:,}, replicas {stream.replicas}"
        + (f", leader {stream.leader}" if stream.leader else "")
        + (f", on {stream.durability} servers" if stream.durability else ""),
    ]
    for part in found.partitions:  # (a log in partitions: this host's consumers on each)
        lines.append(
            f"  part    {part.name}: {part.messages:,} messages ({part.bytes:,} bytes), "
            f"sequences {part.first_seq:,}..{part.last_seq:,}, {len(part.consumers)} "
            "consumers" + (f", leader {part.leader}" if part.leader else "")
        )
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
        if leaf.problem is not None:
            lines.append(f"          not sending to the hub: {leaf.problem}")
    return record, "\n".join(lines)


def _jsonable(event: Event) -> dict[str, object]:
    """The event as JSON-ready builtins, embeddings as lists of floats (not base64); a
    sealed event's box (its key destroyed) as its size only."""
    import msgspec

    from eventlog.events import Sealed, unpack_vector

    record: dict[str, object] = msgspec.to_builtins(event, builtin_types=(bytes,))
    for key, value in record.items():
        if isinstance(value, bytes):
            if isinstance(event, Sealed):
                record[key] = f"<{len(value)} bytes sealed with a destroyed key>"
            else:
                record[key] = [round(float(x), 6) for x in unpack_vector(value)]
    return record


def _summary(entry: LogEntry) -> str:
    from eventlog.events import event_type_name

    if entry.event is None:
        return f"{entry.seq:>8}  UNREADABLE  {entry.subject}  {entry.error}"
    event = entry.event
    details = []
    for name in (
        "name", "content", "pattern", "agent_id", "relation_type", "applications", "kind",
    ):  # fmt: skip
        value = getattr(event, name, None)
        if value is not None:
            text = str(value).replace("\n", " ")
            details.append(f"{name}={text[:60]!r}" if isinstance(value, str) else f"{name}={value}")
    return f"{entry.seq:>8}  {event_type_name(event):<22}  {entry.subject}  {' '.join(details)}"


def tail(args: argparse.Namespace) -> int:
    """Print events as they arrive on the log (from the start, or --from-seq / --new).

    One line per event: stream sequence (on a log in partitions, --partitions, this
    command's own count of what it read), event type, subject and a few fields; with
    --json, one JSON object per line. Runs until Ctrl-C or --limit events. What the log
    holds sealed (an entity's text and vector) is shown opened with its data key; an
    event whose key a delete destroyed shows as `sealed`, with its kind only.

    example:
      pulse tail                         # everything so far, then live
      pulse tail --new --json            # only what arrives from now on, as JSON lines
      pulse tail --collective 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --limit 10
    """
    import asyncio

    import msgspec

    from eventlog.events import Sealed
    from eventlog.keys import Keyring
    from eventlog.partitioned import LocalLog
    from eventlog.sealing import Sealer
    from eventlog.subjects import collective_filter
    from ops.connect import open_log

    async def run() -> int:
        async with open_log(args) as (log, _server):
            if log.numbered_here and args.from_seq > 1:
                raise ValidationError(
                    "from_seq: a log in partitions has no one sequence to start from; "
                    "read it from the start, or --new"
                )
            if isinstance(log, LocalLog) and args.new:  # (it numbers what it takes)
                start = await log.from_now()
            else:
                start = (await log.last_seq()) + 1 if args.new else args.from_seq
            subjects = collective_filter(args.collective) if args.collective else None
            count = 0
            sealer = Sealer(Keyring(log.key_store()))
            stream = log.tail(start, subjects=subjects)
            waiter = asyncio.ensure_future(wait_for_signal())
            try:
                while args.limit is None or count < args.limit:
                    nxt = asyncio.ensure_future(anext(stream))
                    done, _ = await asyncio.wait({nxt, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    if waiter in done:
                        nxt.cancel()
                        break
                    entry = nxt.result()
                    if isinstance(entry.event, Sealed):  # opened; still sealed: forgotten
                        (entry,) = await sealer.open([entry])
                    if args.json:
                        record = {"seq": entry.seq, "subject": entry.subject}
                        if entry.event is not None:
                            record["event"] = _jsonable(entry.event)
                        else:
                            record["error"] = str(entry.error)
                        print(msgspec.json.encode(record).decode(), flush=True)
                    else:
                        print(_summary(entry), flush=True)
                    count += 1
            finally:
                waiter.cancel()
                await stream.aclose()
        return 0

    return asyncio.run(run())


COMMANDS = (
    Command("status", None, status, operations=("status",)),
    Command(
        "sql", None, sql,
        arguments=(
            arg("query", help="a read-only SQL query"),
            arg("--limit", type=int, default=10_000, help="at most this many rows (10000)"),
        ),
        operations=("sql",), reads=True,
    ),
    Command(
        "tail", None, run=tail,
        arguments=(
            arg("--from-seq", type=positive, default=1, help="first stream sequence",
                exclusive="start"),
            arg("--new", action="store_true", help="only events stored from now on",
                exclusive="start"),
            arg("--collective", type=UUID, action="append",
                help="only this collective (repeatable); wisdom events are always shown"),
            arg("--limit", type=positive, help="stop after this many events"),
            arg("--json", action="store_true", help="one JSON object per line"),
        ),
    ),
)  # fmt: skip

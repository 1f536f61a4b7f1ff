"""`pulse import`: many experiences from a JSON-lines or Parquet file, 1,000 a call
through ``record_experiences``, with a progress line and a summary."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import sys
import time
from collections.abc import Generator
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

from eventlog.errors import NotFoundError, PulseError, ValidationError
from ops.cli.arguments import IN_COLLECTIVE, collective_of, experience_type
from ops.cli.declare import Command, arg
from ops.progress import ProgressBar

Numbered = Generator[tuple[int, dict[str, Any]], None, None]  # (line or row number, fields)


async def import_(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Record many experiences from a file, up to 1,000 per call; prints a summary.

    FILE holds JSON lines (one object a line) or, when it ends in .parquet, a Parquet
    table. The fields (columns) are those of record_experience: content, embedding (a
    list of floats), embedder, experience_type (a kind or its JSON object), importance,
    confidence, domain and related_files (lists of strings), source_agent, source_task,
    visibility (private, team or org; --visibility sets it where a line does not). Content
    alone is enough when the collective has an embedder; null means the default.
    Each batch is stored all or nothing. The import stops at the first bad line, naming
    it and the field, and says how many experiences were stored before it. A progress
    line goes to stderr; --ids writes the new ids as they are stored.

    example:
      echo '{"content": "Pin nats-server in CI", "domain": ["ci"], "importance": 0.7}' > a.jsonl
      pulse import a.jsonl -c demo
      pulse import notes.parquet -c demo --ids ids.txt --json
    """
    import asyncio

    from sync.models import BATCH_MAX

    if not 1 <= args.batch <= BATCH_MAX:
        raise ValidationError(f"batch: must be 1..{BATCH_MAX}, got {args.batch}")
    c = await collective_of(db, args.collective)
    if not await asyncio.to_thread(args.file.is_file):
        raise NotFoundError(f"file: no file {args.file}")
    total, unit, records = await asyncio.to_thread(_numbered, args.file)
    if total == 0:
        records.close()
        raise ValidationError(f"file: {args.file} holds no experiences")
    if args.ids:
        await asyncio.to_thread(args.ids.write_text, "")
    bar = ProgressBar(f"importing into {c.name}", unit="experiences")
    started = time.monotonic()
    count, through = 0, 0  # experiences stored, and the last line (row) they came from
    try:
        while batch := await asyncio.to_thread(_take, records, args.batch, unit):
            where = [n for n, _ in batch]
            try:
                items = [f for _, f in batch]
                if args.visibility is not None:
                    items = [{"visibility": args.visibility, **f} for f in items]
                ids = await db.record_experiences(c.collective_id, items)
            except ValidationError as exc:
                raise ValidationError(_located(str(exc), where, unit)) from None
            if args.ids:
                await asyncio.to_thread(_append_lines, args.ids, ids)
            count, through = count + len(ids), where[-1]
            bar(count, total)
    except (ValidationError, NotFoundError) as exc:  # refused: nothing of its batch stored
        raise type(exc)(f"{exc}; {_stored(count, unit, through)}") from None
    except PulseError as exc:
        raise type(exc)(
            f"{exc}; {_stored(count, unit, through)}; the batch after that may be partly stored"
        ) from None
    except asyncio.CancelledError:  # Ctrl-C
        print(f"pulse: interrupted; {_stored(count, unit, through)}", file=sys.stderr)
        raise
    finally:
        records.close()
        bar.finish()
    seconds = time.monotonic() - started
    rate = count / max(seconds, 1e-9)
    result = {
        "count": count, "collective_id": str(c.collective_id), "seconds": round(seconds, 3),
        "rate": round(rate, 1), "ids_file": str(args.ids) if args.ids else None,
    }  # fmt: skip
    text = f"imported {count:,} experiences into {c.name} in {seconds:.1f} s ({rate:,.0f}/s)"
    return result, text


def _numbered(path: Path) -> tuple[int, str, Numbered]:
    """How many records a file holds, what a position in it is called, and the records
    with their line (row) numbers."""
    from projections import analytics
    from sync.models import BATCH_MAX

    if path.suffix.lower() == ".parquet":
        total, rows = analytics.read_parquet_records(path, BATCH_MAX)

        def numbered_rows() -> Numbered:
            with contextlib.closing(rows):
                yield from enumerate(rows, 1)

        return total, "row", numbered_rows()
    with path.open("rb") as lines:
        total = sum(1 for line in lines if line.strip())
    return total, "line", _json_lines(path)


def _json_lines(path: Path) -> Numbered:
    with path.open("rb") as lines:
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValidationError(
                    f"line {n}: not valid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            except UnicodeDecodeError:
                raise ValidationError(f"line {n}: not valid JSON (not UTF-8)") from None
            if not isinstance(record, dict):
                raise ValidationError(
                    f"line {n}: must be a JSON object of experience fields, "
                    f"got {type(record).__name__}"
                )
            yield n, record


def _take(records: Numbered, size: int, unit: str) -> list[tuple[int, dict[str, Any]]]:
    """The next ``size`` records as record_experience fields: null means the default, a
    kind name or JSON text is an experience type, decimals (from Parquet) are floats."""

    def plain(value: Any) -> Any:
        if isinstance(value, Decimal):
            return float(value)
        return [plain(v) for v in value] if isinstance(value, list) else value

    batch = []
    for n, record in itertools.islice(records, size):
        fields = {k: plain(v) for k, v in record.items() if v is not None}
        if isinstance(fields.get("experience_type"), str):
            try:
                fields["experience_type"] = experience_type(fields["experience_type"])
            except ValidationError as exc:
                raise ValidationError(f"{unit} {n}: {exc}") from None
        batch.append((n, fields))
    return batch


def _located(message: str, where: list[int], unit: str) -> str:
    """A record_experiences error with ``items.<index>`` turned into the line (row) of the
    file: the first problem, and how many more the batch had."""
    problems = re.split(r"; (?=items\.\d+)", message)
    first = re.match(r"items\.(\d+)[.:]\s*(.*)", problems[0])
    if first is None or int(first.group(1)) >= len(where):
        return f"{unit}s {where[0]}-{where[-1]}: {message}"
    text = f"{unit} {where[int(first.group(1))]}: {first.group(2)}"
    if len(problems) > 1:
        more = len(problems) - 1
        text += f" (and {more} more problem{'s' if more > 1 else ''} in {unit}s "
        text += f"{where[0]}-{where[-1]})"
    return text


def _stored(count: int, unit: str, through: int) -> str:
    if count == 0:
        return "nothing was imported"
    return f"{count:,} experiences before it were imported (through {unit} {through})"


def _append_lines(path: Path, values: list[UUID]) -> None:
    with path.open("a") as out:
        out.writelines(f"{v}\n" for v in values)


def _batch_limit() -> dict[str, Any]:
    from sync.models import BATCH_MAX  # (the API's limit, one place)

    return {
        "default": BATCH_MAX,
        "help": f"experiences per call, 1..{BATCH_MAX} (default {BATCH_MAX})",
    }


COMMANDS = (
    Command(
        "import", None, import_,
        arguments=(
            arg("file", type=Path, metavar="FILE",
                help="JSON lines, or Parquet when it ends in .parquet"),
            IN_COLLECTIVE,
            arg("--batch", type=int, deferred=_batch_limit, help="experiences per call"),
            arg("--ids", type=Path, metavar="FILE",
                help="write the new ids here, one a line, in file order"),
            arg("--visibility", choices=("private", "team", "org"), default=None,
                help="who may see the experiences a line does not say of itself: private "
                "(the author), team (the collective's members; the default) or org "
                "(everyone)"),
        ),
        operations=("find_collective", "record_experiences"),
    ),
)  # fmt: skip

"""`pulse call`: any operation the API declares (``sync.api.OPERATIONS``), by name, with
its arguments as one JSON object: what `POST /v1/<operation>` takes and answers."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from eventlog.errors import ValidationError
from ops.cli.declare import IDEMPOTENCY_KEY, Command, arg
from ops.cli.output import plain


def _arguments(text: str) -> dict[str, Any]:
    """The operation's arguments: a JSON object given as is, as @file, or '-' (stdin)."""
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        text = Path(text[1:]).read_text()
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"arguments: not valid JSON ({exc.msg})") from None
    if not isinstance(fields, dict):
        raise ValidationError(
            f"arguments: must be a JSON object of the operation's fields, got "
            f"{type(fields).__name__}"
        )
    return fields


async def call(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Call any operation of the API by name; prints its answer as JSON.

    ARGUMENTS is one JSON object of the operation's fields, as `POST /v1/OPERATION` takes
    it (the schema at /docs shows each one): given as is, as @file, or '-' to read stdin.
    They are checked against the operation's declaration before anything is sent. An
    operation that writes takes --idempotency-key (or "idempotency_key" among its
    fields). A getter that finds nothing prints null (where the HTTP API answers 404).
    Like every command, it goes through `pulse up` when it serves the data directory, as
    $PULSE_TOKEN or the local operator.

    example:
      pulse call list_collectives
      pulse call find_collective '{"collective": "demo"}'
      pulse call record_experience '{"collective_id": "0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e", "content": "Pin nats-server in CI"}'
      pulse call search_text @query.json --json
    """  # noqa: E501
    from sync.api import OPERATIONS
    from sync.models import validated

    operation = OPERATIONS.get(args.operation)
    if operation is None:
        raise ValidationError(
            f"operation: no operation {args.operation!r:.100}; `pulse call --help` lists them"
        )
    fields = _arguments(args.arguments)
    if args.idempotency_key is not None:
        if not operation.idempotent:
            raise ValidationError(
                f"idempotency_key: {operation.name} does not write, so it takes none"
            )
        fields["idempotency_key"] = args.idempotency_key
    request = validated(operation.request, **fields)
    answer = await getattr(db, operation.name)(**request.model_dump(exclude_unset=True))
    found = plain(answer)
    return found, json.dumps(found, indent=2, default=str)


def operations() -> str:
    """The operations `pulse call` takes, each with its summary and the least scope of a
    token that may call it (from the declaration)."""
    from sync.api import OPERATIONS

    lines = ["operations (the least token scope; whether it writes):"]
    for operation in OPERATIONS.values():
        kind = operation.scope + (", writes" if operation.writes else "")
        lines.append(f"  {operation.name} ({kind})")
        lines += textwrap.wrap(
            operation.summary, width=88, initial_indent="      ", subsequent_indent="      "
        )
    return "\n".join(lines)


COMMANDS = (
    Command(
        "call", None, call,
        arguments=(
            arg("operation", metavar="OPERATION",
                help="the operation's name (listed below; its POST /v1/<name>)"),
            arg("arguments", metavar="ARGUMENTS", nargs="?", default="{}",
                help="its fields as one JSON object, @file or '-' (stdin); default {}"),
            IDEMPOTENCY_KEY,
        ),
        describe=operations,
    ),
)  # fmt: skip

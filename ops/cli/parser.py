"""The `pulse` parser, built from the registry (``ops.cli.registry``), and ``main``.

Start-up: agent hosts run `pulse` once per action, so this imports only what building
the parser needs (argparse and the records, whose modules import no engine, web stack or
instance at their top). A command's own arguments are added when its parser is first
used (to parse them, or to print its --help): `pulse record ...` sets up the options of
`record` only. Asyncio, msgspec, NATS, DuckDB, FAISS, tantivy, the web stack and the
instance are imported in the commands that use them (tests/test_cli_startup.py keeps it
so; ops/bench/cli_start.py measures it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from eventlog.errors import Forbidden, PulseError, Unauthorized
from ops.cli.declare import Command
from ops.cli.registry import COMMANDS, GROUPS
from ops.cli.running import execute

DEFAULT_DATA_DIR = ".pulse"


def _partitions(value: str) -> int:
    """--partitions: 1..31 (``eventlog.partitions``)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {value!r}") from None
    if not 1 <= number <= 31:
        raise argparse.ArgumentTypeError(f"must be 1..31, got {number}")
    return number


class _CommandParser(argparse.ArgumentParser):
    """A command's parser whose arguments are added from its record when it is first
    used, so that none of them costs `pulse --help` anything."""

    def __init__(self, *args: Any, command: Command | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._command = command

    def _set_up(self) -> None:
        command, self._command = self._command, None
        if command is not None:
            add_arguments(self, command)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self._set_up()
        return super().parse_known_args(*args, **kwargs)

    def format_help(self) -> str:
        self._set_up()
        return super().format_help()

    def format_usage(self) -> str:
        self._set_up()
        return super().format_usage()


def add_arguments(parser: argparse.ArgumentParser, command: Command) -> None:
    """The arguments of ``command``, as its record declares them, and its further help."""
    if command.describe is not None:
        parser.epilog = command.describe()
    sections: dict[str, Any] = {}
    exclusive: dict[str, Any] = {}
    for argument in command.every_argument():
        where: Any = parser
        if argument.section is not None:
            if argument.section not in sections:
                sections[argument.section] = parser.add_argument_group(
                    argument.section, command.sections.get(argument.section)
                )
            where = sections[argument.section]
        if argument.exclusive is not None:
            if argument.exclusive not in exclusive:
                exclusive[argument.exclusive] = where.add_mutually_exclusive_group(
                    required=argument.exclusive.endswith("!")
                )
            where = exclusive[argument.exclusive]
        where.add_argument(*argument.flags, **argument.resolved())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pulse",
        description="Pulse: a shared memory for collectives of AI agents, on a NATS JetStream log.",
        epilog="example:\n  pulse up\n  pulse tail --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("PULSE_DATA_DIR", DEFAULT_DATA_DIR),
        help="data directory (default: $PULSE_DATA_DIR or ./.pulse)",
    )
    parser.add_argument(
        "--nats-url",
        default=os.environ.get("PULSE_NATS_URL"),
        help="NATS server URL(s), comma-separated; default: $PULSE_NATS_URL, else an "
        "embedded server in the data directory",
    )
    parser.add_argument(
        "--nats-creds",
        default=os.environ.get("PULSE_NATS_CREDS") or None,
        metavar="FILE",
        help='with --nats-url: credentials file, JSON {"user", "password"} (as `pulse '
        "nats-config` writes it); default: $PULSE_NATS_CREDS",
    )
    parser.add_argument(
        "--nats-ca",
        default=os.environ.get("PULSE_NATS_CA") or None,
        metavar="FILE",
        help="with --nats-url: CA certificate (PEM) of servers that require TLS; "
        "default: $PULSE_NATS_CA",
    )
    parser.add_argument(
        "--replicas", type=int, default=1, help="stream replicas: 1, or 3 on a cluster (default 1)"
    )
    parser.add_argument(
        "--durability",
        choices=("fsync", "replicated"),
        default=os.environ.get("PULSE_DURABILITY") or None,
        help="with --nats-url: place the streams on the servers tagged with this durability "
        "(`pulse nats-config` tags them): fsync, every write on disk before it is "
        "acknowledged; replicated, acknowledged once a quorum holds it; pulse up moves them "
        "there; default: $PULSE_DURABILITY, else where they are (an embedded server: fsync)",
    )
    parser.add_argument(
        "--partitions",
        type=_partitions,
        default=os.environ.get("PULSE_PARTITIONS") or "1",
        help="how many streams hold the collectives, each spread by a hash of its id (2..31: "
        "each its own leader on a cluster, for writes past one stream's); set when the "
        "deployment is made, and every host gives the same (an edge host: its hub's); default: "
        "$PULSE_PARTITIONS, else 1 (one stream)",
    )
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_CommandParser
    )
    groups: dict[str, Any] = {}
    for command in COMMANDS:
        parent = commands
        if command.group is not None:
            if command.group not in groups:
                text = GROUPS[command.group]
                top = commands.add_parser(command.group, help=text, description=text)
                groups[command.group] = top.add_subparsers(
                    dest="action", metavar="ACTION", required=True
                )
            parent = groups[command.group]
        sub = parent.add_parser(
            command.name,
            help=command.summary,
            description=f"{command.summary}\n\n{command.details}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            command=command,
        )
        sub.set_defaults(declared=command)
    return parser


def run(command: Command, args: argparse.Namespace) -> int:
    """Run the command the arguments name: over the instance, or by itself."""
    if command.run is not None:
        return int(command.run(args))
    return execute(command, args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args.declared, args)
    except (Unauthorized, Forbidden) as exc:
        # who may do what: always one line (a service's answer included)
        print(f"pulse: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except PulseError as exc:
        print(f"pulse: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

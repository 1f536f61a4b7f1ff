"""What a `pulse` command is: a record of its name, its group, its arguments and the
function that runs it, whose docstring is its --help (a summary line, details, examples).

Records are plain data, built when their group's module is imported, and nothing else
happens then: no registry is filled as a side effect, no source is parsed. A group's
module imports no engine, no web stack and no instance at its top (those are imported in
the functions that run a command), so `pulse --help` costs the interpreter and argparse.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# A command over the data directory's instance (or its running service): given the
# instance and the parsed arguments, it answers (what --json prints, what is printed).
Act = Callable[[Any, argparse.Namespace], Awaitable[tuple[Any, str]]]
# A command that opens what it needs itself (the service, the log, a backup): its exit code.
Run = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Arg:
    """One argument of a command: what ``argparse.add_argument`` takes.

    ``exclusive`` names a group of arguments of which at most one may be given (exactly
    one when the group's name ends in "!"); ``section`` a titled group in the help;
    ``deferred`` gives more options when the command's parser is set up: a default (or
    a help text naming it) held by a module too heavy to import for `pulse --help`."""

    flags: tuple[str, ...]
    options: Mapping[str, Any]
    exclusive: str | None = None
    section: str | None = None
    deferred: Callable[[], Mapping[str, Any]] | None = None

    def resolved(self) -> dict[str, Any]:
        """Every option of the argument, the deferred ones included."""
        return {**self.options, **(self.deferred() if self.deferred is not None else {})}

    @property
    def name(self) -> str:
        """What the argument is called in the reference: its long flag, or its name."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])


def arg(
    *flags: str,
    exclusive: str | None = None,
    section: str | None = None,
    deferred: Callable[[], Mapping[str, Any]] | None = None,
    **options: Any,
) -> Arg:
    """An argument, spelt as ``argparse.add_argument`` spells it."""
    return Arg(flags, options, exclusive, section, deferred)


@dataclass(frozen=True)
class Command:
    """One `pulse` command.

    ``act`` commands run over the instance of the data directory, or the running
    `pulse up` that serves it (``ops.cli.running``), and print their answer as text or,
    with --json, as one JSON document; ``run`` commands open what they need
    themselves. ``operations`` names the declared API operations it calls
    (``sync.api.OPERATIONS``). ``writes``: it takes --idempotency-key and passes it to
    the operation it writes with; ``reads``: it takes --as-of and passes it to what it
    reads."""

    name: str
    group: str | None = None  # `pulse GROUP NAME`, or `pulse NAME` when None
    act: Act | None = None
    run: Run | None = None
    arguments: tuple[Arg, ...] = ()
    operations: tuple[str, ...] = ()
    writes: bool = False
    reads: bool = False
    sections: Mapping[str, str] = field(default_factory=dict)  # section title: its text
    describe: Callable[[], str] | None = None  # more help, computed when it is shown

    def __post_init__(self) -> None:
        if (self.act is None) == (self.run is None):
            raise TypeError(f"command {self.name}: give act or run, exactly one")

    @property
    def path(self) -> tuple[str, ...]:
        return (self.name,) if self.group is None else (self.group, self.name)

    @property
    def function(self) -> Callable[..., Any]:
        found = self.act or self.run
        assert found is not None
        return found

    @property
    def summary(self) -> str:
        return self._doc()[0]

    @property
    def details(self) -> str:
        return self._doc()[1]

    def _doc(self) -> tuple[str, str]:
        doc = textwrap.dedent(self.function.__doc__ or "").strip()
        summary, _, rest = doc.partition("\n")
        return summary, textwrap.dedent(rest).strip()

    def every_argument(self) -> tuple[Arg, ...]:
        """Its arguments and those every command of its kind has."""
        added: list[Arg] = []
        if self.writes:
            added.append(IDEMPOTENCY_KEY)
        if self.reads:
            added.append(AS_OF)
        if self.act is not None:
            added.append(JSON)
        return (*self.arguments, *added)


IDEMPOTENCY_KEY = arg(
    "--idempotency-key", metavar="KEY",
    help="repeating the command with the same key (after a timeout, say) stores it once and "
    "prints the first answer; the same key with other arguments is refused",
)  # fmt: skip
AS_OF = arg(
    "--as-of", metavar="MOMENT",
    help="answer from the memory as it was then: a stream sequence (an integer) or a time "
    "(ISO 8601, e.g. 2026-11-30T09:00:00Z)",
)  # fmt: skip
JSON = arg("--json", action="store_true", help="print one JSON document")


def positive(text: str) -> int:
    """An argument that counts something: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value

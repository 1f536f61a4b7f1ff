"""What commands take: the arguments several commands share, and how their text becomes
what the API takes (a collective by name, a vector from JSON or a file, a filter, an
experience type, a duration)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from eventlog.errors import ValidationError
from ops.cli.declare import Arg, arg
from sync import access

if TYPE_CHECKING:  # (the instance is imported where it is used: `pulse --help` goes without)
    from projections import queries

COLLECTIVE = "collective: its id, its name (yours), or owner/name (another owner's)"

IN_COLLECTIVE = arg("-c", "--collective", required=True, help=COLLECTIVE)
A_COLLECTIVE = arg("collective", help=COLLECTIVE)
AN_EXPERIENCE = arg("experience_id", help="experience id")

# the filter of searches and listings (search_filter)
FILTER: tuple[Arg, ...] = (
    arg("--domain", dest="domain_filter", action="append", help="only these tags"),
    arg("--type", dest="type_filter", action="append", help="only these kinds"),
    arg(
        "--source-task",
        dest="task_filter",
        metavar="TASK",
        help="only those recorded for this task (their source task, exactly)",
    ),
    arg("--min-importance", type=float, help="only at least this important"),
    arg("--include-archived", action="store_true", help="archived ones too"),
    arg("--include-invalid", action="store_true", help="ones no longer true too (invalidated)"),
    arg("--valid-at", metavar="TIME", help="only what was true then (ISO 8601 or Unix ms)"),
)


def visibility(team: str = "the collective's members") -> Arg:
    """``--visibility``, fixed when the entity is created (``sync.access``)."""
    return arg(
        "--visibility", choices=access.VISIBILITIES, default="team",
        help=f"who may see it: private (only its author, the owner and agent of the token "
        f"that stores it), team ({team}; the default) or org (every principal)",
    )  # fmt: skip


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


async def collective_of(
    db: Any, ref: str, owner: str | None = None, *, as_of: Any = None
) -> queries.Collective:
    """The collective ``ref`` names (``PulseDB.find_collective``: an id, a name of the
    caller's own, or owner/name), as it was ``as_of`` then (None: now); with ``owner``, a
    bare name is one of that owner's."""
    if owner is not None:
        from projections import naming  # (eventlog.limits, and numpy: not at start-up)

        named = naming.reference(ref)
        if named.collective_id is None and named.owner_id is None:
            ref = f"{owner}{naming.SEPARATOR}{ref}"
    found: queries.Collective = await db.find_collective(ref, as_of=as_of)
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
    """An experience type given as a kind's name (``Fact``) or as its JSON object."""
    if text is None:
        return None
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"experience_type: not valid JSON ({exc.msg})") from None
    return {"kind": text}


def search_filter(args: argparse.Namespace) -> dict[str, Any] | None:
    """The filter the ``FILTER`` arguments give, or None for none."""
    flt: dict[str, Any] = {}
    if getattr(args, "domain_filter", None):
        flt["domains"] = args.domain_filter
    if getattr(args, "type_filter", None):
        flt["experience_types"] = args.type_filter
    if getattr(args, "task_filter", None) is not None:
        flt["source_task"] = args.task_filter
    if getattr(args, "min_importance", None) is not None:
        flt["min_importance"] = args.min_importance
    if getattr(args, "include_archived", False):
        flt["include_archived"] = True
    if getattr(args, "include_invalid", False):
        flt["include_invalid"] = True
    if getattr(args, "valid_at", None) is not None:
        flt["valid_at"] = args.valid_at
    return flt or None


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

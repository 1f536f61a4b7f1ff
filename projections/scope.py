"""Which collectives a host's projection covers: all of them, or those it follows.

A host that follows some collectives (``PulseDB.open(..., collectives=[...])``, ``pulse
up --follow``) reads only their subjects from the log, plus every wisdom and access-token
event (wisdom belongs to no collective, and every host checks tokens). What it follows is
kept in its state directory, ``following.json``, beside the state it describes: the
references it was given (ids, names, ``owner/name``, ``owner:<owner id>``), and every
collective id they came to stand for, each with the sequence its backfill must reach.

A collective followed later is brought in without replaying the others: the host goes on
from where it is with the collective's subjects added to its filters, and reads the
collective's own subjects from the beginning up to that point (its *backfill*). Until the
backfill is done, the collective's ``backfill_to`` is that point; a host that stopped
meanwhile does it again on open (``pending``), after clearing the history rows the
unfinished one wrote (the rows themselves fold idempotently).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

from eventlog.errors import ValidationError
from eventlog.subjects import PREFIX, collective_filter
from projections import naming

FILE = "following.json"
OWNER = "owner:"  # a reference to every collective of an owner, now and later

# the subject of every collective's own events (created, deleted): how a host that
# follows some collectives learns of the others, and of new ones its references match
DIRECTORY_SUBJECT = f"{PREFIX}.c.*.collective.*"


@dataclass
class Scope:
    """What a host follows: ``refs`` as given, and ``collectives`` (id -> the sequence its
    backfill must reach; 0 once it is done)."""

    refs: tuple[str, ...]
    collectives: dict[UUID, int] = field(default_factory=dict)

    def filters(self) -> list[str]:
        """The subject filters of what the host reads (its collectives, wisdom, tokens)."""
        return collective_filter(sorted(self.collectives, key=str))

    def pending(self) -> dict[UUID, int]:
        """Collectives whose backfill is not done: id -> the sequence it must reach."""
        return {cid: to for cid, to in self.collectives.items() if to > 0}

    def describe(self) -> str:
        """The references, as errors and ``pulse status`` name them."""
        return ", ".join(self.refs) if self.refs else "(none)"

    @classmethod
    def load(cls, state: Path) -> Scope | None:
        """The scope kept in a state directory; None: the host follows every collective."""
        path = state / FILE
        try:
            raw = json.loads(path.read_text())
            return cls(tuple(raw["refs"]), {UUID(k): int(v) for k, v in raw["collectives"].items()})
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise ValidationError(f"{path}: not a scope Pulse wrote ({exc})") from exc

    def save(self, state: Path) -> None:
        """Write it (atomically: a crash leaves the old file or the new one)."""
        path = state / FILE
        tmp = path.with_name(path.name + ".tmp")
        body = {
            "refs": list(self.refs),
            "collectives": {str(k): v for k, v in self.collectives.items()},
        }
        with open(tmp, "w") as f:
            json.dump(body, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def parse_refs(given: object) -> tuple[str, ...]:
    """The references of ``collectives=`` / ``--follow``: ids, names, ``owner:<id>``."""
    if isinstance(given, str):
        items = [part.strip() for part in given.split(",")]
    elif isinstance(given, (list, tuple)):
        items = [str(part).strip() for part in given]
    else:
        raise ValidationError(
            f"collectives: a list of collective ids, names or owner:<owner id>, got "
            f"{type(given).__name__}"
        )
    refs: list[str] = []
    for item in items:
        if not item or item == OWNER:
            raise ValidationError(
                "collectives: an empty reference (give collective ids, names, or owner:<owner id>)"
            )
        if len(item.encode()) > 256:
            raise ValidationError(f"collectives: {item[:40]!r}...: at most 256 bytes")
        try:
            item = str(UUID(item))  # an id, in its one spelling
        except ValueError:
            pass
        if item not in refs:
            refs.append(item)
    if not refs:
        raise ValidationError("collectives: give at least one collective id, name or owner:<id>")
    return tuple(refs)


def matches(refs: tuple[str, ...], collective_id: UUID, owner_id: str, name: str) -> bool:
    """Whether a collective is one the references stand for. A name is the operator's
    (``projections.naming``): every owner's collective of that name; ``owner/name`` one
    owner's."""
    for ref in refs:
        if ref.startswith(OWNER):
            if ref[len(OWNER) :] == owner_id:
                return True
        elif naming.reference(ref).matches(collective_id, owner_id, name, None):
            return True
    return False

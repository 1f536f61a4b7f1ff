"""How callers name a collective: by id, by a name of their own, or as ``owner/name``.

Names belong to owners. A bare name stands for one of the caller's own collectives (those
of its principal's owner), so another owner who takes the same name can neither shadow
the caller's (make it ambiguous) nor stand in for it (be found while the caller has none
of that name yet, so that an agent writes to, or recalls from, a collective someone else
planted). Another owner's collective is named ``owner/name`` or by its id; it is found
only if the caller may see something of it (``eventlog.access``), as with an id.

An admin token belongs to an owner like any other token: its bare names are that
owner's collectives, and it names any other owner's as ``owner/name`` (it sees them all).
The local operator holds every owner's data and has no owner of its own (it writes as
``local``, and creates collectives for whichever owner it names), so a bare name it gives
is looked up among every owner's collectives and must be unique there; when it is not,
the error lists each as ``owner/name``. A host's ``--follow`` references are the
operator's too: a bare name follows every owner's collective of that name.

``/`` separates the owner from the name: a reference holding one is ``owner/name``,
split at the first ``/``. So that every spelling means one collective, new owner ids and
new collective names may not hold ``/`` (``sync.models``, ``sync.tokens``: a name
``bob/notes`` of alice's would otherwise read as bob's ``notes``). The log's codec still
takes events whose owner or name holds one (an earlier release could write them, and
what is in the log must stay readable): such a collective is named by its id, or as
``owner/name`` when only its name holds the ``/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from eventlog.errors import ValidationError
from eventlog.limits import NAME_MAX

SEPARATOR = "/"
REFERENCE_MAX = 2 * NAME_MAX + 1  # characters: owner/name
# an id or a name (no "/"), or owner/name: [\s\S] is any character in every regex dialect
REFERENCE_PATTERN = r"^[^/]+(/[\s\S]+)?$"


@dataclass(frozen=True, slots=True)
class Reference:
    """What a caller wrote for a collective (``text``): an id, or a name with the owner it
    named (None: the caller's own, or any owner's for the local operator)."""

    text: str
    collective_id: UUID | None = None
    owner_id: str | None = None
    name: str | None = None

    def matches(self, collective_id: UUID, owner_id: str, name: str, own: str | None) -> bool:
        """Whether a collective is the one meant, for a caller whose bare names are
        ``own``'s collectives (None: every owner's)."""
        if self.collective_id is not None:
            return collective_id == self.collective_id
        whose = self.owner_id if self.owner_id is not None else own
        return name == self.name and whose in (None, owner_id)


def reference(text: str, field: str = "collective") -> Reference:
    """The reference ``text`` stands for: an id, ``owner/name``, or a bare name."""
    if not isinstance(text, str) or not 1 <= len(text) <= REFERENCE_MAX:
        raise ValidationError(
            f"{field}: give a collective id, a name, or owner/name (1..{REFERENCE_MAX} "
            f"characters), got {text!r:.60}"
        )
    try:
        return Reference(text, collective_id=UUID(text))
    except ValueError:
        pass
    owner, slash, name = text.partition(SEPARATOR)
    if not slash:
        return Reference(text, name=text)
    if not owner or not name:
        raise ValidationError(
            f"{field}: {text!r:.80} names no collective; write owner/name (both parts), "
            "a name of your own, or an id"
        )
    return Reference(text, owner_id=owner, name=name)


def unslashed(value: str) -> str:
    """``value``, refused (ValueError, for pydantic) if it holds the separator."""
    if SEPARATOR in value:
        raise ValueError(
            f"must not contain {SEPARATOR!r} (it separates an owner from a collective name: "
            f"owner/name), got {value!r:.60}"
        )
    return value

"""Who may see what: principals, and "visible to", defined once in the three forms the
layers above filter with (a Python predicate, a numpy mask, a SQL condition).

It lives here, below ``projections/``, because every layer that filters needs it: the
engine thread's queries and indexes (``projections.queries``, ``projections.text``), the
SQL sandbox's filtered views (``projections.analytics``), and the instance's access gate
(``sync.access`` holds what is the instance's: tokens, and the principal of the call in
progress).

The rules (``Principal``):

- A principal is an owner, or an agent acting for an owner, with a scope (``read``,
  ``write`` or ``admin``) and optionally the collectives its token is limited to.
- A principal is a *member* of a collective when the collective's owner is its owner
  and the token is not limited to other collectives. Admin principals (and the local
  operator, ``sync.access``) are members of every collective, and see everything.
- Every experience, insight, relation and wisdom has a visibility, fixed when it is
  created: ``private`` (its author only: the same owner and agent), ``team`` (the
  members of its collective; for wisdom, which has none, every principal of its owner),
  or ``org`` (every principal of the deployment: one deployment is one organisation's
  memory). The default is ``team``, and rows from before visibility count as ``team``.

"Visible to", for a principal that is not an admin (``Viewer``: whether it is a member
of the row's collective, its owner and its agent), in its forms, which
``tests/test_visibility.py`` holds to each other:

- Python, one row: ``Viewer.sees`` (and ``Principal.sees``, which decides membership);
- sets of index terms: ``Viewer.reach`` (for tantivy, ``projections.text``);
- numpy, a column of rows: ``Viewer.mask`` over visibility codes (``visibility_code``)
  and author numbers (the similar and exact searches, ``projections.queries``);
- SQL, a condition on a row: ``visible_sql`` with ``member_sql`` (the SQL sandbox's
  filtered views, ``projections.analytics``), over the one-row table of the principal
  that ``PRINCIPAL_SQL`` makes from ``principal_parameters`` (free text is never
  spliced into SQL).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args
from uuid import UUID

from eventlog.errors import Forbidden, ValidationError
from eventlog.events import TokenScope, Visibility

if TYPE_CHECKING:  # (numpy is imported by the numpy form only: see ops.remote)
    import numpy as np
    import numpy.typing as npt

Scope = TokenScope
__all__ = [  # (Visibility: eventlog.events's, named here with the rest of the rule)
    "DEFAULT_VISIBILITY", "LOCAL_OWNER", "NO_AUTHOR", "ORG", "PRINCIPAL_SQL", "PRIVATE",
    "SCOPES", "TEAM", "VISIBILITIES", "VISIBILITY_CODE", "Principal", "Scope", "TokenInfo",
    "Viewer", "Visibility", "member_sql", "principal_parameters", "viewer_of",
    "visibility_code", "visible_sql", "wisdom_member_sql",
]  # fmt: skip
SCOPES: tuple[Scope, ...] = get_args(TokenScope)
VISIBILITIES: tuple[Visibility, ...] = get_args(Visibility)
DEFAULT_VISIBILITY: Visibility = "team"  # of a row from before visibility, too
LOCAL_OWNER = "local"  # the owner the local operator writes as


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a call acts for (see the module docstring)."""

    owner: str
    agent: str | None = None
    scope: Scope = "write"
    collectives: frozenset[UUID] | None = None  # None: every collective of the owner
    token_id: UUID | None = None
    local: bool = False  # the local operator: everything

    def __post_init__(self) -> None:
        if not isinstance(self.owner, str) or not 1 <= len(self.owner) <= 256:
            raise ValidationError(f"owner: must be 1..256 characters, got {self.owner!r:.60}")
        if self.agent is not None and (
            not isinstance(self.agent, str) or not 1 <= len(self.agent) <= 256
        ):
            raise ValidationError(f"agent: must be 1..256 characters, got {self.agent!r:.60}")
        if self.scope not in SCOPES:
            raise ValidationError(f"scope: must be one of {', '.join(SCOPES)}, got {self.scope!r}")

    @classmethod
    def operator(cls) -> Principal:
        return cls(owner=LOCAL_OWNER, scope="admin", local=True)

    @property
    def admin(self) -> bool:
        """May do anything, and sees everything (so its reads need no filter)."""
        return self.local or self.scope == "admin"

    @property
    def writes(self) -> bool:
        return self.admin or self.scope == "write"

    def member(self, owner_id: str | None, collective_id: UUID | None) -> bool:
        """Whether this principal is a member of the collective (see the module doc;
        ``member_sql`` is the same in SQL)."""
        if self.admin:
            return True
        return owner_id == self.owner and (
            self.collectives is None or collective_id in self.collectives
        )

    def sees(
        self,
        visibility: str | None,
        member: bool,
        author_owner: str | None,
        author_agent: str | None,
    ) -> bool:
        """Whether this principal may see an entity of a collective it is (or is not) a
        ``member`` of, with this visibility and author (``Viewer.sees`` has the rule)."""
        return self.admin or Viewer(member, self.owner, self.agent).sees(
            visibility, author_owner, author_agent
        )

    def sees_wisdom(
        self, visibility: str | None, owner_id: str | None, author_owner: str | None,
        author_agent: str | None,
    ) -> bool:  # fmt: skip
        """Wisdom has no collective: ``team`` is every principal of its owner."""
        return self.sees(visibility, owner_id == self.owner, author_owner, author_agent)

    def describe(self) -> str:
        who = f"owner {self.owner!r}" + (f", agent {self.agent!r}" if self.agent else "")
        return "the local operator" if self.local else f"{who} ({self.scope})"

    # -- refusals ----------------------------------------------------------------------------

    def need_write(self) -> None:
        if not self.writes:
            raise Forbidden(f"scope: {self.describe()} may only read; this needs a write token")

    def need_admin(self, what: str) -> None:
        if not self.admin:
            raise Forbidden(f"scope: {what} needs an admin token; {self.describe()} has none")


# -- "visible to" ----------------------------------------------------------------------------

# The numbers of the visibilities in the numpy form (a column of int8)
PRIVATE, TEAM, ORG = 0, 1, 2
VISIBILITY_CODE: Mapping[str, int] = {"private": PRIVATE, "team": TEAM, "org": ORG}
NO_AUTHOR = -1  # the author number of a viewer that wrote no row of the column


def visibility_code(visibility: str | None) -> int:
    """A visibility's number in the numpy form (a row from before visibility: team)."""
    return VISIBILITY_CODE.get(visibility or DEFAULT_VISIBILITY, TEAM)


@dataclass(frozen=True, slots=True)
class Viewer:
    """What a read of one collective may return to a principal that is not an admin, in
    the terms of the rows (the engine thread filters with it; None means everything)."""

    member: bool  # team rows visible
    owner: str
    agent: str | None

    def sees(
        self, visibility: str | None, author_owner: str | None, author_agent: str | None
    ) -> bool:
        """The rule, for one row: org rows to everyone; team rows (and rows from before
        visibility) to members; private rows to the member that is their author (owner
        and agent)."""
        if visibility == "org":
            return True
        if not self.member:
            return False
        if visibility == "private":
            return author_owner == self.owner and author_agent == self.agent
        return True

    def reach(self) -> tuple[tuple[str, ...], tuple[str, str | None] | None]:
        """``sees`` as sets, for indexes that filter by terms (``projections.text``): the
        visibilities it sees whatever their author, and the author whose rows it sees
        whatever their visibility (None: no one's)."""
        if not self.member:
            return ("org",), None
        return ("team", "org"), (self.owner, self.agent)

    def mask(
        self,
        visibility: npt.NDArray[np.int8],
        author: npt.NDArray[np.int32],
        authors: Mapping[tuple[str | None, str | None], int],
    ) -> npt.NDArray[np.bool_]:
        """``sees`` over columns of rows: their ``visibility_code``s and their authors'
        numbers in ``authors`` ((owner, agent) -> number). One comparison or two per
        row, in numpy: it is on every restricted search."""
        if not self.member:
            anyone: npt.NDArray[np.bool_] = visibility == ORG
            return anyone
        mine = authors.get((self.owner, self.agent), NO_AUTHOR)
        visible: npt.NDArray[np.bool_] = (visibility != PRIVATE) | (author == mine)
        return visible


def viewer_of(principal: Principal, owner_id: str | None, collective_id: UUID) -> Viewer | None:
    """The filter of a principal's reads of a collective (None: it sees everything)."""
    if principal.admin:
        return None
    return Viewer(principal.member(owner_id, collective_id), principal.owner, principal.agent)


# The SQL form reads the principal from a one-row table (a temporary view cannot take
# parameters): ``p`` below, made by ``PRINCIPAL_SQL`` with ``principal_parameters``.
PRINCIPAL_SQL = "SELECT ?::VARCHAR AS owner, ?::VARCHAR AS agent, ?::UUID[] AS collectives"


def principal_parameters(principal: Principal) -> list[Any]:
    """The parameters of ``PRINCIPAL_SQL`` for ``principal``."""
    limited = principal.collectives
    return [
        principal.owner,
        principal.agent,
        None if limited is None else sorted(str(c) for c in limited),
    ]


def member_sql(collective: str) -> str:
    """``Principal.member`` in SQL: whether ``p`` is a member of the collective row
    ``collective`` (its ``owner_id`` and ``collective_id``)."""
    return (
        f"({collective}.owner_id IS NOT DISTINCT FROM p.owner AND (p.collectives IS NULL "
        f"OR coalesce(list_contains(p.collectives, {collective}.collective_id), false)))"
    )


def wisdom_member_sql(wisdom: str) -> str:
    """``Principal.sees_wisdom``'s membership in SQL: every principal of the owner."""
    return f"({wisdom}.owner_id IS NOT DISTINCT FROM p.owner)"


def visible_sql(row: str, member: str) -> str:
    """``Viewer.sees`` in SQL: whether ``p`` may see the row ``row`` (its ``visibility``,
    ``author_owner`` and ``author_agent``), where ``member`` is the condition that ``p``
    is a member of the row's collective. True or false for every row (a NULL visibility
    is ``team``), so that it may also be selected, not only filtered on."""
    return (
        f"({row}.visibility IS NOT DISTINCT FROM 'org' OR ({member} AND "
        f"({row}.visibility IS DISTINCT FROM 'private' OR ({row}.author_owner "
        f"IS NOT DISTINCT FROM p.owner AND {row}.author_agent IS NOT DISTINCT FROM p.agent))))"
    )


# -- tokens as the projection holds them -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as the registry holds it (never its secret; ``sync.access.Registry``)."""

    token_id: UUID
    owner_id: str
    agent_id: str | None
    scope: Scope
    collectives: tuple[UUID, ...]
    expires_ms: int | None
    secret_sha256: str | None
    revoked: bool

    def principal(self) -> Principal:
        return Principal(
            owner=self.owner_id, agent=self.agent_id, scope=self.scope,
            collectives=frozenset(self.collectives) if self.collectives else None,
            token_id=self.token_id,
        )  # fmt: skip

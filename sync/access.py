"""Who may see and change what: principals, access tokens and visibility.

A principal is an owner, or an agent acting for an owner. Callers prove who they are
with an access token (``pulse token create``), which names the owner, optionally the
agent, the scope (``read``, ``write`` or ``admin``), optionally the collectives it is
limited to, and optionally when it expires. Tokens are events (``token.created``,
``token.revoked`` on ``pulse.t.<token_id>``), so every host knows them and a revocation
reaches every host with the next event it applies. The log holds only the SHA-256 of a
token's secret; the token itself is printed once.

The rules (``Principal``):

- A principal is a *member* of a collective when the collective's owner is its owner
  and the token is not limited to other collectives. Admin principals (and the local
  operator, below) are members of every collective.
- Every experience, insight, relation and wisdom has a visibility, fixed when it is
  created: ``private`` (its author only: the same owner and agent), ``team`` (the
  members of its collective; for wisdom, which has none, every principal of its owner),
  or ``org`` (every principal of the deployment: one deployment is one organisation's
  memory). The default is ``team``.
- Reading a collective needs membership, or something in it visible to the principal
  (then the principal sees exactly that): a collective with nothing visible to a
  principal does not exist for it (404, as for a collective that was never created).
- Writing needs the ``write`` or ``admin`` scope and membership of the collective;
  changing or deleting an entity also needs to see it. A member that lacks the scope, or
  a principal that can see a collective without being a member, gets 403. Deleting a
  whole collective is an admin's (it forgets what its members may not see).
- Raw SQL over every row, the dead letters and token management are for ``admin``.

The *local operator* is the principal of a process that holds the data directory and
the NATS credentials, which can read every file anyway: ``PulseDB.open`` without a
principal, and requests to ``pulse up`` that carry the data directory's operator secret
(``ops.operator_secret``: a 0600 file the CLI, ``pulse mcp`` and
``RemotePulseDB.from_data_dir`` read). It may do anything (as Pulse did before tokens).
The service wants a credential with every request, this secret or an access token,
whether or not a token exists; revoking every token never locks the operator out.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from eventlog.errors import Forbidden, Unauthorized, ValidationError

Scope = Literal["read", "write", "admin"]
Visibility = Literal["private", "team", "org"]
SCOPES: tuple[Scope, ...] = ("read", "write", "admin")
VISIBILITIES: tuple[Visibility, ...] = ("private", "team", "org")
LOCAL_OWNER = "local"  # the owner the local operator writes as

TOKEN_PREFIX = "pulse_"
_TOKEN = re.compile(r"^pulse_([0-9a-f]{32})_([A-Za-z0-9_-]{43})$")


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
        """Whether this principal is a member of the collective (see the module doc)."""
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


@dataclass(frozen=True, slots=True)
class Viewer:
    """What a read of one collective may return to a principal, in the terms of the
    rows (the engine thread filters with it; None means everything)."""

    member: bool  # team rows visible
    owner: str
    agent: str | None

    def sees(
        self, visibility: str | None, author_owner: str | None, author_agent: str | None
    ) -> bool:
        """The rule: org rows to everyone; team rows (and rows from before visibility) to
        members; private rows to the member that is their author (owner and agent)."""
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


def viewer_of(principal: Principal, owner_id: str | None, collective_id: UUID) -> Viewer | None:
    """The filter of a principal's reads of a collective (None: it sees everything)."""
    if principal.admin:
        return None
    return Viewer(principal.member(owner_id, collective_id), principal.owner, principal.agent)


# -- tokens ----------------------------------------------------------------------------------


def new_secret(token_id: UUID) -> str:
    """A fresh token for ``token_id``: ``pulse_<id hex>_<43 random url-safe characters>``
    (256 random bits)."""
    return f"{TOKEN_PREFIX}{token_id.hex}_{secrets.token_urlsafe(32)}"


def secret_hash(token: str) -> str:
    """What the log keeps of a token: the SHA-256 of the whole token, in hex. (A token is
    256 random bits, so a fast hash is enough: there is nothing to guess.)"""
    return hashlib.sha256(token.encode("ascii", "replace")).hexdigest()


def token_id_of(token: str) -> UUID | None:
    """The token id a well-formed token names, or None."""
    found = _TOKEN.match(token.strip()) if isinstance(token, str) else None
    return UUID(found.group(1)) if found else None


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as the registry holds it (never its secret)."""

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


class Registry:
    """The tokens this host has applied, by id: what a token is resolved against. Kept on
    the event loop and read again from the projection whenever a batch holds a token event
    (so a revocation takes hold here as soon as this host applied it)."""

    def __init__(self) -> None:
        self.tokens: dict[UUID, TokenInfo] = {}

    def replace(self, tokens: Iterable[TokenInfo]) -> None:
        """Hold ``tokens`` (in the order given: ``projections.queries.tokens`` gives them by
        id)."""
        self.tokens = {t.token_id: t for t in tokens}

    def resolve(self, token: str, now_ms: int | None = None) -> Principal:
        """The principal of a token; Unauthorized (naming why) when it is not a live one."""
        token_id = token_id_of(token)
        if token_id is None:
            raise Unauthorized("token: not a Pulse token (pulse_<32 hex>_<43 characters>)")
        info = self.tokens.get(token_id)
        if info is None:
            raise Unauthorized("token: unknown token")
        if info.revoked:
            raise Unauthorized(f"token: token {token_id} was revoked")
        if not secrets.compare_digest(info.secret_sha256 or "", secret_hash(token.strip())):
            raise Unauthorized("token: unknown token")
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if info.expires_ms is not None and now >= info.expires_ms:
            raise Unauthorized(f"token: token {token_id} expired")
        return info.principal()


# -- the principal of the call in progress ---------------------------------------------------

ACTING: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "pulse_acting_principal", default=None
)


@contextlib.contextmanager
def acting(principal: Principal) -> Iterator[Principal]:
    """Calls made inside act for ``principal`` (see ``PulseDB.acting_as``)."""
    reset = ACTING.set(principal)
    try:
        yield principal
    finally:
        ACTING.reset(reset)


def parse_duration_ms(text: str) -> int:
    """``30d``, ``12h``, ``45m``, ``90s`` or ``2w`` as milliseconds (for --expires)."""
    found = re.fullmatch(r"\s*(\d{1,7})\s*([smhdw])\s*", text or "")
    if not found:
        raise ValidationError(
            f"expires: a duration like 30d, 12h, 45m, 90s or 2w, got {text!r:.40}"
        )
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[found.group(2)]
    value = int(found.group(1)) * unit * 1000
    if value <= 0:
        raise ValidationError(f"expires: must be longer than 0, got {text!r}")
    return value

"""The instance's side of access: access tokens, and the principal of the call in progress.

Who may see what (principals, scopes, visibilities and the rule of "visible to" in its
three forms) is defined below every layer that filters, in ``eventlog.access``; its
names are imported here too, so that ``sync`` and ``ops`` ask one module.

Callers prove who they are with an access token (``pulse token create``), which names
the owner, optionally the agent, the scope (``read``, ``write`` or ``admin``), optionally
the collectives it is limited to, and optionally when it expires. Tokens are events
(``token.created``, ``token.revoked`` on ``pulse.t.<token_id>``), so every host knows
them and a revocation reaches every host with the next event it applies. The log holds
only the SHA-256 of a token's secret; the token itself is printed once.

What a principal may do with a collective:

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
from uuid import UUID

from eventlog.access import (
    LOCAL_OWNER,
    SCOPES,
    VISIBILITIES,
    Principal,
    Scope,
    TokenInfo,
    Viewer,
    Visibility,
    viewer_of,
)
from eventlog.errors import Unauthorized, ValidationError

__all__ = [  # (the first nine: eventlog.access's, named here for sync and ops)
    "LOCAL_OWNER", "SCOPES", "VISIBILITIES", "Principal", "Scope", "TokenInfo", "Viewer",
    "Visibility", "viewer_of", "TOKEN_PREFIX", "ACTING", "Registry", "acting", "new_secret",
    "parse_duration_ms", "secret_hash", "token_id_of",
]  # fmt: skip

TOKEN_PREFIX = "pulse_"
_TOKEN = re.compile(r"^pulse_([0-9a-f]{32})_([A-Za-z0-9_-]{43})$")


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

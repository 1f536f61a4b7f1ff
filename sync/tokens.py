"""Access tokens as events: create, list and revoke them (``sync.access`` has the rules).

Only admins (and the local operator) manage tokens. A token's secret is returned once,
by ``create_token``; the log and every host keep only its SHA-256.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from uuid import UUID

import msgspec

from eventlog import events as ev
from eventlog.errors import NotFoundError, ValidationError
from eventlog.limits import NAME_MAX, TOKEN_COLLECTIVES_MAX
from eventlog.log import LogEntry
from projections import naming, queries
from sync import access
from sync.core import check_text, uuid_of
from sync.gate import Gate
from sync.idempotency import idempotent
from sync.reading import Reader
from sync.writer import Writer

log = logging.getLogger(__name__)

EXPIRES_MAX_S = 10 * 365 * 86400  # a token lives at most ten years


class Token(msgspec.Struct, frozen=True, kw_only=True):
    """A token as ``list_tokens`` shows it (never its secret)."""

    token_id: UUID
    owner_id: str
    agent_id: str | None
    scope: str
    collectives: tuple[UUID, ...]  # (): every collective of the owner
    expires_ms: int | None
    revoked: bool


class NewToken(msgspec.Struct, frozen=True, kw_only=True):
    """What ``create_token`` returns: ``token`` is the secret, shown this once."""

    token: str
    token_id: UUID
    owner_id: str
    agent_id: str | None
    scope: str
    collectives: tuple[UUID, ...]
    expires_ms: int | None


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """Who a call acts for, as ``whoami`` tells it."""

    owner_id: str
    agent_id: str | None
    scope: str  # read, write or admin
    collectives: tuple[UUID, ...]  # (): every collective of the owner (an admin's: all)
    token_id: UUID | None  # None: the local operator (the data directory's secret)
    operator: bool


def _public(info: access.TokenInfo) -> Token:
    return Token(
        token_id=info.token_id, owner_id=info.owner_id, agent_id=info.agent_id,
        scope=info.scope, collectives=info.collectives, expires_ms=info.expires_ms,
        revoked=info.revoked,
    )  # fmt: skip


class Tokens:
    """The access tokens this host knows (``sync.access.Registry``), read again when a
    batch applies a token event, and their management (see the module docstring)."""

    def __init__(self, reads: Reader, gate: Gate, writer: Writer) -> None:
        self.reads, self.gate, self.writer = reads, gate, writer
        self.access = access.Registry()
        self._stale = False
        self._reader: asyncio.Task[None] | None = None

    # -- the registry -----------------------------------------------------------------------

    def principal_of(self, token: str) -> access.Principal:
        """The principal of an access token (Unauthorized when it is not a live one)."""
        return self.access.resolve(token)

    def applied(self, entry: LogEntry) -> None:
        """A replication listener: a token event makes the registry stale."""
        if isinstance(entry.event, (ev.TokenCreated, ev.TokenRevoked)):
            self._stale = True

    def after_batch(self) -> None:
        """A replication listener: read the tokens again after a batch that changed them."""
        if self._stale and self._reader is None:
            self._reader = asyncio.ensure_future(self._read_again())

    async def _read_again(self) -> None:
        """Read the tokens again until no token event applied meanwhile."""
        try:
            while self._stale and not self.writer.replication.closed:
                self._stale = False
                self.access.replace(await self.reads.read(queries.tokens))
        except Exception:  # the engine closed under it, or failed: its waiters will hear
            log.debug("reading the access tokens failed", exc_info=True)
        finally:
            self._reader = None

    async def load(self) -> None:
        """Bring the registry up to what is applied now (the token writers wait on it)."""
        self._stale = False
        self.access.replace(await self.reads.read(queries.tokens))

    async def caught_up(self) -> None:
        """The registry holds every token event applied here now."""
        if self._reader is not None:
            await asyncio.shield(self._reader)
        if self._stale:
            await self.load()

    # -- the API ----------------------------------------------------------------------------

    async def create_token(
        self,
        owner_id: str,
        *,
        agent_id: str | None = None,
        scope: ev.TokenScope = "read",
        collectives: Sequence[UUID] = (),
        expires_in: float | None = None,
    ) -> NewToken:
        """A new access token for ``owner_id`` (and ``agent_id``, when an agent acts with
        it): ``scope`` "read", "write" or "admin"; limited to some of the owner's
        ``collectives`` (none: all of them); expiring ``expires_in`` seconds from now
        (None: never). The secret is in the answer only: keep it. Admins only."""
        self.gate.me().need_admin("creating tokens")
        check_text("owner_id", owner_id, NAME_MAX)
        try:
            naming.unslashed(owner_id)
        except ValueError as exc:
            raise ValidationError(f"owner_id: {exc}") from None
        if agent_id is not None:
            check_text("agent_id", agent_id, NAME_MAX)
        if scope not in access.SCOPES:
            raise ValidationError(f"scope: must be one of read, write, admin, got {scope!r:.40}")
        if isinstance(collectives, (str, bytes)) or len(collectives) > TOKEN_COLLECTIVES_MAX:
            raise ValidationError(
                f"collectives: must be a list of at most {TOKEN_COLLECTIVES_MAX} collective ids"
            )
        limited = tuple(dict.fromkeys(uuid_of("collectives", c) for c in collectives))
        for cid in limited:
            found = await self.reads.read(queries.get_collective, cid)
            if found is None or found.owner_id != owner_id:
                raise NotFoundError(f"collectives: no collective {cid} owned by {owner_id!r}")
        expires_ms = None
        if expires_in is not None:
            if (
                isinstance(expires_in, bool)
                or not isinstance(expires_in, (int, float))
                or not math.isfinite(expires_in)
                or not 0 < expires_in <= EXPIRES_MAX_S
            ):
                raise ValidationError(
                    f"expires_in: must be seconds in (0, {EXPIRES_MAX_S}], got {expires_in!r}"
                )
            expires_ms = int(time.time() * 1000 + expires_in * 1000)
        token_id = self.writer.new_id()
        secret = access.new_secret(token_id)
        await self.writer.write(
            ev.TokenCreated(
                **self.writer.common(), token_id=token_id, owner_id=owner_id,
                secret_sha256=access.secret_hash(secret), scope=scope, agent_id=agent_id,
                collectives=limited, expires_ms=expires_ms,
            )
        )  # fmt: skip
        await self.load()  # it works here as soon as this returns
        return NewToken(
            token=secret, token_id=token_id, owner_id=owner_id, agent_id=agent_id,
            scope=scope, collectives=limited, expires_ms=expires_ms,
        )  # fmt: skip

    async def list_tokens(
        self, owner_id: str | None = None, *, include_revoked: bool = False
    ) -> list[Token]:
        """The tokens (of one owner, or all), by id; revoked ones only when asked.
        Admins only."""
        self.gate.me().need_admin("listing tokens")
        return [
            _public(t)
            for t in self.access.tokens.values()  # (by id, as the registry holds them)
            if (owner_id is None or t.owner_id == owner_id) and (include_revoked or not t.revoked)
        ]

    async def whoami(self) -> Caller:
        """Tell the caller who it is: the owner and agent it acts for, its scope, the
        collectives its token is limited to, and whether it is the local operator. Any
        credential may ask; a console or client reads it to offer only what the caller
        may do (a read token is shown no write controls)."""
        me = self.gate.me()
        return Caller(
            owner_id=me.owner, agent_id=me.agent, scope=me.scope,
            collectives=tuple(sorted(me.collectives or ())), token_id=me.token_id,
            operator=me.local,
        )  # fmt: skip

    @idempotent
    async def revoke_token(self, token_id: UUID, *, idempotency_key: str | None = None) -> None:
        """Revoke a token: every host refuses it once it applied the revocation (one
        replication delay). Revoking it again is harmless. Admins only."""
        self.gate.me().need_admin("revoking tokens")
        key = uuid_of("token_id", token_id)
        if key not in self.access.tokens:  # (the registry: what this host applied)
            raise NotFoundError(f"token_id: no token {token_id}")
        await self.writer.write(ev.TokenRevoked(**self.writer.common(), token_id=key))
        await self.load()

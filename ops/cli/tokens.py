"""`pulse token ...` and `pulse keys rotate`: who may do what, and the keys that seal
what entities say (admins only)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any
from uuid import UUID

from ops.cli.arguments import collective_of, duration, every_page
from ops.cli.declare import Command, arg
from ops.cli.output import plain, table, when
from sync import access

if TYPE_CHECKING:
    from projections import queries
    from sync.tokens import NewToken, Token

KEEP_TOKEN = "Keep this token now: Pulse stores only its hash and cannot show it again."


async def token_create(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Create an access token; prints it, this once.

    The token (pulse_...) goes alone to stdout, so T=$(pulse token create ...) keeps it;
    its id, owner, agent, scope, collectives and expiry go to stderr, with a reminder:
    Pulse stores only the token's SHA-256, so it cannot be shown again (revoke it and
    create another if it is lost). With --json, all of it is one JSON object on stdout.
    Callers send it as Authorization: Bearer <token>; the CLI sends $PULSE_TOKEN to a
    running `pulse up`. Admins only: the local operator (this data directory, with no
    `pulse up` running) or $PULSE_TOKEN holding an admin token (or the service's
    --token). Once a token exists, `pulse up` wants one with every request.

    example:
      pulse token create --owner me --scope admin
      BOT_TOKEN=$(pulse token create --owner ana --agent bot-1 -c team --scope write --expires 30d)
      pulse token create --owner ana --expires 12h --json
    """  # noqa: E501
    limited = [await collective_of(db, ref, owner=args.owner) for ref in args.collective]
    new: NewToken = await db.create_token(
        args.owner, agent_id=args.agent, scope=args.scope,
        collectives=[c.collective_id for c in limited], expires_in=args.expires,
    )  # fmt: skip
    names = {c.collective_id: c.name for c in limited}
    collectives = ", ".join(f"{names.get(c, '?')} ({c})" for c in new.collectives)
    details = [
        ("token id", str(new.token_id)),
        ("owner", new.owner_id),
        ("agent", new.agent_id or "- (the owner itself)"),
        ("scope", new.scope),
        ("collectives", collectives or f"every collective of {new.owner_id!r}"),
        ("expires", when(new.expires_ms)),
    ]
    if not args.json:
        for name, value in details:
            print(f"{name:<12} {value}", file=sys.stderr)
    print(KEEP_TOKEN, file=sys.stderr, flush=True)
    record = plain(new)
    record["expires"] = None if new.expires_ms is None else when(new.expires_ms)
    return record, new.token


async def token_list(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """List access tokens (never their secrets), by id; revoked ones with --all.

    One row per token: id, owner, agent, scope, collectives (names where known; "all":
    every collective of the owner), expiry (and whether it passed) and revoked. Admins
    only (see `pulse token create`).

    example:
      pulse token list
      pulse token list --owner ana --all --json
    """
    found: list[Token] = await db.list_tokens(args.owner, include_revoked=args.all)
    if not found:
        return [], "no tokens" if args.all else "no tokens (revoked ones: --all)"
    names: dict[UUID, str] = {}
    if any(t.collectives for t in found):
        listed: list[queries.Collective] = await every_page(db.list_collectives)
        names = {c.collective_id: c.name for c in listed}
    now = time.time() * 1000
    rows = [
        [
            t.token_id, t.owner_id or "-", t.agent_id or "-", t.scope,
            ", ".join(names.get(c, str(c)) for c in t.collectives) or "all",
            when(t.expires_ms) + (" (expired)" if t.expires_ms and t.expires_ms <= now else ""),
            "yes" if t.revoked else "no",
        ]
        for t in found
    ]  # fmt: skip
    columns = ["id", "owner", "agent", "scope", "collectives", "expires", "revoked"]
    return plain(found), table(columns, rows)


async def token_revoke(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Revoke an access token: refused from then on, on every host.

    Each host refuses it as soon as it applied the revocation (one replication delay).
    Revoking it again is harmless. Revoking every token does not open the service
    again: once a token existed, requests need one. Admins only.

    example:
      pulse token revoke 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e
    """
    token_id = access.token_id_of(args.token_id) or args.token_id
    await db.revoke_token(token_id, idempotency_key=args.idempotency_key)
    return {"revoked": str(token_id)}, f"revoked token {token_id}"


async def keys_rotate(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Rotate the key-encryption key that wraps every entity's data key.

    A new key-encryption key is made, every data key in the key store is wrapped again
    with it, and the old one is erased; hosts pick up the new one within a second.
    Afterwards a copy of a destroyed data key that outlived its erasure anywhere (a
    NATS block not yet rewritten, a copy of the key bucket) can no longer be unwrapped.
    Takes a few seconds. Admins only.

    example:
      pulse keys rotate
    """
    done = await db.rotate_keys()
    return plain(done), f"key-encryption key {done.kek_id}: {done.rewrapped:,} data keys rewrapped"


COMMANDS = (
    Command(
        "create", "token", token_create,
        arguments=(
            arg("--owner", required=True, help="the owner it acts for (1..256 characters)"),
            arg("--agent",
                help="the agent that acts with it (default: the owner itself); what it "
                "stores as private is this agent's alone"),
            arg("-c", "--collective", action="append", default=[], metavar="COLLECTIVE",
                help="limit it to this collective of the owner, id or name (repeatable; "
                "default: every collective of the owner)"),
            arg("--scope", choices=access.SCOPES, default="read",
                help="read; write (read and write the owner's collectives); admin "
                "(everything, every owner, and token management). Default read"),
            arg("--expires", type=duration, metavar="DURATION",
                help="expire this long from now: 30d, 12h, 45m, 90s or 2w (default: never)"),
        ),
        operations=("find_collective", "create_token"),
    ),
    Command(
        "list", "token", token_list,
        arguments=(
            arg("--owner", help="only this owner's tokens"),
            arg("--all", action="store_true", help="revoked tokens too"),
        ),
        operations=("list_tokens", "list_collectives"),
    ),
    Command(
        "revoke", "token", token_revoke,
        arguments=(
            arg("token_id",
                help="the token's id (see `pulse token list`), or the token itself"),
        ),
        operations=("revoke_token",), writes=True,
    ),
    Command("rotate", "keys", keys_rotate, operations=("rotate_keys",)),
)  # fmt: skip

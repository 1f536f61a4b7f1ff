"""The access rules through Python (``tests.access_cases``): the remote client
(``RemotePulseDB``) maps the service's refusals to the library's errors, and a token
revoked (or expired) on one host of a deployment is refused by another."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from eventlog import EmbeddedNats
from eventlog.errors import Forbidden, Unauthorized
from ops.remote import RemotePulseDB
from sync import PulseDB
from tests.access_cases import World, assert_refused, http
from tests.harness import eventually, in_process


async def test_the_remote_client_maps_refusals(world: World) -> None:
    """``RemotePulseDB`` (the CLI's and ``pulse mcp``'s client): a getter's 404 is None,
    403 and 401 raise the library's errors."""
    bob = RemotePulseDB(world.url, world.secrets["bob"])
    alice = RemotePulseDB(world.url, world.secrets["alice"])
    nobody = RemotePulseDB(world.url, "nope")
    try:
        assert await bob.get_experience(uuid.UUID(world.ids["e1"])) is None
        assert await bob.get_collective(uuid.UUID(world.ids["team"])) is None
        assert await bob.get_insight(uuid.UUID(world.ids["i"])) is None
        found = await bob.get_experience(uuid.UUID(world.ids["o1"]))
        assert found is not None and found.content == "orgshared alpha nats one"
        assert (await alice.get_experience(uuid.UUID(world.ids["e1"]))) is not None
        with pytest.raises(Forbidden, match="not a member"):
            await bob.record_experience(uuid.UUID(world.ids["shared"]), "x")
        with pytest.raises(Forbidden, match="needs an admin token"):
            await alice.list_tokens()
        with pytest.raises(Unauthorized, match="not a Pulse token"):
            await nobody.list_collectives()
    finally:
        for db in (bob, alice, nobody):
            await db.close()


# -- a revocation reaches every host ------------------------------------------------------------


async def test_a_token_revoked_on_one_host_is_refused_on_another(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        made = await a.create_token("alice", scope="write")
        soon = await a.create_token("alice", scope="read", expires_in=2)

        async def known_on_b() -> bool:
            await b.sync()
            return made.token_id in b.access.tokens and soon.token_id in b.access.tokens

        await eventually(known_on_b, what="the tokens on host b")
        async with in_process(b) as url:
            async with http(url, made.token) as client:
                made_here = await client.post(
                    "/v1/create_collective",
                    json={"owner_id": "alice", "name": "t", "embedding_dimension": 2},
                )
                assert made_here.status_code == 200, made_here.text
                await a.revoke_token(made.token_id)

                async def refused_on_b() -> bool:
                    await b.sync()
                    response = await client.post("/v1/list_collectives", json={})
                    return response.status_code == 401

                await eventually(refused_on_b, timeout=10, what="the revocation on host b")
                await assert_refused(url, made.token, "was revoked")
            with pytest.raises(Unauthorized, match="was revoked"), b.acting_as(made.token):
                pass

            async def expired_on_b() -> bool:
                try:
                    b.principal_of(soon.token)
                except Unauthorized as exc:
                    return "expired" in str(exc)
                return False

            await eventually(expired_on_b, timeout=10, interval=0.1, what="expiry on host b")
            await assert_refused(url, soon.token, "expired")
    finally:
        await b.close()
        await a.close()

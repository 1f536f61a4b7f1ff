"""The edges of a token (``tests.access_cases``): 401 without one, malformed, unknown,
revoked or expired; and the operator's secret: loopback is no credential, and no
revocation of tokens locks the operator out."""

from __future__ import annotations

import uuid
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.access_cases import OP, World, assert_refused, http
from tests.harness import Service, eventually


async def test_requests_without_a_live_token_are_refused(world: World) -> None:
    url = world.url
    await assert_refused(url, None, "a bearer token is required")
    await assert_refused(url, "nope", "not a Pulse token")
    await assert_refused(url, "", "not a Pulse token")  # an empty one is not the operator
    unknown = f"pulse_{uuid.uuid4().hex}_{'A' * 43}"
    await assert_refused(url, unknown, "unknown token")
    bob = world.secrets["bob"]
    forged = bob[:-43] + ("B" if bob[-1] != "B" else "C") * 43  # bob's id, another secret
    await assert_refused(url, forged, "unknown token")
    async with http(url) as client:  # another scheme
        basic = await client.post(
            "/v1/list_collectives", json={}, headers={"Authorization": f"Basic {bob}"}
        )
    assert basic.status_code == 401

    made = await world.call("admin", "create_token", owner_id="alice", scope="write")
    world.hide(made["token"], from_=tuple(world.hidden))
    async with http(url, made["token"]) as c:
        assert (await c.post("/v1/list_collectives", json={})).status_code == 200
    await world.call("admin", "revoke_token", token_id=made["token_id"])
    await assert_refused(url, made["token"], "was revoked")  # at once, on this host

    # the service's own token is the operator's, which sees everything
    async with http(url, OP) as op:
        listed = (await op.post("/v1/list_collectives", json={"owner_id": "alice"})).json()
        assert {world.ids["team"], world.ids["other"]} <= {
            c["collective_id"] for c in listed["items"]
        }
        health = (await op.get("/health")).json()
        assert health["status"] == "ok" and "applied_seq" in health
        assert (await op.get("/metrics")).status_code == 200


async def test_an_expired_token_is_refused(world: World) -> None:
    made = await world.call("admin", "create_token", owner_id="alice", scope="read", expires_in=1)
    world.hide(made["token"], from_=tuple(world.hidden))
    async with http(world.url, made["token"]) as client:
        first = await client.post("/v1/get_collective", json={"collective_id": world.ids["team"]})
        assert first.status_code in (200, 401), first.text  # (a slow host: already expired)

        async def expired() -> bool:
            response = await client.post("/v1/list_collectives", json={})
            return response.status_code == 401 and "expired" in response.json()["message"]

        await eventually(expired, timeout=15, interval=0.1, what="the token expired")
    await assert_refused(world.url, made["token"], "expired")


# -- the operator secret: loopback is no credential, and no revocation locks it out -----------


async def test_the_operator_needs_its_secret_and_is_never_locked_out(service: Service) -> None:
    await assert_refused(service.url, None, "a bearer token is required")  # no token yet
    async with http(service.url, service.token) as client:

        async def call(method: str, **body: Any) -> Any:
            response = await client.post(f"/v1/{method}", json=body)
            assert response.status_code == 200, response.text
            return response.json()

        team = await call("create_collective", owner_id="me", name="team", embedder="hash")
        eid = await call("record_experience", collective_id=team, content="as before")
        hits = await call("search_text", collective_id=team, text="before")
        assert [h["experience"]["experience_id"] for h in hits] == [eid]
        assert (await call("get_experience", experience_id=eid))["author_owner"] == "local"
        async with (
            streamable_http_client(f"{service.url}/mcp", http_client=client) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            done = await session.call_tool("remember", {"collective": "team", "content": "x"})
            assert not done.isError, done.content
        health = (await client.get("/health")).json()
        assert health["status"] == "ok" and "applied_seq" in health

        made = await call("create_token", owner_id="me", scope="admin")
        await assert_refused(service.url, None, "a bearer token is required")
        bearer = {"Authorization": f"Bearer {made['token']}"}
        allowed = await client.post("/v1/list_collectives", json={}, headers=bearer)
        assert allowed.status_code == 200 and len(allowed.json()["items"]) == 1
        assert "applied_seq" in (await client.get("/health", headers=bearer)).json()
        # revoking every token leaves the operator as it was
        await call("revoke_token", token_id=made["token_id"])
        await assert_refused(service.url, made["token"], "was revoked")
        assert len((await call("list_collectives"))["items"]) == 1

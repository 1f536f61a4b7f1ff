"""Names belong to owners (``projections.naming``): a collective named by name is one of
the caller's own owner's, so another owner's collective of that name never shadows it
(makes it ambiguous) nor stands in for it (is found while the caller has none of that
name); another owner's is named ``owner/name``. Through a real `pulse up` with the tokens
of two owners, over HTTP (``find_collective``), the CLI and MCP; and a host that follows
``owner/name``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from eventlog import EmbeddedNats
from sync import PulseDB
from tests.harness import PULSE, Service, call, clean_env, start, stop

OP = "operator-s3cret"
PLANTED = "bob planted this ZEBRA"


async def _tool(url: str, token: str, tool: str, args: dict[str, Any]) -> tuple[bool, str]:
    """One MCP tool call over streamable HTTP with ``token``: (is an error, its text)."""
    async with (
        httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client,
        streamable_http_client(f"{url}/mcp", http_client=client) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result = await session.call_tool(tool, args)
    return bool(result.isError), result.content[0].text  # type: ignore[union-attr]


def _cli(service: Service, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PULSE, "--data-dir", str(service.data_dir), *args],
        capture_output=True, text=True, timeout=60, env=clean_env(PULSE_TOKEN=token),
    )  # fmt: skip


async def test_names_belong_to_owners(tmp_path: Path) -> None:
    running = start(tmp_path / "data", "--token", OP)
    try:
        async with running.client(OP) as op:
            alice_t, bob_t = [
                (await call(op, "create_token", owner_id=who, scope="write"))["token"]
                for who in ("alice", "bob")
            ]
        async with running.client(alice_t) as alice, running.client(bob_t) as bob:

            async def made(client: httpx.AsyncClient, owner: str, name: str) -> str:
                cid: str = await call(
                    client, "create_collective", owner_id=owner, name=name, embedder="hash"
                )
                return cid

            # bob takes alice's names first: one she will create, one she never does
            bob_team = await made(bob, "bob", "alice-team")
            bob_plans = await made(bob, "bob", "plans")
            for cid in (bob_team, bob_plans):  # (org: alice may see it, by id or bob/name)
                await call(bob, "record_experience", collective_id=cid, content=PLANTED,
                           visibility="org")  # fmt: skip
            alice_team = await made(alice, "alice", "alice-team")

            async def found(client: httpx.AsyncClient, ref: str) -> str:
                got = await call(client, "find_collective", collective=ref)
                return str(got["collective_id"])

            # HTTP: each owner's bare name is its own; another's by owner/name
            assert await found(alice, "alice-team") == alice_team
            assert await found(bob, "alice-team") == bob_team
            assert await found(alice, "bob/alice-team") == bob_team
            assert await found(alice, "bob/plans") == bob_plans
            assert await found(alice, alice_team) == alice_team  # an id is an id
            missing = await alice.post("/v1/find_collective", json={"collective": "plans"})
            assert missing.status_code == 404, missing.text
            assert missing.json()["message"].startswith(
                "collective: no collective named 'plans' of owner 'alice'"
            )
            # the local operator's bare names are every owner's: ambiguous here, so it
            # says how to name each
            async with running.client(OP) as op:
                both = await op.post("/v1/find_collective", json={"collective": "alice-team"})
                assert both.status_code == 422, both.text
                message = both.json()["message"]
                assert f"alice/alice-team ({alice_team})" in message
                assert f"bob/alice-team ({bob_team})" in message
                assert await found(op, "alice/alice-team") == alice_team
                # an admin token's bare names are its own owner's; it names others' fully
                admin = (await call(op, "create_token", owner_id="root", scope="admin"))["token"]
            async with running.client(admin) as root:
                none = await root.post("/v1/find_collective", json={"collective": "alice-team"})
                assert none.status_code == 404, none.text
                assert await found(root, "bob/alice-team") == bob_team

            # the CLI, as alice
            recorded = _cli(running, alice_t, "record", "-c", "alice-team", "alice's note")
            assert recorded.returncode == 0, recorded.stderr
            got = await call(alice, "get_experience", experience_id=recorded.stdout.strip())
            assert got["collective_id"] == alice_team
            refused = _cli(running, alice_t, "search", "-c", "plans", "planted")
            assert refused.returncode == 1
            assert "no collective named 'plans' of owner 'alice'" in refused.stderr
            assert "ZEBRA" not in refused.stdout + refused.stderr
            theirs = _cli(running, alice_t, "search", "-c", "bob/plans", "planted", "--json")
            assert theirs.returncode == 0, theirs.stderr
            assert [h["experience"]["content"] for h in json.loads(theirs.stdout)] == [PLANTED]

            # MCP, as alice's agent
            error, text = await _tool(
                running.url,
                alice_t,
                "remember",
                {"collective": "alice-team", "content": "mcp note"},
            )
            assert not error, text
            got = await call(
                alice, "get_experience", experience_id=json.loads(text)["experience_id"]
            )
            assert got["collective_id"] == alice_team
            error, text = await _tool(
                running.url, alice_t, "recall", {"collective": "plans", "query": "planted"}
            )
            assert error and "NotFoundError: collective: no collective named 'plans'" in text, text
            assert "ZEBRA" not in text
            error, text = await _tool(
                running.url, alice_t, "remember", {"collective": "plans", "content": "lost"}
            )
            assert error and "NotFoundError" in text, text
            stats = await call(bob, "get_collective_stats", collective_id=bob_plans)
            assert stats["experiences"] == 1  # nothing of alice's landed in bob's
            error, text = await _tool(
                running.url, alice_t, "recall", {"collective": "bob/plans", "query": "planted"}
            )
            assert not error, text
            assert [h["experience"]["content"] for h in json.loads(text)["results"]] == [PLANTED]

            # "/" separates an owner from a name: no new owner or name holds one
            slashed = await alice.post("/v1/create_collective", json={
                "owner_id": "alice", "name": "bob/notes", "embedder": "hash"})  # fmt: skip
            assert slashed.status_code == 422, slashed.text
            assert "name: must not contain '/'" in slashed.json()["message"]
            async with running.client(OP) as op:
                owner = await op.post("/v1/create_token", json={"owner_id": "x/y"})
                assert owner.status_code == 422, owner.text
                assert "owner_id: must not contain '/'" in owner.json()["message"]
    finally:
        stop(running)


async def test_a_host_follows_one_owners_collective_by_owner_and_name(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        await a.create_collective("alice", "shared-name", 2)
        bobs = await a.create_collective("bob", "shared-name", 2)
        everyone = await a.create_collective("carol", "other", 2)
    finally:
        await a.close()
    b = await PulseDB.open(tmp_path / "b", nats_server.url, collectives=["bob/shared-name"])
    try:
        assert b.followed() == [bobs]
        assert (await b.find_collective("bob/shared-name")).collective_id == bobs
        followed = await b.follow(["carol/other"])
        assert sorted(followed, key=str) == sorted([bobs, everyone], key=str)
    finally:
        await b.close()

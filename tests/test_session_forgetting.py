"""A session can be forgotten (``delete_session``): the session and every summary and
note it ever had (the ``history`` view holds the replaced ones) leave the answers, every
host's files (state, analysts' snapshot, text index) and the NATS store, within the scrub
bound; its data key is destroyed. Through Python on two hosts, then through HTTP, the
CLI and MCP on a real `pulse up` with the tokens of two owners: a caller without the
right gets 403 or 404 and nothing is deleted."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from eventlog import EmbeddedNats
from eventlog.keys import DESTROYED, key_name
from projections.projection import ProjectionSettings
from sync import PulseDB
from tests.harness import (
    PULSE,
    call,
    clean_env,
    eventually,
    raw_payloads,
    scan,
    sql_retried,
    start,
    stop,
)

OP = "operator-s3cret"
SCRUB_BOUND = 30.0  # seconds: the scrub bound (5 s by default, 1 s below) with room to spare


def _secrets(what: str) -> dict[str, str]:
    """Texts no other run shares: a session's first summary, the one that replaces it,
    and a note."""
    tag = os.urandom(6).hex()
    return {
        f"{what} first summary": f"first summary {what} ZEBRA{tag}ALPHA",
        f"{what} second summary": f"second summary {what} ZEBRA{tag}BRAVO",
        f"{what} bug note": f"bug note {what} ZEBRA{tag}CHARLIE",
    }


def _needles(secrets: dict[str, str]) -> dict[str, bytes]:
    return {name: text.encode() for name, text in secrets.items()}


async def test_a_deleted_session_and_its_history_are_gone_from_every_host(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    fast = ProjectionSettings(scrub_after=1.0)
    a = await PulseDB.open(tmp_path / "a", nats_server.url, projection_settings=fast)
    b = await PulseDB.open(tmp_path / "b", nats_server.url, projection_settings=fast)
    hosts = [tmp_path / "a", tmp_path / "b"]
    secrets = _secrets("py")
    first, second, note = secrets.values()
    try:
        cid = await a.create_collective("owner", "team", 4)
        kept = await a.start_session(cid, "agent-k", "an ordinary session that stays")
        s = (await a.start_session(cid, "agent-s", first)).session_id
        await a.update_session(s, summary=second, bugs=[note])
        await b.sync()
        history = f"SELECT change::VARCHAR FROM history WHERE entity_id = '{s}'"
        for db in (a, b):  # the replaced summary is in the history
            changes = " ".join(row[0] for row in (await db.sql(history)).rows)
            assert first in changes and second in changes and note in changes
            await db.engine.run(lambda p: p.save())  # (as a quiet second would)
        before = scan(hosts, _needles(secrets))
        for host in hosts:  # each host's files hold all three while they are there
            found = set().union(*(v for k, v in before.items() if k.startswith(str(host))))
            assert found == set(secrets), (host, before)
        assert scan([nats_server.dir], _needles(secrets)) == {}  # sealed on the log
        assert any(str(s) in p for p in await raw_payloads(a.log))

        await b.delete_session(s)
        await b.delete_session(s)  # repeating it is harmless
        await a.sync()

        for db in (a, b):
            assert await db.get_session(s) is None
            listed = await db.list_sessions(cid)
            assert [x.session_id for x in listed] == [kept.session_id]
            rows = await sql_retried(db, f"SELECT event_type FROM history WHERE entity_id = '{s}'")
            assert rows == [["session.deleted"]]  # its tombstone only
        # the log keeps the tombstone only; the key of its sealed events is destroyed
        assert [
            p
            for p in await raw_payloads(a.log)
            if str(s) in p and not p.startswith("SessionDeleted(")
        ] == []
        assert await a.sealer.keyring.store.get(key_name("session", s, cid)) is DESTROYED

        async def forgotten() -> bool:
            await a.sync()
            await b.sync()
            return scan([*hosts, nats_server.dir], _needles(secrets)) == {}

        await eventually(forgotten, timeout=SCRUB_BOUND, what="the session's text leaving disk")
        digest = await a.digest()
        assert await b.digest() == digest
    finally:
        await a.close()
        await b.close()
    c = await PulseDB.open(tmp_path / "c", nats_server.url)
    try:  # a host built from the log after it: the same state, nothing of the session
        assert await c.digest() == digest
        assert await c.get_session(s) is None
        assert (await c.get_session(kept.session_id)) is not None
    finally:
        await c.close()
    assert scan([tmp_path / "c"], _needles(secrets)) == {}


# -- through the service: HTTP, the CLI and MCP, with the tokens of two owners -------------


async def _session_with_history(
    client: httpx.AsyncClient, cid: str, what: str
) -> tuple[str, dict[str, str]]:
    secrets = _secrets(what)
    first, second, note = secrets.values()
    made = await call(client, "start_session", collective_id=cid, agent_id=f"agent-{what}",
                      summary=first)  # fmt: skip
    sid: str = made["session_id"]
    await call(client, "update_session", session_id=sid, summary=second, bugs=[note])
    return sid, secrets


async def _mcp_delete(url: str, token: str, session_id: str) -> tuple[bool, str]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=60) as client,
        streamable_http_client(f"{url}/mcp", http_client=client) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result = await session.call_tool("session", {"action": "delete", "session_id": session_id})
    return bool(result.isError), result.content[0].text  # type: ignore[union-attr]


async def test_delete_session_over_http_the_cli_and_mcp(tmp_path: Path) -> None:
    data = tmp_path / "data"
    running = start(data, "--token", OP)
    try:
        async with running.client(OP) as op:
            tokens = {
                who: (await call(op, "create_token", owner_id=owner, scope=scope))["token"]
                for who, owner, scope in (
                    ("alice", "alice", "write"), ("reader", "alice", "read"),
                    ("bob", "bob", "write"),
                )
            }  # fmt: skip
        async with (
            running.client(tokens["alice"]) as alice,
            running.client(tokens["reader"]) as reader,
            running.client(tokens["bob"]) as bob,
        ):
            cid = await call(alice, "create_collective", owner_id="alice", name="team",
                             embedder="hash")  # fmt: skip
            made = {
                how: await _session_with_history(alice, cid, how) for how in ("http", "cli", "mcp")
            }
            every: dict[str, str] = {}
            for _, secrets in made.values():
                every.update(secrets)
            async with running.client(OP) as op:
                await call(op, "compact")  # the files as they are now: each text is in one
            before = scan([data], _needles(every))
            assert set().union(*before.values()) == set(every), before

            # without the right: 403 (may see it, may not change it) or 404, nothing deleted
            http_sid = made["http"][0]
            for client, status in ((reader, 403), (bob, 404)):
                refused = await client.post("/v1/delete_session", json={"session_id": http_sid})
                assert refused.status_code == status, refused.text
            error, text = await _mcp_delete(running.url, tokens["bob"], http_sid)
            assert error and "NotFoundError: session_id: no session" in text, text
            error, text = await _mcp_delete(running.url, tokens["reader"], http_sid)
            assert error and "Forbidden: scope:" in text, text
            got = await call(alice, "get_session", session_id=http_sid)
            assert got["summary"] == made["http"][1]["http second summary"]

            # HTTP
            done = await alice.post("/v1/delete_session", json={"session_id": http_sid})
            assert done.status_code == 200, done.text
            # the CLI, through the running service
            cli = subprocess.run(
                [PULSE, "--data-dir", str(data), "session", "delete", made["cli"][0]],
                capture_output=True, text=True, timeout=60,
                env=clean_env(PULSE_TOKEN=tokens["alice"]),
            )  # fmt: skip
            assert cli.returncode == 0, cli.stderr
            assert cli.stdout.strip() == f"deleted session {made['cli'][0]}"
            # MCP
            error, text = await _mcp_delete(running.url, tokens["alice"], made["mcp"][0])
            assert not error, text

            for sid, _ in made.values():
                gone = await alice.post("/v1/get_session", json={"session_id": sid})
                assert gone.status_code == 404, gone.text
            listed = await call(alice, "list_sessions", collective_id=cid)
            assert listed["items"] == []
            async with running.client(OP) as op:
                rows = await call(op, "sql", query="SELECT change::VARCHAR FROM history")
                assert not any("ZEBRA" in str(row) for row in rows["rows"])

            def forgotten() -> bool:
                return scan([data], _needles(every)) == {}

            await eventually(forgotten, timeout=SCRUB_BOUND, what="the sessions leaving disk")
    finally:
        stop(running)


async def test_an_update_checked_before_the_delete_leaves_nothing_in_the_log(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    """Host b checked an update against a state without a's delete_session (a race) and
    writes it: the session's data key is destroyed, so it is refused (nothing is
    appended); were it sealed with a copy of the key, it would land after the tombstone
    and be forgotten (``sync.writer.Writer._forget``)."""
    from eventlog import events as ev
    from eventlog.errors import NotFoundError
    from eventlog.ids import uuid7

    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        cid = await a.create_collective("o", "c", 2)
        s = (await a.start_session(cid, "agent", "soon forgotten")).session_id
        await b.sync()
        await a.delete_session(s)  # (b has not applied it: it still holds the data key)
        late = ev.SessionUpdated(
            event_id=uuid7(), instance_id=b.instance_id, hlc=b.clock.now(), session_id=s,
            collective_id=cid, summary="written after the delete ZEBRA",
        )  # fmt: skip
        with pytest.raises(NotFoundError, match=f"session_id: session {s} was deleted"):
            await b.writer.write(late)  # what update_session does once its check has passed
        left = [p for p in await raw_payloads(a.log) if str(s) in p]
        assert len(left) >= 1 and all(p.startswith("SessionDeleted(") for p in left), left
        assert await a.digest() == await b.digest()
    finally:
        await a.close()
        await b.close()

"""The limits of the HTTP and MCP edges: request bodies over the size limit get 413 before
they are read (with or without Content-Length), listings answer pages with a cursor, a
context is bounded, watch streams are capped, /health says only up or down without the
token, and an unexpected error answers an id, never its details (those go to the log)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import nats
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from eventlog import EmbeddedNats
from eventlog import events as ev
from eventlog.codec import encode_event
from eventlog.errors import ValidationError
from eventlog.ids import uuid7
from ops.cli.arguments import every_page
from projections import queries
from sync import PulseDB, pages
from tests.harness import (
    IN_PROCESS_SECRET,
    Service,
    call,
    clean_env,
    eventually,
    in_process,
    start,
    stop,
)

TOKEN = "s3cret"
BODY_LIMIT = 4096
WATCH_LIMIT = 2


@pytest.fixture(scope="module")
def edged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`pulse up` with a token, a 4 KiB body limit and room for two watch streams."""
    env = clean_env(PULSE_MAX_BODY_BYTES=str(BODY_LIMIT), PULSE_MAX_WATCHERS=str(WATCH_LIMIT))
    running = start(tmp_path_factory.mktemp("edges") / "data", "--token", TOKEN, env=env)
    running.token = TOKEN
    yield running
    stop(running)


async def exchange(url: str, head: str, *parts: bytes) -> tuple[int, dict[str, str], Any]:
    """Send a raw request head and body parts (and nothing more), and read the answer:
    only a server that answers without waiting for the rest of the body answers at all."""
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        writer.write(head.replace("\n", "\r\n").encode() + b"\r\n")
        for part in parts:
            writer.write(part)
        await writer.drain()

        async def answer() -> tuple[int, dict[str, str], Any]:
            status_line, *lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
            headers = {
                k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)
            }
            body = await reader.readexactly(int(headers["content-length"]))
            return int(status_line.split()[1]), headers, json.loads(body)

        return await asyncio.wait_for(answer(), 15)
    finally:
        writer.close()


# -- 1. request bodies --------------------------------------------------------------------------


async def test_a_declared_body_over_the_limit_is_413_before_it_is_read(edged: Service) -> None:
    head = (
        "POST /v1/list_collectives HTTP/1.1\nHost: 127.0.0.1\n"
        f"Authorization: Bearer {TOKEN}\nContent-Type: application/json\n"
        "Content-Length: 1000000000\n"
    )
    # 1 GB announced, a few bytes sent: the answer comes without the rest being read
    status, headers, body = await exchange(edged.url, head, b'{"owner_id": "')
    assert status == 413, body
    assert body["error"] == "PayloadTooLarge"
    assert body["message"].startswith(
        f"body: larger than the limit of {BODY_LIMIT} bytes of this service ($PULSE_MAX_BODY_BYTES)"
    )
    async with edged.client() as client:  # and over a client that sends it all
        response = await client.post("/v1/list_collectives", content=b"x" * (BODY_LIMIT + 1),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        assert response.status_code == 413 and response.json()["error"] == "PayloadTooLarge"


async def test_a_chunked_body_is_counted_and_cut_off_past_the_limit(edged: Service) -> None:
    head = (
        "POST /v1/list_collectives HTTP/1.1\nHost: 127.0.0.1\n"
        f"Authorization: Bearer {TOKEN}\nContent-Type: application/json\n"
        "Transfer-Encoding: chunked\n"
    )
    chunk = b"%x\r\n%s\r\n" % (1000, b" " * 1000)
    # five chunks past the 4 KiB limit and no last chunk: only a server that counts as
    # it reads (and stops) answers before the body ends, which it never does
    status, _, body = await exchange(edged.url, head, *[chunk] * 5)
    assert status == 413 and body["error"] == "PayloadTooLarge", body

    async def pieces() -> AsyncIterator[bytes]:  # under the limit, chunked still works
        for piece in (b'{"owner_id"', b': "nobody"}'):
            yield piece

    async with edged.client() as client:
        response = await client.post("/v1/list_collectives", content=pieces(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        assert "content-length" not in response.request.headers
        assert response.status_code == 200 and response.json() == {"items": [], "next": None}


# -- 2. pages ----------------------------------------------------------------------------------


async def test_collectives_page_with_a_cursor_stable_under_writes(edged: Service) -> None:
    async with edged.client() as client:
        made = [
            await call(
                client, "create_collective", owner_id="pager", name=f"c{i}", embedding_dimension=2
            )  # fmt: skip
            for i in range(5)
        ]
        first = await call(client, "list_collectives", owner_id="pager", limit=2)
        assert [c["collective_id"] for c in first["items"]] == made[:2]
        assert isinstance(first["next"], str)
        # writes between pages: a new collective, and one already listed goes away
        late = await call(client, "create_collective", owner_id="pager", name="late",
                          embedding_dimension=2)  # fmt: skip
        await call(client, "delete_collective", collective_id=made[0])
        seen = [c["collective_id"] for c in first["items"]]
        after = first["next"]
        while after is not None:
            page = await call(client, "list_collectives", owner_id="pager", limit=2, after=after)
            assert len(page["items"]) <= 2
            seen += [c["collective_id"] for c in page["items"]]
            after = page["next"]
        assert seen == [*made, late]  # each once, in order, none skipped
        everything = await call(client, "list_collectives", owner_id="pager")
        assert everything["next"] is None and len(everything["items"]) == 5

        too_many = await client.post("/v1/list_collectives", json={"limit": 1001})
        assert too_many.status_code == 422
        assert too_many.json()["message"].startswith(
            "limit: must be an integer in 1..1000 (items per page), got 1001"
        )
        forged = await client.post("/v1/list_collectives", json={"after": "bm9wZQ"})
        assert forged.status_code == 422
        assert forged.json()["message"].startswith("after: not a cursor of collectives")


async def test_a_listing_answers_its_first_100_by_default(edged: Service) -> None:
    async with edged.client() as client:
        team = await call(client, "create_collective", owner_id="o", name="crowd",
                          embedding_dimension=2)  # fmt: skip
        await asyncio.gather(*(
            call(client, "register_activity", collective_id=team, agent_id=f"a{i:03}")
            for i in range(101)
        ))  # fmt: skip
        page = await call(client, "get_active_agents", collective_id=team)
        assert len(page["items"]) == 100 and page["next"] is not None
        rest = await call(client, "get_active_agents", collective_id=team, after=page["next"])
        assert len(rest["items"]) == 1 and rest["next"] is None
        agents = {a["agent_id"] for a in page["items"] + rest["items"]}
        assert agents == {f"a{i:03}" for i in range(101)}


async def test_related_experiences_page_outgoing_then_incoming(edged: Service) -> None:
    async with edged.client() as client:
        team = await call(client, "create_collective", owner_id="o", name="linked",
                          embedding_dimension=2)  # fmt: skip
        hub, *others = [
            await call(
                client, "record_experience", collective_id=team, content=f"e{i}", embedding=[1, i]
            )  # fmt: skip
            for i in range(6)
        ]
        out = [await call(client, "store_relation", source_id=hub, target_id=o,
                          relation_type="Supports", strength=0.1 * (i + 1))  # fmt: skip
               for i, o in enumerate(others[:3])]  # fmt: skip
        inc = [await call(client, "store_relation", source_id=o, target_id=hub,
                          relation_type="Implies", strength=0.9)  # fmt: skip
               for o in others[3:]]  # fmt: skip
        seen: list[str] = []
        after = None
        while True:
            page = await call(client, "get_related_experiences", experience_id=hub, limit=2,
                              **({"after": after} if after else {}))  # fmt: skip
            seen += [r["relation"]["relation_id"] for r in page["items"]]
            after = page["next"]
            if after is None:
                break
        assert seen == sorted(out) + sorted(inc)
        strong = await call(client, "get_related_experiences", experience_id=hub, limit=1,
                            min_strength=0.25)  # fmt: skip
        # the strength filter is applied before the page is cut, so pages stay full
        assert [r["relation"]["relation_id"] for r in strong["items"]] == [out[2]]


async def test_a_context_is_bounded(edged: Service) -> None:
    async with edged.client() as client:
        team = await call(client, "create_collective", owner_id="o", name="ctx",
                          embedding_dimension=2)  # fmt: skip
        await call(client, "record_experience", collective_id=team, content="x",
                   embedding=[1, 0])  # fmt: skip
        huge = await client.post("/v1/get_context_candidates", json={
            "collective_id": team, "embedding": [1, 0], "k": 1000, "recent": 1000,
            "insights": 1000})  # fmt: skip
        assert huge.status_code == 422
        assert huge.json()["message"].startswith(
            "k + recent + insights: at most 300 items in one context, got 3000"
        )
        at_limit = await call(client, "get_context_candidates", collective_id=team,
                              embedding=[1, 0], k=290, recent=5, insights=5)  # fmt: skip
        assert len(at_limit["similar"]) == 1


async def test_dead_letters_page(tmp_path: Path, nats_server: EmbeddedNats) -> None:
    db = await PulseDB.open(tmp_path / "db", nats_server.url)
    try:
        cid = await db.create_collective("me", "team", 3)
        lesson = await db.record_experience(cid, "x", [1.0, 0.0, 0.0])
        client = await nats.connect(nats_server.url)
        seqs = []
        for _ in range(5):  # out of range: each is kept aside as a message
            wire = encode_event(
                ev.ExperienceReinforced(
                    event_id=uuid7(), instance_id=uuid7(), hlc=ev.pack_hlc(int(time.time() * 1000)),
                    experience_id=lesson, collective_id=cid, applications=2**64 - 1,
                )
            )  # fmt: skip
            ack = await client.jetstream().publish(wire.subject, wire.payload, headers=wire.headers)
            seqs.append(ack.seq)
        await client.close()
        await db.sync()
        first = await db.dead_letters(limit=2)
        assert [d.seq for d in first] == seqs[:2] and first.next is not None
        letters: list[queries.DeadLetter] = await every_page(db.dead_letters)
        assert [d.seq for d in letters] == seqs
        rest = await db.dead_letters(limit=3, after=first.next)
        assert [d.seq for d in rest] == seqs[2:] and rest.next is None
        with pytest.raises(ValidationError, match=r"^limit: must be an integer in 1\.\.1000"):
            await db.dead_letters(limit=1001)
    finally:
        await db.close()


async def test_the_cli_helpers_follow_every_page(
    tmp_path: Path, nats_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the CLI and MCP read whole (names, listings) is not cut at one page."""
    from ops.cli.arguments import collective_of

    monkeypatch.setattr(pages, "PAGE_MAX", 2)
    db = await PulseDB.open(tmp_path / "db", nats_server.url)
    try:
        made = [await db.create_collective("o", f"n{i}", 2) for i in range(5)]
        assert len(await db.list_collectives(limit=2)) == 2
        listed: list[queries.Collective] = await every_page(db.list_collectives)
        assert [c.collective_id for c in listed] == made
        assert (await collective_of(db, "n4")).collective_id == made[4]  # on the third page
    finally:
        await db.close()


# -- 3. watch streams ---------------------------------------------------------------------------


async def test_watch_streams_are_capped_and_a_closed_one_frees_its_place(edged: Service) -> None:
    async with edged.client() as client:
        request = client.build_request("GET", "/v1/watch_experiences")
        streams = []
        lines = []  # each stream's line iterator, kept (a dropped one stalls the client)
        try:
            for _ in range(WATCH_LIMIT):
                stream = await client.send(request, stream=True)
                streams.append(stream)
                assert stream.status_code == 200
                lines.append(stream.aiter_lines())
                assert await anext(lines[-1]) == ": watching"
            refused = await client.send(request, stream=True)  # (a stream, were it let in)
            streams.append(refused)
            assert refused.status_code == 503
            await refused.aread()
            assert refused.headers["retry-after"] == "5"
            assert refused.json()["error"] == "TooManyWatchers"
            assert refused.json()["message"].startswith(
                f"watch: {WATCH_LIMIT} watch streams are open, the limit of this service"
            )
            await streams.pop().aclose()
            await streams.pop(0).aclose()

            async def opens() -> bool:
                stream = await client.send(request, stream=True)
                if stream.status_code == 200:
                    streams.append(stream)
                    return True
                await stream.aclose()
                return False

            await eventually(opens, timeout=20, what="a place freed by a closed watcher")
            full = await client.send(request, stream=True)  # and the cap holds again
            streams.append(full)
            assert full.status_code == 503
        finally:
            for stream in streams:
                await stream.aclose()


# -- 4. health -----------------------------------------------------------------------------------


async def test_health_says_only_up_without_the_token(edged: Service) -> None:
    async with httpx.AsyncClient(base_url=edged.url, timeout=30) as anonymous:
        bare = await anonymous.get("/health")
        assert bare.status_code == 200 and bare.json() == {"status": "up"}
        wrong = await anonymous.get("/health", headers={"Authorization": "Bearer nope"})
        assert wrong.json() == {"status": "up"}
    async with edged.client() as client:
        full = (await client.get("/health")).json()
    assert full["status"] == "ok" and full["nats_connected"] is True
    assert {"applied_seq", "stream_seq", "lag", "instance_id"} <= set(full)


# -- 5. unexpected errors ---------------------------------------------------------------------


def _error_id(text: str) -> str:
    return text.split("internal error ", 1)[1].split(":", 1)[0]


async def test_an_unexpected_error_answers_an_id_and_logs_the_details(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = await PulseDB.open(tmp_path / "db", nats_server.url)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail")

    try:
        team = await db.create_collective("o", "team", 2)
        monkeypatch.setattr(db, "get_collective_stats", broken)
        monkeypatch.setattr(db, "get_active_agents", broken)
        caplog.set_level(logging.DEBUG, logger="pulse")
        operator = {"Authorization": f"Bearer {IN_PROCESS_SECRET}"}
        async with in_process(db) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30, headers=operator) as client:
                response = await client.post("/v1/get_collective_stats",
                                             json={"collective_id": str(team)})  # fmt: skip
                fine = await client.post("/v1/get_collective", json={"collective_id": str(team)})
            async with (
                httpx.AsyncClient(headers=operator, timeout=30) as http,
                streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                tool = await session.call_tool("activity", {"collective": "team",
                                                            "action": "active"})  # fmt: skip
                refused = await session.call_tool("activity", {"collective": "team",
                                                               "action": "end"})  # fmt: skip
    finally:
        await db.close()

    assert fine.status_code == 200
    assert response.status_code == 500
    body = response.json()
    assert body["error"] == "InternalError" and len(body["error_id"]) == 12
    assert body["message"] == (
        f"internal error {body['error_id']}: the service log has the details under this id"
    )
    for leak in ("secret detail", "RuntimeError", "Traceback"):
        assert leak not in response.text

    assert tool.isError
    text = tool.content[0].text  # type: ignore[union-attr]
    mcp_id = _error_id(text)
    for leak in ("secret detail", "RuntimeError", "Traceback"):
        assert leak not in text
    # Pulse's own errors still say what is wrong
    assert refused.isError
    assert "ValidationError: agent: required to end an activity" in (
        refused.content[0].text)  # type: ignore[union-attr]  # fmt: skip

    for error_id, where in ((body["error_id"], "POST /v1/get_collective_stats"),
                            (mcp_id, "MCP tool activity")):  # fmt: skip
        # one line at ERROR (the id, where, what), the traceback once at DEBUG
        line, traceback = [r for r in caplog.records if error_id in r.getMessage()]
        assert line.levelno == logging.ERROR and line.exc_info is None
        assert line.getMessage() == (
            f"internal error {error_id} in {where}: RuntimeError 'secret detail'"
        )
        assert traceback.levelno == logging.DEBUG and traceback.exc_info is not None
        assert "secret detail" in str(traceback.exc_info[1])

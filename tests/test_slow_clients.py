"""Slow or many clients cannot stop `pulse up` (ops.serving): headers, a body and the
start of a next request that trickle are cut off (408), a connection that sends nothing
is closed, running out of descriptors refuses new connections while the request in
flight completes and the process lives, and watch streams and MCP sessions are capped in
total and per token (503 with Retry-After), a slot coming back when its stream ends.

The first tests need no credential; the caps need tokens of their own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.harness import PULSE, Service, clean_env, eventually, start, stop

TOKEN = "s3cret-slow"
BOUND = 30.0  # seconds: how long a test waits for the server before it fails
WATCHERS, WATCHERS_PER_TOKEN = 3, 2
SESSIONS, SESSIONS_PER_TOKEN = 3, 2


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`pulse up` with one-second timeouts and small caps on streams and sessions."""
    env = clean_env(
        PULSE_HEADER_TIMEOUT="1", PULSE_BODY_TIMEOUT="1", PULSE_KEEP_ALIVE_TIMEOUT="1",
        PULSE_MAX_WATCHERS=str(WATCHERS), PULSE_MAX_WATCHERS_PER_TOKEN=str(WATCHERS_PER_TOKEN),
        PULSE_MAX_MCP_SESSIONS=str(SESSIONS),
        PULSE_MAX_MCP_SESSIONS_PER_TOKEN=str(SESSIONS_PER_TOKEN),
    )  # fmt: skip
    running = start(tmp_path_factory.mktemp("slow") / "data", "--token", TOKEN, env=env)
    running.token = running.token or TOKEN
    yield running
    stop(running)


@pytest.fixture(scope="module")
def fallback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`pulse up` with ``edge``'s one-second timeouts on h11 (``PULSE_HTTP=h11``: the
    parser where httptools, the default, is missing), whose deadlines are code of their
    own (``ops.serving.H11EdgeProtocol``)."""
    env = clean_env(
        PULSE_HEADER_TIMEOUT="1", PULSE_BODY_TIMEOUT="1", PULSE_KEEP_ALIVE_TIMEOUT="1",
        PULSE_HTTP="h11",
    )  # fmt: skip
    running = start(tmp_path_factory.mktemp("h11") / "data", "--token", TOKEN, env=env)
    running.token = running.token or TOKEN
    yield running
    stop(running)


@contextlib.asynccontextmanager
async def connection(url: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def trickle_until_closed(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, piece: bytes
) -> bytes:
    """Send ``piece`` every 0.2 s until the server closes the connection; what it sent.
    Fails the test if it is still open after ``BOUND`` seconds."""
    received = b""
    deadline = asyncio.get_running_loop().time() + BOUND
    while asyncio.get_running_loop().time() < deadline:
        with contextlib.suppress(OSError):
            writer.write(piece)
            await writer.drain()
        try:
            chunk = await asyncio.wait_for(reader.read(65536), 0.2)
        except TimeoutError:
            continue
        except OSError:  # (reset: it closed while bytes of ours were on their way)
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the server kept a trickling connection open for {BOUND} s")


def status_and_body(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


# -- timeouts (no credential needed) ----------------------------------------------------------


async def headers_that_trickle_are_cut_off_with_408(timed: Service) -> None:
    async with connection(timed.url) as (reader, writer):
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        answer = await trickle_until_closed(reader, writer, b"X-Slow: 1\r\n")
    status, body = status_and_body(answer)
    assert status == 408
    assert body == {
        "error": "RequestTimeout",
        "message": "headers: not received within 1 s, the limit of this service "
        "($PULSE_HEADER_TIMEOUT)",
    }


async def a_connection_that_sends_nothing_is_closed(timed: Service) -> None:
    async with connection(timed.url) as (reader, _):
        assert await asyncio.wait_for(reader.read(), BOUND) == b""  # closed, without a word


async def an_idle_connection_and_a_next_request_that_stalls_are_closed(timed: Service) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    async with connection(timed.url) as (reader, writer):
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
        assert head.startswith(b"HTTP/1.1 200 ")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))  # fmt: skip
        await reader.readexactly(length)
        # a keep-alive connection, then the first bytes of a next request, and no more
        writer.write(b"GET /health HTTP/1.1\r\n")
        answer = await trickle_until_closed(reader, writer, b"X-Slow: 1\r\n")
    assert status_and_body(answer)[0] == 408
    async with connection(timed.url) as (reader, writer):
        writer.write(request)
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
        await asyncio.wait_for(reader.read(), BOUND)  # the idle one closes (reads to EOF)


async def a_body_that_trickles_is_cut_off_with_408(timed: Service) -> None:
    async with connection(timed.url) as (reader, writer):
        writer.write(
            b"POST /v1/list_collectives HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + (timed.token or "").encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        answer = await trickle_until_closed(reader, writer, b" ")
    status, body = status_and_body(answer)
    assert status == 408
    assert body["message"] == (
        "body: not received within 1 s, the limit of this service ($PULSE_BODY_TIMEOUT)"
    )
    async with timed.client() as client:  # and the service goes on
        assert (await client.post("/v1/list_collectives", json={})).status_code == 200


# each on ``edge`` (httptools), and all at once on h11


async def test_headers_that_trickle_are_cut_off_with_408(edge: Service) -> None:
    await headers_that_trickle_are_cut_off_with_408(edge)


async def test_a_connection_that_sends_nothing_is_closed(edge: Service) -> None:
    await a_connection_that_sends_nothing_is_closed(edge)


async def test_an_idle_connection_and_a_next_request_that_stalls_are_closed(
    edge: Service,
) -> None:
    await an_idle_connection_and_a_next_request_that_stalls_are_closed(edge)


async def test_a_body_that_trickles_is_cut_off_with_408(edge: Service) -> None:
    await a_body_that_trickles_is_cut_off_with_408(edge)


async def test_h11_keeps_the_same_deadlines(fallback: Service) -> None:
    await asyncio.gather(
        headers_that_trickle_are_cut_off_with_408(fallback),
        a_connection_that_sends_nothing_is_closed(fallback),
        an_idle_connection_and_a_next_request_that_stalls_are_closed(fallback),
        a_body_that_trickles_is_cut_off_with_408(fallback),
    )


async def test_headers_past_their_bound_are_refused_400(edge: Service) -> None:
    from ops.serving import HEADERS_MAX

    async with connection(edge.url) as (reader, writer):
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        writer.write(b"X-Large: " + b"x" * HEADERS_MAX + b"\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), BOUND)  # answered, then closed
    assert answer.startswith(b"HTTP/1.1 400 ")


# -- out of descriptors --------------------------------------------------------------------------


OPEN_FILES = 256
FLOOD = 300


def few_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


async def test_running_out_of_descriptors_only_refuses_new_connections(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # (this test holds FLOOD + some)
    if soft < 2 * FLOOD:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * FLOOD), hard))
    env = clean_env(PULSE_HEADER_TIMEOUT="120", PULSE_BODY_TIMEOUT="120")
    running = start(tmp_path / "data", "--token", TOKEN, env=env, preexec_fn=few_open_files)
    token = running.token or TOKEN
    where = urlsplit(running.url)
    address = (where.hostname or "127.0.0.1", where.port or 80)
    slow: list[socket.socket] = []
    body = json.dumps({"owner_id": "ana", "name": "team", "embedder": "hash"}).encode()
    try:
        async with connection(running.url) as (reader, writer):
            # a request in flight: its headers and half its body, the rest after the flood
            writer.write(
                b"POST /v1/create_collective HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer " + token.encode() + b"\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:10]
            )
            await writer.drain()
            for _ in range(FLOOD):  # each sends a first header line, and then nothing
                sock = socket.create_connection(address, timeout=10)
                slow.append(sock)
                with contextlib.suppress(OSError):
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert running.process.poll() is None

            async with httpx.AsyncClient(base_url=running.url, timeout=10) as fresh:

                async def refused() -> bool:
                    try:
                        response = await fresh.get("/health")
                    except httpx.TransportError:
                        return True
                    if response.status_code == 503:
                        assert response.headers["retry-after"] == "5"
                        assert response.json()["error"] == "TooManyConnections"
                        return True
                    return False

                await eventually(refused, timeout=BOUND, what="a new connection refused")
            assert running.process.poll() is None

            writer.write(body[10:])  # the request in flight completes
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
            assert head.startswith(b"HTTP/1.1 200 "), head

        for sock in slow:
            sock.close()
        slow.clear()
        async with httpx.AsyncClient(base_url=running.url, timeout=10) as fresh:

            async def healthy() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await fresh.get("/health")).status_code == 200
                return False

            await eventually(healthy, timeout=BOUND, what="/health answering again")
        assert running.process.poll() is None
    finally:
        for sock in slow:
            sock.close()
        stop(running)
    assert "Too many open files" not in "".join(running.logged)


# -- caps on streams and sessions ----------------------------------------------------------------


async def new_token(edge: Service, owner: str) -> str:
    async with edge.client() as client:
        response = await client.post("/v1/create_token", json={"owner_id": owner})
    assert response.status_code == 200, response.text
    token: str = response.json()["token"]
    return token


async def test_watch_streams_are_capped_per_token_and_in_all(edge: Service) -> None:
    ana, bob = await new_token(edge, "ana"), await new_token(edge, "bob")
    async with edge.client(ana) as as_ana, edge.client(bob) as as_bob:
        streams: list[httpx.Response] = []

        async def watch(client: httpx.AsyncClient) -> httpx.Response:
            stream = await client.send(client.build_request("GET", "/v1/watch_experiences"),
                                       stream=True)  # fmt: skip
            streams.append(stream)
            if stream.status_code == 503:
                await stream.aread()
                assert stream.headers["retry-after"] == "5"
                assert stream.json()["error"] == "TooManyWatchers"
            return stream

        try:
            held = [await watch(as_ana) for _ in range(WATCHERS_PER_TOKEN)]
            assert [s.status_code for s in held] == [200] * WATCHERS_PER_TOKEN
            mine = await watch(as_ana)
            assert mine.status_code == 503
            assert mine.json()["message"] == (
                f"watch: {WATCHERS_PER_TOKEN} watch streams are open for this token, its "
                "limit ($PULSE_MAX_WATCHERS_PER_TOKEN); retry in 5 s"
            )
            assert (await watch(as_bob)).status_code == 200  # bob's own first one
            full = await watch(as_bob)
            assert full.status_code == 503
            assert full.json()["message"] == (
                f"watch: {WATCHERS} watch streams are open, the limit of this service "
                "($PULSE_MAX_WATCHERS); retry in 5 s"
            )
            await held[0].aclose()  # ana's ends: its place is given back

            async def bob_watches() -> bool:
                stream = await watch(as_bob)
                return stream.status_code == 200

            await eventually(bob_watches, timeout=BOUND, what="a place given back")
        finally:
            for stream in streams:
                await stream.aclose()


INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "test", "version": "1"}},
}  # fmt: skip
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


async def open_session(client: httpx.AsyncClient) -> httpx.Response:
    response = await client.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
    if response.status_code == 503:
        assert response.headers["retry-after"] == "5"
        assert response.json()["error"] == "TooManySessions"
    return response


async def test_mcp_sessions_are_capped_per_token_and_in_all(edge: Service) -> None:
    ana, bob = await new_token(edge, "ana-mcp"), await new_token(edge, "bob-mcp")
    async with edge.client(ana) as as_ana, edge.client(bob) as as_bob:
        opened = [await open_session(as_ana) for _ in range(SESSIONS_PER_TOKEN)]
        assert [r.status_code for r in opened] == [200] * SESSIONS_PER_TOKEN, opened[-1].text
        mine = await open_session(as_ana)
        assert mine.status_code == 503
        assert mine.json()["message"] == (
            f"mcp sessions: {SESSIONS_PER_TOKEN} are open, the limit of this token "
            "($PULSE_MAX_MCP_SESSIONS_PER_TOKEN); close one, or retry in 5 s"
        )
        assert (await open_session(as_bob)).status_code == 200
        full = await open_session(as_bob)
        assert full.status_code == 503
        assert full.json()["message"] == (
            f"mcp sessions: {SESSIONS} are open, the limit of this service "
            "($PULSE_MAX_MCP_SESSIONS); close one, or retry in 5 s"
        )
        # a session of ana's ends (the client's DELETE): its place is given back
        session = opened[0].headers["mcp-session-id"]
        ended = await as_ana.delete("/mcp", headers={**MCP_HEADERS, "Mcp-Session-Id": session})
        assert ended.status_code == 200, ended.text

        async def bob_opens() -> bool:
            return (await open_session(as_bob)).status_code == 200

        await eventually(bob_opens, timeout=BOUND, what="a session's place given back")


# -- the settings ----------------------------------------------------------------------------


def test_every_limit_is_a_setting_in_the_help_of_pulse_up() -> None:
    from ops.serving import SETTINGS

    shown = subprocess.run([PULSE, "up", "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0
    for variable in SETTINGS.values():
        assert f"${variable}" in shown.stdout, variable


def test_a_bad_setting_is_refused_before_serving(tmp_path: Path) -> None:
    result = subprocess.run(
        [PULSE, "--data-dir", str(tmp_path / "data"), "up", "--port", "0"],
        capture_output=True, text=True, timeout=60, env=clean_env(PULSE_HEADER_TIMEOUT="soon"),
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "pulse: error: PULSE_HEADER_TIMEOUT: must be a number of seconds in (0, 86400], got 'soon'"
    )

"""The httptools edge answers a ``POST /v1/<name>`` that ``api.Front`` takes itself
(``ops.serving.EdgeProtocol._start_asgi_task``, ``_answered``): the same bytes as the
app's full stack, which answers the same request when it carries an ``Origin`` of the
service's own (Front leaves those to the stack). Over one raw keep-alive connection to a
real `pulse up`: answers, refusals, ``Connection: close``, pipelined requests, and the
request metrics counting both."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from urllib.parse import urlsplit

import pytest

from tests.harness import Service
from tests.test_slow_clients import connection

BOUND = 30.0  # seconds: how long a test waits for the server before it fails


def request(service: Service, path: str, body: bytes, *extra: str) -> bytes:
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {urlsplit(service.url).netloc}",
        f"Authorization: Bearer {service.token}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def answer(reader: asyncio.StreamReader) -> tuple[bytes, list[bytes], bytes]:
    """One answer: its status line, its header lines but ``date``, its body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
    status, *lines = head[:-4].split(b"\r\n")
    headers = [line for line in lines if not line.lower().startswith(b"date:")]
    length = next(int(h.split(b":")[1]) for h in headers if h.lower().startswith(b"content-length"))
    body = await asyncio.wait_for(reader.readexactly(length), BOUND)
    return status, headers, body


def steady(answer: tuple[bytes, list[bytes], bytes]) -> tuple[bytes, list[bytes], object]:
    """An answer without what changes from one call to the next: a search hit's energy
    (it decays with time), so its score, and with them the length."""
    status, headers, body = answer
    data = json.loads(body)
    if isinstance(data, list):
        data = [{k: v for k, v in hit.items() if k not in ("energy", "score")} for hit in data]
        headers = [h for h in headers if not h.lower().startswith(b"content-length")]
    return status, headers, data


def own_origin(service: Service) -> str:
    """An Origin of the service's own: the request is answered by the app's stack."""
    return f"Origin: http://127.0.0.1:{urlsplit(service.url).port}"


async def requests_counted(service: Service, route: str, status: int) -> float:
    async with service.client() as client:
        text = (await client.get("/metrics")).text
    pattern = (
        rf'pulse_http_requests_total\{{[^}}]*route="{re.escape(route)}"[^}}]*'
        rf'status="{status}"[^}}]*\}} ([0-9.e+]+)'
    )
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


@pytest.fixture
async def stored(shared_service: Service) -> tuple[str, str]:
    """A collective of this test's own and one experience in it: (collective, experience)."""
    async with shared_service.client() as client:
        created = await client.post(
            "/v1/create_collective",
            json={"owner_id": "edge", "name": f"answers-{uuid.uuid4().hex[:8]}",
                  "embedding_dimension": 4},
        )  # fmt: skip
        assert created.status_code == 200, created.text
        cid = created.json()
        recorded = await client.post(
            "/v1/record_experience",
            json={"collective_id": cid, "content": "retry the flaky upload with backoff",
                  "embedding": [1.0, 0.0, 0.0, 0.0]},
        )  # fmt: skip
        assert recorded.status_code == 200, recorded.text
    return cid, recorded.json()


async def test_the_edge_answers_as_the_app_stack_does(
    shared_service: Service, stored: tuple[str, str]
) -> None:
    cid, eid = stored
    cases = [  # (path, body): answers, and refusals of each kind Front makes
        ("/v1/get_experience", {"experience_id": eid}),
        # (pure relevance: energy decays between two calls)
        ("/v1/search_text", {"collective_id": cid, "text": "flaky upload", "energy_weight": 0}),
        ("/v1/search_similar", {"collective_id": cid, "query": [1, 0, 0, 0.5], "energy_weight": 0}),
        ("/v1/search_similar", {"collective_id": cid, "query": [1, 0], "k": 5}),  # dimension
        ("/v1/search_text", {"collective_id": cid, "text": "x", "k": 0}),  # 422
        ("/v1/search_text", {"collective_id": cid, "text": "x", "surplus": 1}),  # 422
        ("/v1/get_experience", {"experience_id": str(uuid.uuid4())}),  # 404
    ]
    async with connection(shared_service.url) as (reader, writer):
        for path, body in cases:
            raw = json.dumps(body).encode()
            writer.write(request(shared_service, path, raw))
            direct = await answer(reader)
            writer.write(request(shared_service, path, raw, own_origin(shared_service)))
            stacked = await answer(reader)
            assert steady(direct) == steady(stacked), (path, body)
            if path == "/v1/get_experience" and body["experience_id"] == eid:
                assert direct[0] == b"HTTP/1.1 200 OK"
                assert json.loads(direct[2])["content"] == "retry the flaky upload with backoff"


async def test_connection_close_and_pipelined_requests(
    shared_service: Service, stored: tuple[str, str]
) -> None:
    cid, eid = stored
    raw = json.dumps({"experience_id": eid}).encode()
    # pipelined: three requests in one write, three answers in order
    searched = json.dumps({"collective_id": cid, "text": "backoff", "k": 1}).encode()
    async with connection(shared_service.url) as (reader, writer):
        writer.write(
            request(shared_service, "/v1/get_experience", raw)
            + request(shared_service, "/v1/search_text", searched)
            + request(shared_service, "/v1/get_experience", raw)
        )
        first, second, third = [await answer(reader) for _ in range(3)]
        assert first == third
        assert first[0] == second[0] == b"HTTP/1.1 200 OK"
        assert json.loads(second[2])[0]["experience"]["experience_id"] == eid
    # Connection: close, on the edge's way and the stack's: the same answer, then EOF
    closed = []
    for extra in ([], [own_origin(shared_service)]):
        async with connection(shared_service.url) as (reader, writer):
            writer.write(
                request(shared_service, "/v1/get_experience", raw, "Connection: close", *extra)
            )
            closed.append(await answer(reader))
            assert await asyncio.wait_for(reader.read(), BOUND) == b""
    assert closed[0] == closed[1]
    assert b"connection: close" in closed[0][1]


async def test_answers_of_the_edge_are_counted(
    shared_service: Service, stored: tuple[str, str]
) -> None:
    _, eid = stored
    route = "/v1/get_experience"
    before_ok = await requests_counted(shared_service, route, 200)
    before_missing = await requests_counted(shared_service, route, 404)
    async with connection(shared_service.url) as (reader, writer):
        for body in ({"experience_id": eid}, {"experience_id": str(uuid.uuid4())}) * 2:
            writer.write(request(shared_service, route, json.dumps(body).encode()))
            await answer(reader)
    assert await requests_counted(shared_service, route, 200) == before_ok + 2
    assert await requests_counted(shared_service, route, 404) == before_missing + 2

"""`pulse up` serving agent hosts, driven through real clients: the HTTP JSON API (httpx,
plain JSON as another language would send it), server-sent events, the bearer token,
health and metrics, `pulse sql` while serving, and MCP over streamable HTTP and stdio."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from starlette.responses import JSONResponse

from eventlog import MemoryLog
from ops.encoding import json_bytes, to_json
from ops.remote import API_METHODS
from ops.service import create_app
from sync.instance import PulseDB
from sync.models import ContextIn
from tests.harness import PULSE, Service, call, eventually, start, stop
from tests.harness import clean_env as _env

# -- the HTTP API -----------------------------------------------------------------------------


async def test_openapi_lists_every_method_with_the_data_model_limits(
    shared_service: Service,
) -> None:
    async with shared_service.client() as client:
        schema = (await client.get("/openapi.json")).json()
    paths = set(schema["paths"])
    assert {f"/v1/{name}" for name in API_METHODS} <= paths
    assert {"/v1/watch_experiences", "/health", "/metrics"} <= paths
    experience = schema["components"]["schemas"]["record_experience_request"]["properties"]
    assert experience["importance"]["maximum"] == 1.0
    assert experience["domain"]["maxItems"] == 50
    assert experience["idempotency_key"]["anyOf"][0]["maxLength"] == 200
    batch = schema["components"]["schemas"]["record_experiences_request"]["properties"]["items"]
    assert (batch["minItems"], batch["maxItems"]) == (1, 1000)
    item = schema["components"]["schemas"]["ExperienceItemIn"]["properties"]
    assert item["importance"]["maximum"] == 1.0 and "collective_id" not in item
    relation = schema["components"]["schemas"]["store_relation_request"]["properties"]
    assert set(relation["relation_type"]["enum"]) >= {"Supports", "Contradicts", "RelatedTo"}


async def test_remember_and_recall_over_plain_http_json(shared_service: Service) -> None:
    async with shared_service.client() as client:  # (reads only its own collective)
        team = await call(client, "create_collective", owner_id="ana", name="team",
                          embedder="hash")  # fmt: skip
        a = await call(client, "record_experience", collective_id=team,
                       content="retry NATS publishes with the same message id",
                       domain=["nats"], importance=0.8,
                       experience_type={"kind": "Solution", "approach": "retry",
                                        "worked": True})  # fmt: skip
        b = await call(client, "record_experience", collective_id=team,
                       content="NATS timeouts came from slow fsync")  # fmt: skip
        hits = await call(client, "search_hybrid", collective_id=team, text="nats publish", k=2)
        assert [h["experience"]["experience_id"] for h in hits] == [a, b]
        assert hits[0]["experience"]["dimension"] == 384 and "embedding" not in hits[0]
        full = await client.post("/v1/get_experience", params={"embeddings": "true"},
                                 json={"experience_id": a})  # fmt: skip
        assert len(full.json()["embedding"]) == 384
        assert full.json()["experience_type"] == {"kind": "Solution", "approach": "retry",
                                                  "worked": True}  # fmt: skip
        await call(client, "store_relation", source_id=a, target_id=b, relation_type="Supports")
        assert await call(client, "reinforce_experience", experience_id=a) == 1
        context = await call(client, "get_context_candidates", collective_id=team,
                             text="nats", recent=1)  # fmt: skip
        assert len(context["relations"]) == 1 and len(context["recent"]) == 1
        await call(client, "update_experience", experience_id=b, importance=0.1)
        stats = await call(client, "get_collective_stats", collective_id=team)
        assert (stats["experiences"], stats["relations"], stats["applications"]) == (2, 1, 1)


@pytest.mark.parametrize(
    ("method", "body", "status", "message"),
    [
        ("create_collective", {"owner_id": "", "name": "x", "embedding_dimension": 3}, 422,
         "owner_id: String should have at least 1 character (got '')"),
        ("create_collective", {"owner_id": "o", "name": "x", "embedding_dimension": 5000}, 422,
         "embedding_dimension: Input should be less than or equal to 4096 (got 5000)"),
        ("record_experience", {"collective_id": "01900000-0000-7000-8000-000000000000",
                               "content": "x", "importance": 1.5}, 422,
         "importance: Input should be less than or equal to 1 (got 1.5)"),
        ("record_experience", {"collective_id": "01900000-0000-7000-8000-000000000000",
                               "content": "x", "embedding": [1, 0, 0]}, 404,
         "collective_id: no collective 01900000-0000-7000-8000-000000000000"),
        ("update_experience", {"experience_id": "01900000-0000-7000-8000-000000000000",
                               "content": "new"}, 422,
         "content: is immutable once recorded"),
        ("store_relation", {"source_id": "01900000-0000-7000-8000-000000000000",
                            "target_id": "01900000-0000-7000-8000-000000000000",
                            "relation_type": "Supports"}, 422,
         "target_id: must differ from source_id"),
        ("sql", {"query": "DELETE FROM experience_rows"}, 422,
         "query: only read-only queries are allowed (SELECT, EXPLAIN), got DELETE"),
        ("get_experience", {"experience_id": "nope"}, 422, "experience_id: Input should be a "
         "valid UUID"),
        ("get_experience", {"experience_id": "01900000-0000-7000-8000-000000000000",
                            "colour": "red"}, 422, "colour: is not a field of this input"),
        # a getter's "there is none" is a 404 (as for one the caller may not see)
        ("get_experience", {"experience_id": "01900000-0000-7000-8000-000000000000"}, 404,
         "experience_id: none with that id"),
    ],
)  # fmt: skip
async def test_bad_requests_get_the_library_messages(
    shared_service: Service, method: str, body: dict[str, Any], status: int, message: str
) -> None:
    async with shared_service.client() as client:
        before = await call(client, "digest")
        response = await client.post(f"/v1/{method}", json=body)
        assert response.status_code == status, response.text
        error = response.json()
        assert error["message"].startswith(message), error
        assert error["error"] in ("ValidationError", "NotFoundError")
        assert await call(client, "digest") == before


async def test_a_body_that_is_not_json_is_named(shared_service: Service) -> None:
    async with shared_service.client() as client:
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        response = await client.post("/v1/list_collectives", content=b"owner=me", headers=form)
        assert response.status_code == 415
        assert response.json() == {
            "error": "UnsupportedMediaType",
            "message": "body: must be JSON with Content-Type: application/json, got "
            "'application/x-www-form-urlencoded'",
        }
        broken = await client.post("/v1/list_collectives", content=b'{"owner_id": ',
                                   headers={"Content-Type": "application/json"})  # fmt: skip
        assert broken.status_code == 422
        assert broken.json()["message"].startswith("body: not valid JSON (")


async def test_a_host_name_is_no_credential(shared_service: Service) -> None:
    """Loopback, or a Host name of it, lets nobody in: the credential does."""
    service = shared_service
    async with service.client() as client, httpx.AsyncClient(base_url=service.url) as anonymous:
        for name in ("localhost:8765", "[::1]:8765", "127.0.0.1", "attacker.example"):
            allowed = await client.post("/v1/list_collectives", json={}, headers={"Host": name})
            assert allowed.status_code == 200, name
            refused = await anonymous.post("/v1/list_collectives", json={}, headers={"Host": name})
            assert refused.status_code == 401, name


async def test_a_conflict_is_409(shared_service: Service) -> None:
    async with shared_service.client() as client:
        team = await call(client, "create_collective", owner_id="o", name="t",
                          embedding_dimension=2)  # fmt: skip
        a = await call(client, "record_experience", collective_id=team, content="a",
                       embedding=[1, 0])  # fmt: skip
        b = await call(client, "record_experience", collective_id=team, content="b",
                       embedding=[0, 1])  # fmt: skip
        await call(client, "store_relation", source_id=a, target_id=b, relation_type="Implies")
        again = await client.post("/v1/store_relation", json={
            "source_id": a, "target_id": b, "relation_type": "Implies"})  # fmt: skip
        assert again.status_code == 409 and again.json()["error"] == "ConflictError"


async def test_watch_streams_changes_as_server_sent_events(shared_service: Service) -> None:
    service = shared_service  # (another test's writes may still be applied: seen is this one's)
    async with service.client() as client, client.stream("GET", "/v1/watch_experiences") as sse:
        assert sse.headers["content-type"].startswith("text/event-stream")
        lines = sse.aiter_lines()
        assert await anext(lines) == ": watching"  # registered from here on
        team = await call(client, "create_collective", owner_id="o", name="t",
                          embedding_dimension=2)  # fmt: skip
        eid = await call(client, "record_experience", collective_id=team, content="seen",
                         embedding=[1, 0])  # fmt: skip
        await call(client, "archive_experience", experience_id=eid)
        seen = []
        async for line in lines:
            if line.startswith("data: "):
                change = json.loads(line[6:])
                if isinstance(change, dict) and change.get("experience_id") != eid:
                    continue
                seen.append(change)
                if len(seen) == 2:
                    break
        assert [(c["kind"], c["experience_id"]) for c in seen] == [
            ("created", eid), ("archived", eid)]  # fmt: skip


async def test_health_and_metrics(service: Service) -> None:
    async with service.client() as client:
        team = await call(client, "create_collective", owner_id="o", name="t",
                          embedding_dimension=2)  # fmt: skip
        await call(client, "record_experience", collective_id=team, content="x", embedding=[1, 0])
        health = (await client.get("/health")).json()
        assert health["status"] == "ok" and health["nats_connected"] is True
        assert health["stream_seq"] == health["applied_seq"] == 2 and health["lag"] == 0
        text = (await client.get("/metrics")).text
    assert re.search(
        r'^pulse_http_requests_total\{method="POST",route="/v1/record_experience",'
        r'status="200"\} 1\.0$',
        text,
        re.M,
    )  # fmt: skip (labels in prometheus_client's order)
    assert re.search(
        r'^pulse_http_request_duration_seconds_count\{route="/v1/create_collective"\} 1\.0$',
        text, re.M)  # fmt: skip
    assert re.search(r"^pulse_events_applied_total [2-9]", text, re.M)
    assert re.search(r"^pulse_replication_lag_events 0\.0$", text, re.M)
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    assert names == {
        "pulse_http_requests_total",
        "pulse_http_request_duration_seconds_bucket",
        "pulse_http_request_duration_seconds_count",
        "pulse_http_request_duration_seconds_sum",
        "pulse_events_applied_total",
        "pulse_applied_sequence",
        "pulse_stream_sequence",
        "pulse_replication_lag_events",
    }  # fmt: skip (the names the service always had: no `_created` series)


async def test_health_reports_a_lost_nats(tmp_path: Path) -> None:
    from eventlog import EmbeddedNats

    with EmbeddedNats(tmp_path / "nats") as nats:
        running = start(tmp_path / "data", env=_env())
        try:
            async with running.client() as client:
                assert (await client.get("/health")).json()["status"] == "ok"
        finally:
            stop(running)
        # the same through an external server that then goes away
        env = _env(PULSE_NATS_URL=nats.url)
        running = start(tmp_path / "data2", env=env)
    try:
        async with running.client() as client:

            async def degraded() -> bool:
                response = await client.get("/health")
                return response.status_code == 503 and not response.json()["nats_connected"]

            await eventually(degraded, timeout=30, what="health reporting NATS down")
    finally:
        stop(running)


def test_a_token_guards_every_request(tmp_path: Path) -> None:
    running = start(tmp_path / "data", "--token", "s3cret")
    try:
        assert running.token == "s3cret"  # --token chose the operator secret's value
        with httpx.Client(base_url=running.url, timeout=30) as client:
            denied = client.post("/v1/list_collectives", json={})
            assert denied.status_code == 401
            assert denied.headers["www-authenticate"] == "Bearer"
            wrong = client.post("/v1/list_collectives", json={},
                                headers={"Authorization": "Bearer nope"})  # fmt: skip
            assert wrong.status_code == 401
            assert client.get("/metrics").status_code == 401
            assert client.get("/health").status_code == 200  # for load balancers
            allowed = client.post("/v1/list_collectives", json={},
                                  headers={"Authorization": "Bearer s3cret"})  # fmt: skip
            assert allowed.status_code == 200 and allowed.json() == {"items": [], "next": None}
        # the CLI reads the secret from the data directory; $PULSE_TOKEN, when set, wins
        for env, code in ((_env(), 0), (_env(PULSE_TOKEN="s3cret"), 0), (_env(PULSE_TOKEN="x"), 1)):
            result = subprocess.run(
                [PULSE, "--data-dir", str(tmp_path / "data"), "collective", "list"],
                capture_output=True, text=True, timeout=60, env=env,
            )  # fmt: skip
            assert result.returncode == code, result.stderr
        assert result.stderr.strip().startswith(
            "pulse: error: the Pulse service at 127.0.0.1 refused the request (token: not a "
            "Pulse token"
        ), result.stderr
    finally:
        stop(running)


def test_serving_beyond_loopback_wants_a_credential_as_everywhere(tmp_path: Path) -> None:
    running = start(tmp_path / "data", "--host", "0.0.0.0")
    try:
        assert running.token and running.token.startswith("pulse-operator-")
        with httpx.Client(base_url=running.url, timeout=30) as client:
            assert client.post("/v1/list_collectives", json={}).status_code == 401
            allowed = client.post("/v1/list_collectives", json={},
                                  headers={"Authorization": f"Bearer {running.token}"})  # fmt: skip
            assert allowed.status_code == 200
    finally:
        stop(running)


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [PULSE, "--data-dir", str(tmp_path / "data"), "up", "--port", str(port)],
            capture_output=True, text=True, timeout=60, env=_env(),
        )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"pulse: error: port: cannot listen on 127.0.0.1:{port} (in use? try --port)"
    )
    assert not (tmp_path / "data" / "service.json").exists()


def test_sql_and_the_cli_go_through_the_running_service(shared_service: Service) -> None:
    service = shared_service  # (a collective named as no other test names one)

    def pulse(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PULSE, "--data-dir", str(service.data_dir), *args],
                              capture_output=True, text=True, timeout=60, env=_env())  # fmt: skip

    made = pulse("collective", "create", "cli-team", "--owner", "o", "--embedder", "hash")
    assert made.returncode == 0
    assert pulse("record", "-c", "cli-team", "while serving").returncode == 0
    started = pulse("activity", "start", "bot-1", "-c", "cli-team", "--task", "analysing")
    assert started.returncode == 0
    result = pulse("sql", "SELECT e.content, a.agent_id FROM experiences e, activities a, "
                   "collectives c WHERE c.name = 'cli-team' AND e.collective_id = c.collective_id "
                   "AND a.collective_id = c.collective_id", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"content": "while serving", "agent_id": "bot-1"}]
    refused = pulse("sql", "UPDATE experience_rows SET content = 'x'")
    assert refused.returncode == 1
    assert "query: only read-only queries are allowed (SELECT, EXPLAIN), got UPDATE" in (
        refused.stderr)  # fmt: skip
    assert pulse("export", "out").stderr.startswith("pulse: error: export: `pulse up` serves")


async def test_rebuild_refuses_while_the_service_runs_and_leaves_its_state(
    shared_service: Service,
) -> None:
    service = shared_service  # (it reads back only what it recorded)
    async with service.client() as client:
        team = await call(client, "create_collective", owner_id="ana", name="team",
                          embedder="hash")  # fmt: skip
        recorded = await call(client, "record_experience", collective_id=team,
                              content="rebuild only a stopped instance")  # fmt: skip
    state = (service.data_dir / "state").resolve()

    def files() -> set[str]:  # DuckDB's write-ahead log comes and goes as the service writes,
        # and so does the analysts' snapshot being refreshed (projections.snapshot: .tmp)
        return {p.name for p in state.iterdir() if not p.name.endswith((".wal", ".tmp"))}

    before = files()

    refused = subprocess.run(
        [PULSE, "--data-dir", str(service.data_dir), "rebuild"],
        capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"pulse: error: rebuild: `pulse up` serves this data directory "
        f"(pid {service.process.pid}, {service.url}) and holds its state; stop it first "
        "(Ctrl-C on pulse up), then run pulse rebuild"
    )
    assert refused.stdout == ""
    # the state is untouched: the same directory, its files, no fresh one beside it
    assert (service.data_dir / "state").resolve() == state
    assert files() == before and "state.duckdb" in before
    assert sorted(service.data_dir.glob("state-*")) == [state]
    # and the service still serves what was recorded
    assert service.process.poll() is None
    async with service.client() as client:
        assert (await client.get("/health")).status_code == 200
        got = await call(client, "get_experience", experience_id=recorded)
        assert got["content"] == "rebuild only a stopped instance"
        rows = await call(client, "sql", query="SELECT content FROM experiences "
                          f"WHERE collective_id = '{team}'")  # fmt: skip
        assert rows["rows"] == [["rebuild only a stopped instance"]]


# -- MCP ----------------------------------------------------------------------------------------


async def _remember_and_recall(session: ClientSession) -> None:
    await session.initialize()
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == {
        "remember", "recall", "reinforce", "relate", "invalidate", "insights", "activity",
        "session",
    }  # fmt: skip
    remember = tools["remember"].inputSchema["properties"]
    assert remember["content"]["maxLength"] == 100 * 1024
    assert remember["importance"]["maximum"] == 1.0
    assert remember["visibility"]["enum"] == ["private", "team", "org"]
    done = await session.call_tool("remember", {
        "collective": "team", "content": "agents share memory through pulse",
        "importance": 0.9, "kind": "Fact", "details": {"statement": "s", "source": "docs"},
        "visibility": "org",
    })  # fmt: skip
    assert not done.isError, done.content
    eid = json.loads(done.content[0].text)["experience_id"]  # type: ignore[union-attr]
    found = await session.call_tool("recall", {"collective": "team", "query": "shared memory"})
    hits = json.loads(found.content[0].text)["results"]  # type: ignore[union-attr]
    assert hits[0]["experience"]["experience_id"] == eid
    assert hits[0]["experience"]["visibility"] == "org"
    reinforced = await session.call_tool("reinforce", {"experience_id": eid})
    assert json.loads(reinforced.content[0].text)["applications"] == 1  # type: ignore[union-attr]
    await session.call_tool("activity", {"collective": "team", "action": "register",
                                         "agent": "claude", "task": "testing"})  # fmt: skip
    who = await session.call_tool("activity", {"collective": "team", "action": "active"})
    agents = json.loads(who.content[0].text)["agents"]  # type: ignore[union-attr]
    assert [a["agent_id"] for a in agents] == ["claude"]
    context = await session.call_tool("recall", {"collective": "team", "query": "memory",
                                                 "mode": "context"})  # fmt: skip
    parts = json.loads(context.content[0].text)  # type: ignore[union-attr]
    assert parts["similar"][0]["experience"]["experience_id"] == eid
    assert [a["agent_id"] for a in parts["active_agents"]] == ["claude"]
    refused = await session.call_tool("remember", {"collective": "team", "content": "x",
                                                   "importance": 2})  # fmt: skip
    assert refused.isError and "importance" in refused.content[0].text  # type: ignore[union-attr]
    missing = await session.call_tool("remember", {"collective": "nowhere", "content": "x"})
    assert missing.isError  # Pulse's errors are named by their kind
    assert "NotFoundError: collective: no collective named 'nowhere'" in (
        missing.content[0].text)  # type: ignore[union-attr]  # fmt: skip


@pytest.fixture
def reporting_imports(tmp_path: Path) -> Iterator[Service]:
    """`pulse up` with Python naming each module it imports on stderr (-X importtime)."""
    running = start(tmp_path / "data", env=_env(PYTHONPROFILEIMPORTTIME="1"))
    yield running
    if running.process.poll() is None:
        stop(running)


async def test_mcp_over_streamable_http(reporting_imports: Service) -> None:
    # `pulse up` imports the MCP SDK at the first request to /mcp, not at its start
    service = reporting_imports

    def imported(module: str) -> bool:  # ("import time: self | cumulative | name")
        return any(line.rsplit("|", 1)[-1].strip() == module for line in list(service.logged))

    # (ops.service is imported after the MCP server would be: once it is read, so is that)
    await eventually(lambda: imported("ops.service"), timeout=30, what="the start's imports")
    assert not imported("mcp.server.fastmcp") and not imported("ops.mcp_server")
    async with service.client() as client:
        await call(client, "create_collective", owner_id="o", name="team", embedder="hash")
    assert not imported("mcp.server.fastmcp")
    async with (
        service.mcp_client() as http,
        streamable_http_client(f"{service.url}/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await _remember_and_recall(session)
    for _ in range(3):  # clients that come and go, as agents do
        async with (
            service.mcp_client() as http,
            streamable_http_client(f"{service.url}/mcp", http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert (await session.list_tools()).tools
    # (the SDK's modules, imported by ops.mcp_server's import statements: Python does not
    # report a module importlib.import_module loads, as LazyMcp loads ops.mcp_server)
    await eventually(lambda: imported("mcp.server.fastmcp"), what="the MCP SDK's import")
    stop(service)
    # A client closing its session is no error: the server's log stays free of tracebacks
    # (the MCP SDK logs one per disconnect; a log that grows per client fills a disk, or a
    # pipe nobody reads, which once hung a whole server under test).
    assert "Traceback" not in "".join(service.logged), "".join(service.logged)[-2000:]


async def test_mcp_over_stdio_with_and_without_a_running_service(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    subprocess.run(
        [PULSE, "--data-dir", str(data_dir), "collective", "create", "team", "--owner", "o",
         "--embedder", "hash"], check=True, capture_output=True, env=_env(), timeout=60,
    )  # fmt: skip
    params = StdioServerParameters(command=PULSE, args=["--data-dir", str(data_dir), "mcp"],
                                   env=_env())  # fmt: skip
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await _remember_and_recall(session)  # its own instance: nothing is running

    running = start(data_dir)
    try:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            found = await session.call_tool("recall", {"collective": "team", "query": "pulse"})
            assert "agents share memory" in found.content[0].text  # type: ignore[union-attr]
        async with running.client() as client:  # what the tools wrote, the service holds
            stats = await call(client, "list_collectives")
            assert [c["name"] for c in stats["items"]] == ["team"]
    finally:
        stop(running)


# -- the answers' encoding and the fast way to a route ------------------------------------------

ODD_TEXT = 'naïve "quoted" \\ back\nslash \t tab \x01 \x7f \u2028 \U0001f600 中文'


async def _filled(client: httpx.AsyncClient) -> tuple[str, str]:
    team = await call(client, "create_collective", owner_id="ana", name="team",
                      embedder="hash")  # fmt: skip
    first = await call(client, "record_experience", collective_id=team, content=ODD_TEXT,
                       domain=["nats", "ünï"], importance=0.123456789,
                       experience_type={"kind": "Solution", "approach": "retry",
                                        "worked": True})  # fmt: skip
    second = await call(client, "record_experience", collective_id=team,
                        content="NATS timeouts came from slow fsync", confidence=1e-7,
                        valid_from="2026-11-30T09:00:00Z")  # fmt: skip
    await call(client, "store_relation", source_id=first, target_id=second,
               relation_type="Supports", metadata=ODD_TEXT)  # fmt: skip
    await call(client, "store_insight", collective_id=team, content="fsync is slow",
               source_experiences=[first, second])  # fmt: skip
    return team, first


OPERATOR = {"Authorization": "Bearer s3cret"}


@contextlib.asynccontextmanager
async def _in_memory(tmp_path: Path) -> AsyncIterator[tuple[PulseDB, httpx.AsyncClient, Any]]:
    """An instance on a memory log, its app, and a client of the app (no server)."""
    db = await PulseDB.attach(tmp_path / "data", MemoryLog())
    app = create_app(db, secret="s3cret")
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", headers=OPERATOR
        ) as client:
            yield db, client, app
    finally:
        await db.close()


async def test_answers_are_the_json_the_builtins_made(tmp_path: Path) -> None:
    """``json_bytes`` (msgspec, one pass) writes the JSON ``to_json`` + Starlette's
    JSONResponse (json.dumps) wrote, for results of every shape: the same keys in the same
    order, the same values, no spaces; a float is the same shortest digits, only its
    exponent spelt as msgspec does (1e-7 and 0.00001, where json.dumps wrote 1e-07 and
    1e-05)."""
    async with _in_memory(tmp_path) as (db, client, _):
        team, first = await _filled(client)
        cid, eid = UUID(team), UUID(first)
        results: list[Any] = [
            await db.get_experience(eid),
            await db.search_hybrid(cid, "nats fsync", k=5),
            await db.search_similar(cid, "nats", k=5, embedder="hash"),
            await db.get_context_candidates(ContextIn(collective_id=cid, text="nats")),
            await db.get_related_experiences(eid),
            await db.get_insights(cid, "fsync"),
            await db.get_collective_stats(cid),
            {"items": await db.list_collectives(), "next": None},
            {"a": b"\x00\x00\x80?", "b": [1, 2.5, None, True], "nested": {"c": b""}},
            [],
            None,
            0.1,
            1e-7,
            1e22,
            3,
            "x",
            [0.1 + 0.2, 1 / 3, 5e-324, 1.7976931348623157e308],
        ]
        for result in results:
            for embeddings in (False, True):
                old = JSONResponse(to_json(result, embeddings=embeddings)).body
                written = json_bytes(result, embeddings=embeddings)
                assert _pairs(written) == _pairs(old), (result, embeddings)
                assert re.sub(rb"e[-+]?\d+", b"", written).count(b".") == re.sub(
                    rb"e[-+]?\d+", b"", old
                ).count(b".")  # (whole floats stay written with their ".0")
        assert (
            json_bytes([0.5, 1e-7, 1e22, ODD_TEXT, None])
            == (
                '[0.5,1e-7,1e22,"' + json.dumps(ODD_TEXT, ensure_ascii=False)[1:-1] + '",null]'
            ).encode()
        )


def _steady(written: bytes) -> Any:
    """An answer without what changes from one moment to the next (a hit's energy decays
    with time, and its score with it)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("score", "energy")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(written)) if written.startswith((b"{", b"[")) else written


def _pairs(written: bytes) -> Any:
    """JSON with every object as its list of (key, value) pairs, in order."""
    return json.loads(written, object_pairs_hook=list)


async def test_the_fast_way_answers_as_the_routes_do(tmp_path: Path) -> None:
    """``POST /v1/<name>`` takes the fast way (``ops.http.api.Direct``: the router never
    sees it) with the two plain options, and any other query goes to the route, which
    answers the same (or refuses what is bad, as it always did)."""
    async with _in_memory(tmp_path) as (_, client, app):
        team, first = await _filled(client)
        routed: list[bool] = []

        async def watched(scope: Any, receive: Any, send: Any) -> None:
            await app(scope, receive, send)
            routed.append("endpoint" in scope)  # (the router's mark on a request it routed)

        transport = httpx.ASGITransport(app=watched)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", headers=OPERATOR
        ) as watching:
            calls = [
                ("search_hybrid", {"collective_id": team, "text": "nats", "k": 3}),
                ("get_experience", {"experience_id": first}),
                ("get_experience", {"experience_id": "01900000-0000-7000-8000-000000000000"}),
                ("get_context_candidates", {"collective_id": team, "text": "nats"}),
                ("list_collectives", {}),
                ("record_experience", {"collective_id": team, "content": "x", "importance": 2}),
                ("get_experience", {"experience_id": first, "colour": "red"}),
            ]
            for method, body in calls:
                for query in ("", "?embeddings=true", "?format=msgspec",
                              "?format=json&embeddings=false"):  # fmt: skip
                    routed.clear()
                    fast = await watching.post(f"/v1/{method}{query}", json=body)
                    assert routed == [False], (method, query)
                    other = "&x=1" if query else "?x=1"  # (a parameter the routes ignore)
                    slow = await watching.post(f"/v1/{method}{query}{other}", json=body)
                    assert routed == [False, True], (method, query)
                    assert fast.status_code == slow.status_code, (method, query)
                    assert _steady(fast.content) == _steady(slow.content), (method, query)
                    assert fast.headers["content-type"] == slow.headers["content-type"]
            # what only the routes read: other spellings, and what they refuse
            plain = await watching.post("/v1/get_experience", json={"experience_id": first})
            spelled = await watching.post("/v1/get_experience?embeddings=0",
                                          json={"experience_id": first})  # fmt: skip
            assert spelled.content == plain.content and routed[-1]
            bad = await watching.post("/v1/get_experience?format=xml",
                                      json={"experience_id": first})  # fmt: skip
            assert bad.status_code == 422 and routed[-1]
            assert bad.json()["message"].startswith("format: Input should be 'json' or 'msgspec'")
            assert (await watching.get("/v1/get_experience")).status_code == 405

"""The API is declared once (``sync.api.OPERATIONS``): PulseDB's public API, the HTTP
routes and the remote client's methods are exactly the declared operations, each
summary is one whole sentence, and every request body is one flat object."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from eventlog import MemoryLog
from ops.remote import RemotePulseDB, describe_api
from ops.service import create_app
from sync.api import OPERATIONS
from sync.instance import Delegate, PulseDB
from tests.harness import eventually

# what opens, closes and copies out an instance, and what /health asks: the facade's own,
# on no surface of the API
LIFECYCLE = {"open", "attach", "close", "export", "last_seq"}


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[PulseDB]:
    instance = await PulseDB.attach(tmp_path / "data", MemoryLog())
    yield instance
    await instance.close()


def test_the_declaration_is_pulsedbs_public_api() -> None:
    public = {
        name
        for name, member in inspect.getmembers(PulseDB, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }
    assert public - LIFECYCLE == set(OPERATIONS)
    # every operation is a delegate to the service implementing it, and nothing else is
    delegates = {name for name, value in vars(PulseDB).items() if isinstance(value, Delegate)}
    assert delegates == set(OPERATIONS)
    for name, operation in OPERATIONS.items():
        assert operation.name == name
        method = getattr(PulseDB, name)
        assert method is vars(PulseDB)[name].method  # (the implementation itself)
        assert operation.idempotent == ("idempotency_key" in inspect.signature(method).parameters)
        assert operation.returns == typing.get_type_hints(method)["return"]


async def test_a_delegate_is_its_services_method(db: PulseDB) -> None:
    """On an instance, an operation is the bound method of its service: the same
    signature (without self), annotations and docstring."""
    bound = db.record_experience
    assert bound.__self__ is db.experiences  # type: ignore[attr-defined]
    assert inspect.signature(bound) == inspect.signature(db.experiences.record_experience)
    assert bound.__doc__ == PulseDB.record_experience.__doc__
    assert typing.get_type_hints(bound) == typing.get_type_hints(PulseDB.record_experience)


async def test_the_routes_and_the_remote_client_are_the_declaration(db: PulseDB) -> None:
    app = create_app(db, secret="s3cret")
    # (the routes as the app's schema lists them: FastAPI keeps a router's routes in it)
    routes = {
        path.removeprefix("/v1/")
        for path, item in app.openapi()["paths"].items()
        if path.startswith("/v1/") and "post" in item
    }
    assert routes == set(OPERATIONS)
    assert list(describe_api()) == list(OPERATIONS)
    remote = RemotePulseDB("http://127.0.0.1:9", "token")
    for name in OPERATIONS:
        assert callable(getattr(remote, name))
    for name in LIFECYCLE - {"close"}:  # (close is the client's own: its connections)
        with pytest.raises(AttributeError):
            getattr(remote, name)
    with pytest.raises(AttributeError):
        remote.not_an_operation  # noqa: B018


def test_every_summary_is_one_whole_sentence() -> None:
    for name, operation in OPERATIONS.items():
        summary = operation.summary
        assert re.fullmatch(r"[A-Z][^\n]*[^.]\.", summary), (name, summary)
        # one sentence: no full stop followed by another sentence
        assert not re.search(r"\.\s+[A-Z]", summary), (name, summary)
        assert operation.description, name


def test_every_request_body_is_one_flat_object() -> None:
    for name, operation in OPERATIONS.items():
        schema = operation.request.model_json_schema()
        assert schema["type"] == "object", name
        assert set(schema.get("properties", {})) == set(operation.request.model_fields), name
        for combined in ("anyOf", "oneOf", "allOf"):  # only "at least one of these"
            for branch in schema.get(combined, []):
                assert set(branch) <= {"required", "properties"}, (name, branch)
                assert set(branch.get("properties", {})) <= set(branch["required"]), name
    collective = OPERATIONS["create_collective"].request.model_json_schema()
    assert "anyOf" not in collective
    assert {"owner_id", "name"} <= set(collective["required"])


def test_the_scopes_are_the_rules() -> None:
    """Writes need a write token; reads write nothing; tokens, status, digest, dead
    letters and deleting a collective are the admins'."""
    for name, operation in OPERATIONS.items():
        if operation.idempotent:
            assert operation.writes and operation.scope != "read", name
        if operation.scope == "read":
            assert not operation.writes, name
    admins = {n for n, o in OPERATIONS.items() if o.scope == "admin"}
    assert {"create_token", "list_tokens", "revoke_token", "status", "digest"} <= admins
    assert {"dead_letters", "delete_collective", "compact", "rotate_keys"} <= admins


async def test_health_and_the_log_head_answer_without_the_engine_or_the_log(db: PulseDB) -> None:
    """What /health and /metrics ask of an instance, through its facade."""
    team = await db.create_collective("ana", "team", embedder="hash")
    await db.record_experience(team, "health is the facade's")
    health = db.health()
    assert health.replicating and health.failure is None and health.nats_connected
    assert health.applied_seq == db.applied_seq == await db.last_seq() > 0
    assert health.instance_id == db.instance_id


def _bare(schema: dict[str, typing.Any]) -> dict[str, typing.Any]:
    """A JSON schema without its prose (titles, descriptions)."""
    return {k: v for k, v in schema.items() if k not in ("title", "description", "default")}


@pytest.mark.parametrize(
    ("parameter", "operation"), [("k", "search_similar"), ("idempotency_key", "record_experience")]
)
def test_mcp_tools_take_a_parameter_as_the_declaration_states_it(
    parameter: str, operation: str
) -> None:
    import pydantic

    from ops.mcp_server import TOOLS

    declared = _bare(OPERATIONS[operation].request.model_json_schema()["properties"][parameter])
    tools = 0
    for tool in TOOLS:
        hints = typing.get_type_hints(tool, include_extras=True)
        if parameter in hints:
            taken = _bare(pydantic.TypeAdapter(hints[parameter]).json_schema())
            assert taken == declared, f"{tool.__name__}({parameter})"
            tools += 1
    assert tools >= 2


async def test_health_says_why_duckdb_refuses_the_states_writes(db: PulseDB) -> None:
    """A DuckDB that refuses the state's writes stops nothing (the engine keeps what it
    could not write, the log holds it): /health tells the admins why, until it passes."""
    import httpx

    team = await db.create_collective("ana", "team", embedder="hash")
    assert db.health().duckdb_writer_error is None

    def hold(p: typing.Any) -> typing.Any:  # an uncommitted change of the checkpoint row
        holder = p.store.con.cursor()  # conflicts with every write of the state
        holder.begin()
        holder.execute("UPDATE checkpoint SET applied = applied + 1 WHERE id = 1")
        return holder

    await db.engine.run(lambda p: p.flush())  # (the checkpoint row is there to hold)
    holder = await db.engine.run(hold)
    try:
        await db.record_experience(team, "written while DuckDB refuses")  # (not refused)
        await eventually(lambda: db.health().duckdb_writer_error is not None,
                         what="the refused write in /health")  # fmt: skip
        assert "Conflict" in (db.health().duckdb_writer_error or "")
        app = create_app(db, secret="s3cret")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            answer = await c.get("/health", headers={"Authorization": "Bearer s3cret"})
        assert answer.json()["duckdb_writer_error"] == db.health().duckdb_writer_error
    finally:
        await db.engine.run(lambda _: holder.rollback())
    await eventually(lambda: db.health().duckdb_writer_error is None,
                     what="the write passing once DuckDB takes it")  # fmt: skip
    counted = await db.sql("SELECT count(*) AS n FROM experiences")  # (all of it written)
    assert [list(row) for row in counted.rows] == [[1]]

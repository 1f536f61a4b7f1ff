"""Sessions (issue 14, point 3): an agent's working state in a collective, on every host
and every surface.

The whole life of sessions through the Python API; two hosts updating different fields
of one session at the same moment and converging to the same session and digest; the
real fold folding any order of session events, with any duplicates, to the same row
(and each field to its last write); bad input refused with the field and the limit,
the state untouched, and a session event out of range on the log a dead letter; and
sessions through HTTP (``RemotePulseDB``, as the CLI uses it), MCP and the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from eventlog import EmbeddedNats
from eventlog import events as ev
from eventlog.errors import ConflictError, Forbidden, NotFoundError, ValidationError
from eventlog.ids import uuid7
from ops import cli
from ops.operator_secret import ensure_secret
from ops.remote import RemotePulseDB
from projections import fold, queries
from sync import PulseDB
from sync.access import Principal
from sync.sessions import ResumedSession
from tests.harness import IN_PROCESS_SECRET, eventually, in_process
from tests.histories import common, redeliveries

# -- 1. the life of sessions, through the Python API -----------------------------------------


@contextlib.asynccontextmanager
async def instance(root: Path, name: str, server: EmbeddedNats) -> AsyncIterator[PulseDB]:
    db = await PulseDB.open(root / name, server.url)
    try:
        yield db
    finally:
        await db.close()


async def test_a_session_from_its_start_to_its_end(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    async with instance(tmp_path, "a", nats_server) as db:
        team = await db.create_collective("me", "team", embedder="hash")
        await db.record_experience(team, "retry NATS publishes with the same message id")
        await db.record_experience(team, "DuckDB allows one writer process per file")
        assert await db.resume_session(team, "agent-7") is None  # nothing to resume yet

        started = await db.start_session(team, "agent-7", "harden the NATS publisher")
        assert (started.agent_id, started.summary, started.ended) == (
            "agent-7",
            "harden the NATS publisher",
            False,
        )
        assert started.todo == () and started.changes == () and started.author_owner == "local"
        assert await db.get_session(started.session_id) == started

        updated = await db.update_session(
            started.session_id,
            todo=[
                {"task": "retry on timeout", "priority": "high"},
                ev.TodoItem(task="dedup by message id", note="JetStream does", done=True),
            ],
            bugs=["acks lost on failover"],
        )
        assert [(t.task, t.priority, t.note, t.done) for t in updated.todo] == [
            ("retry on timeout", "high", "", False),
            ("dedup by message id", "medium", "JetStream does", True),
        ]
        assert updated.bugs == ("acks lost on failover",)
        assert updated.summary == started.summary  # a field not given stays
        assert updated.updated_ms >= started.updated_ms

        resumed = await db.resume_session(team, "agent-7", k=1)
        assert isinstance(resumed, ResumedSession) and resumed.session == updated
        assert resumed.context_by == "summary"
        assert [h.experience.content for h in resumed.context.similar] == [
            "retry NATS publishes with the same message id"
        ]

        other = await db.start_session(team, "agent-8")
        newer = await db.start_session(team, "agent-7", "the second run")
        first = await db.list_sessions(team, limit=2)  # oldest first, a page at a time
        assert [s.session_id for s in first] == [started.session_id, other.session_id]
        rest = await db.list_sessions(team, limit=2, after=first.next)
        assert [s.session_id for s in rest] == [newer.session_id] and rest.next is None
        mine = await db.list_sessions(team, agent_id="agent-7")
        assert [s.session_id for s in mine] == [started.session_id, newer.session_id]
        resumed_again = await db.resume_session(team, "agent-7")
        assert resumed_again is not None
        assert resumed_again.session.session_id == newer.session_id  # the one started last

        ended = await db.end_session(
            newer.session_id, summary="done: retries", changes=["eventlog/jetstream.py: retries"]
        )
        assert ended.ended and ended.ended_ms is not None
        assert (ended.summary, ended.changes) == (
            "done: retries",
            ("eventlog/jetstream.py: retries",),
        )
        assert await db.end_session(newer.session_id) == ended  # again: changes nothing
        with pytest.raises(ConflictError, match="has ended"):
            await db.update_session(newer.session_id, bugs=["too late"])
        resumed_last = await db.resume_session(team, "agent-7")
        assert resumed_last is not None and resumed_last.session.session_id == started.session_id
        opened = await db.list_sessions(team, open_only=True)
        assert {s.session_id for s in opened} == {started.session_id, other.session_id}

        rows = (
            await db.sql(
                "SELECT session_id, agent_id, ended, todo->>'$[0].task' AS first_task "
                "FROM sessions ORDER BY started_at, session_id"
            )
        ).rows
        assert rows == [
            [str(started.session_id), "agent-7", False, "retry on timeout"],
            [str(other.session_id), "agent-8", False, None],
            [str(newer.session_id), "agent-7", True, None],
        ]

        count = "SELECT (SELECT count(*) FROM sessions), "
        count += "(SELECT count(*) FROM audit WHERE entity = 'session')"
        with db.acting_as(Principal(owner="me", scope="read")):  # a member reads them
            assert (await db.sql(count)).rows == [[3, 6]]  # 3 starts, 2 updates, 1 end
        with db.acting_as(Principal(owner="bob", scope="read")):  # another owner: none
            assert (await db.sql(count)).rows == [[0, 0]]

        bare = await db.create_collective("me", "vectors", 2)  # no embedder: recent instead
        await db.record_experience(bare, "a vector", [1.0, 0.0])
        await db.start_session(bare, "agent-7", "a summary no one can embed here")
        by_recent = await db.resume_session(bare, "agent-7")
        assert by_recent is not None and by_recent.context_by == "recent"
        assert [e.content for e in by_recent.context.recent] == ["a vector"]

        await db.delete_collective(team)  # sessions are forgotten with their collective
        assert await db.get_session(started.session_id) is None
        kept = (
            await db.sql("SELECT count(*) FROM session_rows WHERE deleted AND summary IS NULL")
        ).rows
        assert kept == [[3]]


# -- 2. two hosts, concurrent updates to different fields ------------------------------------


async def test_two_hosts_updating_different_fields_at_once_converge(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    async with (
        instance(tmp_path, "a", nats_server) as a,
        instance(tmp_path, "b", nats_server) as b,
    ):
        team = await a.create_collective("me", "team", embedder="hash")
        session = await a.start_session(team, "agent-7", "first summary")
        await b.sync()
        assert await b.get_session(session.session_id) == session

        # neither host sees the other's update before making its own
        await asyncio.gather(
            a.update_session(session.session_id, summary="summary from host a"),
            b.update_session(
                session.session_id, todo=[{"task": "from host b"}], architecture=["one writer"]
            ),
        )
        # the same field on both hosts: one value wins, the same one on both
        await asyncio.gather(
            a.update_session(session.session_id, bugs=["bug seen on a"]),
            b.update_session(session.session_id, bugs=["bug seen on b"]),
        )
        await a.sync()
        await b.sync()
        on_a, on_b = (
            await a.get_session(session.session_id),
            await b.get_session(session.session_id),
        )
        assert on_a == on_b and on_a is not None
        assert on_a.summary == "summary from host a"
        assert [t.task for t in on_a.todo] == ["from host b"]
        assert on_a.architecture == ("one writer",)
        assert on_a.bugs in (("bug seen on a",), ("bug seen on b",))
        assert await a.digest() == await b.digest()

        await b.end_session(session.session_id)  # and the end reaches the other host

        async def ended_on_a() -> bool:
            found = await a.get_session(session.session_id)
            return found is not None and found.ended

        await eventually(ended_on_a, what="the end on host a")
        assert await a.resume_session(team, "agent-7") is None
        await a.sync()
        digest, ended = await a.digest(), await a.get_session(session.session_id)
        assert digest == await b.digest()

    async with instance(tmp_path, "a", nats_server) as again:  # read back from DuckDB
        assert await again.get_session(session.session_id) == ended
        assert await again.digest() == digest


# -- 3. the real fold: any order, any duplicates, each field its last write ------------------

SESSIONS = [UUID(int=0x5E0 + i) for i in range(2)]
PLACES = [UUID(int=0xC0), UUID(int=0xC1)]
notes = st.lists(st.sampled_from(["n1", "n2", "n3"]), max_size=2).map(tuple)
todos = st.lists(
    st.builds(
        ev.TodoItem,
        task=st.sampled_from(["t1", "t2"]),
        priority=st.sampled_from(["low", "medium", "high"]),
        done=st.booleans(),
    ),
    max_size=2,
).map(tuple)
SESSION_EVENTS = st.one_of(
    st.builds(
        lambda c, s, col, agent, summary: ev.SessionStarted(
            **c, session_id=s, collective_id=col, agent_id=agent, summary=summary
        ),
        common(),
        st.sampled_from(SESSIONS),
        st.sampled_from(PLACES),
        st.sampled_from(["a1", "a2"]),
        st.sampled_from(["", "s1", "s2"]),
    ),
    st.builds(
        lambda c, s, col, summary, todo, changes, bugs, arch: ev.SessionUpdated(
            **c,
            session_id=s,
            collective_id=col,
            summary=summary,
            todo=todo,
            changes=changes,
            bugs=bugs,
            architecture=arch,
        ),  # fmt: skip
        common(),
        st.sampled_from(SESSIONS),
        st.sampled_from(PLACES),
        st.none() | st.sampled_from(["u1", "u2"]),
        st.none() | todos,
        st.none() | notes,
        st.none() | notes,
        st.none() | notes,
    ),
    st.builds(
        lambda c, s, col: ev.SessionEnded(**c, session_id=s, collective_id=col),
        common(),
        st.sampled_from(SESSIONS),
        st.sampled_from(PLACES),
    ),
    st.builds(
        lambda c, s, col: ev.SessionDeleted(**c, session_id=s, collective_id=col),
        common(),
        st.sampled_from(SESSIONS),
        st.sampled_from(PLACES),
    ),
)


def folded(events: list[ev.Event]) -> dict[tuple[Any, ...], fold.Row]:
    state = fold.FoldState()
    for event in events:
        state.apply(event)
    return state.rows[fold.SessionRow]


@given(st.data())
def test_any_order_with_duplicates_folds_sessions_to_the_same_rows(data: st.DataObject) -> None:
    events = data.draw(st.lists(SESSION_EVENTS, min_size=1, max_size=25))
    again = data.draw(redeliveries(events))
    assert folded(again) == folded(events)


def later(e: ev.Event) -> tuple[int, UUID, UUID]:
    return (e.hlc, e.instance_id, e.event_id)


@given(st.lists(SESSION_EVENTS, min_size=1, max_size=25))
def test_each_field_of_a_session_is_its_last_write(events: list[ev.Event]) -> None:
    """One session in one collective: every field holds the value of its latest write
    (HLC, instance, event id), written from the rule, not from the fold's helpers."""
    events = [
        msgspec.structs.replace(e, session_id=SESSIONS[0], collective_id=PLACES[0]) for e in events
    ]
    (row,) = folded(events).values()
    assert isinstance(row, fold.SessionRow)
    if any(isinstance(e, ev.SessionDeleted) for e in events):
        assert row.deleted and row.summary is None and row.create_event is None
        return
    writes: dict[str, list[tuple[ev.Event, Any]]] = {}
    for e in events:
        if isinstance(e, ev.SessionStarted):
            writes.setdefault("summary", []).append((e, e.summary))
        elif isinstance(e, ev.SessionUpdated):
            for name in ("summary", "todo", "changes", "bugs", "architecture"):
                if getattr(e, name) is not None:
                    writes.setdefault(name, []).append((e, getattr(e, name)))
        elif isinstance(e, ev.SessionEnded):
            writes.setdefault("ended", []).append((e, e.hlc))
    for name in ("summary", "todo", "changes", "bugs", "architecture", "ended"):
        last = max(writes.get(name, []), key=lambda w: later(w[0]), default=None)
        held = getattr(row, "ended_hlc" if name == "ended" else name)
        if last is None:
            assert held is None, name
        elif name == "todo":
            assert held == fold.todo_json(last[1])
        else:
            assert held == last[1], name
    starts = [e for e in events if isinstance(e, ev.SessionStarted)]
    if starts:
        first = min(starts, key=lambda e: (e.event_id, e.hlc))
        assert (row.create_event, row.agent_id) == (first.event_id, first.agent_id)


# -- 4. bad input ------------------------------------------------------------------------------

BAD_UPDATES: list[tuple[dict[str, Any], str]] = [
    ({"summary": "x" * (8 * 1024 + 1)}, "summary: must be 0 to 8,192 bytes of UTF-8"),
    ({"todo": [{"task": "t"}] * 101}, "todo: List should have at most 100 items"),
    ({"todo": [{"task": ""}]}, "todo.0.task: must be 1 byte to 1,024 bytes of UTF-8"),
    ({"todo": [{"task": "t", "priority": "urgent"}]}, "todo.0.priority: Input should be 'low'"),
    ({"todo": [{"task": "t", "note": "é" * 600}]}, "todo.0.note: must be 0 to 1,024 bytes"),
    ({"todo": [{"task": "t", "due": "soon"}]}, "todo.0.due: is not a field of this input"),
    ({"changes": ["ok", "y" * 1025]}, "changes.1: must be 1 byte to 1,024 bytes"),
    ({"bugs": ["b"] * 101}, "bugs: List should have at most 100 items"),
    ({"architecture": "one string"}, "architecture: Input should be a valid list"),
    ({}, "update: give at least one of summary, todo, changes, bugs, architecture"),
]


async def test_bad_input_names_the_field_and_the_limit_and_changes_nothing(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    async with instance(tmp_path, "a", nats_server) as db:
        team = await db.create_collective("me", "team", 3)
        session = await db.start_session(team, "agent-7", "the summary")
        before = (await db.digest(), await db.log.last_seq())

        for fields, message in BAD_UPDATES:
            with pytest.raises(ValidationError, match=_literal(message)):
                await db.update_session(session.session_id, **fields)
            if fields:  # (an end without fields is a plain end)
                with pytest.raises(ValidationError, match=_literal(message)):
                    await db.end_session(session.session_id, **fields)
        with pytest.raises(ValidationError, match="summary: must be 0 to 8,192 bytes"):
            await db.start_session(team, "agent-7", "é" * 4097)
        with pytest.raises(ValidationError, match="agent_id: String should have at most 256"):
            await db.start_session(team, "a" * 257)
        with pytest.raises(ValidationError, match="agent_id: must be 1..256 characters"):
            await db.list_sessions(team, agent_id="")
        with pytest.raises(ValidationError, match="limit: must be an integer in 1..1000"):
            await db.list_sessions(team, limit=0)
        with pytest.raises(ValidationError, match="after: not a cursor of sessions"):
            await db.list_sessions(team, after="nonsense")
        with pytest.raises(ValidationError, match="k: must be an integer in 1..1000"):
            await db.resume_session(team, "agent-7", k=0)
        with pytest.raises(NotFoundError, match="session_id: no session"):
            await db.update_session(uuid7(), summary="nowhere")
        with pytest.raises(ValidationError, match="session_id: not a UUID"):
            await db.get_session("not-a-uuid")  # type: ignore[arg-type]
        with pytest.raises(NotFoundError, match="collective_id: no collective"):
            await db.start_session(uuid7(), "agent-7")

        # a token of an agent speaks for its own sessions; a read token writes none
        bot = Principal(owner="me", agent="agent-8", scope="write")
        with db.acting_as(bot), pytest.raises(Forbidden, match="may speak for agent 'agent-8'"):
            await db.update_session(session.session_id, summary="not mine")
        with db.acting_as(bot), pytest.raises(Forbidden, match="may speak for agent 'agent-8'"):
            await db.start_session(team, "agent-7")
        with (
            db.acting_as(Principal(owner="me", scope="read")),
            pytest.raises(Forbidden, match="may only read"),
        ):
            await db.end_session(session.session_id)
        with db.acting_as(Principal(owner="bob", scope="write")):  # not a member: none
            assert await db.get_session(session.session_id) is None
            with pytest.raises(NotFoundError, match="session_id: no session"):
                await db.update_session(session.session_id, summary="bob's")
        assert (await db.digest(), await db.log.last_seq()) == before
        assert await db.get_session(session.session_id) == session

        # written past the API (a buggy host): a dead letter, never a crash
        hostile = ev.SessionUpdated(
            event_id=uuid7(), instance_id=uuid7(), hlc=ev.pack_hlc(int(time.time() * 1000)),
            session_id=session.session_id, collective_id=team, bugs=("b",) * 101,
        )  # fmt: skip
        seq = await db.log.append(hostile)
        await db.sync()
        (letter,) = [d for d in await db.dead_letters() if d.seq == seq]
        assert letter.reason == "bugs: must hold 0..100 items, got 101"
        assert letter.subject == f"pulse.c.{team}.session.{session.session_id}"
        assert await db.get_session(session.session_id) == session
        await db.update_session(session.session_id, bugs=["a real one"])  # and it goes on


def _literal(text: str) -> str:
    return re.escape(text)


# -- 5. HTTP, MCP and the CLI -------------------------------------------------------------------


async def test_sessions_over_http_mcp_and_the_cli(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PULSE_TOKEN", raising=False)
    async with instance(tmp_path, "a", nats_server) as db, in_process(db) as url:
        team = await db.create_collective("me", "team", embedder="hash")
        await db.record_experience(team, "retry NATS publishes with the same message id")

        # HTTP, through the API's Python client: the same methods, typed results
        remote = RemotePulseDB(url, IN_PROCESS_SECRET)
        try:
            started = await remote.start_session(team, "agent-7", "NATS publish retries")
            assert isinstance(started, queries.Session)
            updated = await remote.update_session(
                started.session_id, todo=[{"task": "retry", "priority": "high"}], bugs=["b1"]
            )
            assert updated == await db.get_session(started.session_id)
            page = await remote.list_sessions(team, agent_id="agent-7")
            assert [s.session_id for s in page] == [started.session_id] and page.next is None
            resumed = await remote.resume_session(team, "agent-7", k=1)
            assert isinstance(resumed, ResumedSession) and resumed.session == updated
            assert resumed.context.similar[0].experience.content.startswith("retry NATS")
            assert await remote.get_session(uuid7()) is None  # a getter's 404
            with pytest.raises(ValidationError, match="todo.0.task: must be 1 byte"):
                await remote.update_session(started.session_id, todo=[{"task": ""}])
            ended = await remote.end_session(started.session_id, changes=["retries"])
            assert ended.ended and ended.changes == ("retries",)
            assert await remote.resume_session(team, "agent-7") is None
        finally:
            await remote.close()
        operator = {"Authorization": f"Bearer {IN_PROCESS_SECRET}"}
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=operator) as client:
            refused = await client.post(
                "/v1/update_session",
                json={"session_id": str(started.session_id), "todo": [{"task": "x"}] * 101},
            )
            schema = (await client.get("/openapi.json")).json()
        assert refused.status_code == 422
        assert "todo: List should have at most 100 items" in refused.json()["message"]
        assert {"/v1/start_session", "/v1/resume_session", "/v1/list_sessions"} <= set(
            schema["paths"]
        )

        # MCP: what an agent calls at its start and at its end
        async with (
            httpx.AsyncClient(headers=operator, timeout=30) as http,
            streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _),
            ClientSession(read, write) as mcp,
        ):
            await mcp.initialize()

            async def tool(**args: Any) -> Any:
                result = await mcp.call_tool("session", args)
                text = result.content[0].text  # type: ignore[union-attr]
                if result.isError:
                    return text
                return json.loads(text)

            args = {"collective": "team", "agent": "agent-9"}
            assert await tool(action="resume", **args) == {"session": None}
            made = await tool(
                action="start", summary="write the docs", todo=[{"task": "README"}], **args
            )
            sid = made["session"]["session_id"]
            assert made["session"]["todo"][0] == {
                "task": "README", "priority": "medium", "note": "", "done": False
            }  # fmt: skip
            back = await tool(action="resume", k=1, **args)
            assert back["session"]["session_id"] == sid and back["context_by"] == "summary"
            assert "similar" in back["context"]
            noted = await tool(action="update", session_id=sid, architecture=["one writer"])
            assert noted["session"]["architecture"] == ["one writer"]
            done = await tool(action="end", session_id=sid, summary="docs written")
            assert done["session"]["ended"] is True
            got = await tool(action="get", session_id=sid)
            assert got["session"]["summary"] == "docs written"
            assert (await tool(action="update", session_id=sid, bugs=["late"])).startswith(
                "Error executing tool session: ConflictError: session_id: session"
            )
            assert "ValidationError: session_id: required to get a session" in await tool(
                action="get"
            )

        # the CLI, through the running service of its data directory
        data_dir = tmp_path / "cli"
        data_dir.mkdir()
        (data_dir / "service.json").write_text(json.dumps({"url": url, "pid": os.getpid()}))
        ensure_secret(data_dir, IN_PROCESS_SECRET)  # (what pulse up keeps there)

        async def pulse(*argv: str) -> str:
            capsys.readouterr()
            code = await asyncio.to_thread(cli.main, ["--data-dir", str(data_dir), *argv])
            out, err = capsys.readouterr()
            assert code == 0, err
            return out.strip()

        sid = await pulse("session", "start", "agent-5", "-c", "team", "--summary", "CLI run")
        UUID(sid)
        shown = await pulse("session", "update", sid, "--task", "one", "--task", "two",
                            "--bug", "flaky")  # fmt: skip
        assert "[ ] medium  one" in shown and "bugs:\n    - flaky" in shown
        listed = json.loads(await pulse("session", "list", "-c", "team", "--agent", "agent-5",
                                        "--open", "--json"))  # fmt: skip
        assert [s["session_id"] for s in listed] == [sid]
        assert [t["task"] for t in listed[0]["todo"]] == ["one", "two"]
        resumed_text = await pulse("session", "resume", "agent-5", "-c", "team")
        assert resumed_text.startswith(sid) and "context (by summary):" in resumed_text
        ended_json = json.loads(await pulse("session", "end", sid, "--change", "cli", "--json"))
        assert ended_json["ended"] is True and ended_json["changes"] == ["cli"]
        got_json = json.loads(await pulse("session", "get", sid, "--json"))
        assert got_json == ended_json

"""Pulse as LangGraph's memory (``sync.langgraph.PulseSaver``, issue 30), on real NATS
servers: the maintainers' conformance suite for checkpointers, every capability; a real
graph (deterministic nodes, no language model) that is interrupted on one host and
resumed on another of the same deployment; and the sync API ``graph.invoke`` uses."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any, TypedDict
from uuid import UUID, uuid4

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from eventlog import EmbeddedNats
from eventlog.keys import DESTROYED, key_name
from projections.projection import ProjectionSettings
from sync import PulseDB, PulseDBSync
from sync.langgraph import PulseSaver
from tests.harness import eventually, raw_payloads, scan, sql_retried


class Draft(TypedDict):
    text: str
    approved: bool
    trail: list[str]


def review_graph() -> StateGraph[Draft]:
    """draft -> review (which asks a person: an interrupt) -> publish."""

    def draft(state: Draft) -> dict[str, Any]:
        return {"text": state["text"].upper(), "trail": [*state["trail"], "draft"]}

    def review(state: Draft) -> dict[str, Any]:
        decision = interrupt({"question": "publish?", "text": state["text"]})
        return {"approved": decision == "yes", "trail": [*state["trail"], "review"]}

    def publish(state: Draft) -> dict[str, Any]:
        return {"trail": [*state["trail"], "published" if state["approved"] else "dropped"]}

    builder = StateGraph(Draft)
    builder.add_node("draft", draft)
    builder.add_node("review", review)
    builder.add_node("publish", publish)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "review")
    builder.add_edge("review", "publish")
    builder.add_edge("publish", END)
    return builder


async def test_the_conformance_suite_passes_every_capability(tmp_path: Path) -> None:
    db = await PulseDB.open(tmp_path / "host")
    made = 0

    @checkpointer_test(name="PulseSaver")
    async def pulse_saver() -> Any:
        nonlocal made
        made += 1  # (a fresh collective for each capability: the suite's own isolation)
        collective = await db.create_collective("me", f"graphs-{made}", embedding_dimension=4)
        yield PulseSaver(db, collective)

    try:
        report = await validate(pulse_saver)
    finally:
        await db.close()
    results = {name: (r.detected, r.passed) for name, r in report.results.items()}
    expected = ("put", "put_writes", "get_tuple", "list", "delete_thread",
                "delete_for_runs", "copy_thread", "prune")  # fmt: skip
    assert results == {name: (True, True) for name in expected}, report.results
    assert report.passed_all_base() and report.passed_all()


async def test_a_run_interrupted_on_one_host_is_resumed_on_another(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "nats") as server:
        a = await PulseDB.open(tmp_path / "a", server.url)
        b = await PulseDB.open(tmp_path / "b", server.url)
        try:
            collective = await a.create_collective("team", "agents", embedding_dimension=4)
            config = {"configurable": {"thread_id": "review-7"}}
            on_a = review_graph().compile(checkpointer=PulseSaver(a, collective))
            first = await on_a.ainvoke({"text": "ship it", "approved": False, "trail": []}, config)
            assert [i.value for i in first["__interrupt__"]] == [
                {"question": "publish?", "text": "SHIP IT"}
            ]
            await b.sync()  # (b has read what the log holds: a's checkpoints)
            on_b = review_graph().compile(checkpointer=PulseSaver(b, collective))
            paused = await on_b.aget_state(config)
            assert paused.next == ("review",) and paused.values["trail"] == ["draft"]
            done = await on_b.ainvoke(Command(resume="yes"), config)
            assert done == {"text": "SHIP IT", "approved": True,
                            "trail": ["draft", "review", "published"]}  # fmt: skip
            await a.sync()
            history = [s.metadata["step"] async for s in on_a.aget_state_history(config)]
            assert history == [3, 2, 1, 0, -1]  # the whole run, as a sees it
        finally:
            await b.close()
            await a.close()


def test_the_sync_api_runs_a_graph_on_an_instance_of_its_own(tmp_path: Path) -> None:
    db = PulseDBSync.open(tmp_path / "host")
    try:
        collective = db.create_collective("me", "graphs", embedding_dimension=4)
        saver = PulseSaver(db, collective)
        graph = review_graph().compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "t-1"}}
        graph.invoke({"text": "draft", "approved": False, "trail": []}, config)
        assert graph.get_state(config).next == ("review",)
        done = graph.invoke(Command(resume="no"), config)
        assert done["trail"] == ["draft", "review", "dropped"]
        listed = list(saver.list(config))
        assert [t.metadata["step"] for t in listed] == [3, 2, 1, 0, -1]
        assert listed[0].checkpoint["channel_values"]["trail"] == done["trail"]
        saver.delete_thread("t-1")
        assert saver.get_tuple(config) is None and db.list_threads(collective) == []
    finally:
        db.close()


async def test_a_sync_method_on_the_instances_loop_is_refused_and_elsewhere_waits(
    tmp_path: Path,
) -> None:
    db = await PulseDB.open(tmp_path / "host")
    try:
        collective = await db.create_collective("me", "graphs", embedding_dimension=4)
        saver = PulseSaver(db, collective)
        config = {"configurable": {"thread_id": "t-1"}}
        with pytest.raises(RuntimeError, match="would block"):
            saver.get_tuple(config)  # (on the loop the instance runs on: it would hang)
        graph = review_graph().compile(checkpointer=saver)
        found: list[Any] = []

        def elsewhere() -> None:  # a thread of code that is not async
            graph.invoke({"text": "x", "approved": False, "trail": []}, config)
            found.append(saver.get_tuple(config))

        worker = threading.Thread(target=elsewhere)
        worker.start()
        while worker.is_alive():  # (the loop must run while the thread waits on it)
            await asyncio.sleep(0.01)
        worker.join()
        assert found and found[0].metadata["step"] == 1
        assert (await saver.aget_tuple(config)).checkpoint["id"] == found[0].checkpoint["id"]
    finally:
        await db.close()


async def test_writes_made_before_their_checkpoint_land_in_its_thread(tmp_path: Path) -> None:
    """LangGraph stores a checkpoint and the writes after it at once (on threads of its
    own): the writes may be asked first, and must go to the checkpoint's thread."""
    db = await PulseDB.open(tmp_path / "host")
    try:
        collective = await db.create_collective("me", "graphs", embedding_dimension=4)
        write = {"idx": 0, "channel": "c", "value_type": "json", "value": b"1"}
        await asyncio.gather(
            db.put_pending_writes(collective, "t-1", "0001", "task", [write]),
            db.put_checkpoint(collective, "t-1", "0001", "json", b"{}"),
            db.put_pending_writes(collective, "t-1", "0001", "task", [{**write, "idx": 1}]),
        )
        found = await db.get_checkpoint(collective, "t-1")
        assert found is not None and [w.idx for w in found.pending_writes] == [0, 1]
        assert await db.list_threads(collective) == ["t-1"]
    finally:
        await db.close()


async def test_bad_input_names_the_field_and_stores_nothing(tmp_path: Path) -> None:
    db = await PulseDB.open(tmp_path / "host")
    try:
        collective = await db.create_collective("me", "graphs", embedding_dimension=4)
        cases = [
            ({"thread": ""}, "thread: must be 1 byte to 1,024 bytes"),
            ({"checkpoint": bytes(896 * 1024)}, "checkpoint: with its metadata must be at most"),
            ({"checkpoint_type": "t" * 65}, "checkpoint_type"),
            ({"metadata": {"m": "x" * 70_000}}, "metadata: must be at most 65,536 bytes"),
            ({"metadata": {"run_id": "é" * 600}}, "metadata.run_id: must be at most 1,024"),
        ]
        for change, message in cases:
            arguments: dict[str, Any] = {
                "thread": "t-1", "checkpoint_id": "0001", "checkpoint_type": "json",
                "checkpoint": b"{}",
            }  # fmt: skip
            arguments.update(change)
            with pytest.raises(Exception, match=message):
                await db.put_checkpoint(UUID(str(collective)), **arguments)
        assert await db.list_threads(collective) == []
    finally:
        await db.close()


async def test_a_name_deleted_on_another_host_makes_a_new_thread_here(tmp_path: Path) -> None:
    """A host remembers the thread it found for a name; a delete on another host, once
    applied here, makes it forget, so the name's next checkpoint starts a new thread
    (rather than writing to the deleted one, which would be refused)."""
    with EmbeddedNats(tmp_path / "nats") as server:
        a = await PulseDB.open(tmp_path / "a", server.url)
        b = await PulseDB.open(tmp_path / "b", server.url)
        try:
            collective = await a.create_collective("team", "agents", embedding_dimension=4)
            first = await a.put_checkpoint(collective, "t-1", "0001", "json", b"{}")
            await a.put_checkpoint(collective, "t-1", "0002", "json", b"{}")  # (remembered)
            await b.sync()
            await b.delete_thread(collective, "t-1")
            await a.sync()
            again = await a.put_checkpoint(collective, "t-1", "0003", "json", b"{}")
            assert again.thread_id != first.thread_id
            found = await a.list_checkpoints(collective, thread="t-1")
            assert [c.checkpoint_id for c in found] == ["0003"]
        finally:
            await b.close()
            await a.close()


async def test_the_saver_works_over_http_with_the_remote_client(shared_service: Any) -> None:
    """``pulse up`` elsewhere: the same saver over ``ops.remote.RemotePulseDB`` (every
    call a POST, bytes in base64) passes the same suite."""
    from ops.remote import RemotePulseDB

    db = RemotePulseDB(shared_service.url, shared_service.token)
    made = 0

    @checkpointer_test(name="PulseSaver over HTTP")
    async def pulse_saver() -> Any:
        nonlocal made
        made += 1
        collective = await db.create_collective("me", f"remote-graphs-{made}-{uuid4().hex[:8]}",
                                                embedding_dimension=4)  # fmt: skip
        yield PulseSaver(db, collective)

    try:
        report = await validate(pulse_saver)
    finally:
        await db.close()  # (its kept-alive connections)
    assert all(r.detected and r.passed for r in report.results.values()), report.results


async def test_a_deleted_thread_is_gone_from_every_hosts_files_and_the_log(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    """``delete_thread`` (LangGraph's ``delete_thread``) forgets a thread as a session is
    forgotten: its checkpoints, metadata and pending writes leave every host's files
    within the scrub bound, the log keeps its tombstone only, and its key is destroyed."""
    fast = ProjectionSettings(scrub_after=1.0)
    a = await PulseDB.open(tmp_path / "a", nats_server.url, projection_settings=fast)
    b = await PulseDB.open(tmp_path / "b", nats_server.url, projection_settings=fast)
    hosts = [tmp_path / "a", tmp_path / "b"]
    tag = os.urandom(6).hex()
    needles = {f"{what}": f"{what} ZEBRA{tag}".encode() for what in ("state", "meta", "write")}
    try:
        cid = await a.create_collective("owner", "team", 4)
        kept = await a.put_checkpoint(cid, "kept", "0001", "json", b"an ordinary state")
        gone = await a.put_checkpoint(
            cid, "doomed", "0001", "json", needles["state"],
            metadata={"note": needles["meta"].decode()},
        )  # fmt: skip
        await a.put_pending_writes(cid, "doomed", "0001", "task", [
            {"idx": 0, "channel": "messages", "value_type": "json", "value": needles["write"]}
        ])  # fmt: skip
        await b.sync()
        for db in (a, b):
            await db.engine.run(lambda p: p.save())  # (as a quiet second would)
        before = scan(hosts, needles)
        for host in hosts:  # each host's files hold them while they are there
            found = set().union(*(v for k, v in before.items() if k.startswith(str(host))))
            assert found == set(needles), (host, before)
        assert scan([nats_server.dir], needles) == {}  # sealed on the log

        await b.delete_thread(cid, "doomed")
        await a.sync()
        for db in (a, b):
            assert await db.list_threads(cid) == ["kept"]
            assert await db.get_checkpoint(cid, "doomed") is None
            rows = await sql_retried(
                db, f"SELECT event_type FROM history WHERE entity_id = '{gone.thread_id}'"
            )
            assert rows == [["thread.deleted"]]  # its tombstone only
        assert [
            p for p in await raw_payloads(a.log)
            if str(gone.thread_id) in p and not p.startswith("ThreadDeleted(")
        ] == []  # fmt: skip
        name = key_name("thread", gone.thread_id, cid)
        assert await a.sealer.keyring.store.get(name) is DESTROYED
        assert not a.sealer.keyring.holds(name)  # (a forgot it as b's delete applied)

        async def forgotten() -> bool:
            await a.sync()
            await b.sync()
            return scan([*hosts, nats_server.dir], needles) == {}

        await eventually(forgotten, timeout=30.0, what="the thread leaving disk")
        assert (await a.get_checkpoint(cid, "kept")).thread_id == kept.thread_id
        assert await a.digest() == await b.digest()
    finally:
        await a.close()
        await b.close()


@pytest.mark.timeout(90)
async def test_an_edge_host_checkpoints_while_cut_off_and_the_hub_goes_on(tmp_path: Path) -> None:
    """An edge host (``leaf_of``) runs a graph while its link to the hub is down: its
    checkpoints are written to its own log; once the link returns, the hub holds the
    thread and resumes the run from where the edge host stopped."""
    from tests.harness import hub_server
    from tests.test_leaf import Edge, converged, link_is

    server, leaf_url = hub_server(tmp_path)
    hub = leaf = None
    try:
        hub = await PulseDB.open(tmp_path / "hub", server.url)
        leaf = await PulseDB.open(tmp_path / "leaf", leaf_of=leaf_url)
        edge = Edge(server, hub, leaf, leaf_url)
        await eventually(lambda: link_is(edge, "up"), what="link up", timeout=15)
        collective = await hub.create_collective("team", "agents", embedding_dimension=4)
        await converged(hub, leaf)

        edge.leaf_server.set_leaf_link(False)  # cut
        await eventually(lambda: link_is(edge, "down"), what="link down", timeout=15)
        config = {"configurable": {"thread_id": "offline-1"}}
        on_edge = review_graph().compile(checkpointer=PulseSaver(leaf, collective))
        paused = await on_edge.ainvoke({"text": "field notes", "approved": False, "trail": []},
                                       config)  # fmt: skip
        assert paused["__interrupt__"]
        assert await hub.list_threads(collective) == []  # (the hub has not seen it)

        edge.leaf_server.set_leaf_link(True)  # restore
        await converged(hub, leaf, timeout=30)
        on_hub = review_graph().compile(checkpointer=PulseSaver(hub, collective))
        assert (await on_hub.aget_state(config)).next == ("review",)
        done = await on_hub.ainvoke(Command(resume="yes"), config)
        assert done["trail"] == ["draft", "review", "published"]
    finally:
        for db in (leaf, hub):
            if db is not None:
                await db.close()
        server.stop()

"""LangGraph's long-term memory on Pulse (``sync.langgraph.PulseStore``, issue 30), on
real NATS servers. No conformance suite exists for stores, so LangGraph's own
``InMemoryStore`` is the reference: any sequence of puts, deletes, gets, searches and
namespace listings answers as it does. Then what only Pulse does: a query ranks by the
collective's embedder and BM25 together, the items are the collective's experiences (its
API and SQL see them, and a delete forgets them), hosts share them, and the store works
over HTTP."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any, TypedDict
from uuid import uuid4

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, InvalidNamespaceError, PutOp
from langgraph.store.memory import InMemoryStore

from eventlog import EmbeddedNats
from sync import PulseDB, PulseDBSync
from sync.langgraph import PulseStore
from tests.harness import by_profile, sql_retried

NAMESPACES = [("users", "u1"), ("users", "u2"), ("users", "u1", "notes"), ("teams", "t1")]
KEYS = ["prefs", "food", "k3"]

puts = st.tuples(
    st.just("put"),
    st.sampled_from(NAMESPACES),
    st.sampled_from(KEYS),
    st.one_of(
        st.none(),  # (a delete)
        st.fixed_dictionaries(
            {"n": st.integers(0, 5), "tag": st.sampled_from(["a", "b"])},
            optional={"text": st.sampled_from(["green tea", "dark mode", "ünïcode ✓"])},
        ),
    ),
)
gets = st.tuples(st.just("get"), st.sampled_from(NAMESPACES), st.sampled_from(KEYS))
prefixes = st.sampled_from([(), ("users",), ("users", "u1"), ("teams",), ("nobody",)])
filters = st.sampled_from(
    [None, {"tag": "a"}, {"n": {"$gte": 3}}, {"n": {"$lt": 2}, "tag": "b"}, {"n": {"$ne": 0}}]
)
searches = st.tuples(st.just("search"), prefixes, filters)
listings = st.tuples(
    st.just("namespaces"),
    st.sampled_from([None, ("users",), ("*", "u1"), ("teams", "*")]),
    st.sampled_from([None, ("u1",), ("notes",), ("*",)]),
    st.sampled_from([None, 1, 2]),
)


def apply(store: BaseStore, step: tuple[Any, ...]) -> Any:
    """One step on a store (the sync API: what ``graph.invoke``'s nodes call), and what
    it answered, in a form both stores can be compared in."""
    kind = step[0]
    if kind == "put":
        _, namespace, key, value = step
        if value is None:
            store.delete(namespace, key)
        else:
            store.put(namespace, key, value)
        return None
    if kind == "get":
        found = store.get(step[1], step[2])
        return None if found is None else (found.namespace, found.key, found.value)
    if kind == "search":  # (no query: the orders differ, the sets must not)
        listed = store.search(step[1], filter=step[2], limit=100)
        return sorted((i.namespace, i.key, json.dumps(i.value)) for i in listed)
    _, prefix, suffix, depth = step
    if isinstance(store, InMemoryStore):  # its get of a missing item leaves an empty
        for empty in [ns for ns, items in store._data.items() if not items]:  # namespace
            del store._data[empty]  # behind, which it then lists: one that holds nothing
    return store.list_namespaces(prefix=prefix, suffix=suffix, max_depth=depth)


def test_any_sequence_answers_as_langgraphs_memory_store(tmp_path: Path) -> None:
    db = PulseDBSync.open(tmp_path / "host")
    names = itertools.count()

    @settings(max_examples=by_profile(ci=50, dev=300), deadline=None)
    @given(st.lists(st.one_of(puts, gets, searches, listings), min_size=2, max_size=20))
    def same_answers(steps: list[tuple[Any, ...]]) -> None:
        collective = db.create_collective("me", f"memories-{next(names)}", embedder="hash")
        pulse, reference = PulseStore(db, collective), InMemoryStore()
        for step in steps:
            assert apply(pulse, step) == apply(reference, step), step

    try:
        same_answers()
    finally:
        db.close()


async def test_a_query_ranks_by_meaning_and_words_with_the_collectives_embedder(
    tmp_path: Path,
) -> None:
    db = await PulseDB.open(tmp_path / "host")
    try:
        collective = await db.create_collective("me", "memories", embedder="hash")
        store = PulseStore(db, collective)
        await store.aput(("users", "u1"), "drink", {"text": "prefers green tea to coffee", "n": 1})
        await store.aput(("users", "u1"), "editor", {"text": "edits code in vim", "n": 2})
        await store.aput(("users", "u2"), "drink", {"text": "drinks green smoothies", "n": 3})
        await store.aput(("users", "u2"), "hidden", {"text": "green tea ceremony"}, index=False)
        found = await store.asearch(("users",), query="green tea")
        assert (found[0].namespace, found[0].key) == (("users", "u1"), "drink")
        scores = [i.score for i in found]
        assert None not in scores and scores == sorted(scores, reverse=True)  # type: ignore[type-var]
        assert "hidden" not in {i.key for i in found}  # (index=False: no query finds it)
        assert await store.aget(("users", "u2"), "hidden") is not None
        assert {i.key for i in await store.asearch(("users", "u2"))} == {"drink", "hidden"}
        # a prefix, a filter, an offset
        only_u2 = await store.asearch(("users", "u2"), query="green tea")
        assert [i.key for i in only_u2] == ["drink"]
        some = await store.asearch(("users",), query="green tea", filter={"n": {"$gte": 2}})
        assert {i.key for i in some} <= {"editor", "drink"} and all(i.value["n"] >= 2 for i in some)
        second = await store.asearch(("users",), query="green tea", offset=1, limit=1)
        assert [(i.namespace, i.key) for i in second] == [(found[1].namespace, found[1].key)]
    finally:
        await db.close()


async def test_the_items_are_the_collectives_experiences(tmp_path: Path) -> None:
    """What a graph stores, Pulse's own API and SQL see; what Pulse deletes, the store
    no longer has; a put replaces the item's experience and keeps its creation time."""
    db = await PulseDB.open(tmp_path / "host")
    try:
        collective = await db.create_collective("me", "memories", embedder="hash")
        store = PulseStore(db, collective, agent="planner")
        await store.aput(("users", "u1"), "drink", {"text": "prefers green tea"})
        first = await store.aget(("users", "u1"), "drink")
        hits = await db.search_hybrid(collective, "green tea")
        assert [json.loads(h.experience.content) for h in hits] == [{"text": "prefers green tea"}]
        experience = hits[0].experience
        assert experience.source_agent == "planner"
        assert json.loads(experience.source_task or "") == [["users", "u1"], "drink"]
        assert "ns:users.u1" in experience.domain and "ns:users" in experience.domain
        await store.aput(("users", "u1"), "drink", {"text": "now prefers black coffee"})
        again = await store.aget(("users", "u1"), "drink")
        assert first is not None and again is not None
        assert again.value == {"text": "now prefers black coffee"}
        assert again.created_at == first.created_at and again.updated_at >= first.updated_at
        assert await db.get_experience(experience.experience_id) is None  # (replaced)
        rows = await sql_retried(
            db,
            "SELECT content, experience_type FROM experiences "
            f"WHERE collective_id = '{collective}' AND source_task IS NOT NULL "
            "AND list_contains(domain, 'langgraph.store')",  # (as docs/langgraph.md says)
        )
        assert [json.loads(r[0]) for r in rows] == [{"text": "now prefers black coffee"}]
        listed = await db.list_experiences(
            collective, flt={"source_task": json.dumps([["users", "u1"], "drink"],
                                                        separators=(",", ":"))},
        )  # fmt: skip
        assert len(listed) == 1
        await db.delete_experience(listed[0].experience_id)  # Pulse forgets it: so does the store
        assert await store.aget(("users", "u1"), "drink") is None
        assert await store.alist_namespaces() == []
    finally:
        await db.close()


async def test_puts_of_one_key_at_once_leave_one_item_the_last(tmp_path: Path) -> None:
    """Concurrent puts of one key through two stores of one instance: one at a time, so
    one experience is left, the last put's (without the instance's lock, each put would
    keep its own value beside the others')."""
    db = await PulseDB.open(tmp_path / "host")
    try:
        collective = await db.create_collective("me", "memories", embedder="hash")
        first, second = PulseStore(db, collective), PulseStore(db, collective)
        await first.aput(("users", "u1"), "mood", {"v": -1})
        await asyncio.gather(
            *(
                (first if i % 2 else second).aput(("users", "u1"), "mood", {"v": i})
                for i in range(6)
            )
        )
        address = json.dumps([["users", "u1"], "mood"], separators=(",", ":"))
        listed = await db.list_experiences(collective, flt={"source_task": address})
        assert [json.loads(e.content) for e in listed] == [{"v": 5}]
        got = await second.aget(("users", "u1"), "mood")
        assert got is not None and got.value == {"v": 5}
    finally:
        await db.close()


async def test_two_values_of_one_key_read_as_the_newer_until_a_put_leaves_one(
    tmp_path: Path,
) -> None:
    """Two hosts' puts of one key at once can leave two values (each host's lock is its
    own): every read answers the newer, wherever the older ranks, and the next put of
    the key removes both."""
    db = await PulseDB.open(tmp_path / "host")
    try:
        collective = await db.create_collective("me", "memories", embedder="hash")
        store = PulseStore(db, collective)
        address = json.dumps([["users", "u1"], "drink"], separators=(",", ":"))
        for text in ("green tea, green tea, always green tea", "black coffee"):  # older first
            await db.record_experience(
                collective, json.dumps({"text": text}), source_task=address,
                experience_type={"kind": "Generic", "category": "langgraph.store"},
                domain=["langgraph.store", "ns:users", "ns:users.u1"],
            )  # fmt: skip
        newer = {"text": "black coffee"}
        got = await store.aget(("users", "u1"), "drink")
        assert got is not None and got.value == newer
        assert [i.value for i in await store.asearch(("users",), query="green tea")] == [newer]
        assert [i.value for i in await store.asearch(("users",))] == [newer]
        assert await store.asearch(("users",), filter={"text": "green tea"}) == []
        await store.aput(("users", "u1"), "drink", {"text": "water"})
        listed = await db.list_experiences(collective, flt={"source_task": address})
        assert [json.loads(e.content) for e in listed] == [{"text": "water"}]
    finally:
        await db.close()


class Chat(TypedDict):
    user: str
    said: str
    answer: str


def remembering_graph() -> StateGraph[Chat]:
    """One node: remembers what the user said, and answers with everything it recalls."""

    def respond(state: Chat, *, store: BaseStore) -> dict[str, Any]:
        namespace = ("users", state["user"])
        store.put(namespace, f"m{len(store.search(namespace, limit=100))}",
                  {"text": state["said"]})  # fmt: skip
        recalled = sorted(i.value["text"] for i in store.search(namespace, limit=100))
        return {"answer": "; ".join(recalled)}

    builder = StateGraph(Chat)
    builder.add_node("respond", respond)
    builder.add_edge(START, "respond")
    builder.add_edge("respond", END)
    return builder


def test_a_graph_on_one_host_recalls_what_a_graph_on_another_stored(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "nats") as server:
        a = PulseDBSync.open(tmp_path / "a", server.url)
        b = PulseDBSync.open(tmp_path / "b", server.url)
        try:
            collective = a.create_collective("team", "memories", embedder="hash")
            on_a = remembering_graph().compile(store=PulseStore(a, collective))
            said = on_a.invoke({"user": "u1", "said": "I like green tea", "answer": ""})
            assert said["answer"] == "I like green tea"
            b.sync()
            on_b = remembering_graph().compile(store=PulseStore(b, collective))
            said = on_b.invoke({"user": "u1", "said": "and quiet rooms", "answer": ""})
            assert said["answer"] == "I like green tea; and quiet rooms"
            a.sync()
            hits = a.search_hybrid(collective, "quiet rooms")
            assert json.loads(hits[0].experience.content) == {"text": "and quiet rooms"}
            assert PulseStore(a, collective).list_namespaces() == [("users", "u1")]
        finally:
            b.close()
            a.close()


async def test_bad_input_names_the_field_and_stores_nothing(tmp_path: Path) -> None:
    db = await PulseDB.open(tmp_path / "host")
    try:
        collective = await db.create_collective("me", "memories", embedder="hash")
        store = PulseStore(db, collective)
        good = PutOp(("users", "u1"), "ok", {"text": "fine"})
        cases: list[tuple[PutOp, type[Exception], str]] = [
            (PutOp(("users", "u.1"), "k", {}), InvalidNamespaceError, "periods"),
            (PutOp(("langgraph", "x"), "k", {}), InvalidNamespaceError, "langgraph"),
            (PutOp((), "k", {}), InvalidNamespaceError, "empty"),
            (PutOp(("users",), "k", {"when": {1, 2}}), ValueError, "value: must be JSON"),
            (PutOp(("users",), "k", {"t": "x" * 110_000}), ValueError, "value: at most"),
            (PutOp(("users",), "k" * 1100, {}), ValueError, "namespace and key: at most 1,024"),
            (PutOp(("users",), "", {}), ValueError, "key: must be a non-empty string"),
            (PutOp(("users",), "k", {}, ttl=5.0), NotImplementedError, "TTL"),
        ]
        for bad, error, words in cases:
            with pytest.raises(error, match=words):
                await store.abatch([good, bad])  # (the good one is not stored either)
        assert await store.aget(("users", "u1"), "ok") is None
        assert await db.list_experiences(collective) == []
        await store.aput(("users",), "k", {"n": 1})
        with pytest.raises(ValueError, match="unknown operator '\\$near'"):
            await store.asearch(("users",), filter={"n": {"$near": 1}})
    finally:
        await db.close()


async def test_the_store_works_over_http_with_the_remote_client(shared_service: Any) -> None:
    from ops.remote import RemotePulseDB

    db = RemotePulseDB(shared_service.url, shared_service.token)
    try:
        collective = await db.create_collective(
            "me", f"remote-memories-{uuid4().hex[:8]}", embedder="hash"
        )
        store = PulseStore(db, collective)
        await store.aput(("users", "u1"), "drink", {"text": "prefers green tea", "n": 1})
        await store.aput(("users", "u2"), "drink", {"text": "prefers coffee", "n": 2})
        got = await store.aget(("users", "u1"), "drink")
        assert got is not None and got.value == {"text": "prefers green tea", "n": 1}
        found = await store.asearch(("users",), query="green tea")
        assert (found[0].namespace, found[0].key) == (("users", "u1"), "drink")
        assert [i.key for i in await store.asearch((), filter={"n": 2})] == ["drink"]
        assert await store.alist_namespaces(prefix=("users",)) == [("users", "u1"), ("users", "u2")]
        await store.adelete(("users", "u1"), "drink")
        assert await store.aget(("users", "u1"), "drink") is None
    finally:
        await db.close()

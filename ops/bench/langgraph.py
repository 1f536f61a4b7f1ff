"""Benchmark: ``PulseSaver`` and ``PulseStore`` beside LangGraph's own (issue 30).

    python -m ops.bench.langgraph [--checkpoints 100] [--rounds 5] [--steps 10]
                                  [--items 10000] [--queries 300]

Needs the ``langgraph`` extra, ``langgraph-checkpoint-sqlite`` and (for the SQLite
store's vectors on a Python built without SQLite extensions) ``pysqlite3-binary``, all
in ``dev``. In the same run:

Three checkpointers, the same calls:
- ``pulse``: ``sync.langgraph.PulseSaver`` on a ``PulseDB`` with its embedded NATS
  server (every write synced to disk before it is acknowledged, as Pulse always runs);
- ``sqlite``: ``AsyncSqliteSaver`` on a database file (LangGraph's own durable saver:
  WAL, its defaults);
- ``memory``: ``InMemorySaver`` (nothing durable: the floor of the framework itself).

Per saver, in rounds where the savers take turns (the order rotating): ``put`` (the
checkpoints of a thread of ``--checkpoints``, one after the other, with their pending
writes: a checkpoint of a chat-like state of a few KB, and two writes after it),
``get_latest`` (``aget_tuple`` of the thread, as many times), ``list`` (``alist`` of the
whole thread) and ``graph`` (a graph of ``--steps`` nodes run end to end with
``ainvoke``, a fresh thread each time).

Three stores, each embedding every item's value with Pulse's hash embedder (the
collective's for ``pulse``, the same function as the index's ``embed`` for the others):
``PulseStore`` on its own ``PulseDB``, LangGraph's ``AsyncSqliteStore`` (sqlite-vec) and
``InMemoryStore``. ``store_put``: ``--items`` puts of new keys, a tenth at a time per
store, in 100 namespaces; then ``--queries`` rounds, the stores taking turns, of
``store_get`` (a key), ``store_search`` (a query of three words over every item, the
best 10) and ``store_update`` (a put of a key the store holds).

Figures: each one's p50 in ms, and the ratio pulse / sqlite (target <= 2) and pulse /
memory; for ``put``, also the log's own floor in the same rounds (``raw_log_p50_ms``: two
acknowledged publishes of the same bytes to a stream of the same server, one after the
other, and ``floor_vs_sqlite``). One JSON line a figure; a table on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypedDict

import aiosqlite
import nats
import numpy as np
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from langgraph.store.sqlite.aio import AsyncSqliteStore
from nats.js.api import StorageType

from eventlog import EmbeddedNats
from ops.bench import emitter, table
from sync import PulseDB, embedders
from sync.langgraph import PulseSaver, PulseStore

SAVERS = ("pulse", "sqlite", "memory")
FIGURES = ("put", "get_latest", "list", "graph")
TARGET = 2.0  # pulse / sqlite, every figure

emit = emitter("langgraph")


def progress(message: str) -> None:
    print(f"langgraph: {message}", file=sys.stderr, flush=True)


class Chat(TypedDict):
    messages: list[str]
    step: int


def chat_state(i: int) -> dict[str, Any]:
    """A chat-like state: a few KB of messages, growing a little each step."""
    return {"messages": [f"message {j}: " + "lorem ipsum " * 20 for j in range(i % 20 + 5)],
            "step": i}  # fmt: skip


def stepping_graph(steps: int) -> StateGraph[Chat]:
    builder = StateGraph(Chat)
    names = [f"n{i}" for i in range(steps)]

    def node(state: Chat) -> dict[str, Any]:
        return {"messages": [*state["messages"][-10:], f"step {state['step']}"],
                "step": state["step"] + 1}  # fmt: skip

    for name in names:
        builder.add_node(name, node)
    builder.add_edge(START, names[0])
    for a, b in zip(names, names[1:], strict=False):
        builder.add_edge(a, b)
    builder.add_edge(names[-1], END)
    return builder


@contextlib.asynccontextmanager
async def savers(root: Path) -> AsyncIterator[tuple[dict[str, BaseCheckpointSaver[Any]], str]]:
    """The three savers, and the URL of the NATS server under Pulse's."""
    with EmbeddedNats(root / "nats") as server:
        db = await PulseDB.open(root / "pulse", server.url)
        try:
            collective = await db.create_collective("bench", "graphs", embedding_dimension=4)
            async with AsyncSqliteSaver.from_conn_string(str(root / "sqlite.db")) as sqlite:
                await sqlite.setup()
                yield {"pulse": PulseSaver(db, collective), "sqlite": sqlite,
                       "memory": InMemorySaver()}, server.url  # fmt: skip
        finally:
            await db.close()


async def raw_puts(url: str, n: int) -> list[float]:
    """The floor of a put on the log: two acknowledged publishes to a stream of the same
    server (its own: no host folds it), of the sizes of a put's two events' payloads (a
    checkpoint of ``chat_state`` and two writes, as the saver's serializer makes them),
    one after the other as the saver's two writes are; each pair's latency."""
    serde = InMemorySaver().serde
    connection = await nats.connect(url)
    try:
        js = connection.jetstream()
        await js.add_stream(name="RAW_PUTS", subjects=["raw.puts"], storage=StorageType.FILE)
        took = []
        for i in range(n):
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = chat_state(i)
            first = serde.dumps_typed(checkpoint)[1]
            second = b"".join(serde.dumps_typed(v)[1] for v in (["next"], i + 1))
            started = time.perf_counter()
            await js.publish("raw.puts", first)
            await js.publish("raw.puts", second)
            took.append(time.perf_counter() - started)
        return took
    finally:
        await connection.close()


async def put_thread(saver: BaseCheckpointSaver[Any], thread: str, n: int) -> list[float]:
    """``n`` checkpoints of a thread, each with two pending writes after it; each put's
    latency (the checkpoint and its writes) in seconds."""
    took = []
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    version: Any = None
    for i in range(n):
        checkpoint = empty_checkpoint()
        version = saver.get_next_version(version, None)
        checkpoint["channel_values"] = chat_state(i)
        checkpoint["channel_versions"] = {"messages": version, "step": version}
        started = time.perf_counter()
        config = await saver.aput(
            config, checkpoint, {"source": "loop", "step": i, "parents": {}},
            {"messages": version, "step": version},
        )  # fmt: skip
        await saver.aput_writes(config, [("messages", ["next"]), ("step", i + 1)], f"task-{i}")
        took.append(time.perf_counter() - started)
    return took


async def timed(action: Callable[[], Awaitable[Any]], times: int) -> list[float]:
    took = []
    for _ in range(times):
        started = time.perf_counter()
        await action()
        took.append(time.perf_counter() - started)
    return took


async def one_round(
    saver: BaseCheckpointSaver[Any], graph: Any, thread: str, checkpoints: int, steps: int
) -> dict[str, list[float]]:
    """Every figure's samples of one saver in one round, on thread ``thread``."""
    config: Any = {"configurable": {"thread_id": thread}}

    async def latest() -> None:
        assert await saver.aget_tuple(config) is not None

    async def listed() -> None:
        found = [t async for t in saver.alist(config)]
        assert len(found) == checkpoints, (len(found), checkpoints)

    runs = iter(range(1_000_000))

    async def end_to_end() -> None:
        run_config = {"configurable": {"thread_id": f"{thread}-run-{next(runs)}"}}
        done = await graph.ainvoke({"messages": [], "step": 0}, run_config)
        assert done["step"] == steps, done

    return {
        "put": await put_thread(saver, thread, checkpoints),
        "get_latest": await timed(latest, checkpoints),
        "list": await timed(listed, 3),
        "graph": await timed(end_to_end, 5),
    }


# -- the store: PulseStore beside LangGraph's own stores ------------------------------------

STORES = ("pulse", "sqlite", "memory")
STORE_FIGURES = ("store_put", "store_get", "store_search", "store_update")
USERS = 100  # namespaces ("users", "u<n>") the items spread over


def memory_text(rng: random.Random, i: int) -> dict[str, Any]:
    """A memory of a chat agent: a dozen words of a 600-word vocabulary, and a number."""
    words = " ".join(rng.choice(VOCABULARY) for _ in range(12))
    return {"text": f"the user said {words}", "n": i % 10}


VOCABULARY = [f"{a}{b}" for a in ("tea", "code", "night", "rain", "map", "song", "gym", "book",
              "bike", "cat", "sun", "city", "lake", "fire", "jazz", "wine", "chess", "ski",
              "yoga", "film") for b in ("", "s", "ing", "er", "ed", "y", "ish", "ful", "less",
              "ward", "ly", "ness", "ist", "ism", "ic", "al", "ous", "ent", "ive", "ion",
              "ary", "ory", "ure", "ade", "age", "ant", "ate", "dom", "ee", "hood")]  # fmt: skip
DIMENSION = 384  # the hash embedder's own


@contextlib.asynccontextmanager
async def stores(root: Path) -> AsyncIterator[dict[str, BaseStore]]:
    """The three stores, each embedding with Pulse's hash embedder (the collective's own
    for ``pulse``; the same function as LangGraph's index for the others)."""
    hashing = embedders.embedder("hash", DIMENSION)
    index: Any = {"dims": DIMENSION, "fields": ["$"],
                  "embed": lambda texts: hashing.embed_documents(list(texts)).tolist()}  # fmt: skip
    db = await PulseDB.open(root / "pulse-store")
    try:
        collective = await db.create_collective("bench", "memories", embedder="hash")
        async with aiosqlite.Connection(_extensible(root / "store.db"), 64) as connection:
            lite = AsyncSqliteStore(connection, index=index)
            await lite.setup()
            yield {"pulse": PulseStore(db, collective), "sqlite": lite,
                   "memory": InMemoryStore(index=index)}  # fmt: skip
    finally:
        await db.close()


def _extensible(path: Path) -> Callable[[], Any]:
    """A connector of a SQLite that loads extensions (LangGraph's store loads sqlite-vec):
    Python's own when it can, else pysqlite3's (a Python built without them)."""
    import sqlite3

    module: Any = sqlite3
    if not hasattr(sqlite3.Connection, "enable_load_extension"):
        import pysqlite3.dbapi2 as module  # type: ignore[import-untyped,no-redef]

    # (as AsyncSqliteStore.from_conn_string opens its own: autocommit)
    return lambda: module.connect(str(path), isolation_level=None, check_same_thread=False)


async def store_figures(items: int, queries: int) -> dict[tuple[str, str], list[float]]:
    """Each store: ``items`` puts of new keys (one at a time, into USERS namespaces),
    then ``queries`` rounds of a get, a search with a query over all of them, and a put
    of a key it holds (an update), the stores taking turns."""
    samples: dict[tuple[str, str], list[float]] = {}
    rng = random.Random(7)
    values = [memory_text(rng, i) for i in range(items)]
    asked = [" ".join(rng.choice(VOCABULARY) for _ in range(3)) for _ in range(queries)]
    held = {name: list(values) for name in STORES}  # each store's value of each key
    with tempfile.TemporaryDirectory(prefix="pulse-bench-store-") as tmp:
        async with stores(Path(tmp)) as by_name:
            chunk = max(1, items // 10)
            for start in range(0, items, chunk):  # (the stores take turns, a tenth each)
                for name in STORES:
                    store = by_name[name]
                    for i in range(start, min(items, start + chunk)):
                        began = time.perf_counter()
                        await store.aput(("users", f"u{i % USERS}"), f"m{i}", values[i])
                        samples.setdefault((name, "store_put"), []).append(
                            time.perf_counter() - began
                        )
                progress(f"store: {min(items, start + chunk)}/{items} items in every store")
            for r, text in enumerate(asked):
                for name in STORES[r % 3 :] + STORES[: r % 3]:
                    store = by_name[name]
                    i = rng.randrange(items)
                    began = time.perf_counter()
                    got = await store.aget(("users", f"u{i % USERS}"), f"m{i}")
                    samples.setdefault((name, "store_get"), []).append(time.perf_counter() - began)
                    assert got is not None and got.value == held[name][i], (name, i)
                    began = time.perf_counter()
                    found = await store.asearch(("users",), query=text, limit=10)
                    samples.setdefault((name, "store_search"), []).append(
                        time.perf_counter() - began
                    )
                    assert len(found) == 10, (name, len(found))
                    changed = {**values[i], "n": -1 - r}  # (a put of a key it holds: a new value)
                    began = time.perf_counter()
                    await store.aput(("users", f"u{i % USERS}"), f"m{i}", changed)
                    samples.setdefault((name, "store_update"), []).append(
                        time.perf_counter() - began
                    )
                    held[name][i] = changed
    return samples


async def run(checkpoints: int, rounds: int, steps: int, items: int, queries: int) -> int:
    samples: dict[tuple[str, str], list[float]] = {}
    graph = stepping_graph(steps)
    with tempfile.TemporaryDirectory(prefix="pulse-bench-langgraph-") as tmp:
        async with savers(Path(tmp)) as (by_name, url):
            compiled = {name: graph.compile(checkpointer=s) for name, s in by_name.items()}
            for r in range(rounds):
                for name in SAVERS[r % 3 :] + SAVERS[: r % 3]:  # (each first in turn)
                    found = await one_round(
                        by_name[name], compiled[name], f"thread-{r}", checkpoints, steps
                    )
                    for figure, took in found.items():
                        samples.setdefault((name, figure), []).extend(took)
                samples.setdefault(("raw", "put"), []).extend(await raw_puts(url, checkpoints))
                progress(f"round {r + 1}/{rounds}")
    if items:
        samples.update(await store_figures(items, queries))
    rows, notes = [], []
    for figure in FIGURES + (STORE_FIGURES if items else ()):
        p50 = {n: float(np.median(samples[(n, figure)])) * 1000 for n in SAVERS}
        vs_sqlite, vs_memory = p50["pulse"] / p50["sqlite"], p50["pulse"] / p50["memory"]
        floor: dict[str, Any] = {}
        if ("raw", figure) in samples:  # (what the log alone takes: the floor of the figure)
            raw = float(np.median(samples[("raw", figure)])) * 1000
            floor = {"raw_log_p50_ms": round(raw, 3),
                     "floor_vs_sqlite": round(raw / p50["sqlite"], 3)}  # fmt: skip
            notes.append(f"{figure}: the log alone (two acknowledged publishes of its bytes) "
                         f"{raw:.3f} ms, {raw / p50['sqlite']:.2f}x sqlite")  # fmt: skip
        emit(figure, **{f"{n}_p50_ms": round(p50[n], 3) for n in SAVERS},
             pulse_vs_sqlite=round(vs_sqlite, 3), target=TARGET, met=vs_sqlite <= TARGET,
             pulse_vs_memory=round(vs_memory, 2), **floor,
             samples=len(samples[("pulse", figure)]))  # fmt: skip
        rows.append((figure, *(f"{p50[n]:.3f}" for n in SAVERS), f"{vs_sqlite:.2f}",
                     "ok" if vs_sqlite <= TARGET else "MISS"))  # fmt: skip
    header = ("figure", "pulse ms", "sqlite ms", "memory ms", "pulse/sqlite", "<= 2")
    print(table(header, rows), file=sys.stderr)
    for note in notes:
        print(note, file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.langgraph", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--checkpoints", type=int, default=100,
                        help="checkpoints of each thread (100)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every saver (5)")
    parser.add_argument("--steps", type=int, default=10, help="nodes of the graph (10)")
    parser.add_argument("--items", type=int, default=10_000,
                        help="items put in each store (10,000; 0: no store figures)")  # fmt: skip
    parser.add_argument("--queries", type=int, default=300,
                        help="gets and searches of each store (300)")  # fmt: skip
    options = parser.parse_args(argv)
    for name in ("checkpoints", "rounds", "steps", "queries"):
        if getattr(options, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if options.items != 0 and options.items < 10 * USERS:
        parser.error(f"--items must be 0 or at least {10 * USERS:,}")
    return asyncio.run(run(options.checkpoints, options.rounds, options.steps, options.items,
                           options.queries))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

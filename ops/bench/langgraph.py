"""Benchmark: ``PulseSaver`` beside LangGraph's own checkpointers (issue 30).

    python -m ops.bench.langgraph [--checkpoints 100] [--rounds 5] [--steps 10]

Needs the ``langgraph`` extra and ``langgraph-checkpoint-sqlite`` (both in ``dev``).
Three savers, the same calls, in the same run:

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
``ainvoke``, a fresh thread each time). Figures: each one's p50 in ms, and the ratio
pulse / sqlite (target <= 2) and pulse / memory. One JSON line a figure; a table on
stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

from ops.bench import emitter
from sync import PulseDB
from sync.langgraph import PulseSaver

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
async def savers(root: Path) -> AsyncIterator[dict[str, BaseCheckpointSaver[Any]]]:
    db = await PulseDB.open(root / "pulse")
    try:
        collective = await db.create_collective("bench", "graphs", embedding_dimension=4)
        async with AsyncSqliteSaver.from_conn_string(str(root / "sqlite.db")) as sqlite:
            await sqlite.setup()
            yield {"pulse": PulseSaver(db, collective), "sqlite": sqlite, "memory": InMemorySaver()}
    finally:
        await db.close()


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


async def run(checkpoints: int, rounds: int, steps: int) -> int:
    samples: dict[tuple[str, str], list[float]] = {}
    graph = stepping_graph(steps)
    with tempfile.TemporaryDirectory(prefix="pulse-bench-langgraph-") as tmp:
        async with savers(Path(tmp)) as by_name:
            compiled = {name: graph.compile(checkpointer=s) for name, s in by_name.items()}
            for r in range(rounds):
                for name in SAVERS[r % 3 :] + SAVERS[: r % 3]:  # (each first in turn)
                    found = await one_round(
                        by_name[name], compiled[name], f"thread-{r}", checkpoints, steps
                    )
                    for figure, took in found.items():
                        samples.setdefault((name, figure), []).extend(took)
                progress(f"round {r + 1}/{rounds}")
    rows = []
    for figure in FIGURES:
        p50 = {n: float(np.median(samples[(n, figure)])) * 1000 for n in SAVERS}
        vs_sqlite, vs_memory = p50["pulse"] / p50["sqlite"], p50["pulse"] / p50["memory"]
        emit(figure, **{f"{n}_p50_ms": round(p50[n], 3) for n in SAVERS},
             pulse_vs_sqlite=round(vs_sqlite, 3), target=TARGET, met=vs_sqlite <= TARGET,
             pulse_vs_memory=round(vs_memory, 2),
             samples=len(samples[("pulse", figure)]))  # fmt: skip
        rows.append((figure, *(f"{p50[n]:.3f}" for n in SAVERS), f"{vs_sqlite:.2f}",
                     "ok" if vs_sqlite <= TARGET else "MISS"))  # fmt: skip
    header = ("figure", "pulse ms", "sqlite ms", "memory ms", "pulse/sqlite", "<= 2")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)),
              file=sys.stderr)  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.langgraph", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--checkpoints", type=int, default=100,
                        help="checkpoints of each thread (100)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every saver (5)")
    parser.add_argument("--steps", type=int, default=10, help="nodes of the graph (10)")
    options = parser.parse_args(argv)
    for name in ("checkpoints", "rounds", "steps"):
        if getattr(options, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return asyncio.run(run(options.checkpoints, options.rounds, options.steps))


if __name__ == "__main__":
    sys.exit(main())

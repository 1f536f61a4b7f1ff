"""Benchmark: what one memory per lesson and languages per document cost a write.

    python -m ops.bench.duplicates [--size 10000] [--writes 300]

One host on an embedded NATS server. Each collective is filled with ``--size`` lessons
(random 384-d vectors, short English texts), then ``--writes`` single records are timed
one after another (each returns once this host applied it), in blocks of 20 of each
kind in turn, in:

- ``english``: a collective with the English analyzer fixed and duplicates kept (what
  every write did before this release): the peer of the others;
- ``auto``: the default language (each text's language detected by the writer);
- ``reinforce, new``: duplicates reinforced, each write a new lesson (the search for a
  duplicate finds none, then the record);
- ``reinforce, duplicate``: each write a lesson already there (a reinforcement instead);
- ``link, duplicate``: each write a lesson already there (the record and its relation);

and raw nats-py publishes of the same bytes to a stream of their own, acknowledged, one
after another: the floor under every write. Prints one JSON line per figure and a table
on stderr, each p50 beside the fixed-English peer's and the raw publish's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from ops.bench import emitter, table

DIM = 384
BLOCK = 20  # writes of one kind in a row
emit = emitter("duplicates")
WORDS = ("retry", "publish", "timeout", "stream", "consumer", "ack", "index", "vector",
         "commit", "snapshot", "token", "lease", "cache", "queue", "replica", "leader")  # fmt: skip


def lesson(i: int) -> str:
    """A short English lesson of its own (words picked by ``i``)."""
    picked = [WORDS[(i >> (4 * k)) % len(WORDS)] for k in range(4)]
    return f"When the {picked[0]} of the {picked[1]} fails, check the {picked[2]} first ({i})"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000, q))


async def timed(writes: range, write: Callable[[int], Awaitable[Any]]) -> list[float]:
    took = []
    for i in writes:
        started = time.perf_counter()
        await write(i)
        took.append(time.perf_counter() - started)
    return took


async def run(size: int, writes: int) -> dict[str, list[float]]:
    import nats

    from eventlog import EmbeddedNats
    from sync import PulseDB

    rng = np.random.default_rng(7)
    fill = rng.standard_normal((size, DIM)).astype(np.float32)
    fresh = rng.standard_normal((writes, DIM)).astype(np.float32)
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        db = await PulseDB.open(Path(tmp) / "db", server.url)
        try:
            made = {}
            chosen: list[tuple[str, dict[str, Any]]] = [
                ("english", {"language": "english"}),
                ("auto", {}),
                ("reinforce", {"on_duplicate": "reinforce"}),
                ("link", {"on_duplicate": "link"}),
            ]
            for name, settings in chosen:
                cid = await db.create_collective("bench", name, DIM, **settings)
                for start in range(0, size, 1000):
                    await db.record_experiences(cid, [
                        {"content": lesson(i), "embedding": fill[i].tolist(),
                         "on_duplicate": "keep"}
                        for i in range(start, min(size, start + 1000))
                    ])  # fmt: skip
                made[name] = cid
                print(f"filled {name}: {size} lessons", file=sys.stderr)

            def new_in(name: str) -> Callable[[int], Awaitable[Any]]:
                return lambda i: db.record_experience(
                    made[name], lesson(size + i), fresh[i].tolist()
                )

            def again_in(name: str) -> Callable[[int], Awaitable[Any]]:
                return lambda i: db.record_experience(made[name], lesson(i), fill[i].tolist())

            kinds = {
                "english": new_in("english"),
                "auto": new_in("auto"),
                "reinforce, new": new_in("reinforce"),
                "reinforce, duplicate": again_in("reinforce"),
                "link, duplicate": again_in("link"),
            }
            results = {figure: [] for figure in kinds}
            for start in range(0, writes, BLOCK):  # alternating blocks: the host's background
                for figure, write in kinds.items():  # work falls on each kind alike
                    block = range(start, min(writes, start + BLOCK))
                    results[figure] += await timed(block, write)
            # the floor: the same bytes, published raw and acknowledged
            client = await nats.connect(server.url)
            js = client.jetstream()
            await js.add_stream(name="RAW", subjects=["raw.>"])
            payload = bytes(40 + DIM * 4 + 200)
            results["raw publish"] = await timed(
                range(writes), lambda i: js.publish("raw.x", payload)
            )
            await client.close()
        finally:
            await db.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=10_000, help="lessons in each collective")
    parser.add_argument("--writes", type=int, default=300, help="timed writes of each kind")
    args = parser.parse_args()
    results = asyncio.run(run(args.size, args.writes))
    peer = percentile(results["english"], 50)
    raw = percentile(results["raw publish"], 50)
    rows = []
    for figure, took in results.items():
        p50, p99 = percentile(took, 50), percentile(took, 99)
        emit(figure, size=args.size, writes=args.writes, p50_ms=round(p50, 3),
             p99_ms=round(p99, 3), vs_english=round(p50 / peer, 2),
             vs_raw=round(p50 / raw, 2))  # fmt: skip
        rows.append([figure, f"{p50:.2f}", f"{p99:.2f}", f"{p50 / peer:.2f}x",
                     f"{p50 / raw:.2f}x"])  # fmt: skip
    print(table(["write", "p50 ms", "p99 ms", "p50 vs english", "p50 vs raw"], rows),
          file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()

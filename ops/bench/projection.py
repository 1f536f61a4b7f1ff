"""Benchmark: rebuilding a projection, similar search, and memory, each beside a peer.

    python -m ops.bench.projection [--n 100000] [--queries 1000]

Fills an embedded NATS with ``n`` recorded experiences (384-dimension embeddings in 40
clusters), then prints JSON lines:

- rebuild: ``pulse rebuild``'s rate (events/s, DuckDB + FAISS + tantivy, swap included)
  beside a raw nats-py ordered consumer draining the same stream without decoding;
- similar_search: p50 / p99 latency of ``similar_experiences`` (k=10) beside exact
  numpy search (one matrix product + argpartition) over the same normalized vectors;
- memory: resident memory of a process that opens the projection and answers a query,
  minus the same process before opening it, per 100,000 experiences.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from eventlog import EmbeddedNats, JetStreamLog
from eventlog import events as ev
from eventlog.ids import uuid7
from ops.bench.peers import raw_drain
from projections import queries as q
from projections.projection import Projection, rebuild, state_dir

DIM, CLUSTERS = 384, 40


def corpus(n: int, seed: int = 1) -> tuple[np.ndarray, list[ev.Event]]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(CLUSTERS, DIM))
    vectors = (centers[rng.integers(0, CLUSTERS, n)] + 0.35 * rng.normal(size=(n, DIM))).astype(
        np.float32
    )
    cid, instance = uuid7(), uuid7()
    hlc = ev.pack_hlc(int(time.time() * 1000))
    events: list[ev.Event] = [
        ev.CollectiveCreated(
            event_id=uuid7(), instance_id=instance, hlc=hlc, collective_id=cid, owner_id="bench",
            name="bench", embedding_dimension=DIM,
        )
    ]  # fmt: skip
    for i in range(n):
        events.append(
            ev.ExperienceRecorded(
                event_id=uuid7(), instance_id=instance, hlc=hlc + i, experience_id=uuid7(),
                collective_id=cid, content=f"lesson {i}: retry with the same id, cluster {i % 40}",
                embedding=vectors[i].tobytes(), experience_type=ev.Generic(), importance=0.5,
                confidence=0.5, source_agent="bench",
            )
        )  # fmt: skip
    return vectors, events


def emit(figure: str, **values: object) -> None:
    print(json.dumps({"bench": "projection", "figure": figure, **values}), flush=True)


def percentile(samples: list[float], p: float) -> float:
    return float(np.percentile(np.array(samples), p))


MEMORY_PROBE = """
import sys, resource
from uuid import UUID
import numpy as np
from projections.projection import Projection, state_dir
from projections import queries as q

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
before = rss()
p = Projection(state_dir(sys.argv[1]))
q.similar_experiences(p, UUID(sys.argv[2]), np.ones(384, dtype=np.float32), k=10)
q.search_text(p, UUID(sys.argv[2]), "retry", k=10)
print(rss() - before)
"""


async def main(n: int, queries: int) -> None:
    vectors, events = corpus(n)
    cid = events[0].collective_id  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(tmp, sync_always=False) as server:
        log = await JetStreamLog.connect(server.url, append_timeout=60)
        for start in range(0, len(events), 1000):
            await log.append_batch(events[start : start + 1000])
        total = await log.last_seq()

        started = time.perf_counter()
        await raw_drain(log.js, "pulse.c.>", total)
        raw_rate = total / (time.perf_counter() - started)

        started = time.perf_counter()
        await rebuild(tmp, log)
        rebuild_rate = total / (time.perf_counter() - started)
        emit("rebuild", events=total, pulse_per_s=round(rebuild_rate),
             raw_drain_per_s=round(raw_rate), ratio=round(rebuild_rate / raw_rate, 3))  # fmt: skip

        projection = Projection(state_dir(tmp))
        rng = np.random.default_rng(2)
        probes = vectors[rng.integers(0, n, queries)] + 0.05 * rng.normal(
            size=(queries, DIM)
        ).astype(np.float32)
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        pulse_ms: list[float] = []
        numpy_ms: list[float] = []
        # Alternate in blocks, not per query: BLAS threads keep spinning for a while after
        # a matrix product and would slow whatever runs right after them.
        for block in range(0, queries, 50):
            chunk = probes[block : block + 50]
            for turn in [0, 1] if (block // 50) % 2 == 0 else [1, 0]:
                for probe in chunk:
                    started = time.perf_counter()
                    if turn == 0:
                        q.similar_experiences(projection, cid, probe, k=10)
                        pulse_ms.append((time.perf_counter() - started) * 1000)
                    else:
                        scores = unit @ (probe / np.linalg.norm(probe))
                        top = np.argpartition(-scores, 10)[:10]
                        top[np.argsort(-scores[top])]
                        numpy_ms.append((time.perf_counter() - started) * 1000)
        index = projection.vectors[("experience", cid)]
        emit("similar_search", experiences=n, k=10, index="hnsw" if index.is_hnsw else "flat",
             pulse_p50_ms=round(percentile(pulse_ms, 50), 3),
             pulse_p99_ms=round(percentile(pulse_ms, 99), 3),
             numpy_exact_p50_ms=round(percentile(numpy_ms, 50), 3),
             numpy_exact_p99_ms=round(percentile(numpy_ms, 99), 3),
             ratio_p50=round(percentile(pulse_ms, 50) / percentile(numpy_ms, 50), 3))  # fmt: skip
        projection.close()
        await log.close()

        probe = subprocess.run(  # noqa: ASYNC221 (nothing else runs)
            [sys.executable, "-c", MEMORY_PROBE, tmp, str(cid)],
            capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2],
        )  # fmt: skip
        rss = int(probe.stdout.strip())
        raw_vectors = n * DIM * 4
        emit("memory", experiences=n, rss_mb=round(rss / 2**20, 1),
             rss_mb_per_100k=round(rss / 2**20 * 100_000 / n, 1),
             raw_vectors_mb=round(raw_vectors / 2**20, 1),
             ratio_to_raw_vectors=round(rss / raw_vectors, 3))  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="recorded experiences")
    parser.add_argument("--queries", type=int, default=1000, help="similar-search queries")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.queries))

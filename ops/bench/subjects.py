"""Benchmark: one subject per entity, from a hundred thousand entities to millions.

    python -m ops.bench.subjects [--steps 100000,300000,1000000,3000000] [--replicas 3]

Pulse gives every entity a subject of its own (``pulse.c.<collective>.<kind>.<id>``:
``eventlog.subjects``), so a stream holds as many subjects as entities, and JetStream
keeps an index entry per subject on every replica. Three local nats-server processes
(``ops.cluster``; ``replicated`` durability, so filling is quick: the index does not
depend on syncing) hold one stream of ``--replicas`` replicas. At each step the stream is
filled up to the step's count of entities, one message of ~200 bytes each on a subject
of its own, spread over 100 collectives, and the step prints:

- the servers' memory (``/varz`` ``mem``, all three) and its growth per entity;
- a purge's stall: one entity's subject is purged (as forgetting does) while a writer
  publishes one message at a time; the purge's round trip, and the writer's worst
  acknowledgement during it beside its median before;
- a restart: the stream leader's server killed and started again, and the seconds
  until it answers ``/healthz`` (its JetStream recovered) and every replica of the
  stream is current again.

A knee is the first step where the purge stalls the writer past 1 s, a restart takes
more than 60 s, or the servers' memory passes half of RAM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from uuid import UUID

import nats
from nats.js import api

from eventlog.ids import uuid7
from ops.cluster import LocalCluster

RAM = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
PAYLOAD = b"x" * 200
STREAM = "SUBJECTS"


def _memory(cluster: LocalCluster) -> int:
    total = 0
    for port in cluster.monitor_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=10) as answer:
            total += int(json.load(answer).get("mem", 0))
    return total


def _wait_healthy(port: int, timeout: float) -> None:
    """Until a server answers ``/healthz`` (its JetStream recovered)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"the server of monitoring port {port} not healthy in {timeout:g}s")


async def _wait_current(js: object, replicas: int, timeout: float) -> None:
    """Until the stream has a leader and every replica is current again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = await js.stream_info(STREAM)  # type: ignore[attr-defined]
        except Exception:  # (asked while it elects a leader, or the client reconnects)
            info = None
        cluster = info.cluster if info is not None else None
        if cluster is not None and cluster.leader:
            followers = cluster.replicas or []
            if len(followers) == replicas - 1 and all(r.current for r in followers):
                return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"stream {STREAM} not current in {timeout:g}s")


async def _fill(js: object, collectives: list[UUID], start: int, end: int) -> None:
    """Entities ``start``..``end - 1``, one message each on a subject of its own,
    published in pipelined batches."""
    for first in range(start, end, 2000):
        for n in range(first, min(end, first + 2000)):
            subject = f"pulse.c.{collectives[n % len(collectives)]}.experience.{uuid7()}"
            await js.publish_async(subject, PAYLOAD)  # type: ignore[attr-defined]
        await js.publish_async_completed()  # type: ignore[attr-defined]


async def _stall(js: object, subject: str) -> tuple[float, float, float]:
    """(the purge's round trip, the writer's median acknowledgement before it, its worst
    during it), in ms: a writer publishing one message at a time beside the purge."""
    before: list[float] = []
    during: list[float] = []
    purging = False

    stop = asyncio.Event()  # (not a cancel: nats-py's wait_for may swallow one on 3.11)

    async def writer(until: float) -> None:
        while time.perf_counter() < until and not stop.is_set():
            started = time.perf_counter()
            await js.publish("pulse.c.stall.writer", PAYLOAD)  # type: ignore[attr-defined]
            (during if purging else before).append(time.perf_counter() - started)

    task = asyncio.create_task(writer(time.perf_counter() + 60))
    await asyncio.sleep(1.0)
    purging = True
    started = time.perf_counter()
    await js.purge_stream(STREAM, subject=subject)  # type: ignore[attr-defined]
    purge = time.perf_counter() - started
    await asyncio.sleep(0.2)  # (a writer's next acknowledgements, after the purge)
    stop.set()
    await asyncio.gather(task, return_exceptions=True)
    worst = max(during, default=0.0)
    return purge * 1000, statistics.median(before) * 1000, worst * 1000


async def main(steps: list[int], replicas: int) -> None:
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", 3, durability="replicated")
        urls = cluster.start()
        nc = await nats.connect(urls, reconnect_time_wait=0.2, max_reconnect_attempts=-1)
        js = nc.jetstream(timeout=10)
        await js.add_stream(name=STREAM, subjects=["pulse.c.>"], num_replicas=replicas,
                            storage=api.StorageType.FILE)  # fmt: skip
        collectives = [uuid7() for _ in range(100)]
        base = _memory(cluster)
        held = 0
        try:
            for step in steps:
                if rows:  # (a step whose memory would pass 60% of RAM is not run)
                    grows = rows[-1]["bytes_per_entity"] * (step - held)
                    if _memory(cluster) + grows > 0.6 * RAM:
                        print(f"step {step}: skipped, its servers would take about "
                              f"{(_memory(cluster) + grows) / 2**30:.1f} GiB of this machine's "
                              f"{RAM / 2**30:.1f}", flush=True)  # fmt: skip
                        break
                started = time.perf_counter()
                await _fill(js, collectives, held, step)
                fill = time.perf_counter() - started
                held = step
                info = await js.stream_info(STREAM)
                reply = await nc.request(f"$JS.API.STREAM.INFO.{STREAM}", b"", timeout=60)
                subjects = int(json.loads(reply.data)["state"].get("num_subjects", 0))
                memory = _memory(cluster)
                subject = f"pulse.c.{collectives[0]}.experience.{uuid7()}"
                await js.publish(subject, PAYLOAD)
                purge, median, worst = await _stall(js, subject)
                leader = int(str(info.cluster.leader).removeprefix("n"))  # type: ignore[union-attr]
                cluster.kill(leader)  # (a crash: its store recovered on the way up)
                restarted = time.perf_counter()
                cluster.start_node(leader, wait=False)
                await asyncio.to_thread(_wait_healthy, cluster.monitor_ports[leader], 600.0)
                await _wait_current(js, replicas, 600.0)
                restart = time.perf_counter() - restarted
                row = {
                    "entities": step, "subjects": subjects,
                    "fill_per_s": round((step - (rows[-1]["entities"] if rows else 0)) / fill),
                    "server_memory_mb": round(memory / 2**20),
                    "bytes_per_entity": round((memory - base) / step),
                    "purge_ms": round(purge, 1), "writer_median_ms": round(median, 2),
                    "writer_worst_during_purge_ms": round(worst, 1),
                    "restart_s": round(restart, 1),
                }  # fmt: skip
                rows.append(row)
                print(json.dumps({"bench": "subjects", **row}), flush=True)
        finally:
            await nc.close()
            cluster.stop()
    knee = next((r["entities"] for r in rows if r["writer_worst_during_purge_ms"] > 1000
                 or r["restart_s"] > 60 or r["server_memory_mb"] * 2**20 > RAM / 2),
                None)  # fmt: skip
    names = ["entities", "subjects", "fill_per_s", "server_memory_mb", "bytes_per_entity",
             "purge_ms", "writer_median_ms", "writer_worst_during_purge_ms",
             "restart_s"]  # fmt: skip
    print(" ".join(f"{n:>{len(n)}}" for n in names))
    for r in rows:
        print(" ".join(f"{r[n]!s:>{len(n)}}" for n in names))
    print(f"knee: {'none up to ' + str(steps[-1]) + ' entities' if knee is None else knee} "
          "(a purge stalling a writer past 1 s, a restart past 60 s, or the servers' memory "
          "past half of RAM)")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="100000,300000,1000000,3000000",
                        help="entities at each step")  # fmt: skip
    parser.add_argument("--replicas", type=int, default=3, help="the stream's (3)")
    args = parser.parse_args()
    counts = [int(s) for s in args.steps.split(",") if s.strip()]
    asyncio.run(main(counts, args.replicas))

"""Benchmark: the HTTP API under 16 concurrent clients, beside the same calls in-process.

    python -m ops.bench.service [--n 100000] [--clients 16] [--requests 25]

Fills a data directory's embedded NATS with ``n`` experiences (12 words each from a
2,000-word vocabulary, 384-d clustered vectors, a collective with the ``hash``
embedder), starts ``pulse up`` on it (a separate process, which catches up first), and
runs ``clients`` concurrent HTTP clients (httpx, plain JSON) making ``requests`` calls
each of ``search_hybrid`` (three-word queries, k=10) and then ``record_experience``
(text only, embedded by the service). It then stops the service, opens the same data
directory in this process and makes the same calls from ``clients`` concurrent tasks.
Prints JSON lines: p50 / p99 latency in ms for each, and the ratio HTTP / in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import numpy as np

from eventlog import EmbeddedNats, JetStreamLog
from eventlog import events as ev
from eventlog.ids import uuid7
from ops.bench import emitter
from sync import PulseDB

DIM, CLUSTERS, VOCABULARY = 384, 40, 2000


def words(rng: np.random.Generator, count: int) -> str:
    return " ".join(f"w{int(i)}" for i in rng.integers(0, VOCABULARY, count))


def centers(rng: np.random.Generator) -> Any:
    """The ``CLUSTERS`` centers the corpus's vectors are drawn around."""
    return rng.normal(size=(CLUSTERS, DIM))


def near(around: Any, n: int, rng: np.random.Generator) -> Any:
    """``n`` unit vectors (float32), each a random center of ``around`` plus noise."""
    vectors = around[rng.integers(0, len(around), n)] + 0.35 * rng.normal(size=(n, DIM))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def recorded(
    contents: Sequence[str], vectors: Any, cid: UUID | None = None
) -> tuple[UUID, list[UUID], list[ev.Event]]:
    """A ``hash``-embedder collective (``cid``, or a new one) of ``DIM`` dimensions with
    one experience of each content and vector: its id, the experiences' ids, and the
    events that make them (the collective's creation first)."""
    cid, instance = cid or uuid7(), uuid7()
    hlc = ev.pack_hlc(int(time.time() * 1000))
    ids = [uuid7() for _ in contents]
    events: list[ev.Event] = [
        ev.CollectiveCreated(
            event_id=uuid7(), instance_id=instance, hlc=hlc, collective_id=cid,
            owner_id="bench", name="bench", embedding_dimension=DIM, embedder="hash",
        )
    ]  # fmt: skip
    for i, (content, vector) in enumerate(zip(contents, vectors, strict=True)):
        events.append(
            ev.ExperienceRecorded(
                event_id=uuid7(), instance_id=instance, hlc=hlc + i, experience_id=ids[i],
                collective_id=cid, content=content, embedding=vector.tobytes(),
                experience_type=ev.Generic(), importance=0.5, confidence=0.5,
                source_agent="bench",
            )
        )  # fmt: skip
    return cid, ids, events


def corpus(n: int, rng: np.random.Generator) -> tuple[Any, list[ev.Event]]:
    """A collective of ``n`` experiences: 12 words each, vectors near ``CLUSTERS``
    centers."""
    vectors = near(centers(rng), n, rng)
    cid, _, events = recorded([words(rng, 12) for _ in range(n)], vectors)
    return cid, events


async def fill(data_dir: Path, events: list[ev.Event]) -> None:
    """``events`` appended to the log of ``data_dir``'s embedded NATS server."""
    with EmbeddedNats(data_dir) as server:
        await append(server.url, events)


async def append(nats_url: str, events: list[ev.Event]) -> None:
    """``events`` appended to the log on the server at ``nats_url``, 1,000 a batch."""
    log = await JetStreamLog.connect(nats_url)
    try:
        for start in range(0, len(events), 1000):
            await log.append_batch(events[start : start + 1000])
    finally:
        await log.close()


async def load(
    clients: int, requests: int, call: Callable[[int, int], Awaitable[None]]
) -> list[float]:
    """``clients`` concurrent loops of ``requests`` calls; every call's latency (s)."""
    latencies: list[float] = []

    async def client(c: int) -> None:
        for r in range(requests):
            started = time.perf_counter()
            await call(c, r)
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(client(c) for c in range(clients)))
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    ms = np.array(latencies) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2), "calls": len(latencies)}  # fmt: skip


emit = emitter("service")


async def over_http(
    url: str, cid: str, queries: list[str], contents: list[str], clients: int, requests: int
) -> tuple[list[float], list[float]]:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=url, timeout=120, limits=limits, headers=OPERATOR
    ) as http:

        async def search(c: int, r: int) -> None:
            body = {"collective_id": cid, "text": queries[(c * requests + r) % len(queries)],
                    "k": 10}  # fmt: skip
            response = await http.post("/v1/search_hybrid", json=body)
            response.raise_for_status()

        async def record(c: int, r: int) -> None:
            body = {"collective_id": cid, "content": contents[c * requests + r]}
            response = await http.post("/v1/record_experience", json=body)
            response.raise_for_status()

        await search(0, 0)  # warm up
        return await load(clients, requests, search), await load(clients, requests, record)


async def in_process(
    data_dir: Path, cid: str, queries: list[str], contents: list[str], clients: int,
    requests: int,
) -> tuple[list[float], list[float]]:  # fmt: skip
    db = await PulseDB.open(data_dir)
    try:

        async def search(c: int, r: int) -> None:
            await db.search_hybrid(cid, queries[(c * requests + r) % len(queries)], k=10)  # type: ignore[arg-type]

        async def record(c: int, r: int) -> None:
            await db.record_experience(cid, contents[c * requests + r])  # type: ignore[arg-type]

        await search(0, 0)
        return await load(clients, requests, search), await load(clients, requests, record)
    finally:
        await db.close()


SECRET = "bench-operator-secret"  # the operator secret of the service start_service starts
OPERATOR = {"Authorization": f"Bearer {SECRET}"}  # the header of a request as the operator


def stop_service(process: subprocess.Popen[str]) -> None:
    """A ``start_service`` process stopped as Ctrl-C would (SIGTERM), killed if it does
    not end."""
    process.send_signal(signal.SIGTERM)
    try:
        process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()


def start_service(data_dir: Path, nats_url: str | None = None) -> tuple[subprocess.Popen[str], str]:
    """``pulse up`` on ``data_dir`` (its embedded NATS server, or the one at ``nats_url``)
    on a free port, once it serves; the process and its HTTP URL."""
    pulse = str(Path(sys.executable).parent / "pulse")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    server = ["--nats-url", nats_url] if nats_url else []
    process = subprocess.Popen(
        [pulse, "--data-dir", str(data_dir), *server, "up", "--port", "0", "--token", SECRET],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert process.stdout is not None
    seen = ""
    while "Ctrl-C stops" not in seen:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"pulse up ended: {seen}")
        seen += line
    match = re.search(r"HTTP\s+(http://\S+)", seen)
    assert match
    return process, match.group(1)


async def main(n: int, clients: int, requests: int) -> None:
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(prefix="pulse-bench-service-") as tmp:
        data_dir = Path(tmp) / "data"
        collective, events = corpus(n, rng)
        cid = str(collective)
        await fill(data_dir, events)
        del events
        queries = [words(rng, 3) for _ in range(clients * requests)]
        contents = [words(rng, 12) for _ in range(2 * clients * requests)]
        started = time.perf_counter()
        process, url = start_service(data_dir)
        emit("service_start", seconds=round(time.perf_counter() - started, 1), experiences=n)
        try:
            http_search, http_record = await over_http(
                url, cid, queries, contents[: clients * requests], clients, requests
            )
        finally:
            stop_service(process)
        local_search, local_record = await in_process(
            data_dir, cid, queries, contents[clients * requests :], clients, requests
        )
        for figure, http, local in (
            ("search_hybrid", http_search, local_search),
            ("record_experience", http_record, local_record),
        ):
            h, loc = summary(http), summary(local)
            emit(figure, clients=clients, experiences=n, http=h, in_process=loc,
                 ratio_p50=round(h["p50_ms"] / loc["p50_ms"], 2),
                 ratio_p99=round(h["p99_ms"] / loc["p99_ms"], 2))  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="experiences (100000)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (16)")
    parser.add_argument("--requests", type=int, default=25, help="calls per client (25)")
    options = parser.parse_args()
    asyncio.run(main(options.n, options.clients, options.requests))

"""Benchmark: fast at the edges (issue 28, targets 1 and 2), beside Postgres+pgvector.

    python -m ops.bench.edges [--size X] [--m 16] [--ef-construction 64]

Needs the ``bench`` extra (``pip install -e '.[bench]'``: ``pgserver``'s Postgres 16 with
pgvector, and ``psycopg``); ``make bench-edges`` installs it and runs this.

The same data for every side: a collective of ``--size`` x 100,000 experiences (20
words each from a 2,000-word vocabulary; 384-d unit vectors near 40 random centers,
``ops.bench.service``'s corpus), and the same calls. Three sides:

- in_process: a ``PulseDB`` in this process on a data directory of its own (its
  embedded NATS holding the collective, ``hash`` embedder, explicit vectors);
- http: ``pulse up`` in its own process on another data directory holding the same
  events (a copy of the first's log), called with ``http.client`` over keep-alive connections;
- postgres: the peer of ``ops.bench.pg`` (a table, HNSW, GIN full text), called with
  ``psycopg`` over its unix socket, autocommit, ``synchronous_commit`` on.

Setup: both Pulse logs filled, the peer loaded (COPY) and indexed, Pulse's recall@10 of
``search_similar`` measured against exact (numpy) search on 200 queries drawn like the
data, and the peer's ``hnsw.ef_search`` set to the smallest of a ladder whose recall@10
on the same queries is at least Pulse's (printed: ``recall_calibration``).

Target 2, no HTTP tax: for ``similar`` (a vector, k=10), ``text`` (three words, OR
semantics), ``hybrid`` (three words and a vector, RRF of 50 candidates each), ``context``
(``get_context_candidates`` with text and vector; the peer: its hybrid query and the
5 latest rows in one statement), ``record`` (content and vector) and ``reinforce`` (the
peer: an UPDATE of a counter): sequential calls, the sides in alternating blocks of 25
(their order rotating block by block), HTTP over ONE keep-alive connection. Searches
ask for pure relevance (``energy_weight`` 0: the ranking the peer's SQL computes).
Figures: each call's p50 over HTTP / in-process (target <= 1.3) and over HTTP /
Postgres (target <= 1.0), with the recall@10 of the timed vector searches of each side
beside them. A fourth side, ``floor``, takes its turn in the same blocks: the same client
and bodies on one keep-alive connection to ``ops.bench.http_floor``, a server that only
answers (each call's answer recorded from ``pulse up``); ``http_floor_vs_in_process`` =
(in-process p50 + floor p50) / in-process p50, the least HTTP / in-process ratio this
transport leaves any Python server.

Target 1, no write tail: ``--size`` x 20,000 single writes (``record_experience`` with
content and vector; the peer: one INSERT) from 1, then 8, concurrent writers on each
side (in-process: tasks; HTTP and Postgres: a thread and a connection per writer), in
rounds where the sides take turns (order rotating). Figures per side and writers: p99 /
p50 (target <= 3) and p99 / Postgres's p99 (target <= 1). A fourth side, ``raw``, takes
its turn in the same rounds: acknowledged nats-py publishes of the same writes, encoded
as record events, to a stream of their own on the in-process side's NATS server (a task
per writer); ``raw_log_p99_over_p50`` is the tail of the log under every Pulse write.

Output: one JSON line per figure (``value``, ``target``, ``met`` and the numbers it
comes from), progress and a readable table on stderr. Postgres and ``pulse up`` are
stopped however the run ends (Ctrl-C, SIGTERM, an error).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import nats
import numpy as np
import numpy.typing as npt
from nats.js import JetStreamContext

from eventlog.ids import uuid7
from ops.bench import emitter, table
from ops.bench import pg as peer
from ops.bench.engine import Material, publish_all, raw_stream
from ops.bench.service import OPERATOR, centers, fill, near, recorded, start_service, stop_service
from sync import PulseDB

Vectors = npt.NDArray[np.float32]
SIDES = ("in_process", "http", "postgres")
# beside them, two floors: the HTTP transport with a server that only answers (target 2)
# and raw acknowledged publishes to the in-process side's NATS server (target 1)
SIDES_2, SIDES_1 = (*SIDES, "floor"), (*SIDES, "raw")
KINDS = ("similar", "text", "hybrid", "context", "record", "reinforce")  # searches first
BLOCK = 25  # calls of one kind on one side before the next side's turn (target 2)
K, POOL, RECENT, WORDS, QUERY_WORDS, VOCABULARY = 10, 50, 5, 20, 3, 2000
EF_LADDER = (10, 16, 20, 24, 32, 40, 48, 64, 80, 100, 128, 160, 200, 256, 320, 400, 512,
             640, 800, 1000)  # fmt: skip
HTTP_TARGET, PG_TARGET, TAIL_TARGET = 1.3, 1.0, 3.0

emit = emitter("edges")


def progress(message: str) -> None:
    print(f"edges: {message}", file=sys.stderr, flush=True)


# -- pure helpers (tests/test_bench_pg.py checks them) ----------------------------------------


def percentile_ms(latencies: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (linear interpolation) of latencies in seconds, in ms."""
    return float(np.percentile(np.asarray(latencies, dtype=np.float64) * 1000, p))


def exact_top(base: Vectors, queries: Vectors, k: int) -> npt.NDArray[np.int64]:
    """The indexes of each query's ``k`` nearest rows of ``base`` by cosine (the rows
    and queries are unit vectors: the largest inner products), best first."""
    scores = queries @ base.T
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
    return np.take_along_axis(top, order, axis=1)


def recall_at(found: Sequence[Sequence[Any]], truth: Sequence[Sequence[Any]], k: int) -> float:
    """Mean over queries of |found's first k ∩ truth's first k| / k."""
    if not truth:
        return 0.0
    hits = [len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth, strict=True)]
    return float(np.mean(hits))


def sig(x: float) -> float:
    return float(f"{x:.3g}")


# -- the data ----------------------------------------------------------------------------------


def words(rng: np.random.Generator, count: int) -> str:
    return " ".join(f"w{int(i)}" for i in rng.integers(0, VOCABULARY, count))


@dataclass
class Data:
    """The collective, the calls' arguments and the writes' material, the same for every
    side."""

    cid: UUID
    ids: list[UUID]
    contents: list[str]
    vectors: Vectors
    around: Any
    seed: int
    index: dict[UUID, int] = field(default_factory=dict)

    @classmethod
    def make(cls, n: int, seed: int = 28) -> tuple[Data, list[Any]]:
        rng = np.random.default_rng(seed)
        around = centers(rng)
        vectors = near(around, n, rng)
        contents = [words(rng, WORDS) for _ in range(n)]
        cid, ids, events = recorded(contents, vectors)
        data = cls(cid, ids, contents, vectors, around, seed)
        data.index = {eid: i for i, eid in enumerate(ids)}
        return data, events

    def rng(self, *purpose: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *purpose])

    def queries(self, n: int, purpose: int) -> Vectors:
        """``n`` query vectors drawn as the data are (near the same centers)."""
        return np.asarray(near(self.around, n, self.rng(1, purpose)), dtype=np.float32)

    def texts(self, n: int, purpose: int) -> list[str]:
        rng = self.rng(2, purpose)
        return [words(rng, QUERY_WORDS) for _ in range(n)]

    def writes(self, n: int, purpose: int) -> tuple[list[str], Vectors]:
        rng = self.rng(3, purpose)
        contents = [words(rng, WORDS) for _ in range(n)]
        return contents, np.asarray(near(self.around, n, rng), dtype=np.float32)

    def hot(self, n: int, purpose: int) -> list[UUID]:
        """``n`` ids of experiences to reinforce."""
        rng = self.rng(4, purpose)
        return [self.ids[int(i)] for i in rng.integers(0, len(self.ids), n)]


@dataclass(frozen=True)
class Calls:
    """The ``n`` arguments of each kind of call of target 2."""

    queries: Vectors
    texts: list[str]
    contents: list[str]
    vectors: Vectors
    hot: list[UUID]

    @classmethod
    def make(cls, data: Data, n: int) -> Calls:
        contents, vectors = data.writes(n, 0)
        return cls(data.queries(n, 0), data.texts(n, 0), contents, vectors, data.hot(n, 0))


# -- the sides ---------------------------------------------------------------------------------


def hit_ids(answer: Any) -> list[UUID]:
    """The experience ids of a search's or a context's JSON answer, in order."""
    items = answer["similar"] if isinstance(answer, dict) else answer
    return [UUID(item["experience"]["experience_id"]) for item in items]


class Connection:
    """One keep-alive HTTP/1.1 connection to ``pulse up`` (``http.client``), used from one
    thread at a time. The service closes a connection idle for its keep-alive timeout
    (5 s), as a client's turn waits while the other sides take theirs: a block of calls
    then opens a new one before its clock starts, as a client pool would (``reconnects``
    counts them)."""

    IDLE = 4.0  # seconds: reconnect before the service's 5 s timeout can close mid-request

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.http = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
        self.headers = {**OPERATOR, "Content-Type": "application/json"}
        self.used = 0.0
        self.reconnects = -1  # the first connection is not one

    def fresh(self) -> None:
        """An open connection the service has not closed, or a new one."""
        sock = self.http.sock
        closed = sock is None or bool(select.select([sock], [], [], 0)[0])  # EOF: readable
        if closed or time.monotonic() - self.used > self.IDLE:
            self.http.close()
            self.http.connect()
            self.reconnects += 1

    def calls(self, route: str, bodies: Sequence[bytes]) -> tuple[list[float], list[bytes]]:
        """``bodies`` posted to ``route`` one after the other: each call's latency (s) and
        answer."""
        self.fresh()
        latencies, answers = [], []
        for body in bodies:
            started = time.perf_counter()
            self.http.request("POST", route, body=body, headers=self.headers)
            response = self.http.getresponse()
            answer = response.read()
            latencies.append(time.perf_counter() - started)
            if response.status != 200:
                raise RuntimeError(f"{route}: {response.status} {answer[:300]!r}")
            answers.append(answer)
        self.used = time.monotonic()
        return latencies, answers

    def close(self) -> None:
        self.http.close()


ROUTES = {"similar": "search_similar", "text": "search_text", "hybrid": "search_hybrid",
          "context": "get_context_candidates", "record": "record_experience",
          "reinforce": "reinforce_experience"}  # fmt: skip


def http_body(kind: str, cid: UUID, calls: Calls, i: int) -> bytes:
    c = str(cid)
    pure = {"energy_weight": 0.0}
    if kind == "similar":
        body: dict[str, Any] = {"collective_id": c, "query": calls.queries[i].tolist(), "k": K,
                                "embedder": "hash", **pure}  # fmt: skip
    elif kind == "text":
        body = {"collective_id": c, "text": calls.texts[i], "k": K, **pure}
    elif kind in ("hybrid", "context"):
        body = {"collective_id": c, "text": calls.texts[i], "embedding": calls.queries[i].tolist(),
                "k": K, "embedder": "hash", **pure}  # fmt: skip
        if kind == "context":
            body["recent"] = RECENT
    elif kind == "record":
        body = {"collective_id": c, "content": calls.contents[i],
                "embedding": calls.vectors[i].tolist(), "embedder": "hash"}  # fmt: skip
    else:
        body = {"experience_id": str(calls.hot[i])}
    return json.dumps(body).encode()


def local_call(db: PulseDB, kind: str, cid: UUID, calls: Calls, i: int) -> Awaitable[Any]:
    if kind == "similar":
        return db.search_similar(cid, calls.queries[i], k=K, embedder="hash", energy_weight=0.0)
    if kind == "text":
        return db.search_text(cid, calls.texts[i], k=K, energy_weight=0.0)
    if kind == "hybrid":
        return db.search_hybrid(cid, calls.texts[i], calls.queries[i], k=K, embedder="hash",
                                energy_weight=0.0)  # fmt: skip
    if kind == "context":
        return db.get_context_candidates(
            collective_id=cid, text=calls.texts[i], embedding=calls.queries[i], k=K,
            embedder="hash", energy_weight=0.0, recent=RECENT,
        )  # fmt: skip
    if kind == "record":
        return db.record_experience(cid, calls.contents[i], calls.vectors[i], embedder="hash")
    return db.reinforce_experience(calls.hot[i])


def pg_statement(kind: str, cid: UUID, calls: Calls, i: int) -> tuple[str, dict[str, Any]]:
    if kind == "similar":
        return peer.SIMILAR, {"q": peer.Vector(calls.queries[i]), "c": cid, "k": K}
    if kind == "text":
        return peer.TEXT, {"t": peer.or_query(calls.texts[i]), "c": cid, "k": K}
    if kind in ("hybrid", "context"):
        params = {"q": peer.Vector(calls.queries[i]), "t": peer.or_query(calls.texts[i]),
                  "c": cid, "k": K, "pool": POOL, "recent": RECENT}  # fmt: skip
        return (peer.HYBRID if kind == "hybrid" else peer.CONTEXT), params
    if kind == "record":
        return peer.RECORD, {"id": uuid7(), "c": cid, "content": calls.contents[i],
                             "importance": 0.5, "v": peer.Vector(calls.vectors[i])}  # fmt: skip
    return peer.REINFORCE, {"id": calls.hot[i]}


def pg_calls(
    connection: Any, statements: Sequence[tuple[str, dict[str, Any]]], answers: bool
) -> tuple[list[float], list[list[UUID]]]:
    """``statements`` run one after the other: each one's latency (s), and (``answers``)
    the ids of its rows."""
    latencies, found = [], []
    for query, params in statements:
        started = time.perf_counter()
        cursor = connection.execute(query, params)
        rows = cursor.fetchall() if cursor.description else []
        latencies.append(time.perf_counter() - started)
        if answers:
            found.append([row[0] for row in rows])
    return latencies, found


# -- setup -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    experiences: int = 100_000
    writes: int = 20_000  # of each side, for each number of writers
    write_rounds: int = 10
    calls: int = 500  # of each kind on each side (target 2)
    warm_up: int = 25  # first calls of each kind and side left out
    recall_queries: int = 200

    def scaled(self, size: float) -> Sizes:
        def n(count: int, least: int) -> int:
            return max(least, round(count * size))

        return Sizes(n(self.experiences, 200), n(self.writes, 40), self.write_rounds,
                     n(self.calls, 20), n(self.warm_up, 5), n(self.recall_queries, 20))  # fmt: skip


@dataclass
class Bench:
    data: Data
    sizes: Sizes
    db: PulseDB
    url: str
    postgres: peer.Postgres
    pg: Any  # the peer connection of target 2 and the checks
    floor_url: str  # ops.bench.http_floor
    js: JetStreamContext  # the raw publisher's, on the in-process side's server
    ef_search: int = 40
    material: Material = field(default_factory=Material)  # encodes the raw side's events
    setup: dict[str, Any] = field(default_factory=dict)


def load_peer(server: peer.Postgres, data: Data, m: int, ef_construction: int) -> dict[str, Any]:
    """The peer's table filled with the collective and indexed; how long each took."""
    with server.connect() as connection:
        server.create(connection)
        started = time.perf_counter()
        rows = server.load(
            connection, data.cid, zip(data.ids, data.contents, data.vectors, strict=True)
        )
        copied = time.perf_counter() - started
        progress(f"postgres: {rows} rows copied in {copied:.1f} s; building its indexes")
        started = time.perf_counter()
        server.index(connection, m, ef_construction)
        indexed = time.perf_counter() - started
        progress(f"postgres: indexes built in {indexed:.1f} s")
        return {"postgres_copy_s": round(copied, 1), "postgres_index_s": round(indexed, 1),
                "postgres_rows": rows, "postgres_mb": server.size_mb(connection)}  # fmt: skip


def calibrate(bench: Bench, local_hits: list[list[UUID]], queries: Vectors) -> dict[str, Any]:
    """The peer's ``hnsw.ef_search``: the smallest of ``EF_LADDER`` whose recall@10 on
    ``queries`` is at least Pulse's (``local_hits``), else the largest."""
    data = bench.data
    truth = [[data.ids[j] for j in row] for row in exact_top(data.vectors, queries, K)]
    pulse = recall_at(local_hits, truth, K)
    tried: dict[int, float] = {}
    for ef in EF_LADDER:
        bench.postgres.set_ef_search(bench.pg, ef)
        found = [
            [row[0] for row in bench.pg.execute(peer.SIMILAR, {"q": peer.Vector(q),
                                                               "c": data.cid, "k": K})]
            for q in queries
        ]  # fmt: skip
        tried[ef] = round(recall_at(found, truth, K), 4)
        if tried[ef] >= pulse:
            break
    ef = next((e for e, r in tried.items() if r >= pulse), EF_LADDER[-1])
    bench.ef_search = ef
    bench.postgres.set_ef_search(bench.pg, ef)
    return {"pulse_recall": round(pulse, 4), "postgres_recall": tried[ef], "ef_search": ef,
            "tried": {str(e): r for e, r in tried.items()}, "queries": len(queries)}  # fmt: skip


# -- target 2 ----------------------------------------------------------------------------------


async def target_2(bench: Bench, pool: ThreadPoolExecutor) -> dict[str, dict[str, Any]]:
    """Each kind of call on each side, in alternating blocks; per kind and side, the
    latencies (s) after the warm-up, and for ``similar`` each call's hit ids."""
    data, sizes = bench.data, bench.sizes
    n = sizes.warm_up + sizes.calls
    calls = Calls.make(data, n)
    connection, floor = Connection(bench.url), Connection(bench.floor_url)
    loop = asyncio.get_running_loop()
    results: dict[str, dict[str, Any]] = {}
    try:
        for kind in KINDS:
            progress(f"target 2: {n} {kind} calls on each side")
            route = "/v1/" + ROUTES[kind]
            latencies: dict[str, list[float]] = {side: [] for side in SIDES_2}
            found: dict[str, list[list[UUID]]] = {side: [] for side in SIDES}
            ef = bench.ef_search if kind == "similar" else max(bench.ef_search, POOL)
            bench.postgres.set_ef_search(bench.pg, ef)
            for block, start in enumerate(range(0, n, BLOCK)):
                span = range(start, min(n, start + BLOCK))
                for side in rotated(block, SIDES_2):
                    if side in ("http", "floor"):
                        bodies = [http_body(kind, data.cid, calls, i) for i in span]
                        took, answers = await loop.run_in_executor(
                            pool, (connection if side == "http" else floor).calls, route, bodies
                        )
                        if kind == "similar" and side == "http":
                            found[side] += [hit_ids(json.loads(a)) for a in answers]
                    elif side == "postgres":
                        statements = [pg_statement(kind, data.cid, calls, i) for i in span]
                        took, ids = await loop.run_in_executor(
                            pool, pg_calls, bench.pg, statements, kind == "similar"
                        )
                        found[side] += ids
                    else:
                        took = []
                        for i in span:
                            started = time.perf_counter()
                            answer = await local_call(bench.db, kind, data.cid, calls, i)
                            took.append(time.perf_counter() - started)
                            if kind == "similar":
                                found[side].append([h.experience.experience_id for h in answer])
                    latencies[side] += took
            results[kind] = {"latencies": {s: v[sizes.warm_up :] for s, v in latencies.items()},
                             "found": found, "ef_search": ef}  # fmt: skip
            if kind == "similar":
                truth = exact_top(data.vectors, calls.queries, K)
                ids = [[data.ids[j] for j in row] for row in truth]
                results[kind]["recall"] = {s: round(recall_at(found[s], ids, K), 4)
                                           for s in SIDES}  # fmt: skip
    finally:
        connection.close()
        floor.close()
    return results


def rotated(block: int, sides: tuple[str, ...]) -> tuple[str, ...]:
    """The sides' order in ``block``: each one first in turn."""
    shift = block % len(sides)
    return sides[shift:] + sides[:shift]


def report_2(results: dict[str, dict[str, Any]], bench: Bench) -> list[list[str]]:
    rows = []
    recall = results["similar"]["recall"]
    for kind, result in results.items():
        p50 = {side: percentile_ms(v, 50) for side, v in result["latencies"].items()}
        p99 = {side: percentile_ms(v, 99) for side, v in result["latencies"].items()}
        detail: dict[str, Any] = {
            "call": kind, "calls": len(result["latencies"]["http"]),
            **{f"{s}_p50_ms": round(p50[s], 3) for s in SIDES_2},
            **{f"{s}_p99_ms": round(p99[s], 3) for s in SIDES_2},
        }  # fmt: skip
        if kind in ("similar", "hybrid", "context"):
            detail["postgres_ef_search"] = result["ef_search"]
        if kind == "similar":
            detail.update({f"{s}_recall": recall[s] for s in SIDES})
        vs_local, vs_pg = p50["http"] / p50["in_process"], p50["http"] / p50["postgres"]
        emit("http_vs_in_process", value=sig(vs_local), target=HTTP_TARGET,
             met=vs_local <= HTTP_TARGET, **detail)  # fmt: skip
        emit("http_vs_postgres", value=sig(vs_pg), target=PG_TARGET, met=vs_pg <= PG_TARGET,
             **detail)  # fmt: skip
        bound = (p50["in_process"] + p50["floor"]) / p50["in_process"]
        emit("http_floor_vs_in_process", value=sig(bound), target=None,
             below_target=bound > HTTP_TARGET, **detail)  # fmt: skip
        note = ""
        if kind == "similar":
            note = " / ".join(f"{recall[s]:.3f}" for s in SIDES)
        elif kind in ("hybrid", "context"):
            note = f"(pg ef_search {result['ef_search']})"
        rows.append([kind, *(f"{p50[s]:.3f}" for s in SIDES_2), mark(vs_local, HTTP_TARGET),
                     f"{bound:.2f}", mark(vs_pg, PG_TARGET), note])  # fmt: skip
    return rows


def mark(value: float, target: float) -> str:
    return f"{value:.2f} {'ok' if value <= target else 'MISS'}"


# -- target 1 ----------------------------------------------------------------------------------


Shares = list[range]  # the indexes of a round's writes each writer makes


async def local_writes(
    db: PulseDB, cid: UUID, contents: list[str], vectors: Vectors, shares: Shares
) -> list[float]:
    """``record_experience`` in this process, a task per writer; each call's latency."""
    took: list[float] = []

    async def writer(share: range) -> None:
        for i in share:
            started = time.perf_counter()
            await db.record_experience(cid, contents[i], vectors[i], embedder="hash")
            took.append(time.perf_counter() - started)

    await asyncio.gather(*(writer(share) for share in shares))
    return took


async def http_writes(
    pool: ThreadPoolExecutor, connections: list[Connection], cid: UUID, contents: list[str],
    vectors: Vectors, shares: Shares,
) -> list[float]:  # fmt: skip
    """``POST /v1/record_experience``, a thread and a connection per writer (the bodies
    encoded before the clock starts); each call's latency."""
    bodies = [
        [json.dumps({"collective_id": str(cid), "content": contents[i],
                     "embedding": vectors[i].tolist(), "embedder": "hash"}).encode()
         for i in share]
        for share in shares
    ]  # fmt: skip
    loop = asyncio.get_running_loop()
    done = await asyncio.gather(*(
        loop.run_in_executor(pool, c.calls, "/v1/record_experience", b)
        for c, b in zip(connections, bodies, strict=True)
    ))  # fmt: skip
    return [t for took, _ in done for t in took]


async def pg_writes(
    pool: ThreadPoolExecutor, connections: list[Any], cid: UUID, contents: list[str],
    vectors: Vectors, shares: Shares,
) -> list[float]:  # fmt: skip
    """One INSERT a write (autocommit), a thread and a connection per writer; each
    statement's latency."""
    statements = [
        [(peer.RECORD, {"id": uuid7(), "c": cid, "content": contents[i], "importance": 0.5,
                        "v": peer.Vector(vectors[i])}) for i in share]
        for share in shares
    ]  # fmt: skip
    loop = asyncio.get_running_loop()
    done = await asyncio.gather(*(
        loop.run_in_executor(pool, pg_calls, c, s, False)
        for c, s in zip(connections, statements, strict=True)
    ))  # fmt: skip
    return [t for took, _ in done for t in took]


async def raw_writes(
    bench: Bench, contents: list[str], vectors: Vectors, shares: Shares
) -> list[float]:
    """The same writes, encoded as record events (before the clock starts), published raw
    and acknowledged, a task per writer; each publish's latency."""
    wires = bench.material.recorded_of(bench.data.cid, contents, vectors)
    took: list[float] = []
    await asyncio.gather(*(publish_all(bench.js, [wires[i] for i in share], took)
                           for share in shares))  # fmt: skip
    return took


async def target_1(bench: Bench, pool: ThreadPoolExecutor, writers: int) -> dict[str, list[float]]:
    """``sizes.writes`` single writes on each side from ``writers`` concurrent writers, in
    rounds where the sides take turns; each side's latencies (s)."""
    data, sizes = bench.data, bench.sizes
    rounds = min(sizes.write_rounds, sizes.writes // writers) or 1
    per_round = sizes.writes // rounds
    latencies: dict[str, list[float]] = {side: [] for side in SIDES_1}
    connections = [Connection(bench.url) for _ in range(writers)]
    pgs = [bench.postgres.connect() for _ in range(writers)]
    try:
        for r in range(rounds):
            contents, vectors = data.writes(per_round, 100 * writers + r + 1)
            shares = [range(w, per_round, writers) for w in range(writers)]
            for side in rotated(r, SIDES_1):
                if side == "http":
                    took = await http_writes(pool, connections, data.cid, contents, vectors, shares)
                elif side == "postgres":
                    took = await pg_writes(pool, pgs, data.cid, contents, vectors, shares)
                elif side == "raw":
                    took = await raw_writes(bench, contents, vectors, shares)
                else:
                    took = await local_writes(bench.db, data.cid, contents, vectors, shares)
                latencies[side] += took
            progress(f"target 1, {writers} writer(s): round {r + 1}/{rounds} "
                     f"({(r + 1) * per_round} writes of each side)")  # fmt: skip
    finally:
        for c in connections:
            c.close()
        for p in pgs:
            p.close()
    return latencies


def report_1(writers: int, latencies: dict[str, list[float]]) -> list[list[str]]:
    p50 = {side: percentile_ms(v, 50) for side, v in latencies.items()}
    p99 = {side: percentile_ms(v, 99) for side, v in latencies.items()}
    rows = []
    for side in SIDES_1:
        tail, vs_pg = p99[side] / p50[side], p99[side] / p99["postgres"]
        detail = {"side": side, "writers": writers, "writes": len(latencies[side]),
                  "p50_ms": round(p50[side], 3), "p99_ms": round(p99[side], 3),
                  "postgres_p99_ms": round(p99["postgres"], 3)}  # fmt: skip
        if side == "raw":  # the log's own tail: no target, the floor of the others'
            emit("raw_log_p99_over_p50", value=sig(tail), target=None, **detail)
        else:
            emit("write_p99_over_p50", value=sig(tail), target=TAIL_TARGET,
                 met=tail <= TAIL_TARGET, **detail)  # fmt: skip
        if side in ("in_process", "http"):
            emit("write_p99_vs_postgres", value=sig(vs_pg), target=PG_TARGET,
                 met=vs_pg <= PG_TARGET, **detail)  # fmt: skip
        rows.append([side, str(writers), f"{p50[side]:.3f}", f"{p99[side]:.3f}",
                     f"{tail:.2f}" if side == "raw" else mark(tail, TAIL_TARGET),
                     mark(vs_pg, PG_TARGET) if side in ("in_process", "http")
                     else "-"])  # fmt: skip
    return rows


# -- the run -----------------------------------------------------------------------------------


async def run(sizes: Sizes, m: int, ef_construction: int) -> int:
    started = time.perf_counter()
    progress(f"making {sizes.experiences} experiences")
    data, events = Data.make(sizes.experiences)
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="edges")
    with tempfile.TemporaryDirectory(prefix="pulse-bench-edges-") as tmp:
        root = Path(tmp)
        progress(f"working in {root}")
        async with AsyncExitStack() as stack:
            stack.callback(pool.shutdown, cancel_futures=True)
            loop = asyncio.get_running_loop()
            postgres = await loop.run_in_executor(pool, peer.Postgres.start, root / "pg")
            stack.callback(postgres.stop)
            progress("postgres started; loading it while Pulse's logs fill")
            loading = loop.run_in_executor(pool, load_peer, postgres, data, m, ef_construction)
            t = time.perf_counter()
            await fill(root / "local", events)
            del events
            # the same log for the service: a copy of the stopped server's directory (its
            # configuration is written anew, with the copy's paths, at each start)
            await loop.run_in_executor(pool, shutil.copytree, root / "local", root / "service")
            filled = time.perf_counter() - t
            progress(f"both Pulse logs filled in {filled:.1f} s; opening both instances")
            t = time.perf_counter()
            # one after the other: two catch-ups of 100,000 events beside the peer's index
            # build starved a log reader on the 2-core machine ("no answer within 10s")
            db = await PulseDB.open(root / "local")
            stack.push_async_callback(db.close)
            await db.sync()
            starting = loop.run_in_executor(pool, start_service, root / "service")
            stack.push_async_callback(stop_started, starting)
            process, url = await starting
            opened = time.perf_counter() - t
            progress(f"Pulse instances open in {opened:.1f} s")
            setup = await loading
            connection = postgres.connect()
            stack.callback(connection.close)
            floor_url = await loop.run_in_executor(
                pool, start_floor, root / "answers", url, data, stack
            )
            assert db.server is not None  # (the in-process side's embedded server)
            publisher = await nats.connect(db.server.url)
            stack.push_async_callback(publisher.close)
            js = await raw_stream(publisher)
            bench = Bench(data, sizes, db, url, postgres, connection, floor_url, js)
            bench.setup = {"experiences": sizes.experiences, "pulse_fill_s": round(filled, 1),
                           "pulse_open_s": round(opened, 1), **setup,
                           "hnsw_m": m, "hnsw_ef_construction": ef_construction,
                           "load_average": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}  # fmt: skip
            emit("setup", **bench.setup)

            queries = data.queries(sizes.recall_queries, 99)
            hits = [
                [h.experience.experience_id for h in await db.search_similar(
                    data.cid, q, k=K, embedder="hash", energy_weight=0.0)]
                for q in queries
            ]  # fmt: skip
            calibration = calibrate(bench, hits, queries)
            plan = postgres.plan(connection, peer.SIMILAR,
                                 {"q": peer.Vector(queries[0]), "c": data.cid, "k": K})  # fmt: skip
            # (on a tiny table the planner prefers an exact scan, of recall 1)
            calibration["postgres_uses_hnsw"] = "experiences_embedding" in plan
            emit("recall_calibration", **calibration)
            pulse_recall, pg_recall = calibration["pulse_recall"], calibration["postgres_recall"]
            progress(f"recall@10: Pulse {pulse_recall}, Postgres {pg_recall} "
                     f"at ef_search {bench.ef_search}")  # fmt: skip

            results = await target_2(bench, pool)
            rows_2 = report_2(results, bench)
            rows_1: list[list[str]] = []
            written = 0
            for writers in (1, 8):
                latencies = await target_1(bench, pool, writers)
                written += len(latencies["postgres"])
                rows_1 += report_1(writers, latencies)

            rows = postgres.rows(connection)
            expected = sizes.experiences + sizes.warm_up + sizes.calls + written
            emit("peer_rows", rows=rows, expected=expected, met=rows == expected,
                 seconds=round(time.perf_counter() - started, 1),
                 load_average=round(os.getloadavg()[0], 2))  # fmt: skip
            print(
                "\nTarget 2, no HTTP tax: p50 ms of sequential calls (HTTP: one keep-alive "
                f"connection), {sizes.calls} calls each, {sizes.experiences} experiences\n"
                + table(["call", "in-process", "http", "postgres", "floor",
                         "http/in-process <= 1.3", "(in-process+floor)/in-process",
                         "http/postgres <= 1.0", "recall@10 (in-proc / http / pg)"], rows_2)
                + f"\n\nTarget 1, no write tail: {sizes.writes} single writes per side and "
                "writer count\n"
                + table(["side", "writers", "p50 ms", "p99 ms", "p99/p50 <= 3",
                         "p99/postgres p99 <= 1"], rows_1),
                file=sys.stderr,
            )  # fmt: skip
            return 0 if rows == expected else 1
    return 1


def start_floor(answers: Path, url: str, data: Data, stack: AsyncExitStack) -> str:
    """``ops.bench.http_floor`` serving one answer ``pulse up`` at ``url`` gave to each
    kind of call (recorded in ``answers``); its URL. Stopped with ``stack``."""
    answers.mkdir()
    calls, connection = Calls.make(data, 1), Connection(url)
    try:
        for kind in KINDS:
            _, [answer] = connection.calls(
                "/v1/" + ROUTES[kind], [http_body(kind, data.cid, calls, 0)]
            )
            (answers / ROUTES[kind]).write_bytes(answer)
    finally:
        connection.close()
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.bench.http_floor", str(answers)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    stack.callback(stop_floor, process)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("floor "):
        raise RuntimeError(f"ops.bench.http_floor did not start: {line!r}")
    return line.split()[1]


def stop_floor(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def stop_started(starting: asyncio.Future[Any]) -> None:
    try:
        process, _ = await starting
    except Exception:  # it did not start: nothing to stop (its error is raised elsewhere)
        return
    await asyncio.to_thread(stop_service, process)


@contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so every cleanup runs."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.edges", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--size", type=float, default=1.0,
                        help="scale the collective and the numbers of calls (1.0)")  # fmt: skip
    parser.add_argument("--m", type=int, default=16, help="the peer's HNSW m (16)")
    parser.add_argument("--ef-construction", type=int, default=64,
                        help="the peer's HNSW ef_construction (64)")  # fmt: skip
    options = parser.parse_args(argv)
    if options.size <= 0:
        parser.error("--size must be positive")
    with terminated_as_interrupted():
        return asyncio.run(run(Sizes().scaled(options.size), options.m, options.ef_construction))


if __name__ == "__main__":
    sys.exit(main())

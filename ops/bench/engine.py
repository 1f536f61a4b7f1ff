"""Benchmark: the projection engine's targets (DESIGN.md, "The projection engine"), each
Pulse figure beside its peer measured in the same run.

    python -m ops.bench.engine [--writes 480] [--rounds 3] [--experiences 3000]

One embedded NATS server (sync_interval always) serves Pulse and the raw nats-py peer;
the peer publishes the same kind of encoded events (``encode_event``: same subject under
a ``raw.`` prefix, same headers and body bytes) on its own stream, RAW, so no instance
folds them. 384-d vectors and about 200 bytes of content throughout.

- write_1_caller_record / write_1_caller_reinforce: acknowledged ``record_experience`` /
  ``reinforce_experience`` calls per second from one caller, beside awaited raw
  ``js.publish`` calls; target ratio >= 0.5.
- writes_16_callers (op record, op reinforce): the same from 16 concurrent tasks
  (reinforce: 16 experiences, one per task), beside 16 tasks of raw publishes; >= 0.7.
  Each write figure also prints the CPU per call of each side (``pulse_cpu_us``: the
  process, every thread; ``raw_cpu_us``: the event loop's thread during the peer's
  rounds) and their ``cpu_ratio`` (issue 28's target: <= 2.5).
- batch_record_1000: ``record_experiences`` of 1,000 items, beside FAISS alone adding the
  same normalized vectors to a fresh ``IndexIDMap2(IndexFlatIP(384))`` (the index of a
  collective that size); ratio = FAISS time / Pulse time, median of the rounds; >= 0.8.
  Also printed, to show where the time goes: FAISS adding them to an HNSW graph, and
  the log alone committing the same 1,000 encoded events as one atomic batch.
- convergence_lag: instance A's ``record_experience`` until instance B's
  ``watch_experiences`` yields it, beside a raw publish until an ordered push consumer
  on another connection receives it; p50 ratio <= 3 and Pulse p99 <= 10 ms.
- health_under_load: ``pulse up`` on a data directory of ``--experiences`` experiences;
  ``GET /health`` p50 / p99 idle, then while another process runs 16 HTTP clients
  calling ``search_hybrid`` in a loop and one heavy SQL query (a self-join over
  experiences) through ``POST /v1/sql``; p99 under load <= 50 ms.

Rates alternate Pulse and peer round by round and report the median round. Each figure
is one JSON line: both sides, ``ratio``, ``target`` and ``met``; a figure is printed
whether or not it meets its target.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path
from typing import Any
from uuid import UUID

import faiss as _faiss
import httpx
import nats
import numpy as np
import numpy.typing as npt
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api

from eventlog import EmbeddedNats, encode_event
from eventlog import events as ev
from eventlog.codec import WireMessage
from eventlog.ids import uuid7
from ops.bench import emitter
from ops.bench.service import OPERATOR, corpus, fill, start_service, words
from sync import PulseDB

faiss: Any = _faiss  # as in projections/vectors.py: its stubs miss the Python wrappers

DIM, CALLERS, BATCH = 384, 16, 1000
RAW_STREAM, RAW_PREFIX = "RAW", "raw"
FIGURES = ("write_1_caller_record", "write_1_caller_reinforce", "writes_16_callers",
           "batch_record_1000", "convergence_lag", "health_under_load")  # fmt: skip
# seconds of CPU on every core at a few thousand experiences (DuckDB, both threads)
HEAVY_SQL = (
    "SELECT count(*) AS pairs FROM experiences a, experiences b "
    "WHERE md5(a.content || b.content) < '1'"
)

Vectors = npt.NDArray[np.float32]
Action = Callable[[], Awaitable[None]]


emit = emitter("engine")


def pct(samples_ms: Sequence[float], p: float) -> float:
    return round(float(np.percentile(np.asarray(samples_ms), p)), 3)


def median(samples: Sequence[float]) -> float:
    return float(np.median(np.asarray(samples)))


def sig(x: float) -> float:
    """Three significant digits: a ratio far below 1 still shows its size."""
    return float(f"{x:.3g}")


class Material:
    """Content and vectors for the writes, and the raw peer's encoded events."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = np.random.default_rng(seed)
        self.instance = uuid7()  # the raw peer's writer
        self.counter = 0

    def items(self, n: int) -> tuple[list[str], Vectors]:
        contents = []
        for _ in range(n):
            self.counter += 1
            text = f"lesson {self.counter}: retry with the same idempotency key, " + words(
                self.rng, 40
            )
            contents.append(text[:200])
        return contents, self.rng.normal(size=(n, DIM)).astype(np.float32)

    def hlc(self) -> int:
        self.counter += 1
        return ev.pack_hlc(int(time.time() * 1000)) + self.counter % 60_000

    def recorded(self, cid: UUID, n: int) -> list[WireMessage]:
        """``n`` encoded experience.recorded events, as ``record_experience`` writes them."""
        return self.recorded_of(cid, *self.items(n))

    def recorded_of(
        self, cid: UUID, contents: Sequence[str], vectors: Vectors
    ) -> list[WireMessage]:
        """The encoded experience.recorded events of ``contents`` and their ``vectors``."""
        return [
            raw(
                ev.ExperienceRecorded(
                    event_id=uuid7(), instance_id=self.instance, hlc=self.hlc(),
                    experience_id=uuid7(), collective_id=cid, content=content,
                    embedding=ev.pack_vector(vector), experience_type=ev.Generic(),
                    importance=0.5, confidence=0.5, source_agent="agent",
                )
            )
            for content, vector in zip(contents, vectors, strict=True)
        ]  # fmt: skip

    def reinforced(self, cid: UUID, eid: UUID, n: int, start: int) -> list[WireMessage]:
        """``n`` encoded experience.reinforced events (totals start+1 .. start+n)."""
        return [
            raw(
                ev.ExperienceReinforced(
                    event_id=uuid7(), instance_id=self.instance, hlc=self.hlc(),
                    experience_id=eid, collective_id=cid, applications=start + i + 1,
                )
            )
            for i in range(n)
        ]  # fmt: skip


def raw(event: ev.Event) -> WireMessage:
    wire = encode_event(event)
    return WireMessage(f"{RAW_PREFIX}.{wire.subject}", wire.headers, wire.payload)


async def publish_all(
    js: JetStreamContext, wires: Sequence[WireMessage], latencies: list[float] | None = None
) -> None:
    """Awaited raw publishes, one after the other; each one's latency (s) is appended to
    ``latencies`` if given."""
    for wire in wires:
        started = time.perf_counter()
        await js.publish(wire.subject, wire.payload, headers=wire.headers)
        if latencies is not None:
            latencies.append(time.perf_counter() - started)


def split(items: Sequence[Any], parts: int) -> list[Sequence[Any]]:
    return [items[i::parts] for i in range(parts)]


async def timed(action: Action) -> tuple[float, float, float]:
    """Wall seconds of ``action``; CPU seconds of the thread running the event loop (a raw
    nats-py peer does all its work on that thread), and of the process, meanwhile."""
    started, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
    await action()
    return (time.perf_counter() - started, time.thread_time() - thread,
            time.process_time() - process)  # fmt: skip


@dataclass(frozen=True)
class Rates:
    """Pulse and its raw peer over alternating rounds of ``calls`` calls each.

    Rates are the median round's. CPU is per call over all rounds: the raw peer's is the
    CPU of the event loop's thread during its rounds (nats-py works on it alone); Pulse's
    is the process's CPU, every thread, during its rounds, plus that of the threads
    other than the loop's during the peer's rounds (Pulse finishing its writes' work:
    flushes, index saves)."""

    calls: int
    rounds: int
    pulse_per_s: float
    raw_per_s: float
    pulse_cpu_us: float
    raw_cpu_us: float

    @property
    def ratio(self) -> float:
        return self.pulse_per_s / self.raw_per_s

    @property
    def cpu_ratio(self) -> float:
        return self.pulse_cpu_us / self.raw_cpu_us


async def measure_rates(
    calls: int, rounds: int, pulse: Callable[[], Action], peer: Callable[[], Action]
) -> Rates:
    """Calls/s and CPU per call of Pulse and the raw peer, alternating round by round
    (P R R P P R ...). Each factory makes its round's data before the clock starts and
    returns the timed part."""
    pulse_rates: list[float] = []
    raw_rates: list[float] = []
    pulse_cpu = raw_cpu = 0.0
    for i in range(rounds):
        for make, rates in [(pulse, pulse_rates), (peer, raw_rates)][:: 1 if i % 2 == 0 else -1]:
            action = make()
            wall, thread, process = await timed(action)
            rates.append(calls / wall)
            if make is peer:
                raw_cpu += thread
                pulse_cpu += process - thread
            else:
                pulse_cpu += process
    total = calls * rounds
    return Rates(calls, rounds, median(pulse_rates), median(raw_rates),
                 pulse_cpu / total * 1e6, raw_cpu / total * 1e6)  # fmt: skip


async def compare_rates(
    figure: str, calls: int, rounds: int, pulse: Callable[[], Action],
    peer: Callable[[], Action], target: float, **extra: object,
) -> None:  # fmt: skip
    """Calls/s of Pulse and the raw peer, alternating, median of ``rounds`` rounds (and
    the CPU per call of each, see ``Rates``)."""
    r = await measure_rates(calls, rounds, pulse, peer)
    emit(figure, **extra, calls=calls, rounds=rounds, pulse_per_s=round(r.pulse_per_s, 1),
         raw_js_publish_per_s=round(r.raw_per_s, 1), ratio=sig(r.ratio), target=f">= {target}",
         met=r.ratio >= target, pulse_cpu_us=round(r.pulse_cpu_us),
         raw_cpu_us=round(r.raw_cpu_us), cpu_ratio=sig(r.cpu_ratio))  # fmt: skip


# -- writes ------------------------------------------------------------------------------------


def pulse_records(
    db: PulseDB, cid: UUID, data: Material, total: int, callers: int = 1,
    latencies: list[float] | None = None,
) -> Callable[[], Action]:  # fmt: skip
    """Rounds of ``total`` ``record_experience`` calls (content and a 384-d vector each)
    from ``callers`` concurrent tasks; each call's latency (s) goes to ``latencies``."""

    def factory() -> Action:
        contents, vectors = data.items(total)
        shares = split(list(zip(contents, vectors, strict=True)), callers)

        async def task(share: Sequence[tuple[str, Vectors]]) -> None:
            for content, vector in share:
                started = time.perf_counter()
                await db.record_experience(cid, content, vector)
                if latencies is not None:
                    latencies.append(time.perf_counter() - started)

        async def run() -> None:
            await asyncio.gather(*(task(share) for share in shares))

        return run

    return factory


def raw_publishes(
    js: JetStreamContext, make: Callable[[], list[WireMessage]], callers: int = 1,
    latencies: list[float] | None = None,
) -> Callable[[], Action]:  # fmt: skip
    """Rounds of awaited raw publishes of ``make()``'s messages (made before the clock
    starts) from ``callers`` concurrent tasks, task i taking messages i, i+callers, ..."""

    def factory() -> Action:
        shares = split(make(), callers)

        async def run() -> None:
            await asyncio.gather(*(publish_all(js, share, latencies) for share in shares))

        return run

    return factory


def raw_records(
    js: JetStreamContext, cid: UUID, data: Material, total: int, callers: int = 1,
    latencies: list[float] | None = None,
) -> Callable[[], Action]:  # fmt: skip
    """The raw peer of ``pulse_records``: the same kind of encoded events, published."""
    return raw_publishes(js, lambda: data.recorded(cid, total), callers, latencies)


def pulse_reinforcements(
    db: PulseDB, targets: Sequence[UUID], per_target: int
) -> Callable[[], Action]:
    """Rounds of ``reinforce_experience`` calls: one task per target, ``per_target``
    calls each."""

    def factory() -> Action:
        async def task(target: UUID) -> None:
            for _ in range(per_target):
                await db.reinforce_experience(target)

        async def run() -> None:
            await asyncio.gather(*(task(t) for t in targets))

        return run

    return factory


def raw_reinforcements(
    js: JetStreamContext, cid: UUID, data: Material, totals: dict[UUID, int], per_target: int
) -> Callable[[], Action]:
    """The raw peer of ``pulse_reinforcements``: one task per (made-up) experience in
    ``totals``, publishing its next ``per_target`` totals (``totals`` kept up to date)."""

    def make() -> list[WireMessage]:
        wires: list[WireMessage] = []
        for target, done in totals.items():
            wires += data.reinforced(cid, target, per_target, done)
            totals[target] = done + per_target
        n = len(totals)  # task t (every n-th message from t) publishes target t's totals
        return [wires[t * per_target + r] for r in range(per_target) for t in range(n)]

    return raw_publishes(js, make, len(totals))


async def writes(
    db: PulseDB, js: JetStreamContext, cid: UUID, data: Material, calls: int, rounds: int,
    figures: set[str],
) -> None:  # fmt: skip
    if "write_1_caller_record" in figures:
        await compare_rates(
            "write_1_caller_record", calls, rounds, pulse_records(db, cid, data, calls),
            raw_records(js, cid, data, calls), 0.5,
        )  # fmt: skip

    if "write_1_caller_reinforce" in figures:
        contents, vectors = data.items(1)
        eid = await db.record_experience(cid, contents[0], vectors[0])
        await compare_rates(
            "write_1_caller_reinforce", calls, rounds, pulse_reinforcements(db, [eid], calls),
            raw_reinforcements(js, cid, data, {uuid7(): 0}, calls), 0.5,
        )  # fmt: skip

    if "writes_16_callers" in figures:
        per_task = max(1, calls // CALLERS)
        total = per_task * CALLERS
        await compare_rates(
            "writes_16_callers", total, rounds, pulse_records(db, cid, data, total, CALLERS),
            raw_records(js, cid, data, total, CALLERS), 0.7, op="record", callers=CALLERS,
        )  # fmt: skip
        hot = await hot_experiences(db, cid, data, CALLERS)
        await compare_rates(
            "writes_16_callers", total, rounds, pulse_reinforcements(db, hot, per_task),
            raw_reinforcements(js, cid, data, {uuid7(): 0 for _ in hot}, per_task), 0.7,
            op="reinforce", callers=CALLERS,
        )  # fmt: skip


async def hot_experiences(db: PulseDB, cid: UUID, data: Material, n: int) -> list[UUID]:
    """``n`` new experiences, recorded one after the other, to be reinforced."""
    contents, vectors = data.items(n)
    return [await db.record_experience(cid, c, v) for c, v in zip(contents, vectors, strict=True)]


async def batch_record(db: PulseDB, data: Material, rounds: int, peer: NATS) -> None:
    """``record_experiences`` of 1,000 items beside FAISS adding the same vectors alone
    (the issue's peer: the flat index a collective of that size holds), and, to show
    where the time goes, beside two more: FAISS adding them to an HNSW graph (what a
    collective past ``hnsw_threshold`` holds) and the log alone committing the same
    1,000 encoded events as one raw JetStream atomic batch."""
    record_experiences: Callable[..., Awaitable[list[UUID]]] | None = getattr(
        db, "record_experiences", None
    )
    if record_experiences is None:
        emit("batch_record_1000", skipped="no record_experiences")
        return
    pulse_s: list[float] = []
    faiss_s: list[float] = []
    hnsw_s: list[float] = []
    log_s: list[float] = []
    for i in range(rounds):
        cid = await db.create_collective("bench", f"batch {i}", DIM)  # a fresh collective
        contents, vectors = data.items(BATCH)
        items = [
            {"content": content, "embedding": vector, "importance": 0.5, "confidence": 0.5,
             "domain": ["bench"], "source_agent": "bench"}
            for content, vector in zip(contents, vectors, strict=True)
        ]  # fmt: skip
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        ids = np.arange(BATCH, dtype=np.int64)
        wires = [
            raw(ev.ExperienceRecorded(
                event_id=uuid7(), instance_id=data.instance, hlc=data.hlc(),
                experience_id=uuid7(), collective_id=cid, content=content,
                embedding=vector.tobytes(), experience_type=ev.Generic(), importance=0.5,
                confidence=0.5, source_agent="bench", domain=("bench",),
            ))
            for content, vector in zip(contents, vectors, strict=True)
        ]  # fmt: skip
        got: list[UUID] = []
        for turn in (0, 1, 2, 3) if i % 2 == 0 else (3, 2, 1, 0):
            started = time.perf_counter()
            if turn == 0:
                got = await record_experiences(cid, items)
                pulse_s.append(time.perf_counter() - started)
            elif turn == 1:
                index = faiss.IndexIDMap2(faiss.IndexFlatIP(DIM))
                index.add_with_ids(unit, ids)
                faiss_s.append(time.perf_counter() - started)
            elif turn == 2:
                graph = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
                graph.hnsw.efConstruction = 80
                faiss.IndexIDMap2(graph).add_with_ids(unit, ids)
                hnsw_s.append(time.perf_counter() - started)
            else:
                await atomic_batch(peer, wires)
                log_s.append(time.perf_counter() - started)
        assert len(got) == BATCH, f"record_experiences returned {len(got)} ids"
        first = await db.get_experience(got[0])
        assert first is not None and first.content == contents[0], "ids not in item order"
    p, f = median(pulse_s), median(faiss_s)
    h, g = median(hnsw_s), median(log_s)
    emit("batch_record_1000", items=BATCH, dim=DIM, rounds=rounds,
         pulse_ms=round(p * 1000, 3), faiss_add_ms=round(f * 1000, 3),
         pulse_per_s=round(BATCH / p), ratio=sig(f / p), target=">= 0.8",
         met=f / p >= 0.8, faiss_hnsw_add_ms=round(h * 1000, 3),
         ratio_to_hnsw_add=sig(h / p), log_atomic_batch_ms=round(g * 1000, 3),
         ratio_to_log_alone=sig(g / p))  # fmt: skip


async def atomic_batch(nc: NATS, wires: list[WireMessage]) -> None:
    """The log alone: ``wires`` committed as one JetStream atomic batch, acknowledged."""
    batch = str(uuid7())
    for number, wire in enumerate(wires, 1):
        headers = {k: v for k, v in wire.headers.items() if k != "Nats-Msg-Id"}
        headers.update({"Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(number)})
        if number < len(wires):
            await nc.publish(wire.subject, wire.payload, headers=headers)
        else:
            headers["Nats-Batch-Commit"] = "1"
            reply = await nc.request(wire.subject, wire.payload, headers=headers, timeout=30)
            answer = json.loads(reply.data)
            assert answer.get("count") == len(wires), answer


# -- convergence ----------------------------------------------------------------------------


async def convergence(
    a: PulseDB, b: PulseDB, server_url: str, js: JetStreamContext, cid: UUID, data: Material,
    n: int,
) -> None:  # fmt: skip
    pulse_ms, raw_ms = await convergence_lags(a, b, server_url, js, cid, data, n)
    ratio = median(pulse_ms) / median(raw_ms)
    p99 = pct(pulse_ms, 99)
    emit("convergence_lag", writes=n, pulse_p50_ms=pct(pulse_ms, 50), pulse_p99_ms=p99,
         raw_js_p50_ms=pct(raw_ms, 50), raw_js_p99_ms=pct(raw_ms, 99),
         ratio=sig(ratio), target="ratio <= 3 and pulse_p99_ms <= 10",
         met=ratio <= 3 and p99 <= 10)  # fmt: skip


async def convergence_lags(
    a: PulseDB, b: PulseDB, server_url: str, js: JetStreamContext, cid: UUID, data: Material,
    n: int,
) -> tuple[list[float], list[float]]:  # fmt: skip
    """A's write until B's watch yields it, beside raw publish until a push consumer on
    another connection receives it; alternating in blocks of 50 writes. The lags (ms) of
    each: Pulse's, the raw peer's."""
    seen: asyncio.Queue[tuple[UUID, float]] = asyncio.Queue()
    watch = b.watch_experiences()

    async def watching() -> None:
        async for change in watch:
            if change.kind == "created":
                seen.put_nowait((change.experience_id, time.perf_counter()))

    watcher = asyncio.create_task(watching())
    subscriber = await nats.connect(server_url)
    arrived: asyncio.Queue[float] = asyncio.Queue()

    async def on_message(msg: object) -> None:
        arrived.put_nowait(time.perf_counter())

    sub = await subscriber.jetstream().subscribe(
        f"{RAW_PREFIX}.>", cb=on_message, ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.NEW,
    )  # fmt: skip

    async def pulse_once(content: str, vector: Vectors) -> float:
        started = time.perf_counter()
        eid = await a.record_experience(cid, content, vector)
        async with asyncio.timeout(30):
            while True:
                got, at = await seen.get()
                if got == eid:
                    return (at - started) * 1000

    async def raw_once(wire: WireMessage) -> float:
        started = time.perf_counter()
        await js.publish(wire.subject, wire.payload, headers=wire.headers)
        async with asyncio.timeout(30):
            return (await arrived.get() - started) * 1000

    pulse_ms: list[float] = []
    raw_ms: list[float] = []
    try:
        for block, start in enumerate(range(0, n, 50)):
            size = min(50, n - start)
            contents, vectors = data.items(size)
            wires = data.recorded(cid, size)
            for turn in (0, 1) if block % 2 == 0 else (1, 0):
                if turn == 0:
                    for content, vector in zip(contents, vectors, strict=True):
                        pulse_ms.append(await pulse_once(content, vector))
                else:
                    for wire in wires:
                        raw_ms.append(await raw_once(wire))
    finally:
        await sub.unsubscribe()
        await subscriber.close()
        watch.close()
        watcher.cancel()
    return pulse_ms, raw_ms


async def raw_stream(peer: NATS) -> JetStreamContext:
    """The raw peer's stream, RAW, on ``peer``'s server; its JetStream context."""
    js = peer.jetstream()
    await js.add_stream(
        name=RAW_STREAM, subjects=[f"{RAW_PREFIX}.>"], storage=api.StorageType.FILE,
        duplicate_window=120.0, allow_direct=True,  # as PULSE: both ack the same way
        allow_atomic=True,
    )  # fmt: skip
    return js


@dataclass
class Pair:
    """A Pulse instance ``a`` beside the raw nats-py ``peer`` (and its stream, ``js``)
    on one embedded NATS server that syncs every write, in the temporary ``tmp``."""

    tmp: Path
    url: str
    a: PulseDB
    peer: NATS
    js: JetStreamContext


@contextlib.asynccontextmanager
async def beside_raw(name: str) -> AsyncIterator[Pair]:
    """What every write figure runs on (here and in ``ops.bench.quick``)."""
    with (
        tempfile.TemporaryDirectory(prefix=f"pulse-bench-{name}-") as tmp,
        EmbeddedNats(Path(tmp) / "nats", sync_always=True) as server,
    ):
        a = await PulseDB.open(Path(tmp) / "a", server.url)
        peer = await nats.connect(server.url)
        try:
            yield Pair(Path(tmp), server.url, a, peer, await raw_stream(peer))
        finally:
            await peer.close()
            await a.close()


async def engine_figures(options: argparse.Namespace, figures: set[str]) -> None:
    """Figures 1-5: one embedded NATS server shared by Pulse and the raw peer."""
    async with beside_raw("engine") as pair:
        a, peer, js = pair.a, pair.peer, pair.js
        cid = await a.create_collective("bench", "engine", DIM)
        data = Material()
        await writes(a, js, cid, data, options.writes, options.rounds, figures)
        if "batch_record_1000" in figures:
            await batch_record(a, data, options.batch_rounds, peer)
        if "convergence_lag" in figures:
            b = await PulseDB.open(pair.tmp / "b", pair.url)
            try:
                await b.sync()
                await convergence(a, b, pair.url, js, cid, data, options.lag_writes)
            finally:
                await b.close()


# -- /health under load ------------------------------------------------------------------------


def load_worker(
    url: str, cid: str, queries: list[str], max_seconds: float, started: ProcessEvent,
    done: ProcessEvent, results: Queue[dict[str, Any]],
) -> None:  # fmt: skip
    """In its own process (so its event loop does not delay the /health probes): 16 HTTP
    clients calling search_hybrid in a loop while one heavy SQL query runs."""
    asyncio.run(generate_load(url, cid, queries, max_seconds, started, done, results))


async def generate_load(
    url: str, cid: str, queries: list[str], max_seconds: float, started: ProcessEvent,
    done: ProcessEvent, results: Queue[dict[str, Any]],
) -> None:  # fmt: skip
    limits = httpx.Limits(max_connections=CALLERS, max_keepalive_connections=CALLERS)
    timeout = max_seconds + 60
    async with (
        httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits, headers=OPERATOR) as http,
        httpx.AsyncClient(base_url=url, timeout=timeout, headers=OPERATOR) as analyst,
    ):
        body = {"collective_id": cid, "text": queries[0], "k": 10}
        (await http.post("/v1/search_hybrid", json=body)).raise_for_status()  # warm up
        began = time.perf_counter()
        started.set()

        async def heavy() -> tuple[int, float]:
            response = await analyst.post("/v1/sql", json={"query": HEAVY_SQL})
            return response.status_code, time.perf_counter() - began

        query = asyncio.create_task(heavy())
        latencies: list[float] = []
        errors = 0

        async def client(c: int) -> None:
            nonlocal errors
            r = 0
            while not query.done() and time.perf_counter() - began < max_seconds:
                body = {"collective_id": cid, "text": queries[(c + r * CALLERS) % len(queries)],
                        "k": 10}  # fmt: skip
                r += 1
                sent = time.perf_counter()
                response = await http.post("/v1/search_hybrid", json=body)
                latencies.append((time.perf_counter() - sent) * 1000)
                errors += response.status_code != 200

        await asyncio.gather(*(client(c) for c in range(CALLERS)))
        done.set()
        status, seconds = await query
    results.put({"searches": len(latencies), "search_errors": errors,
                 "search_p50_ms": pct(latencies, 50), "search_p99_ms": pct(latencies, 99),
                 "sql_status": status, "sql_seconds": round(seconds, 2)})  # fmt: skip


async def probe_health(
    http: httpx.AsyncClient, limit: int, stop: Callable[[], bool] = lambda: False
) -> tuple[list[float], int]:
    """``GET /health`` latencies (ms), one every 20 ms, and how many were not 200."""
    latencies: list[float] = []
    failures = 0
    while len(latencies) < limit and not stop():
        started = time.perf_counter()
        response = await http.get("/health")
        latencies.append((time.perf_counter() - started) * 1000)
        failures += response.status_code != 200
        await asyncio.sleep(0.02)
    return latencies, failures


async def health_under_load(n: int, probes: int, max_seconds: float) -> None:
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(prefix="pulse-bench-engine-health-") as tmp:
        data_dir = Path(tmp) / "data"
        collective, events = corpus(n, rng)
        await fill(data_dir, events)
        del events
        queries = [words(rng, 3) for _ in range(CALLERS * 50)]
        started_at = time.perf_counter()
        process, url = start_service(data_dir)
        start_seconds = time.perf_counter() - started_at
        context = multiprocessing.get_context("spawn")
        started, done = context.Event(), context.Event()
        results: Queue[dict[str, Any]] = context.Queue()
        worker = context.Process(
            target=load_worker, args=(url, str(collective), queries, max_seconds, started,
                                      done, results), daemon=True,
        )  # fmt: skip
        try:
            async with httpx.AsyncClient(base_url=url, timeout=120, headers=OPERATOR) as http:
                (await http.get("/health")).raise_for_status()  # warm up
                idle, idle_failures = await probe_health(http, probes)
                worker.start()
                if not await asyncio.to_thread(started.wait, 120):
                    raise RuntimeError("the load process did not start within 120 s")
                deadline = time.monotonic() + max_seconds + 60
                loaded, load_failures = await probe_health(
                    http, 100_000,
                    lambda: done.is_set() or not worker.is_alive() or time.monotonic() > deadline,
                )  # fmt: skip
                load = await asyncio.to_thread(results.get, True, max_seconds + 120)
                await asyncio.to_thread(worker.join, 30)
        finally:
            if worker.is_alive():
                worker.kill()
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.communicate, timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.communicate)
    p99 = pct(loaded, 99)
    emit("health_under_load", experiences=n, service_start_s=round(start_seconds, 1),
         idle_p50_ms=pct(idle, 50), idle_p99_ms=pct(idle, 99), idle_probes=len(idle),
         load_p50_ms=pct(loaded, 50), load_p99_ms=p99, load_max_ms=pct(loaded, 100),
         load_probes=len(loaded), not_ok=idle_failures + load_failures,
         clients=CALLERS, **load, ratio=sig(p99 / pct(idle, 99)),
         target="load_p99_ms <= 50", met=p99 <= 50)  # fmt: skip


async def main(options: argparse.Namespace) -> None:
    figures = set(options.figures)
    if figures - {"health_under_load"}:
        await engine_figures(options, figures)
    if "health_under_load" in figures:
        await health_under_load(options.experiences, options.probes, options.load_seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.engine",
        description=__doc__.split("\n\n")[0],
        epilog="figures: " + ", ".join(FIGURES),
    )
    parser.add_argument("--writes", type=int, default=480,
                        help="calls per round of each write figure (480)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per write figure, alternating; the median (3)")  # fmt: skip
    parser.add_argument("--batch-rounds", type=int, default=5,
                        help="rounds of the 1,000-item batch, median reported (5)")  # fmt: skip
    parser.add_argument("--lag-writes", type=int, default=200,
                        help="writes per side for the convergence lag (200)")  # fmt: skip
    parser.add_argument("--experiences", type=int, default=3000,
                        help="experiences in the service's data directory (3000)")  # fmt: skip
    parser.add_argument("--probes", type=int, default=200,
                        help="idle /health probes, one every 20 ms (200)")  # fmt: skip
    parser.add_argument("--load-seconds", type=float, default=60,
                        help="longest load phase, if the SQL runs longer (60)")  # fmt: skip
    parser.add_argument("--figures", nargs="+", choices=FIGURES, default=list(FIGURES),
                        metavar="FIGURE", help="only these figures (all)")  # fmt: skip
    asyncio.run(main(parser.parse_args()))

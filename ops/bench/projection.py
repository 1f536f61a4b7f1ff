"""Benchmark: rebuilding a projection, searching it and its memory, each Pulse figure
beside a peer measured in the same run (the machine may be shared and noisy).

    python -m ops.bench.projection [--n 100000] [--queries 1000]
        [--counter-events 1000000] [--only FIGURE ...]

Logs are filled in an embedded NATS (sync_interval 2m: filling is not measured), with
JetStream atomic batches of 1,000 events. Each figure is one JSON line holding both
sides, the ratio(s), ``target`` and ``met``; it is printed whether or not it meets its
target.

- rebuild_counters: ``--counter-events`` events without large vectors: one collective
  (8-d embeddings), 10,000 experiences recorded, then reinforcements (3 in 4, each the
  running total of one of 4 instances for that experience) and importance updates (1 in
  4) at random over those experiences. ``rebuild`` (``projections.projection``: replay
  into a fresh state directory, DuckDB, FAISS, tantivy, digest and swap) in events/s
  beside a raw nats-py ordered push consumer draining the same stream without decoding
  (``ops.bench.peers.raw_drain``), once before and once after the rebuild (their mean
  rate); ratio = Pulse / raw, target >= 0.5. The G-counter totals are checked.
- rebuild_vectors: ``--n`` recorded experiences (384-d vectors around 40 cluster
  centers; content of 6 to 24 words from a Zipf-like vocabulary of 5,000, each cluster
  with its own favourite words beside 20 common to all). ``rebuild`` in seconds beside FAISS
  alone building the index Pulse uses past 10,000 vectors
  (``projections.vectors.graph_index(384)``: ``train`` then ``add`` of the L2-normalized
  vectors, one call each); ratio = FAISS s / Pulse s, target >= 0.8. The raw drain rate
  of the same stream is printed beside it.
- similar_search: p50 / p99 of ``queries.similar_experiences`` (k=10) on the rebuilt
  projection, beside (a) the FAISS index of rebuild_vectors searched alone (efSearch =
  ``ProjectionSettings().ef_search``, one normalized query at a time, k=10):
  ratio_to_faiss_p50 = Pulse / FAISS, target <= 1.5; and (b) exact numpy (one matrix
  product + argpartition over the normalized vectors): speedup_vs_numpy_p50 = numpy /
  Pulse, target >= 10.
- hybrid_and_context: p50 of ``queries.hybrid_experiences`` (pool 50; three query
  words drawn as the contents' words are) and of ``sync.recall._context`` (what
  ``get_context_candidates`` runs on the engine thread: hybrid pool 50, 10 recent,
  5 insights), beside the p50 of
  ``similar_experiences`` (k=10) in the same loop; ratios to it: targets <= 3 (hybrid)
  and <= 5 (context).
- filtered_search: p50 / p99 of ``similar_experiences`` (k=10) with a filter keeping
  about half the rows (importance >= 0.5; importances are uniform in [0, 1]) beside the
  same search unfiltered, and the filtered search right after a write (an importance
  update applied, untimed, before each query: the filter's columns are patched). No
  target in the issue; it shows that filters select inside the search.
- visible_search: p50 / p99 of ``similar_experiences`` (k=10) as principals that may
  not see every row (``sync.access``): a member of the collective (every 10th
  experience is private to another agent) and a principal of another owner (it sees the
  org-visible rows: every 20th), beside the same search unrestricted (an admin) in the
  same loop; ratios to it, target <= 3 for the member. Both are exact scans of the rows
  they may see (``projections.vectors``: a graph's answer would depend on the rows they
  may not see); the first query of each gathers the rows, the rest reuse them.
- visible_text: p50 / p99 of ``queries.search_text`` (k=10; the hybrid queries' words)
  and of ``hybrid_experiences`` (pool 50) as that member, scored from the statistics
  of the rows it may see (``projections.text``: counts under a visibility filter, the
  candidates' content analyzed again), beside both unrestricted (tantivy's BM25) in
  the same loop; ratios to them. No target: it shows what noninterference costs.
- add_and_search: writes to the rebuilt collective (past ``hnsw_threshold``): one vector
  added at a time, as a record's ``sync_indexes`` does, each followed by a k=10 search
  of the index (``VectorIndex.search``: graph + pending vectors, re-ranked), beside
  FAISS alone doing the same on the index of rebuild_vectors (``add`` of one normalized
  vector, then ``search``), in alternating blocks of 50 writes. Per write: the add's
  wall time on the adding thread (what a write waits for) and its CPU; the process CPU
  per write (every thread: Pulse's block ends when its background inserter has caught
  up, so the inserter's CPU is counted on Pulse's side); the search p50 / p99 while the
  vectors are added; ratio_to_faiss_search_p50 target <= 1.5 and p99 <= 3x p50; and
  recall@10 against exact numpy over every vector at the end.
- memory: a fresh process opens the rebuilt projection and answers a vector and a text
  query; the growth of its VmRSS and of its RssAnon (``/proc/self/status``) per 100,000
  experiences, beside the raw data per 100,000 (n x 384 x 4 bytes of vectors + the UTF-8
  bytes of the contents); ratio for each, target <= 1.5.
- recall: recall@20 of ``similar_experiences`` against exact numpy search, on the corpus
  of ``tests/test_search_quality.py`` (20,000 clustered 384-d vectors, queries drawn
  around the centers; a ``Projection`` applied in batches of 2,000 with default
  settings, so HNSW past 10,000), 200 queries; target >= 0.95. The recall of
  ``graph_index`` alone on the same vectors is printed beside it.

Search latencies alternate Pulse and its peers in blocks of 50 queries, in every order
in turn (BLAS threads keep spinning for a while after a matrix product and would slow
whatever runs right after them), after one untimed call of each.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from eventlog import EmbeddedNats, JetStreamLog
from eventlog import events as ev
from eventlog.access import Viewer
from eventlog.ids import uuid7
from eventlog.keys import Keyring
from eventlog.log import LogEntry
from eventlog.sealing import Sealer
from ops.bench import emitter
from ops.bench.peers import raw_drain
from projections import queries as q
from projections.projection import Projection, ProjectionSettings, state_dir
from projections.rebuild import rebuild
from projections.vectors import graph_index, normalized
from sync.recall import _context

FIGURES = ("rebuild_counters", "rebuild_vectors", "similar_search", "hybrid_and_context",
           "filtered_search", "visible_search", "visible_text", "add_and_search", "memory",
           "recall")  # fmt: skip
VECTOR_FIGURES = {
    "rebuild_vectors", "similar_search", "hybrid_and_context", "filtered_search",
    "visible_search", "visible_text", "add_and_search", "memory",
}  # fmt: skip
VOCABULARY, WORDS = 5000, 24  # content words: vocabulary size, most words per experience
DIM, CLUSTERS = 384, 40
COUNTER_DIM, COUNTER_EXPERIENCES, COUNTER_INSTANCES, REINFORCE_SHARE = 8, 10_000, 4, 0.75
RECALL_N, RECALL_QUERIES, RECALL_K = 20_000, 200, 20
WRITES = 2000  # vectors added by add_and_search
CHUNK = 1000  # events per append_batch: a JetStream atomic batch holds at most 1,000
BLOCK = 50  # queries per turn when alternating
K, POOL = 10, 50
EF_SEARCH = ProjectionSettings().ef_search

Vectors = npt.NDArray[np.float32]


emit = emitter("projection")


def pct(samples_ms: Sequence[float], p: float) -> float:
    return round(float(np.percentile(np.asarray(samples_ms), p)), 3)


def sig(x: float) -> float:
    """Three significant digits: a ratio far from 1 still shows its size."""
    return float(f"{x:.3g}")


def chunked(events: Iterable[ev.Event], size: int = CHUNK) -> Iterator[list[ev.Event]]:
    iterator = iter(events)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


async def append_all(log: JetStreamLog, events: Iterable[ev.Event]) -> int:
    """Append ``events`` in atomic batches of ``CHUNK``, made as they go (a million
    events at once would take gigabytes), sealed as a host writes them (their text and
    vectors encrypted with their entities' keys, in the log's key bucket: a rebuild opens
    them); returns the last sequence."""
    sealer = Sealer(Keyring(log.key_store()))
    for chunk in chunked(events):
        await log.append_batch(await sealer.seal_many(chunk), atomic=True)
    return await log.last_seq()


def alternate(count: int, actions: Sequence[Callable[[int], object]]) -> list[list[float]]:
    """Milliseconds of each action on items 0 .. count-1: after one untimed call of each,
    the actions take turns in blocks of ``BLOCK`` items, in every order in turn."""
    for action in actions:
        action(0)
    samples: list[list[float]] = [[] for _ in actions]
    orders = list(itertools.permutations(range(len(actions))))
    for block, start in enumerate(range(0, count, BLOCK)):
        for turn in orders[block % len(orders)]:
            action, out = actions[turn], samples[turn]
            for i in range(start, min(start + BLOCK, count)):
                started = time.perf_counter()
                action(i)
                out.append((time.perf_counter() - started) * 1000)
    return samples


# -- rebuild_counters ------------------------------------------------------------------------


class CounterStream:
    """A collective, its experiences (8-d), then reinforcements and updates over them."""

    def __init__(self, total: int, seed: int = 3) -> None:
        rng = np.random.default_rng(seed)
        self.cid = uuid7()
        self.instances = [uuid7() for _ in range(COUNTER_INSTANCES)]
        self.experiences = [uuid7() for _ in range(max(0, min(COUNTER_EXPERIENCES, total - 1)))]
        rest = max(0, total - 1 - len(self.experiences))
        self.vectors = rng.normal(size=(len(self.experiences), COUNTER_DIM)).astype(np.float32)
        self.targets: list[int] = rng.integers(0, len(self.experiences) or 1, rest).tolist()
        self.reinforce: list[bool] = (rng.random(rest) < REINFORCE_SHARE).tolist()
        self.values: list[float] = rng.random(rest).round(3).tolist()
        self.reinforcements = sum(self.reinforce)

    def events(self) -> Iterator[ev.Event]:
        cid, instances = self.cid, self.instances
        hlc = ev.pack_hlc(int(time.time() * 1000))
        yield ev.CollectiveCreated(
            event_id=uuid7(), instance_id=instances[0], hlc=hlc, collective_id=cid,
            owner_id="bench", name="counters", embedding_dimension=COUNTER_DIM,
        )  # fmt: skip
        for i, eid in enumerate(self.experiences):
            hlc += 1
            yield ev.ExperienceRecorded(
                event_id=uuid7(), instance_id=instances[i % COUNTER_INSTANCES], hlc=hlc,
                experience_id=eid, collective_id=cid, content=f"lesson {i}: retry it",
                embedding=self.vectors[i].tobytes(), experience_type=ev.Generic(),
                importance=0.5, confidence=0.5, source_agent="bench",
            )  # fmt: skip
        totals = [[0] * len(self.experiences) for _ in instances]  # running, per instance
        for j, (target, reinforce, value) in enumerate(
            zip(self.targets, self.reinforce, self.values, strict=True)
        ):
            hlc += 1
            writer = j % COUNTER_INSTANCES
            eid = self.experiences[target]
            if reinforce:
                totals[writer][target] += 1
                yield ev.ExperienceReinforced(
                    event_id=uuid7(), instance_id=instances[writer], hlc=hlc,
                    experience_id=eid, collective_id=cid, applications=totals[writer][target],
                )  # fmt: skip
            else:
                yield ev.ExperienceUpdated(
                    event_id=uuid7(), instance_id=instances[writer], hlc=hlc,
                    experience_id=eid, collective_id=cid, importance=value,
                )  # fmt: skip


async def rebuild_counters(total_events: int) -> None:
    stream = CounterStream(total_events)
    with (
        tempfile.TemporaryDirectory(prefix="pulse-bench-projection-") as tmp,
        EmbeddedNats(tmp, sync_always=False) as server,
    ):
        log = await JetStreamLog.connect(server.url, append_timeout=60)
        try:
            total = await append_all(log, stream.events())
            raw_s = [await timed(raw_drain(log.js, "pulse.c.>", total))]
            pulse_s = await timed(rebuild(tmp, log))
            raw_s.append(await timed(raw_drain(log.js, "pulse.c.>", total)))
        finally:
            await log.close()
        projection = Projection(state_dir(tmp))
        try:
            applications = sum(q.total_applications(projection, e) for e in stream.experiences)
        finally:
            projection.close()
    assert applications == stream.reinforcements, (applications, stream.reinforcements)
    pulse_rate, raw_rate = total / pulse_s, 2 * total / sum(raw_s)
    ratio = pulse_rate / raw_rate
    emit("rebuild_counters", events=total, experiences=len(stream.experiences),
         reinforcements=stream.reinforcements, instances=COUNTER_INSTANCES,
         pulse_s=round(pulse_s, 2), pulse_per_s=round(pulse_rate),
         raw_drain_per_s=round(raw_rate),
         raw_drain_before_after_per_s=[round(total / s) for s in raw_s],
         ratio=sig(ratio), target=">= 0.5", met=ratio >= 0.5)  # fmt: skip


async def timed(action: Awaitable[object]) -> float:
    started = time.perf_counter()
    await action
    return time.perf_counter() - started


# -- rebuild_vectors, similar_search, hybrid_and_context, memory -----------------------------


class Corpus:
    """``n`` recorded experiences: 384-d vectors around 40 cluster centers, and one line
    of content naming the cluster."""

    def __init__(self, n: int, seed: int = 1) -> None:
        rng = np.random.default_rng(seed)
        centers = rng.normal(size=(CLUSTERS, DIM))
        self.n = n
        self.labels: list[int] = rng.integers(0, CLUSTERS, n).tolist()
        self.vectors: Vectors = (centers[self.labels] + 0.35 * rng.normal(size=(n, DIM))).astype(
            np.float32
        )
        self.words = self.draw(rng, np.array(self.labels), WORDS)
        self.lengths: list[int] = rng.integers(6, WORDS + 1, n).tolist()  # 6..24 words
        self.importance: list[float] = np.round(rng.uniform(0, 1, n), 2).tolist()
        self.ids = [uuid7() for _ in range(n)]
        self.cid, self.instance = uuid7(), uuid7()
        self.content_bytes = sum(len(self.content(i).encode()) for i in range(n))

    @staticmethod
    def draw(rng: np.random.Generator, labels: Any, count: int) -> Any:
        """``count`` words per label from a Zipf-like vocabulary of VOCABULARY words,
        each cluster with its own favourite words (a few common to all, most rare)."""
        ranks = np.minimum(rng.zipf(1.3, size=(len(labels), count)), VOCABULARY) - 1
        shift = np.where(ranks < 20, 0, 97 * np.asarray(labels)[:, None])  # shared top 20
        return (ranks + shift) % VOCABULARY

    def content(self, i: int) -> str:
        words = self.words[i][: self.lengths[i]].tolist()
        return f"lesson {i}: " + " ".join(f"w{w}" for w in words)

    def query_text(self, rng: np.random.Generator, i: int) -> str:
        """Three words as an agent of experience ``i``'s cluster might ask them."""
        words = self.draw(rng, np.array([self.labels[i]]), 3)[0]
        return " ".join(f"w{w}" for w in words.tolist())

    def events(self) -> Iterator[ev.Event]:
        hlc = ev.pack_hlc(int(time.time() * 1000))
        yield ev.CollectiveCreated(
            event_id=uuid7(), instance_id=self.instance, hlc=hlc, collective_id=self.cid,
            owner_id="bench", name="bench", embedding_dimension=DIM,
        )  # fmt: skip
        for i in range(self.n):
            yield ev.ExperienceRecorded(
                event_id=uuid7(), instance_id=self.instance, hlc=hlc + 1 + i,
                experience_id=self.ids[i], collective_id=self.cid, content=self.content(i),
                embedding=self.vectors[i].tobytes(), experience_type=ev.Generic(),
                importance=self.importance[i], confidence=0.5, source_agent="bench",
                author_owner="bench", author_agent="other" if i % 10 == 0 else "agent",
                visibility=self.visibility(i),
            )  # fmt: skip

    @staticmethod
    def visibility(i: int) -> ev.Visibility:
        """Every 10th private (to agent "other"), every 20th else org, the rest team."""
        return "private" if i % 10 == 0 else "org" if i % 20 == 5 else "team"


def faiss_build(unit: Vectors) -> tuple[Any, float]:
    """The peer: ``graph_index`` trained on and filled with ``unit``, and its seconds."""
    started = time.perf_counter()
    index = graph_index(DIM)
    index.train(unit)
    index.add(unit)
    seconds = time.perf_counter() - started
    index.hnsw.efSearch = EF_SEARCH
    return index, seconds


async def fill_and_rebuild(data_dir: str, corpus: Corpus, unit: Vectors, figures: set[str]) -> Any:
    """Fill the log, rebuild; with rebuild_vectors, time the rebuild beside FAISS alone
    and the raw drain. Returns the FAISS peer index (None if no figure needs it)."""
    with EmbeddedNats(data_dir, sync_always=False) as server:
        log = await JetStreamLog.connect(server.url, append_timeout=60)
        try:
            total = await append_all(log, corpus.events())
            if "rebuild_vectors" not in figures:
                await rebuild(data_dir, log)
                wanted = {"similar_search", "add_and_search"}
                return faiss_build(unit)[0] if figures & wanted else None
            raw_s = await timed(raw_drain(log.js, "pulse.c.>", total))
            peer, faiss_s = faiss_build(unit)
            pulse_s = await timed(rebuild(data_dir, log))
        finally:
            await log.close()
    ratio = faiss_s / pulse_s
    emit("rebuild_vectors", experiences=corpus.n, dim=DIM, events=total,
         pulse_s=round(pulse_s, 2), pulse_per_s=round(total / pulse_s),
         faiss_train_add_s=round(faiss_s, 2), ratio=sig(ratio), target=">= 0.8",
         met=ratio >= 0.8, raw_drain_per_s=round(total / raw_s))  # fmt: skip
    return peer


def similar_search(projection: Projection, corpus: Corpus, peer: Any, probes: Vectors) -> None:
    cid, unit, probe_unit = corpus.cid, normalized(corpus.vectors), normalized(probes)

    def pulse(i: int) -> object:
        return q.similar_experiences(projection, cid, probes[i], k=K)

    def faiss(i: int) -> object:
        return peer.search(probe_unit[i : i + 1], K)

    def numpy(i: int) -> object:
        scores = unit @ (probes[i] / np.linalg.norm(probes[i]))
        top = np.argpartition(-scores, K)[:K]
        return top[np.argsort(-scores[top])]

    pulse_ms, faiss_ms, numpy_ms = alternate(len(probes), [pulse, faiss, numpy])
    index = projection.vectors[("experience", cid)]
    to_faiss = pct(pulse_ms, 50) / pct(faiss_ms, 50)
    speedup = pct(numpy_ms, 50) / pct(pulse_ms, 50)
    emit("similar_search", experiences=corpus.n, queries=len(probes), k=K,
         index="hnsw" if index.is_hnsw else "flat", ef_search=EF_SEARCH,
         pulse_p50_ms=pct(pulse_ms, 50), pulse_p99_ms=pct(pulse_ms, 99),
         faiss_p50_ms=pct(faiss_ms, 50), faiss_p99_ms=pct(faiss_ms, 99),
         numpy_exact_p50_ms=pct(numpy_ms, 50), numpy_exact_p99_ms=pct(numpy_ms, 99),
         ratio_to_faiss_p50=sig(to_faiss), speedup_vs_numpy_p50=sig(speedup),
         target="ratio_to_faiss_p50 <= 1.5 and speedup_vs_numpy_p50 >= 10",
         met=to_faiss <= 1.5 and speedup >= 10)  # fmt: skip


def filtered_search(projection: Projection, corpus: Corpus, probes: Vectors) -> None:
    """Similar search with a filter that keeps about half the rows, beside the same
    search unfiltered; then the filtered search right after a write to the collective
    (an importance update applied, untimed, before each query)."""
    cid, half = corpus.cid, q.ExperienceFilter(min_importance=0.5)

    def plain(i: int) -> object:
        return q.similar_experiences(projection, cid, probes[i], k=K)

    def filtered(i: int) -> object:
        return q.similar_experiences(projection, cid, probes[i], k=K, flt=half)

    plain_ms, filtered_ms = alternate(len(probes), [plain, filtered])
    rng = np.random.default_rng(4)
    targets = [corpus.ids[int(i)] for i in rng.integers(0, corpus.n, len(probes))]
    after_write_ms = []
    for i, experience_id in enumerate(targets):
        update = ev.ExperienceUpdated(
            event_id=uuid7(), instance_id=corpus.instance,
            hlc=ev.pack_hlc(int(time.time() * 1000)), experience_id=experience_id,
            collective_id=cid, importance=round(float(rng.uniform()), 2),
        )  # fmt: skip
        projection.apply([LogEntry(projection.seq + 1, "bench", update)])
        started = time.perf_counter()
        filtered(i)
        after_write_ms.append((time.perf_counter() - started) * 1000)
    emit("filtered_search", experiences=corpus.n, queries=len(probes), k=K,
         filter="min_importance 0.5 (about half)", plain_p50_ms=pct(plain_ms, 50),
         filtered_p50_ms=pct(filtered_ms, 50), filtered_p99_ms=pct(filtered_ms, 99),
         after_a_write_p50_ms=pct(after_write_ms, 50),
         after_a_write_p99_ms=pct(after_write_ms, 99),
         ratio_filtered_to_plain_p50=sig(pct(filtered_ms, 50) / pct(plain_ms, 50)))  # fmt: skip


def add_and_search(projection: Projection, corpus: Corpus, peer: Any, probes: Vectors) -> None:
    """Single-vector adds, each followed by a search, Pulse's index beside FAISS alone."""
    index = projection.vectors[("experience", corpus.cid)]
    index.wait()
    rng = np.random.default_rng(5)
    fresh: Vectors = (
        corpus.vectors[rng.integers(0, corpus.n, WRITES)] + 0.35 * rng.normal(size=(WRITES, DIM))
    ).astype(np.float32)
    fresh_unit, probe_unit = normalized(fresh), normalized(probes)
    first = max(index.members) + 1
    keys = [uuid7() for _ in range(WRITES)]
    sides = ("pulse", "faiss")
    wait_ms: dict[str, list[float]] = {side: [] for side in sides}
    add_cpu: dict[str, list[float]] = {side: [] for side in sides}
    search_ms: dict[str, list[float]] = {side: [] for side in sides}
    process_cpu = dict.fromkeys(sides, 0.0)

    def write(side: str, i: int) -> None:
        probe = i % len(probes)
        cpu, started = time.thread_time(), time.perf_counter()
        if side == "pulse":
            index.add([first + i], fresh[i : i + 1], [keys[i]])
        else:
            peer.add(fresh_unit[i : i + 1])
        wait_ms[side].append((time.perf_counter() - started) * 1000)
        add_cpu[side].append(time.thread_time() - cpu)
        started = time.perf_counter()
        if side == "pulse":
            index.search(probes[probe], K)
        else:
            peer.search(probe_unit[probe : probe + 1], K)
        search_ms[side].append((time.perf_counter() - started) * 1000)

    for block, start in enumerate(range(0, WRITES, BLOCK)):
        for side in sides if block % 2 == 0 else sides[::-1]:
            cpu = time.process_time()
            for i in range(start, min(start + BLOCK, WRITES)):
                write(side, i)
            while side == "pulse" and index.inserting is not None:  # its inserter's share
                time.sleep(0.0005)
            process_cpu[side] += time.process_time() - cpu
    every = np.concatenate([normalized(corpus.vectors), fresh_unit])
    by_vec_id = {projection.memory.vec_ids[eid]: i for i, eid in enumerate(corpus.ids)}
    by_vec_id.update({first + i: corpus.n + i for i in range(WRITES)})
    hits = {side: 0 for side in sides}
    for j in range(len(probes)):
        truth = set(np.argsort(-(every @ probe_unit[j]))[:K].tolist())
        hits["pulse"] += len(truth & {by_vec_id[v] for v, _ in index.search(probes[j], K)})
        hits["faiss"] += len(truth & set(peer.search(probe_unit[j : j + 1], K)[1][0].tolist()))
    figures: dict[str, float] = {}
    for side in sides:
        figures |= {
            f"{side}_add_wait_p50_ms": pct(wait_ms[side], 50),
            f"{side}_add_wait_p99_ms": pct(wait_ms[side], 99),
            f"{side}_add_cpu_us": round(float(np.mean(add_cpu[side])) * 1e6),
            f"{side}_process_cpu_per_write_us": round(process_cpu[side] / WRITES * 1e6),
            f"{side}_search_p50_ms": pct(search_ms[side], 50),
            f"{side}_search_p99_ms": pct(search_ms[side], 99),
            f"{side}_recall10": round(hits[side] / (K * len(probes)), 4),
        }
    to_faiss = figures["pulse_search_p50_ms"] / figures["faiss_search_p50_ms"]
    tail = figures["pulse_search_p99_ms"] / figures["pulse_search_p50_ms"]
    emit("add_and_search", experiences=corpus.n, writes=WRITES, k=K, **figures,
         ratio_to_faiss_search_p50=sig(to_faiss), search_p99_to_p50=sig(tail),
         target="ratio_to_faiss_search_p50 <= 1.5 and search_p99_to_p50 <= 3",
         met=to_faiss <= 1.5 and tail <= 3)  # fmt: skip


def visible_search(projection: Projection, corpus: Corpus, probes: Vectors) -> None:
    """Similar search as a member that may not see the private rows of another agent,
    and as a principal of another owner (org rows only), beside it unrestricted."""
    cid = corpus.cid
    member = q.ExperienceFilter(viewer=Viewer(True, "bench", "agent"))
    stranger = q.ExperienceFilter(viewer=Viewer(False, "elsewhere", None))

    def plain(i: int) -> object:
        return q.similar_experiences(projection, cid, probes[i], k=K)

    def as_member(i: int) -> object:
        return q.similar_experiences(projection, cid, probes[i], k=K, flt=member)

    def as_stranger(i: int) -> object:
        return q.similar_experiences(projection, cid, probes[i], k=K, flt=stranger)

    seen = {h.experience.experience_id for h in as_member(0)}  # type: ignore[attr-defined]
    private = {corpus.ids[i] for i in range(0, corpus.n, 10)}
    assert len(seen) == K and not seen & private, "the member saw a private row"
    plain_ms, member_ms, stranger_ms = alternate(len(probes), [plain, as_member, as_stranger])
    ratio = pct(member_ms, 50) / pct(plain_ms, 50)
    emit("visible_search", experiences=corpus.n, queries=len(probes), k=K,
         private="every 10th (another agent's)", org="every 20th",
         plain_p50_ms=pct(plain_ms, 50), member_p50_ms=pct(member_ms, 50),
         member_p99_ms=pct(member_ms, 99), other_owner_p50_ms=pct(stranger_ms, 50),
         other_owner_p99_ms=pct(stranger_ms, 99), ratio_member_to_plain_p50=sig(ratio),
         ratio_other_owner_to_plain_p50=sig(pct(stranger_ms, 50) / pct(plain_ms, 50)),
         target="ratio_member_to_plain_p50 <= 3", met=ratio <= 3)  # fmt: skip


def visible_text(projection: Projection, corpus: Corpus, probes: Vectors, texts: list[str]) -> None:
    """Text and hybrid search as a member that may not see another agent's private rows
    (scored from what it may see: ``projections.text``), beside them unrestricted."""
    cid = corpus.cid
    member = q.ExperienceFilter(viewer=Viewer(True, "bench", "agent"))

    def plain(i: int) -> object:
        return q.search_text(projection, cid, texts[i], k=K)

    def as_member(i: int) -> object:
        return q.search_text(projection, cid, texts[i], k=K, flt=member)

    def hybrid(i: int) -> object:
        return q.hybrid_experiences(projection, cid, texts[i], probes[i], pool=POOL)

    def hybrid_member(i: int) -> object:
        return q.hybrid_experiences(projection, cid, texts[i], probes[i], pool=POOL, flt=member)

    plain_ms, member_ms, hybrid_ms, hybrid_member_ms = alternate(
        len(probes), [plain, as_member, hybrid, hybrid_member]
    )
    ratio = pct(member_ms, 50) / pct(plain_ms, 50)
    emit("visible_text", experiences=corpus.n, queries=len(probes), k=K,
         private="every 10th (another agent's)", plain_p50_ms=pct(plain_ms, 50),
         plain_p99_ms=pct(plain_ms, 99), member_p50_ms=pct(member_ms, 50),
         member_p99_ms=pct(member_ms, 99), hybrid_p50_ms=pct(hybrid_ms, 50),
         hybrid_member_p50_ms=pct(hybrid_member_ms, 50),
         hybrid_member_p99_ms=pct(hybrid_member_ms, 99),
         ratio_member_to_plain_p50=sig(ratio),
         ratio_hybrid_member_to_hybrid_p50=sig(
             pct(hybrid_member_ms, 50) / pct(hybrid_ms, 50)))  # fmt: skip


def hybrid_and_context(
    projection: Projection, corpus: Corpus, probes: Vectors, texts: list[str]
) -> None:
    cid = corpus.cid

    def similar(i: int) -> object:
        return q.similar_experiences(projection, cid, probes[i], k=K)

    def hybrid(i: int) -> object:
        return q.hybrid_experiences(projection, cid, texts[i], probes[i], pool=POOL)

    def context(i: int) -> object:
        return _context(projection, cid, texts[i], probes[i], q.ANY_LIVE, POOL, True, True,
                        10, 5, 1.0, 1.0)  # fmt: skip

    similar_ms, hybrid_ms, context_ms = alternate(len(probes), [similar, hybrid, context])
    base = pct(similar_ms, 50)
    hybrid_ratio, context_ratio = pct(hybrid_ms, 50) / base, pct(context_ms, 50) / base
    emit("hybrid_and_context", experiences=corpus.n, queries=len(probes), pool=POOL,
         similar_p50_ms=base, hybrid_p50_ms=pct(hybrid_ms, 50),
         hybrid_p99_ms=pct(hybrid_ms, 99), context_p50_ms=pct(context_ms, 50),
         context_p99_ms=pct(context_ms, 99), hybrid_ratio=sig(hybrid_ratio),
         context_ratio=sig(context_ratio),
         target="hybrid_ratio <= 3 and context_ratio <= 5",
         met=hybrid_ratio <= 3 and context_ratio <= 5)  # fmt: skip


MEMORY_PROBE = """
import sys
from uuid import UUID
import numpy as np
from projections.projection import Projection, state_dir
from projections import queries as q

def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return [int(fields[name].split()[0]) * 1024 for name in ("VmRSS", "RssAnon")]
before = status()
p = Projection(state_dir(sys.argv[1]))
q.similar_experiences(p, UUID(sys.argv[2]), np.ones(int(sys.argv[3]), dtype=np.float32), k=10)
q.search_text(p, UUID(sys.argv[2]), "retry", k=10)
print(*[after - was for after, was in zip(status(), before)])
"""


def memory(data_dir: str, corpus: Corpus) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, data_dir, str(corpus.cid), str(DIM)],
        capture_output=True, text=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    if probe.returncode:
        raise RuntimeError(f"the memory probe failed:\n{probe.stderr}")
    rss, anon = (int(x) for x in probe.stdout.split())
    raw = corpus.n * DIM * 4 + corpus.content_bytes
    per_100k = 100_000 / corpus.n / 2**20  # bytes -> MiB per 100,000 experiences
    emit("memory", experiences=corpus.n, vm_rss_mb=round(rss / 2**20, 1),
         rss_anon_mb=round(anon / 2**20, 1), vm_rss_mb_per_100k=round(rss * per_100k, 1),
         rss_anon_mb_per_100k=round(anon * per_100k, 1),
         raw_mb_per_100k=round(raw * per_100k, 1),
         raw_vectors_mb_per_100k=round(corpus.n * DIM * 4 * per_100k, 1),
         raw_content_mb_per_100k=round(corpus.content_bytes * per_100k, 1),
         ratio_vm_rss=sig(rss / raw), ratio_rss_anon=sig(anon / raw),
         target="ratio_vm_rss <= 1.5 and ratio_rss_anon <= 1.5",
         met=rss / raw <= 1.5 and anon / raw <= 1.5)  # fmt: skip


async def vector_figures(n: int, count: int, figures: set[str]) -> None:
    corpus = Corpus(n)
    unit = normalized(corpus.vectors)
    rng = np.random.default_rng(2)
    picked = rng.integers(0, n, count)
    probes: Vectors = (corpus.vectors[picked] + 0.05 * rng.normal(size=(count, DIM))).astype(
        np.float32
    )
    texts = [corpus.query_text(rng, int(i)) for i in picked]
    with tempfile.TemporaryDirectory(prefix="pulse-bench-projection-") as tmp:
        peer = await fill_and_rebuild(tmp, corpus, unit, figures)  # NATS stops after it
        searches = {"similar_search", "hybrid_and_context", "filtered_search", "visible_search",
                    "visible_text", "add_and_search"}  # fmt: skip
        if figures & searches:
            projection = Projection(state_dir(tmp))
            try:
                indexed = projection.vectors[("experience", corpus.cid)].members
                assert len(indexed) == n, f"the rebuild indexed {len(indexed)} of {n}"
                if "similar_search" in figures:
                    similar_search(projection, corpus, peer, probes)
                if "hybrid_and_context" in figures:
                    hybrid_and_context(projection, corpus, probes, texts)
                if "visible_search" in figures:
                    visible_search(projection, corpus, probes)
                if "visible_text" in figures:
                    visible_text(projection, corpus, probes, texts)
                if "filtered_search" in figures:  # it changes the projection
                    filtered_search(projection, corpus, probes)
                if "add_and_search" in figures:  # last: it adds vectors without rows
                    add_and_search(projection, corpus, peer, probes)
            finally:
                projection.close()
        del peer
        if "memory" in figures:
            memory(tmp, corpus)


# -- recall ----------------------------------------------------------------------------------


def recall() -> None:
    """tests/test_search_quality.py's corpus and measure, with more queries."""
    rng = np.random.default_rng(20)
    centers = rng.normal(size=(CLUSTERS, DIM))
    vectors: Vectors = (
        centers[rng.integers(0, CLUSTERS, RECALL_N)] + 0.35 * rng.normal(size=(RECALL_N, DIM))
    ).astype(np.float32)
    probes: Vectors = (
        centers[rng.integers(0, CLUSTERS, RECALL_QUERIES)]
        + 0.35 * rng.normal(size=(RECALL_QUERIES, DIM))
    ).astype(np.float32)
    cid, instance, hlc = uuid7(), uuid7(), ev.pack_hlc(1_700_000_000_000)
    ids = [uuid7() for _ in range(RECALL_N)]
    events: list[ev.Event] = [
        ev.CollectiveCreated(event_id=uuid7(), instance_id=instance, hlc=hlc, collective_id=cid,
                             owner_id="o", name="recall", embedding_dimension=DIM)
    ]  # fmt: skip
    events += [
        ev.ExperienceRecorded(
            event_id=uuid7(), instance_id=instance, hlc=hlc, experience_id=eid,
            collective_id=cid, content=f"vector {i}", embedding=vectors[i].tobytes(),
            experience_type=ev.Generic(), importance=0.5, confidence=0.5,
            source_agent="recall",
        )
        for i, eid in enumerate(ids)
    ]  # fmt: skip
    entries = [LogEntry(seq, "s", e) for seq, e in enumerate(events, start=1)]
    unit, probe_unit = normalized(vectors), normalized(probes)
    truth = [set(np.argsort(-(unit @ p))[:RECALL_K].tolist()) for p in probe_unit]
    position = {eid: i for i, eid in enumerate(ids)}
    with tempfile.TemporaryDirectory(prefix="pulse-bench-recall-") as tmp:
        projection = Projection(Path(tmp) / "state")
        try:
            for start in range(0, len(entries), 2000):
                projection.apply(entries[start : start + 2000])
                projection.sync_indexes()  # as the engine does after every batch
            index = projection.vectors[("experience", cid)]
            hits = 0
            for expected, probe in zip(truth, probes, strict=True):
                found = q.similar_experiences(projection, cid, probe, k=RECALL_K)
                hits += len(expected & {position[h.experience.experience_id] for h in found})
        finally:
            projection.close()
    pulse = hits / (RECALL_K * RECALL_QUERIES)
    peer = graph_index(DIM)
    peer.train(unit)
    peer.add(unit)
    peer.hnsw.efSearch = max(EF_SEARCH, 2 * RECALL_K)
    _, found_ids = peer.search(probe_unit, RECALL_K)
    faiss_hits = sum(len(t & set(row.tolist())) for t, row in zip(truth, found_ids, strict=True))
    emit("recall", experiences=RECALL_N, queries=RECALL_QUERIES, k=RECALL_K,
         index="hnsw" if index.is_hnsw else "flat", pulse_recall=round(pulse, 4),
         faiss_graph_index_recall=round(faiss_hits / (RECALL_K * RECALL_QUERIES), 4),
         target=">= 0.95", met=pulse >= 0.95)  # fmt: skip


def main(options: argparse.Namespace) -> None:
    figures = set(options.only)
    if "rebuild_counters" in figures:
        asyncio.run(rebuild_counters(options.counter_events))
    if figures & VECTOR_FIGURES:
        asyncio.run(vector_figures(options.n, options.queries, figures))
    if "recall" in figures:
        recall()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.projection",
        description=__doc__.split("\n\n")[0],
        epilog="figures: " + ", ".join(FIGURES),
    )
    parser.add_argument("--n", type=int, default=100_000,
                        help="384-d experiences of the vector figures (100000)")  # fmt: skip
    parser.add_argument("--queries", type=int, default=1000,
                        help="queries per side of the search figures (1000)")  # fmt: skip
    parser.add_argument("--counter-events", type=int, default=1_000_000,
                        help="events in the rebuild_counters stream (1000000)")  # fmt: skip
    parser.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES),
                        metavar="FIGURE", help="only these figures (all)")  # fmt: skip
    main(parser.parse_args())

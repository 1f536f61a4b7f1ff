"""Compaction of the HNSW graphs (``projections.vectors.VectorIndex``).

Once more than ``COMPACT_FRACTION`` of a graph's nodes are deleted, a graph of the live
vectors is built in the background and swapped in, with the changes made during the
build applied to it. Search never returns a deleted experience (before, during or after
a compaction) and stays close to exact; the graph does not grow with the number of
deletes; and a process killed with SIGKILL mid-compaction leaves a state directory that
opens and converges to the digest of a clean replay (``tests/compaction_worker.py``).
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict
from uuid import UUID

import msgspec
import numpy as np
import numpy.typing as npt
import pytest

from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections import queries as q
from projections.projection import Projection, ProjectionSettings
from projections.vectors import _COMPACTOR, COMPACT_FRACTION, VectorIndex

Matrix = npt.NDArray[np.float32]

ROOT = Path(__file__).resolve().parent.parent
INSTANCE = uuid7()
BASE_MS = 1_700_000_000_000
CLUSTERS = 24
BATCH = 5000  # events per apply, as the engine's catch-up batches
K = 10
ARCHIVED_TOO = q.ExperienceFilter(include_archived=True)


class Common(TypedDict):
    """The fields every event carries."""

    event_id: UUID
    instance_id: UUID
    hlc: int


class History:
    """One collective's log, built in stream order (sequence = position + 1), and what
    it should leave: every vector recorded, which experiences are deleted or archived."""

    def __init__(self, dim: int, seed: int) -> None:
        self.dim = dim
        self.rng = np.random.default_rng(seed)
        self.centers = self.rng.normal(size=(CLUSTERS, dim))
        self.cid = uuid7()
        self.entries: list[LogEntry] = []
        self.vectors: dict[UUID, Matrix] = {}  # every experience recorded, in order
        self.deleted: set[UUID] = set()
        self.archived: set[UUID] = set()
        self._clock = itertools.count()
        created = ev.CollectiveCreated(
            **self._common(),
            collective_id=self.cid,
            owner_id="o",
            name="compaction",
            embedding_dimension=dim,
        )
        self._append([created])

    @property
    def seq(self) -> int:
        return len(self.entries)

    def _common(self) -> Common:
        hlc = ev.pack_hlc(BASE_MS + next(self._clock))
        return Common(event_id=uuid7(), instance_id=INSTANCE, hlc=hlc)

    def _append(self, events: Sequence[ev.Event]) -> list[LogEntry]:
        start = len(self.entries)
        new = [LogEntry(start + i, "s", e) for i, e in enumerate(events, start=1)]
        self.entries.extend(new)
        return new

    def points(self, n: int) -> Matrix:
        """Clustered vectors (as embeddings are), not normalized."""
        centers = self.centers[self.rng.integers(0, CLUSTERS, n)]
        return (centers + 0.35 * self.rng.normal(size=(n, self.dim))).astype(np.float32)

    def record(self, n: int) -> tuple[list[UUID], list[LogEntry]]:
        ids, events = [], []
        for vector in self.points(n):
            eid = uuid7()
            ids.append(eid)
            self.vectors[eid] = vector
            events.append(
                ev.ExperienceRecorded(
                    **self._common(),
                    experience_id=eid,
                    collective_id=self.cid,
                    content=f"lesson {len(self.vectors)}",
                    embedding=vector.tobytes(),
                    experience_type=ev.Generic(),
                    importance=0.5,
                    confidence=0.5,
                    source_agent="compaction",
                )
            )
        return ids, self._append(events)

    def delete(self, ids: Iterable[UUID]) -> list[LogEntry]:
        ids = list(ids)
        assert not self.deleted & set(ids)
        self.deleted.update(ids)
        common = self._common
        return self._append(
            [ev.ExperienceDeleted(**common(), experience_id=i, collective_id=self.cid) for i in ids]
        )

    def archive(self, ids: Iterable[UUID]) -> list[LogEntry]:
        ids = list(ids)
        self.archived.update(ids)
        common = self._common
        return self._append(
            [
                ev.ExperienceArchived(**common(), experience_id=i, collective_id=self.cid)
                for i in ids
            ]
        )

    def live(self) -> list[UUID]:
        """Not deleted (archived ones included), in the order they were recorded."""
        return [i for i in self.vectors if i not in self.deleted]

    def shown(self) -> list[UUID]:
        """What a default search may return: live and not archived."""
        return [i for i in self.live() if i not in self.archived]

    def pick(self, n: int, among: Sequence[UUID] | None = None) -> list[UUID]:
        pool = self.live() if among is None else list(among)
        return [pool[i] for i in self.rng.choice(len(pool), size=n, replace=False)]


def feed(p: Projection, entries: Sequence[LogEntry]) -> None:
    """Apply in batches, bringing the indexes up after each (as the engine does)."""
    for start in range(0, len(entries), BATCH):
        p.apply(entries[start : start + BATCH])
        p.sync_indexes()


def graph_size(index: VectorIndex) -> int:
    """Nodes in the FAISS index now serving searches (live and deleted ones)."""
    return int(index.index.ntotal)


def assert_graph_holds_the_live(p: Projection, h: History, index: VectorIndex) -> None:
    live = {p.memory.vec_ids[i] for i in h.live()}
    assert index.members - index.gone == live, "the index's live members are the live experiences"
    assert graph_size(index) == len(index.members)
    archived = {p.memory.vec_ids[i] for i in h.archived - h.deleted}
    assert index.hidden == archived, "archived experiences stay in the index, hidden"


def assert_search_is_live_and_close_to_exact(
    p: Projection, h: History, index: VectorIndex, queries: Matrix, least: float = 0.95
) -> None:
    """Neither the index nor the query returns a deleted (or, unasked, an archived)
    experience; each query gets k hits; recall@k against exact numpy is at least
    ``least``."""
    shown = h.shown()
    unit = np.stack([h.vectors[i] for i in shown])
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    truths = np.argsort(
        -(unit @ (queries / np.linalg.norm(queries, axis=1, keepdims=True)).T), axis=0
    )
    hits = 0
    for n, query in enumerate(queries):
        raw = [index.keys.get(vec_id) for vec_id, _ in index.search(query[None, :], K)]
        assert None not in raw, "the index returned a vec_id it has no experience for"
        assert not set(raw) & h.deleted, "the index returned a deleted experience"
        assert not set(raw) & h.archived, "the index returned an archived experience unasked"
        found = [r.experience.experience_id for r in q.similar_experiences(p, h.cid, query, k=K)]
        assert len(found) == K, f"{len(found)} hits for k={K}"
        assert not set(found) & (h.deleted | h.archived)
        hits += len({shown[i] for i in truths[:K, n]} & set(found))
    recall = hits / (K * len(queries))
    assert recall >= least, f"recall@{K} = {recall}"


def assert_found_by_own_vector(
    p: Projection, h: History, ids: Iterable[UUID], least: float = 0.98
) -> None:
    """A deleted experience is never found, an archived one never unasked; of the others,
    at least ``least`` are their own nearest neighbour (archived ones when asked for)."""
    found, tried = 0, 0
    for eid in ids:
        vector = h.vectors[eid]
        default = [r.experience.experience_id for r in q.similar_experiences(p, h.cid, vector, k=3)]
        asked = [
            r.experience.experience_id
            for r in q.similar_experiences(p, h.cid, vector, k=3, flt=ARCHIVED_TOO)
        ]
        if eid in h.deleted:
            assert eid not in default and eid not in asked, "a deleted experience was found"
            continue
        tried += 1
        if eid in h.archived:
            assert eid not in default, "an archived experience was found unasked"
            found += asked[:1] == [eid]
        else:
            found += default[:1] == [eid]
    assert found >= least * tried, f"{tried - found} of {tried} not their own nearest neighbour"


def assert_forgotten(p: Projection, h: History, index: VectorIndex) -> None:
    """No deleted vector (a sample of them) is left in the graph's codes or anywhere in
    the exact-vectors file."""
    deleted = sorted(h.deleted)
    sample = np.stack([h.vectors[i] for i in deleted[:: max(1, len(deleted) // 300)]])
    sample /= np.linalg.norm(sample, axis=1, keepdims=True)
    _, graph = index.stored()
    index.exact.sync()
    exact = np.fromfile(index.exact.path, dtype=np.float32).reshape(-1, h.dim)
    for where, held in (("the graph", graph), ("the exact file", exact)):
        norms = np.maximum(np.linalg.norm(held, axis=1), 1e-9)[:, None]
        assert not np.any(held @ sample.T > 0.99 * norms), f"a deleted vector is in {where}"


# -- in process -------------------------------------------------------------------------------


def test_deleting_past_a_fifth_compacts_the_graph_and_search_stays_exact(tmp_path: Path) -> None:
    h = History(dim=32, seed=1)
    h.record(2000)
    p = Projection(tmp_path / "state", ProjectionSettings(hnsw_threshold=200))
    feed(p, h.entries)
    feed(p, h.archive(h.pick(100)))
    index = p.vectors[("experience", h.cid)]
    index.wait()
    assert index.is_hnsw and graph_size(index) == 2000
    queries = h.points(40)
    assert_search_is_live_and_close_to_exact(p, h, index, queries)
    old_graph = index.index

    doomed = h.pick(600)  # 30%: past the fifth after 401 of them
    for start in range(0, len(doomed), 50):  # searched before, at and after the trigger
        feed(p, h.delete(doomed[start : start + 50]))
        assert_search_is_live_and_close_to_exact(p, h, index, queries)
    index.wait()

    assert index.compacting is None
    assert index.index is not old_graph, "a new graph was swapped in"
    assert graph_size(index) == 2000 - 401, "the nodes of the 401 deleted first are dropped"
    assert_graph_holds_the_live(p, h, index)
    assert len(index.gone) == 600 - 401 <= COMPACT_FRACTION * len(index.members)
    assert_search_is_live_and_close_to_exact(p, h, index, queries)
    assert_found_by_own_vector(p, h, [*h.pick(50), *sorted(h.archived)[:20], *doomed[:50]])
    assert_forgotten(p, h, index)
    p.close()


def test_a_graph_a_fifth_deleted_still_finds_the_live(tmp_path: Path) -> None:
    """Up to a fifth of a graph's nodes stay in it, deleted, until the next delete starts
    a compaction: they must not keep searches from the live ones meanwhile."""
    h = History(dim=32, seed=7)
    h.record(5000)
    p = Projection(tmp_path / "state", ProjectionSettings(hnsw_threshold=200))
    feed(p, h.entries)
    index = p.vectors[("experience", h.cid)]
    index.wait()
    queries = h.points(50)
    assert_search_is_live_and_close_to_exact(p, h, index, queries)
    feed(p, h.delete(h.pick(int(COMPACT_FRACTION * 5000))))
    assert index.compacting is None and len(index.gone) == COMPACT_FRACTION * len(index.members)
    assert graph_size(index) == 5000
    assert_search_is_live_and_close_to_exact(p, h, index, queries)
    assert_found_by_own_vector(p, h, h.pick(300))
    p.close()


N_BIG, DIM_BIG, THRESHOLD_BIG = 4000, 64, 1000


@contextmanager
def compactor_held() -> Iterator[threading.Event]:
    """Hold the compaction worker (``_COMPACTOR``, one thread) with a task that waits for
    the event yielded: a compaction started meanwhile is queued behind it, under way and
    not done, until the event is set (at the latest on leaving)."""
    gate = threading.Event()
    _COMPACTOR.submit(gate.wait)
    try:
        yield gate
    finally:
        gate.set()


def test_changes_made_while_a_compaction_runs_are_in_the_swapped_graph(tmp_path: Path) -> None:
    """Deletes past a fifth of the graph start a compaction; records, archives and
    deletes (of old experiences and of ones recorded during the build) follow before it
    ends, and searches run on the old graph meanwhile; then it is swapped in."""
    n = N_BIG
    h = History(dim=DIM_BIG, seed=2)
    h.record(n)
    p = Projection(tmp_path / "state", ProjectionSettings(hnsw_threshold=THRESHOLD_BIG))
    feed(p, h.entries)
    index = p.vectors[("experience", h.cid)]
    index.wait()
    assert index.is_hnsw and graph_size(index) == n
    queries = h.points(30)
    old_graph = index.index

    first = h.pick(int(COMPACT_FRACTION * n) + 1)
    with compactor_held() as gate:
        feed(p, h.delete(first))  # the last of these starts the compaction
        running = index.compacting
        assert running is not None, "deleting past a fifth of the graph starts a compaction"
        old = h.live()
        fresh, entries = h.record(300)
        feed(p, entries + h.archive(h.pick(100, among=old)))
        later = h.pick(300, among=[i for i in old if i not in h.archived])
        feed(p, h.delete([*later, *fresh[:100]]))
        assert index.compacting is running and not running.done()
        assert index.index is old_graph
        # while it runs, the old graph serves, without what was deleted since
        assert_search_is_live_and_close_to_exact(p, h, index, queries)
        assert_found_by_own_vector(
            p, h, [*fresh[::4], *sorted(h.archived)[:10], *first[:10], *later[:10]]
        )
        assert index.compacting is running and index.index is old_graph
        gate.set()
        index.wait()

    assert index.compacting is None and index.index is not old_graph
    assert_graph_holds_the_live(p, h, index)
    # built from what was live when it started, plus what arrived during the build; what
    # was deleted during the build is erased in it (and counted gone)
    assert graph_size(index) == n - len(first) + 200
    assert index.gone == {p.memory.vec_ids[i] for i in later}
    assert_search_is_live_and_close_to_exact(p, h, index, queries)
    assert_found_by_own_vector(p, h, [*fresh, *sorted(h.archived)[:20], *first[:20], *later[:20]])
    assert_forgotten(p, h, index)
    p.close()


def test_the_graph_stays_bounded_over_rounds_of_records_and_deletes(tmp_path: Path) -> None:
    h = History(dim=32, seed=3)
    h.record(2000)
    p = Projection(tmp_path / "state", ProjectionSettings(hnsw_threshold=200))
    feed(p, h.entries)
    index = p.vectors[("experience", h.cid)]
    index.wait()
    per_round, sizes = 500, []
    for _ in range(10):
        feed(p, h.record(per_round)[1])
        feed(p, h.delete(h.pick(per_round)))
        index.wait()
        live = len(h.live())
        assert live == 2000
        sizes.append(graph_size(index))
        assert sizes[-1] <= live / (1 - COMPACT_FRACTION) + per_round, (
            f"graph sizes by round {sizes}: it grows with the deletes"
        )
        assert_graph_holds_the_live(p, h, index)
    assert_search_is_live_and_close_to_exact(p, h, index, h.points(30))
    assert_found_by_own_vector(p, h, h.pick(50))
    p.close()


# -- killed mid-compaction ----------------------------------------------------------------------

N_KILL, DIM_KILL, THRESHOLD_KILL = 4000, 64, 1000


@dataclass
class Plan:
    """The log the worker applies, with its phases' last sequences and the digest of a
    clean replay of all of it."""

    history: History
    events_file: Path
    recorded: int  # applied first: the graph
    saved: int  # applied, then saved (a fifth of the graph deleted)
    trigger: int  # the two deletes that start a compaction
    during: list[int]  # applied while it runs
    digest: str


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    directory = tmp_path_factory.mktemp("plan")
    h = History(dim=DIM_KILL, seed=4)
    h.record(N_KILL)
    recorded = h.seq
    doomed = h.pick(int(COMPACT_FRACTION * N_KILL) + 1)
    h.delete(doomed[:-2])  # a fifth of the graph, not more: no compaction yet
    saved = h.seq
    h.delete(doomed[-2:])  # past a fifth: these start one (and take no time)
    trigger = h.seq
    old = h.live()
    fresh, _ = h.record(300)
    h.archive(h.pick(100, among=old))
    during = [h.seq]
    h.delete([*h.pick(300, among=[i for i in old if i not in h.archived]), *fresh[:100]])
    during.append(h.seq)
    events_file = directory / "events.msgpack"
    events_file.write_bytes(msgspec.msgpack.encode([e.event for e in h.entries]))
    reference = Projection(directory / "reference", ProjectionSettings(hnsw_threshold=10 * N_KILL))
    feed(reference, h.entries)
    digest = reference.digest()
    reference.close()
    return Plan(h, events_file, recorded, saved, trigger, during, digest)


def open_and_check(state: Path, plan: Plan, seq: int) -> None:
    """Open the state (it must), replay the whole log into it, and compare it with a
    clean replay: same digest, only live experiences found, each where it should be."""
    h = plan.history
    p = Projection(state, ProjectionSettings(hnsw_threshold=THRESHOLD_KILL))
    assert p.seq == seq, "it opens at the last sequence DuckDB holds"
    feed(p, h.entries)  # what is at or below its checkpoint is skipped
    assert p.seq == h.seq
    index = p.vectors[("experience", h.cid)]
    index.wait()
    assert p.digest() == plan.digest, "it converges to the state of a clean replay"
    assert_graph_holds_the_live(p, h, index)
    assert graph_size(index) < N_KILL, "the compaction the kill interrupted happened again"
    assert len(index.gone) <= COMPACT_FRACTION * len(index.members)
    assert_search_is_live_and_close_to_exact(p, h, index, h.points(20))
    deleted = sorted(h.deleted)
    assert_found_by_own_vector(
        p, h, [*h.pick(100, among=h.shown()), *sorted(h.archived)[:20], *deleted[::100]]
    )
    assert_forgotten(p, h, index)
    p.close()


@pytest.mark.parametrize("action", ["none", "flush", "save"])
def test_a_projection_killed_mid_compaction_opens_and_converges(
    tmp_path: Path, plan: Plan, action: str
) -> None:
    """Killed while the compaction started by deletes applied after a save runs, with
    more records, archives and deletes applied during it, and then: nothing more
    ("none": DuckDB and the index files at the save), a flush ("flush": DuckDB ahead of
    the index files), or a save ("save": the old graph saved with its deleted nodes)."""
    state = tmp_path / "state"
    worker = subprocess.run(
        [
            sys.executable, "-m", "tests.compaction_worker", str(state), str(plan.events_file),
            str(THRESHOLD_KILL), action, str(plan.recorded), str(plan.saved), str(plan.trigger),
            *map(str, plan.during),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = worker.stdout + worker.stderr
    assert worker.returncode == -signal.SIGKILL, output
    (line,) = [x for x in worker.stdout.splitlines() if x.startswith("compacting ")]
    killed = json.loads(line.removeprefix("compacting "))
    last = plan.history.seq
    assert killed["seq"] == last
    assert killed["flushed_seq"] == (plan.saved if action == "none" else last)
    assert killed["saved_seq"] == (last if action == "save" else plan.saved)

    open_and_check(state, plan, killed["flushed_seq"])
    open_and_check(state, plan, last)  # and again, from what it saved when it closed

"""Pending vectors of an HNSW index (``projections.vectors.VectorIndex``).

Past ``hnsw_threshold`` a vector added to a collective's index is not inserted into its
graph by the adding thread: it is pending, found by an exact scan beside the graph
search, until the background inserter (``_INSERTER``) moves it into the graph. These
tests hold the inserter with a gate (a task queued on its one thread) to see the index
while vectors are pending: a search finds them with the filters a graph search has; a
removed or archived one is not found; a restart with vectors that the saved graph lacks
finds them again; and for any sequence of adds, removes, archives, inserter steps and
compactions, a search that explores the whole (small) graph answers what an exact
search over the live vectors answers.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

import faiss
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import projections.vectors as vectors_module
from projections import queries as q
from projections.projection import Projection, ProjectionSettings
from projections.vectors import (
    _COMPACTOR,
    _INSERTER,
    HNSW_EF_CONSTRUCTION,
    HNSW_EF_ONLINE,
    PENDING_CAP,
    STABLE_WAIT,
    ExactVectors,
    VectorIndex,
)
from tests.test_compaction import History, feed, graph_size

Matrix = npt.NDArray[np.float32]
DIM = 16


@contextmanager
def inserter_held() -> Iterator[threading.Event]:
    """Hold the background inserter (one thread) with a task that waits for the event
    yielded: vectors added meanwhile stay pending until it is set (at the latest on
    leaving)."""
    gate = threading.Event()
    _INSERTER.submit(gate.wait)
    try:
        yield gate
    finally:
        gate.set()


@contextmanager
def compactor_held() -> Iterator[threading.Event]:
    gate = threading.Event()
    _COMPACTOR.submit(gate.wait)
    try:
        yield gate
    finally:
        gate.set()


def make_index(path: Path, threshold: int = 50, ef_search: int = 128) -> VectorIndex:
    return VectorIndex(DIM, ExactVectors(path / "exact.f32", DIM), threshold, ef_search)


def add(index: VectorIndex, first: int, vectors: Matrix, *, defer: bool = False) -> list[int]:
    ids = list(range(first, first + len(vectors)))
    index.add(ids, vectors, [UUID(int=i + 1) for i in ids], defer=defer)
    return ids


def in_graph(index: VectorIndex) -> set[int]:
    return set(faiss.vector_to_array(index.index.id_map).tolist())


def top(index: VectorIndex, vector: Matrix, k: int = 1, **kwargs: object) -> list[int]:
    return [vec_id for vec_id, _ in index.search(vector, k, **kwargs)]  # type: ignore[arg-type]


def until(condition: object, seconds: float = 30.0) -> None:
    """Poll ``condition`` (the state of the inserter's or the compactor's thread, which
    signal nothing a test could wait on) every millisecond until it holds, failing the
    test past the deadline: the synchronous twin of ``tests.harness.eventually``."""
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not reached before the deadline"
        time.sleep(0.001)


def test_a_pending_vector_is_found_before_the_inserter_inserts_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    index = make_index(tmp_path)
    vectors = rng.normal(size=(300, DIM)).astype(np.float32)
    add(index, 0, vectors[:200])  # past the threshold: a graph of the 200
    assert index.is_hnsw and graph_size(index) == 200 and not index.pending
    with inserter_held() as gate:
        fresh = add(index, 200, vectors[200:])
        assert graph_size(index) == 200, "the adding thread inserted nothing"
        assert list(index.pending) == fresh and set(fresh) <= index.members
        for vec_id in fresh:
            found = index.search(vectors[vec_id], 3)
            assert found[0][0] == vec_id and abs(found[0][1] - 1.0) < 1e-5
        # archived: only when asked for; removed: never, and never inserted
        index.set_hidden(fresh[0], True)
        index.remove([fresh[1], 5])
        assert top(index, vectors[fresh[0]]) != [fresh[0]]
        assert top(index, vectors[fresh[0]], include_archived=True) == [fresh[0]]
        assert fresh[1] not in index.members and fresh[1] not in index.pending
        assert fresh[1] not in {v for v, _ in index.search(vectors[fresh[1]], 300)}
        assert not np.any(index.exact.get(np.array([fresh[1], 5])))
        assert 5 in index.gone and 5 not in {v for v, _ in index.search(vectors[5], 300)}
        # an allowed set large enough for the graph: pending ones in it, none outside it
        allowed = np.array([v for v in range(0, 300, 2) if v not in (fresh[1], 5)])
        assert top(index, vectors[fresh[2]], allowed=allowed) == [fresh[2]]
        assert fresh[3] not in top(index, vectors[fresh[3]], 10, allowed=allowed)
        assert graph_size(index) == 200
        gate.set()
        until(lambda: not index.pending)
    assert in_graph(index) == index.members and fresh[1] not in in_graph(index)
    assert top(index, vectors[fresh[0]]) != [fresh[0]], "inserted, it stays hidden"
    assert top(index, vectors[fresh[0]], include_archived=True) == [fresh[0]]
    assert all(top(index, vectors[v]) == [v] for v in fresh[2:])


def test_the_inserter_empties_the_queue_in_chunks(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    index = make_index(tmp_path)
    vectors = rng.normal(size=(2000, DIM)).astype(np.float32)
    add(index, 0, vectors[:100])
    for start in range(100, 2000, 50):  # as writes come: the inserter keeps up meanwhile
        add(index, start, vectors[start : start + 50])
    until(lambda: not index.pending and index.inserting is None)
    assert in_graph(index) == set(range(2000)) and graph_size(index) == 2000
    assert all(top(index, vectors[v]) == [v] for v in range(0, 2000, 37))


def test_vectors_inserted_into_a_graph_search_wider_than_its_one_add_build(
    tmp_path: Path,
) -> None:
    """A graph built online is worse than one built in one add at the same breadth
    (``python -m ops.bench.graph_build``): the first graph (one add) is built with
    HNSW_EF_CONSTRUCTION, every later insert, the inserter's or the adding thread's, with
    the wider HNSW_EF_ONLINE."""

    def breadth() -> int:
        return int(faiss.downcast_index(index.index.index).hnsw.efConstruction)

    assert HNSW_EF_ONLINE > HNSW_EF_CONSTRUCTION
    rng = np.random.default_rng(7)
    index = make_index(tmp_path)
    vectors = rng.normal(size=(400, DIM)).astype(np.float32)
    add(index, 0, vectors[:100])
    assert index.is_hnsw and breadth() == HNSW_EF_CONSTRUCTION
    with inserter_held():
        add(index, 100, vectors[100:200])
        assert breadth() == HNSW_EF_CONSTRUCTION, "nothing inserted yet"
    until(lambda: not index.pending and index.inserting is None)
    assert breadth() == HNSW_EF_ONLINE and graph_size(index) == 200
    index.compact()  # a graph built again in one add, then inserted into
    index.wait()
    assert breadth() == HNSW_EF_CONSTRUCTION and graph_size(index) == 200
    add(index, 200, vectors[200:])
    index.wait_pending()
    assert breadth() == HNSW_EF_ONLINE and graph_size(index) == 400


def test_deferred_vectors_are_built_into_one_graph_in_one_add(tmp_path: Path) -> None:
    """Adds with ``defer`` (a catch-up's) past the threshold build no graph and insert
    nothing; the first use that needs them (here a search, then a save after more) builds
    the graph of all of them in one add at HNSW_EF_CONSTRUCTION, as FAISS alone does."""
    rng = np.random.default_rng(11)
    index = make_index(tmp_path, threshold=50)
    vectors = rng.normal(size=(300, DIM)).astype(np.float32)
    for first in range(0, 200, 40):
        add(index, first, vectors[first : first + 40], defer=True)
    assert not index.is_hnsw and graph_size(index) == 0 and not index.pending
    assert index.members == set(range(200)) and len(index.deferred) == 200
    index.remove([7])  # a deferred vector forgotten before any build
    assert 7 not in index.deferred and index.exact.get(np.array([7]))[0].tolist() == [0] * DIM
    assert top(index, vectors[120]) == [120]  # the search builds the graph first
    graph = faiss.downcast_index(index.index.index)
    assert index.is_hnsw and graph.hnsw.efConstruction == HNSW_EF_CONSTRUCTION
    assert in_graph(index) == set(range(200)) - {7} and not index.deferred
    add(index, 200, vectors[200:], defer=True)  # a graph exists: pending, as any add
    assert set(index.pending) == set(range(200, 300))
    index.save(tmp_path / "index.faiss")
    assert in_graph(index) == set(range(300)) - {7} and not index.pending


def test_few_deferred_vectors_go_into_the_flat_index_at_their_first_use(tmp_path: Path) -> None:
    index = make_index(tmp_path, threshold=50)
    vectors = np.random.default_rng(12).normal(size=(60, DIM)).astype(np.float32)
    add(index, 0, vectors[:30], defer=True)
    assert graph_size(index) == 0 and len(index.deferred) == 30
    add(index, 30, vectors[30:40])  # a live add after the catch-up takes them all in
    assert not index.is_hnsw and graph_size(index) == 40 and not index.deferred
    add(index, 40, vectors[40:], defer=True)  # past the threshold once built: a graph
    index.wait()
    assert index.is_hnsw and graph_size(index) == 60 and not index.deferred


def test_a_writer_faster_than_the_inserter_inserts_past_the_cap_itself(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    index = make_index(tmp_path)
    vectors = rng.normal(size=(PENDING_CAP + 600, DIM)).astype(np.float32)
    add(index, 0, vectors[:100])
    with inserter_held():
        add(index, 100, vectors[100:PENDING_CAP])
        assert len(index.pending) == PENDING_CAP - 100 and graph_size(index) == 100
        add(index, PENDING_CAP, vectors[PENDING_CAP:])
        assert len(index.pending) <= PENDING_CAP, "the queue stays bounded"
        assert graph_size(index) + len(index.pending) == len(vectors)
        assert in_graph(index).isdisjoint(index.pending)
        assert all(top(index, vectors[v]) == [v] for v in range(0, len(vectors), 97))
    index.wait()
    assert not index.pending and graph_size(index) == len(vectors)


@contextmanager
def lock_held(lock: threading.Lock, until_then: Callable[[], bool]) -> Iterator[None]:
    """Hold ``lock`` on another thread (as the inserter holds the index's ``_stable``
    for a chunk, and a save for its write) until ``until_then()`` holds, or at the
    latest on leaving; the body runs once it is held."""
    leaving = threading.Event()
    taken = threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            until(lambda: leaving.is_set() or until_then())

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait()
    try:
        yield
    finally:
        leaving.set()
        thread.join()


def test_an_add_past_the_cap_waits_out_a_chunk_but_not_a_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the cap, the adding thread inserts the excess even while the inserter is in
    a chunk (it holds the lock a few ms; trying without waiting, the add found it held
    chunk after chunk, and a million's graph fell minutes behind); while a save writes
    the index (longer than ``STABLE_WAIT``) it leaves the excess pending."""
    rng = np.random.default_rng(13)
    index = make_index(tmp_path)
    vectors = rng.normal(size=(2 * PENDING_CAP + 1200, DIM)).astype(np.float32)
    add(index, 0, vectors[:100])
    with inserter_held():
        add(index, 100, vectors[100:PENDING_CAP])
        # a chunk: the lock let go as soon as the adding thread asks for it
        with lock_held(index._stable, lambda: index._wanted > 0):
            add(index, PENDING_CAP, vectors[PENDING_CAP : PENDING_CAP + 600])
        assert len(index.pending) <= PENDING_CAP, "the excess inserted after the chunk"
        # held past ``STABLE_WAIT``: the add gives up waiting and leaves the excess
        with lock_held(index._stable, lambda: False):
            started = time.monotonic()
            add(index, PENDING_CAP + 600, vectors[PENDING_CAP + 600 : PENDING_CAP + 3000])
            waited = time.monotonic() - started
        assert len(index.pending) > PENDING_CAP, "left pending while the lock is held"
        assert waited < STABLE_WAIT * 10, waited
        # a save writing the index (``write`` marks it): not waited for at all, however
        # long the wait allowed for a chunk
        monkeypatch.setattr(vectors_module, "STABLE_WAIT", 10.0)
        index._writing = True
        with lock_held(index._stable, lambda: False):
            started = time.monotonic()
            add(index, PENDING_CAP + 3000, vectors[PENDING_CAP + 3000 :])
            waited = time.monotonic() - started
        index._writing = False
        assert len(index.pending) > PENDING_CAP and waited < 5.0, waited
        assert all(top(index, vectors[v]) == [v] for v in range(0, len(vectors), 211))
    index.wait()
    assert not index.pending and graph_size(index) == len(vectors)


def test_a_compaction_takes_pending_vectors_and_leaves_later_ones_pending(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(4)
    index = make_index(tmp_path)
    vectors = rng.normal(size=(700, DIM)).astype(np.float32)
    add(index, 0, vectors[:500])
    with inserter_held(), compactor_held() as compactor:
        before = add(index, 500, vectors[500:600])  # pending when the compaction starts
        index.remove(range(0, 130))  # past a fifth of 600: it starts
        assert index.compacting is not None
        after = add(index, 600, vectors[600:])  # pending, added during the build
        index.remove([before[0], after[0]])
        compactor.set()
        until(lambda: index.compacting is not None and index.compacting.done())
        index._settle()  # the owner swaps it in at its next use
        assert index.compacting is None
        assert in_graph(index) == set(range(130, 600)), "built from the live, pending too"
        assert index.gone == {before[0]}, "removed during the build: erased in the new graph"
        assert list(index.pending) == after[1:], "added during the build: pending"
        live = [v for v in range(130, 700) if v not in (before[0], after[0])]
        assert all(top(index, vectors[v]) == [v] for v in live[::7])
        assert not {before[0], after[0], 3} & set(top(index, vectors[before[0]], 700))
    index.wait()
    assert in_graph(index) == index.members == set(live) | {before[0]}


def test_a_save_inserts_the_pending_vectors_first(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    index = make_index(tmp_path)
    vectors = rng.normal(size=(300, DIM)).astype(np.float32)
    add(index, 0, vectors[:200])
    with inserter_held():
        add(index, 200, vectors[200:])
        assert len(index.pending) == 100
        index.save(tmp_path / "graph.faiss")
        assert not index.pending and graph_size(index) == 300
    assert faiss.read_index(str(tmp_path / "graph.faiss")).ntotal == 300


def test_vectors_pending_at_a_crash_are_found_after_it(tmp_path: Path) -> None:
    """The state on disk as a crash leaves it (DuckDB flushed past the saved graph,
    which lacks the vectors that were pending): opened, it adds them again."""
    h = History(dim=DIM, seed=5)
    h.record(400)
    state, crashed = tmp_path / "state", tmp_path / "crashed"
    p = Projection(state, ProjectionSettings(hnsw_threshold=100))
    feed(p, h.entries)
    p.save()
    index = p.vectors[("experience", h.cid)]
    with inserter_held():
        fresh, entries = h.record(40)
        feed(p, entries + h.archive(fresh[:5]))
        assert len(index.pending) == 40 and graph_size(index) == 400
        p.flush()
        p.store.checkpoint_file()
        shutil.copytree(state, crashed, ignore=shutil.ignore_patterns(".tmp*"))  # a kill -9 now
        p.close()
        p = Projection(crashed, ProjectionSettings(hnsw_threshold=100))
        assert p.seq == h.seq
        index = p.vectors[("experience", h.cid)]
        assert set(fresh) <= set(index.keys.values())
        for eid in fresh:
            found = q.similar_experiences(p, h.cid, h.vectors[eid], k=1)
            archived = q.similar_experiences(
                p, h.cid, h.vectors[eid], k=1, flt=q.ExperienceFilter(include_archived=True)
            )
            assert [r.experience.experience_id for r in archived] == [eid]
            assert (found[0].experience.experience_id == eid) == (eid not in fresh[:5])
    index.wait()
    assert graph_size(index) == len(index.members) == 440
    p.close()


# -- any sequence ---------------------------------------------------------------------------------

N_MAX = 160

step = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 40), st.booleans()),  # (deferred or not)
    st.tuples(st.just("remove"), st.lists(st.integers(0, N_MAX - 1), max_size=12)),
    st.tuples(st.just("hide"), st.lists(st.integers(0, N_MAX - 1), max_size=6), st.booleans()),
    st.tuples(st.just("insert"), st.integers(1, 30)),
    st.tuples(st.just("compact")),
)


@settings(max_examples=40)
@given(
    steps=st.lists(step, min_size=1, max_size=14),
    seed=st.integers(0, 2**16),
    threshold=st.sampled_from([10, 40]),
)
def test_any_sequence_searches_as_an_exact_scan_of_the_live(
    tmp_path_factory: object, steps: list[tuple[object, ...]], seed: int, threshold: int
) -> None:
    """Adds (deferred, as a catch-up's, or not), removes, archives, inserter steps (a
    chunk inserted as the inserter does) and compactions in any order, the inserter
    held otherwise: a search whose graph
    exploration covers the whole graph (efSearch past its size) returns the exact top k
    of the live vectors it may return, up to the 8-bit codes' error at the cut."""
    path = Path(tmp_path_factory.mktemp("any"))  # type: ignore[attr-defined]
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(N_MAX, DIM)).astype(np.float32)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    index = make_index(path, threshold=threshold, ef_search=4 * N_MAX)
    live: set[int] = set()
    hidden: set[int] = set()
    added = 0
    with inserter_held():
        for action, *args in steps:
            if action == "add" and added < N_MAX:
                count = min(int(args[0]), N_MAX - added)  # type: ignore[call-overload]
                add(index, added, vectors[added : added + count], defer=bool(args[1]))
                live.update(range(added, added + count))
                added += count
            elif action == "remove":
                index.remove(args[0])  # type: ignore[arg-type]
                live.difference_update(args[0])  # type: ignore[arg-type]
                hidden.difference_update(args[0])  # type: ignore[arg-type]
            elif action == "hide":
                for vec_id in args[0]:  # type: ignore[attr-defined]
                    if vec_id in live:
                        index.set_hidden(vec_id, bool(args[1]))
                        (hidden.add if args[1] else hidden.discard)(vec_id)
            elif action == "insert" and index.is_hnsw:
                with index._lock:
                    index._insert(int(args[0]), 1)  # type: ignore[call-overload]
            elif action == "compact":
                index.compact()
                if index.compacting is not None:
                    concurrent_wait(index)
            check(index, unit, live, hidden, rng)
    index.wait()
    check(index, unit, live, hidden, rng)
    if index.is_hnsw:
        assert in_graph(index) == index.members and not index.pending


def concurrent_wait(index: VectorIndex) -> None:
    until(lambda: index.compacting is None or index.compacting.done())


def check(
    index: VectorIndex,
    unit: Matrix,
    live: set[int],
    hidden: set[int],
    rng: np.random.Generator,
) -> None:
    assert index.members - index.gone == live
    if index.is_hnsw:
        assert in_graph(index).isdisjoint(index.pending)
        assert in_graph(index) | set(index.pending) == index.members
    queries = [unit[rng.integers(len(unit))], rng.normal(size=DIM).astype(np.float32)]
    allowed = np.array(sorted(v for v in live if v % 3), dtype=np.int64)
    for query in queries:
        qn = query / np.linalg.norm(query)
        for k in (1, 5, 20):
            for kwargs, eligible in (
                ({}, live - hidden),
                ({"include_archived": True}, live),
                ({"allowed": allowed}, set(allowed.tolist())),
            ):
                found = index.search(query, k, **kwargs)
                ids = [vec_id for vec_id, _ in found]
                assert len(ids) == len(set(ids)) == min(k, len(eligible))
                assert set(ids) <= eligible, "a vector it may not return"
                scores = {v: float(unit[v] @ qn) for v in eligible}
                for vec_id, score in found:
                    assert abs(score - scores[vec_id]) < 1e-4, "scores are exact cosines"
                best = sorted(eligible, key=lambda v: (-scores[v], v))[:k]
                if best:
                    cut = scores[best[-1]]
                    for vec_id in set(best) ^ set(ids):  # only ties at the cut, within
                        assert abs(scores[vec_id] - cut) < 0.02, (kwargs, k, best, ids)


def test_a_row_holds_where_its_vector_is_not_a_view_of_it(tmp_path: Path) -> None:
    """An experience whose vector is in the exact-vectors file holds only where it is,
    as a small int (a memoryview of the slot cost 184 bytes a row: a tenth of an
    experience's raw bytes at a million), when indexed and after an open; a read, a
    write to DuckDB and a vector that leaves the file while its row stays all give the
    bytes recorded."""
    h = History(dim=DIM, seed=7)
    ids, _ = h.record(150)
    state = tmp_path / "state"
    p = Projection(state, ProjectionSettings(hnsw_threshold=100))
    feed(p, h.entries)
    p.save()
    p.flush()
    p.close()
    p = Projection(state, ProjectionSettings(hnsw_threshold=100))
    try:
        for eid in ids:
            row = p.memory.experiences[(eid,)]
            assert type(row.embedding) is int and sys.getsizeof(row.embedding) <= 32
            got = q.get_experience(p, eid)
            assert got is not None and got.embedding == h.vectors[eid].tobytes()
        stored = dict(
            p.store.con.execute("SELECT experience_id, embedding FROM experience_rows").fetchall()
        )
        assert {eid: stored[eid] for eid in ids} == {eid: h.vectors[eid].tobytes() for eid in ids}
        row = p.memory.experiences[(ids[0],)]
        p._own_copy(row)  # (what a removal from the index does first)
        assert row.embedding == h.vectors[ids[0]].tobytes()
    finally:
        p.close()

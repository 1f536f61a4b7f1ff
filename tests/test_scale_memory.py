"""What a host keeps resident per experience (issue 28, target 4: ``ops/bench/scale.py``):
the exact vectors written with ``pwrite`` and let go of (``ExactVectors.release``), rows
loaded on open in one pass (``MemoryState.load``) as the fold would index them, values
rows repeat held once (``fold.shared``), and DuckDB's buffer pool bounded."""

from __future__ import annotations

import random
from pathlib import Path
from uuid import UUID

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from projections import fold
from projections.state import MemoryState
from projections.store import MEMORY_LIMIT, Store
from projections.vectors import RELEASE_EVERY, ExactVectors
from tests.histories import histories

DIM = 8


def resident(path: Path) -> int:
    """The resident bytes of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and ":" not in head[0]:
                inside = len(head) > 5 and head[5] == str(path)
            elif inside and head and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


def vectors(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, DIM)).astype(np.float32)


def test_put_in_any_order_reads_back_what_was_put(tmp_path: Path) -> None:
    exact = ExactVectors(tmp_path / "exact.f32", DIM)
    run = [5, 3, 4, 6]  # one run of slots, out of order: written with pwrite
    scattered = [10, 20, 12]  # not a run: written through the mapping
    first, second = vectors(len(run), 1), vectors(len(scattered), 2)
    exact.put(run, first)
    exact.put(scattered, second)
    assert np.array_equal(exact.get(np.array(run)), first)
    assert np.array_equal(exact.get(np.array(scattered)), second)
    assert bytes(exact.view(4)) == first[2].tobytes()
    assert not exact.get(np.array([0, 7, 11])).any()  # never written: zeros
    exact.close()
    again = ExactVectors(tmp_path / "exact.f32", DIM)  # what the file holds
    assert np.array_equal(again.get(np.array(run + scattered)), np.concatenate([first, second]))
    again.close()


def test_release_lets_go_of_resident_pages_and_views_stay_good(tmp_path: Path) -> None:
    path = tmp_path / "exact.f32"
    exact = ExactVectors(path, DIM)
    count = RELEASE_EVERY - 1  # (one put short of a release of its own)
    data = vectors(count, 3)
    exact.put(range(count), data)
    views = [exact.view(i) for i in range(count)]
    assert b"".join(bytes(v) for v in views) == data.tobytes()  # read: resident now
    assert resident(path) >= count * DIM * 4 // 2
    exact.release()
    assert resident(path) == 0
    assert bytes(views[-1]) == data[-1].tobytes()  # (read again from the page cache)
    assert resident(path) > 0
    more = vectors(RELEASE_EVERY, 4)
    exact.put(range(count, count + RELEASE_EVERY), more)  # reaches RELEASE_EVERY: released
    assert resident(path) == 0
    assert np.array_equal(exact.get(np.arange(count, count + RELEASE_EVERY)), more)
    exact.get(np.arange(RELEASE_EVERY))  # reads count too: a release
    assert resident(path) == 0
    b"".join(bytes(v) for v in views)
    exact.sync()  # a save releases too
    assert resident(path) == 0
    exact.close()


@settings(max_examples=60, deadline=None)
@given(histories, st.randoms(use_true_random=False))
def test_load_indexes_rows_as_merging_them_does(events: list[ev.Event], rng: random.Random) -> None:
    folded = fold.FoldState()
    for event in events:
        folded.apply(event)
    merged = MemoryState()
    merged.merge(folded)
    rows = [row.copy() for table in folded.rows.values() for row in table.values()]
    rng.shuffle(rows)  # (DuckDB gives them in no particular order)
    loaded = MemoryState()
    loaded.load(sorted(rows, key=lambda r: fold.ROW_TYPES.index(type(r))), {})
    assert loaded.fold.rows == merged.fold.rows
    assert loaded.order == merged.order
    assert loaded.experiences_of == merged.experiences_of
    assert loaded.versions.keys() == merged.versions.keys()
    assert loaded.counters == merged.counters
    assert loaded.triples == merged.triples
    assert not loaded.forgotten_counts


def test_shared_gives_one_object_for_equal_values_of_one_type() -> None:
    a, b = "agent-" + str(random.random()), None
    b = "".join(a)  # equal, another object
    assert a is not b and fold.shared(a) is fold.shared(b)
    uid = UUID(int=7)
    assert fold.shared(UUID(int=7)) is fold.shared(uid)
    assert fold.shared(None) is None
    fold.shared(1)
    assert fold.shared(True) is True  # equal to 1, another type: itself


def test_the_store_bounds_duckdbs_memory(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.duckdb")
    try:
        found = store.con.execute("SELECT current_setting('memory_limit')").fetchone()
        assert found is not None
        value, unit = found[0].split()
        assert MEMORY_LIMIT == "1GB" and unit == "MiB" and float(value) <= 1000
        store.drop_cache()  # (a reopened connection keeps it)
        again = store.con.execute("SELECT current_setting('memory_limit')").fetchone()
        assert again == found
    finally:
        store.close()


def test_an_open_keys_each_vector_number_by_its_rows_own_id(tmp_path: Path) -> None:
    """The open reads each experience's local FAISS id with its row, keyed by the row's
    own id object, not a second UUID made of the same text (a million of them were 2 s
    of an open and 90 MB); a row stored before its create (no create event: NULL in a
    UUID column, its stamps unlike its first stamp column's) reads back as it was."""
    from eventlog.log import LogEntry
    from projections.projection import Projection
    from tests import factories as f

    cid = f.uuid7()
    made = [f.collective(cid), *(f.experience(cid, f"lesson {i}") for i in range(5))]
    early = f.experience(cid, "changed before its create came")
    change = ev.ExperienceUpdated(
        **f._common(),  # type: ignore[arg-type]
        experience_id=early.experience_id,
        collective_id=cid,
        importance=0.9,
    )
    entries = [LogEntry(seq, "pulse.test", e) for seq, e in enumerate([*made, change], 1)]
    projection = Projection(tmp_path)
    projection.apply(entries)
    projection.close()
    again = Projection(tmp_path)
    try:
        vec_ids = again.memory.vec_ids
        assert len(vec_ids) == 5
        stored = dict(
            again.store.con.execute(
                "SELECT experience_id, vec_id FROM experience_rows WHERE vec_id IS NOT NULL"
            ).fetchall()
        )
        assert vec_ids == stored
        rows = again.memory.experiences
        for row_id in vec_ids:
            assert next(k for k in rows if k[0] == row_id)[0] is row_id
            assert rows[(row_id,)].experience_id is row_id
        waiting = rows[(early.experience_id,)]
        assert waiting.create_event is None and waiting.importance == 0.9
        assert waiting.importance_stamp and waiting.confidence_stamp == fold.NO_STAMP
        for row_id in vec_ids:  # a create stamps its registers alike: one object
            row = rows[(row_id,)]
            assert type(row.create_event) is UUID and row.importance_stamp
            assert row.confidence_stamp is row.importance_stamp is row.domain_stamp
    finally:
        again.close()


def test_the_order_loaded_breaks_ties_of_hlc_by_id_as_merging_does() -> None:
    """The open sorts a collective's experiences by HLC alone, and by HLC and id again
    only where two share an HLC: the order must be what merging them one by one gives."""
    cid = UUID(int=1)
    rows = [
        fold.ExperienceRow(experience_id=UUID(int=i), collective_id=cid, created_hlc=hlc)
        for i, hlc in ((9, 5), (3, 5), (7, 2), (1, 8), (4, 5), (2, 2))
    ]
    folded = fold.FoldState()
    for row in rows:
        folded.rows[fold.ExperienceRow][row.key()] = row.copy()
    merged = MemoryState()
    merged.merge(folded)
    loaded = MemoryState()
    loaded.load([row.copy() for row in rows], {})
    assert loaded.order == merged.order
    assert [i.int for _, i in loaded.order[cid]] == [2, 7, 3, 4, 9, 1]

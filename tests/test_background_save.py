"""The background save (``Projection.save(background=True)``).

The engine saves its index files every ``save_interval`` without holding its thread for
the write: it hands DuckDB's batch over and takes the text index's commit (sequence S),
and a saver thread commits the text index (the engine's text changes held meanwhile),
waits for DuckDB to hold S, writes each vector index (while the engine
goes on applying, so a file may hold vectors past S, or lack some pending at S), syncs
the exact vectors and writes the manifest with S last. These tests stop the saver at
each of its steps, apply more meanwhile (records, deletes, archives; DuckDB flushed past
S or not; the inserter run or held), and copy the state directory there: what a kill -9
at that moment would leave. Opened and caught up from the log, the copy must reach the
state of a clean replay: the same digest, the same live and archived vectors in the
index, each live vector found by a search for itself, the live experiences and no other
in the text index.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from projections import projection as projection_module
from projections import queries as q
from projections import vectors as vectors_module
from projections.projection import Projection, ProjectionSettings
from projections.text import TextIndex
from projections.vectors import VectorIndex, read_manifest
from tests.test_compaction import History, feed
from tests.test_vectors import inserter_held, until

DIM = 16
SETTINGS = ProjectionSettings(hnsw_threshold=60, ef_search=400)
# where the saver is stopped: before each, after all
STEPS = ("text", "write", "manifest", "done")


class Saver:
    """Stops the saver thread at each step (``STEPS``) until the test lets it go."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.arrived = {name: threading.Event() for name in STEPS}
        self.go = {name: threading.Event() for name in STEPS}
        write, manifest = VectorIndex.write, vectors_module.write_manifest
        commit_behind = TextIndex.commit_behind

        def paused_commit_behind(text: TextIndex) -> Callable[[], None]:
            commit = commit_behind(text)

            def paused() -> None:
                self._pause("text")
                if commit is not None:
                    commit()

            return paused

        def paused_write(index: VectorIndex, path: Path) -> None:
            self._pause("write")
            write(index, path)

        def paused_manifest(directory: Path, seq: int, entries: dict[str, int]) -> None:
            self._pause("manifest")
            manifest(directory, seq, entries)
            self._pause("done")

        monkeypatch.setattr(TextIndex, "commit_behind", paused_commit_behind)
        monkeypatch.setattr(VectorIndex, "write", paused_write)
        monkeypatch.setattr(projection_module, "write_manifest", paused_manifest)

    def _pause(self, name: str) -> None:
        self.arrived[name].set()
        assert self.go[name].wait(60), f"the test never let the saver past {name!r}"

    def at(self, name: str) -> None:
        """Wait until the saver stops at ``name``."""
        assert self.arrived[name].wait(60), f"the saver never reached {name!r}"

    def release(self) -> None:
        for event in self.go.values():
            event.set()


@contextmanager
def maybe(held: bool, hold: Callable[[], Any]) -> Iterator[None]:
    if held:
        with hold():
            yield
    else:
        yield


def crashed_copy(p: Projection, state: Path, to: Path) -> None:
    """The directory as a kill -9 would leave it now (no DuckDB write or checkpoint under
    way: the flusher's gate is held while copying)."""
    until(lambda: not p.flusher.busy)
    with p.flusher.gate:
        # (tantivy's merging threads remove their temporary files as they go)
        shutil.copytree(state, to, ignore=shutil.ignore_patterns(".tmp*"))


def assert_caught_up(crashed: Path, h: History, reference_digest: str) -> None:
    p = Projection(crashed, SETTINGS)
    try:
        assert p.seq <= h.seq
        feed(p, h.entries[p.seq :])  # the tail replays the log past DuckDB's checkpoint
        assert p.digest() == reference_digest
        index = p.vectors[("experience", h.cid)]
        index.wait()
        live = {p.memory.vec_ids[i] for i in h.live()}
        assert index.members - index.gone == live
        assert set(index.keys[v] for v in live) == set(h.live())
        assert index.hidden == {p.memory.vec_ids[i] for i in h.archived - h.deleted}
        for eid in h.shown():
            found = q.similar_experiences(p, h.cid, h.vectors[eid], k=1)
            assert [r.experience.experience_id for r in found] == [eid]
        texts = p.text.search("experience", h.cid, "lesson", 10 * len(h.vectors))
        assert {doc_id for doc_id, _ in texts} == set(h.live())
    finally:
        p.close()


def test_a_background_save_writes_what_a_save_writes(tmp_path: Path) -> None:
    """The periodic save's files hold what the synchronous save's do; the engine's
    thread returns before the files are written, and DuckDB's fold runs on the flusher."""
    h = History(dim=DIM, seed=3)
    h.record(150)
    p = Projection(tmp_path / "state", SETTINGS)
    feed(p, h.entries)
    checkpoints = p.flusher.checkpoints
    p.save(background=True)
    assert p.saved()
    assert read_manifest(tmp_path / "state" / "vectors")[0] == h.seq == p.saved_seq
    until(lambda: p.flusher.checkpoints > checkpoints)
    p.close()
    assert_caught_up(tmp_path / "state", h, _reference(tmp_path, h))


def _reference(tmp_path: Path, h: History) -> str:
    reference = Projection(tmp_path / "reference", SETTINGS)
    try:
        feed(reference, h.entries)
        return reference.digest()
    finally:
        reference.close()
        shutil.rmtree(tmp_path / "reference")


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    crash=st.sampled_from(STEPS),
    seed=st.integers(0, 2**16),
    during=st.tuples(st.integers(0, 30), st.integers(0, 12), st.integers(0, 8)),
    flushed=st.booleans(),
    inserted=st.booleans(),
)
# the file holds vectors of rows DuckDB never got: their numbers must not be reused
@example(crash="manifest", seed=1, during=(20, 3, 2), flushed=False, inserted=True)
# the vector file holds records applied during the save, the text index (committed at S)
# does not: they must be put in the text index again on opening
@example(crash="done", seed=0, during=(3, 1, 4), flushed=True, inserted=True)
def test_a_crash_during_a_background_save_opens_and_catches_up(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    crash: str,
    seed: int,
    during: tuple[int, int, int],
    flushed: bool,
    inserted: bool,
) -> None:
    """Records, deletes and archives applied while the saver is stopped before its
    index write (so the file may hold them, or lack them while they are pending),
    flushed to DuckDB or not; the copy made at ``crash`` opens and converges."""
    tmp_path = tmp_path_factory.mktemp("save")
    h = History(dim=DIM, seed=seed)
    h.record(120)
    state = tmp_path / "state"
    p = Projection(state, SETTINGS)
    feed(p, h.entries)
    p.save()
    recorded, deleted, archived = during
    _, entries = h.record(20)
    feed(p, entries)  # in DuckDB and the files at S
    with monkeypatch.context() as patch:
        saver = Saver(patch)
        try:
            p.save(background=True)
            saver.at("text")  # (the text index's changes are held from here until it commits)
            with maybe(not inserted, inserter_held):  # held: what is recorded stays pending
                fresh, more = h.record(recorded)
                feed(p, more + h.delete(h.pick(deleted)) + h.archive(h.pick(archived)))
                if inserted:
                    until(lambda: not p.vectors[("experience", h.cid)].pending)
                if flushed:
                    p.flush()
                if crash == "text":
                    crashed_copy(p, state, tmp_path / "crashed")
                saver.go["text"].set()
                saver.at("write")
                if crash == "write":
                    crashed_copy(p, state, tmp_path / "crashed")
                saver.go["write"].set()
                saver.at("manifest")
                if crash == "manifest":
                    crashed_copy(p, state, tmp_path / "crashed")
                saver.go["manifest"].set()
                saver.at("done")
                if crash == "done":
                    crashed_copy(p, state, tmp_path / "crashed")
                saver.release()
                assert p.saved()
        finally:
            saver.release()
            p.saved()
    p.close()
    assert_caught_up(tmp_path / "crashed", h, _reference(tmp_path, h))

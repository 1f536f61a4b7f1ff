"""``sync.maintenance``: catch-up, rebuild and digest of a data directory's state, with
no instance open, on an in-memory log (the CLI's commands over a real NATS server are
tests/test_rebuild.py's): a catch-up applies only what is new, a rebuild reaches the
same digest in a fresh state, and a rebuild refuses while another process holds the
state, leaving it as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import faiss
import pytest

from eventlog.memory import MemoryLog
from projections.projection import ProjectionSettings
from projections.store import StateInUse
from projections.vectors import HNSW_EF_CONSTRUCTION, HNSW_EF_ONLINE
from sync import maintenance
from tests.factories import history
from tests.test_compaction import History

# holds a DuckDB file open, as a running instance does, until its stdin closes
HOLDER = "import sys, duckdb; con = duckdb.connect(sys.argv[1]); print('held', flush=True); sys.stdin.read()"  # noqa: E501


async def test_catch_up_applies_what_is_new_and_rebuild_reaches_the_same_digest(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    events = history(30)
    await log.append_batch(events[:20])
    first = await maintenance.catch_up(tmp_path, log)
    assert (first.applied, first.seq) == (20, 20)
    await log.append_batch(events[20:])
    second = await maintenance.catch_up(tmp_path, log)
    assert second.applied == len(events) - 20 and second.seq == len(events)
    assert second.applied_total == len(events)
    assert (await maintenance.digest(tmp_path)).digest == second.digest != first.digest
    before = (tmp_path / "state").resolve()
    rebuilt = await maintenance.rebuild(tmp_path, log)
    assert rebuilt.digest == second.digest
    assert rebuilt.state == (tmp_path / "state").resolve() != before and not before.exists()


async def test_a_rebuild_builds_each_graph_in_one_add_after_the_fold(tmp_path: Path) -> None:
    """A catch-up (here a rebuild) keeps the vectors it folds out of FAISS until it ends,
    then builds each collective's graph in one add, as FAISS alone builds one: at
    HNSW_EF_CONSTRUCTION. Built as the fold went, past the threshold at the first
    index sync and inserted into at every later one, the graph would carry
    HNSW_EF_ONLINE, the breadth of inserts into a graph that exists."""
    assert HNSW_EF_ONLINE != HNSW_EF_CONSTRUCTION
    made = History(dim=16, seed=5)
    made.record(400)
    log = MemoryLog()
    await log.append_batch([entry.event for entry in made.entries])
    settings = ProjectionSettings(hnsw_threshold=50, batch_size=50, bulk_index_events=60)
    rebuilt = await maintenance.rebuild(tmp_path, log, settings=settings)
    index = faiss.read_index(str(rebuilt.state / "vectors" / f"experience-{made.cid}.faiss"))
    graph = faiss.downcast_index(index.index)
    assert isinstance(graph, faiss.IndexHNSWSQ) and index.ntotal == 400
    assert graph.hnsw.efConstruction == HNSW_EF_CONSTRUCTION


async def test_a_rebuild_refuses_while_another_process_holds_the_state(tmp_path: Path) -> None:
    log = MemoryLog()
    await log.append_batch(history(5))
    caught_up = await maintenance.catch_up(tmp_path, log)
    state = (tmp_path / "state").resolve()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(state / "state.duckdb")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(StateInUse) as refused:
            await maintenance.rebuild(tmp_path, log)
        assert str(refused.value) == (
            f"rebuild: the state {state / 'state.duckdb'} is open in another process (pid "
            f"{holder.pid}); stop it first (Ctrl-C on pulse up), then run pulse rebuild"
        )
        assert (tmp_path / "state").resolve() == state
        assert sorted(tmp_path.glob("state-*")) == [state]
    finally:
        holder.communicate(timeout=30)
    assert (await maintenance.digest(tmp_path)).digest == caught_up.digest

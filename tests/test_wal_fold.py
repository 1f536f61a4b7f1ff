"""The flusher folds DuckDB's write-ahead log into the file once it passes
``Flusher.wal_fold`` (issue 28, target 4): until a checkpoint, DuckDB holds every row it
logged in memory too (``IN_MEMORY_TABLE`` in ``duckdb_memory()``), about 3 KB per
experience ingested between two of the engine's saves."""

from __future__ import annotations

from pathlib import Path

import pytest

from projections.projection import Projection, ProjectionSettings
from projections.store import Store
from tests.test_compaction import History, feed
from tests.test_vectors import until


def in_memory_table_bytes(p: Projection) -> int:
    found = p.store.con.execute(
        "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() "
        "WHERE tag = 'IN_MEMORY_TABLE'"
    ).fetchone()
    return int(found[0]) if found else 0


@pytest.mark.parametrize("fold", [True, False])
def test_the_flusher_folds_a_long_write_ahead_log(tmp_path: Path, fold: bool) -> None:
    h = History(dim=64, seed=5)
    h.record(300)
    p = Projection(tmp_path / "state", ProjectionSettings())
    try:
        if fold:
            p.flusher.wal_fold = 0  # any log is long
        feed(p, h.entries)
        assert p.flush() == h.seq
        wal = Path(f"{p.store.path}.wal")
        if fold:  # folded after the write: no log, no rows held in memory beside it
            until(lambda: p.flusher.checkpoints >= 1)
            assert not wal.exists() or wal.stat().st_size == 0
            assert in_memory_table_bytes(p) == 0
        else:  # (the default: a log this short stays, and DuckDB holds its rows)
            assert p.flusher.checkpoints == 0
            assert wal.stat().st_size > 0
            assert in_memory_table_bytes(p) > 0
    finally:
        p.close()


def test_the_stores_reads_leave_no_transaction_open(tmp_path: Path) -> None:
    """A read on the engine's connection that left its result open (``fetchone``) kept
    its transaction open until the next statement there, so DuckDB refused every
    checkpoint after the flusher's UPDATEs, and held the rows in memory."""
    store = Store(tmp_path / "state.duckdb")
    writer = store.writer()
    try:
        writer.execute("INSERT INTO checkpoint VALUES (1, 5, 5)")
        assert store.wire_schema() >= 1 and not store.scrub_owed()
        assert store.checkpoint() == (5, 5)  # (a read of one row, the connection left idle)
        writer.execute("UPDATE checkpoint SET seq = 6 WHERE id = 1")  # committed
        assert store.checkpoint_file(writer)  # (refused while a read held a transaction)
        held = store.con.execute("SELECT seq FROM checkpoint")
        assert held.fetchone() == (6,)  # left open, as before: refused
        writer.execute("UPDATE checkpoint SET seq = 7 WHERE id = 1")
        assert not store.checkpoint_file(writer)
    finally:
        store.close()

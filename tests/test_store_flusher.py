"""DuckDB is written beside the engine, not on its thread (``store.Flusher``): a write
offered while DuckDB writes is applied and its writer woken at once; a write DuckDB
refuses is tried again and loses nothing; what asks for the present (SQL, a flush)
waits for the writer and sees every applied row; and any interleaving of applies and
hand-offs leaves DuckDB equal to memory."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.errors import PulseError
from eventlog.log import LogEntry
from projections import fold
from projections.engine import Engine
from projections.projection import Projection, ProjectionSettings
from tests import factories as f
from tests.harness import by_profile, eventually
from tests.histories import creates_in_two_collectives, histories, redeliveries, stored_model


def _entries(events: list[ev.Event], start: int = 1) -> list[LogEntry]:
    return [LogEntry(seq, "pulse.test", event) for seq, event in enumerate(events, start=start)]


def _stored_ids(p: Projection) -> set[object]:
    return set(p.store.rows(fold.ExperienceRow))


def _memory_ids(p: Projection) -> set[object]:
    return set(p.memory.experiences)


async def test_a_write_offered_while_duckdb_writes_is_applied_before_the_write_ends(
    tmp_path: Path,
) -> None:
    settings_ = ProjectionSettings(flush_interval=0.02, snapshot_interval=None)
    engine = await Engine.start(tmp_path / "state", settings_)
    try:
        cid = f.collective().collective_id
        first = [f.collective(cid), f.experience(cid)]
        await engine.apply(_entries(first))  # (written to DuckDB before it returns)
        flusher = await engine.run(lambda p: p.flusher)
        heard: list[int] = []
        engine.subscribe(lambda applied: heard.append(applied.seq))
        flusher.gate.acquire()  # DuckDB's next write waits here, in the middle of a flush
        try:
            engine.submit(_entries([f.experience(cid)], start=3))
            # the periodic hand-off takes it to the writer, which now holds it
            await eventually(lambda: flusher.busy, what="a DuckDB write in flight")
            assert flusher.written_seq == 2
            # a writer's event offered now: applied, and its waiter woken, at once
            offered = _entries([f.experience(cid)], start=4)
            engine.offer(offered)
            await eventually(lambda: 4 in heard, timeout=5.0, what="the offer applied")
            assert await engine.run(lambda p: p.seq) == 4
            key = (offered[0].event.experience_id,)  # type: ignore[union-attr]
            assert await engine.run(lambda p: key in p.memory.experiences)
            assert flusher.busy and flusher.written_seq == 2  # the write still has not ended
        finally:
            flusher.gate.release()
        assert await engine.flush() == 4
        stored = await engine.run(
            lambda p: (p.store.checkpoint(), _stored_ids(p) == _memory_ids(p))
        )
        assert stored == ((4, 4), True)
    finally:
        await engine.close()


def _hold_the_checkpoint(p: Projection) -> duckdb.DuckDBPyConnection:
    """A transaction of another connection that changed the checkpoint's row and has not
    committed: DuckDB refuses every write of the projection (a write-write conflict)."""
    holder = p.store.con.cursor()
    holder.begin()
    holder.execute("UPDATE checkpoint SET applied = applied + 1 WHERE id = 1")
    return holder


def test_a_write_duckdb_refuses_is_tried_again_and_loses_nothing(tmp_path: Path) -> None:
    p = Projection(tmp_path / "state", ProjectionSettings(flush_interval=0.05))
    try:
        cid = f.collective().collective_id
        events: list[ev.Event] = [f.collective(cid), f.experience(cid)]
        p.apply(_entries(events))
        p.flush()
        holder = _hold_the_checkpoint(p)
        more = [f.experience(cid) for _ in range(3)]
        p.apply(_entries(more[:2], start=3))
        refused = p.hand_off()
        assert refused is not None
        with pytest.raises(duckdb.TransactionException):
            refused.result(timeout=10)
        assert p.flusher.error is not None and p.flushed_seq == 2
        with pytest.raises(duckdb.TransactionException):  # asked for now: tried, refused
            p.flush()
        p.apply(_entries(more[2:], start=5))  # applying goes on meanwhile
        assert p.hand_off() is refused  # (memory keeps the rest while DuckDB refuses)
        assert p.flusher.busy and p.flushed_seq == 2 and p.dirty
        holder.rollback()
        holder.close()
        assert p.flush() == 5  # the refused batch, then the one behind it
        assert p.flusher.error is None
        assert p.store.checkpoint() == (5, 5)
        assert _stored_ids(p) == _memory_ids(p)
        clean = Projection(tmp_path / "clean")
        clean.apply(_entries(events + more))
        assert p.digest() == clean.digest()
        clean.close()
    finally:
        p.close()


def test_a_refused_write_retries_by_itself(tmp_path: Path) -> None:
    p = Projection(tmp_path / "state", ProjectionSettings(flush_interval=0.05))
    try:
        cid = f.collective().collective_id
        p.apply(_entries([f.collective(cid)]))
        p.flush()
        holder = _hold_the_checkpoint(p)
        p.apply(_entries([f.experience(cid)], start=2))
        refused = p.hand_off()
        assert refused is not None
        with pytest.raises(duckdb.TransactionException):
            refused.result(timeout=10)
        holder.rollback()
        holder.close()
        asyncio.run(eventually(lambda: p.flushed_seq == 2, what="the retry"))
        assert p.flusher.error is None and not p.flusher.busy
        assert _stored_ids(p) == _memory_ids(p)
    finally:
        p.close()


async def test_sql_of_the_present_waits_for_the_write_and_sees_every_applied_row(
    tmp_path: Path,
) -> None:
    settings_ = ProjectionSettings(flush_interval=0.02, snapshot_interval=None)
    engine = await Engine.start(tmp_path / "state", settings_)
    try:
        cid = f.collective().collective_id
        await engine.apply(_entries([f.collective(cid)]))
        flusher = await engine.run(lambda p: p.flusher)
        flusher.gate.acquire()
        try:
            engine.submit(_entries([f.experience(cid) for _ in range(3)], start=2))
            await eventually(lambda: flusher.busy, what="a DuckDB write in flight")
            engine.submit(_entries([f.experience(cid) for _ in range(2)], start=5))
            await eventually(lambda: engine.seq == 6, what="the rest applied")
            asked = asyncio.ensure_future(
                engine.sql("SELECT count(*) FROM experience_rows", [], 10)
            )
            await asyncio.sleep(0)  # (let it reach the engine)
            assert not asked.done()
        finally:
            flusher.gate.release()
        result = await asyncio.wait_for(asked, 30)
        assert result.rows == [[5]] and result.seq == 6
    finally:
        await engine.close()


def test_a_closed_writer_refuses_work_and_memory_keeps_it(tmp_path: Path) -> None:
    p = Projection(tmp_path / "state")
    cid = f.collective().collective_id
    p.apply(_entries([f.collective(cid)]))
    p.flusher.close()
    with pytest.raises(PulseError):
        p.hand_off()
    assert p.dirty  # nothing taken: the rows stay in memory, for a writer to come
    p.store.close()


@settings(max_examples=by_profile(ci=10, dev=40))
@given(st.data())
def test_any_interleaving_of_applies_and_hand_offs_leaves_duckdb_equal_to_memory(
    data: st.DataObject,
) -> None:
    events = data.draw(histories)
    assume(not creates_in_two_collectives(events))
    again = data.draw(redeliveries(events))
    cuts = sorted(data.draw(st.lists(st.integers(1, len(again)), max_size=8)))
    delivered = _entries(again)
    with tempfile.TemporaryDirectory() as tmp:
        p = Projection(Path(tmp) / "state")
        try:
            # the engine hands off between batches while the writer may still be
            # writing the one before; sometimes it waits for the writer (a read)
            for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
                p.apply(delivered[start:end])
                step = data.draw(st.sampled_from(["hand_off", "hand_off", "flush", "none"]))
                if step == "hand_off":
                    p.hand_off()
                elif step == "flush":
                    p.flush()
            assert p.flush() == len(again)
            assert p.store.checkpoint() == (len(again), len(again))
            expected = stored_model(events)
            for row_type in fold.ROW_TYPES:
                stored = p.store.rows(row_type)
                for row in stored.values():  # stamped from the stream, which bare events lack
                    if isinstance(row, fold.Placed):
                        row.create_seq = None
                assert stored == expected[row_type], row_type.__name__
        finally:
            p.close()


def test_a_writer_thread_that_died_is_started_again(tmp_path: Path) -> None:
    p = Projection(tmp_path / "state")
    try:
        cid = f.collective().collective_id
        p.apply(_entries([f.collective(cid)]))

        def die() -> None:  # (what the thread does after this write: end)
            raise SystemExit

        p.flusher.on_written = die
        assert p.flush() == 1
        asyncio.run(eventually(lambda: not p.flusher._thread.is_alive(), what="the end"))
        p.flusher.on_written = None
        p.apply(_entries([f.experience(cid)], start=2))
        assert p.flush() == 2  # (started again by the wait, as by the engine every round)
        assert p.flusher.restarts == 1
        assert _stored_ids(p) == _memory_ids(p)
    finally:
        p.close()

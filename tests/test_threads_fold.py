"""Threads in the fold (an agent framework's checkpoints and pending writes): any order of
the same events, with any duplicates and any cut into batches, leaves the same rows, as a
model written from the rules says (the model reads the events, never the fold's rows):

- a checkpoint is the one its events made (one event each in an honest history; of
  several, the smallest event id's), unless a tombstone deleted it or its thread;
- a pending write of a special channel (``idx`` below 0) holds the latest write, an
  ordinary one the first (by HLC, instance, event id), unless its checkpoint or its thread
  was deleted;
- a thread's tombstone stays, and so does a checkpoint's.

The same holds through a real projection: DuckDB's rows after a flush and a reopen."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections.fold import CheckpointRow, FoldState, PendingWriteRow, ThreadRow
from projections.projection import Projection
from projections.state import MemoryState

INSTANCES = (UUID(int=1), UUID(int=2))
COLLECTIVE = UUID("01930c4e-2b2a-7d40-8a11-0000000000c0")
THREADS = (UUID(int=0xA1), UUID(int=0xA2))
NAMESPACES = ("", "child:1")
CHECKPOINTS = ("1ef-01", "1ef-02", "1ef-03")


def _base(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "event_id": uuid7(),
        "instance_id": draw(st.sampled_from(INSTANCES)),
        "hlc": draw(st.integers(1, 50)),  # few values: ties are drawn too
        "thread_id": draw(st.sampled_from(THREADS)),
        "collective_id": COLLECTIVE,
    }


@st.composite
def thread_events(draw: st.DrawFn) -> ev.Event:
    base = _base(draw)
    where = {
        "checkpoint_ns": draw(st.sampled_from(NAMESPACES)),
        "checkpoint_id": draw(st.sampled_from(CHECKPOINTS)),
    }
    kind = draw(st.sampled_from(("checkpointed", "written", "written", "pruned", "deleted")))
    if kind == "checkpointed":
        return ev.ThreadCheckpointed(
            **base, **where, name="t", checkpoint_type="msgpack",
            checkpoint=draw(st.binary(min_size=1, max_size=4)),
            metadata=draw(st.sampled_from(('{"step":1}', '{"step":2}'))),
            run_id=draw(st.sampled_from((None, "run-1"))), author_agent="a",
        )  # fmt: skip
    if kind == "written":
        places = draw(st.lists(st.sampled_from((-3, -1, 0, 1)), min_size=1, max_size=3,
                               unique=True))  # fmt: skip
        return ev.ThreadWritten(
            **base, **where, task_id=draw(st.sampled_from(("task-1", "task-2"))),
            writes=tuple(
                ev.PendingWrite(idx=i, channel="c", value_type="msgpack",
                                value=draw(st.binary(max_size=4)))
                for i in places
            ),
        )  # fmt: skip
    if kind == "pruned":
        return ev.ThreadCheckpointDeleted(**base, **where)
    return ev.ThreadDeleted(**base)


def stamp(event: ev.EventBase) -> tuple[int, bytes, bytes]:
    return (event.hlc, event.instance_id.bytes, event.event_id.bytes)


def model(events: list[ev.Event]) -> dict[str, dict[tuple[Any, ...], tuple[Any, ...]]]:
    """What the rules say the rows hold, from the events (duplicates are one event)."""
    unique = {e.event_id: e for e in events}.values()
    dead_threads = {
        (e.thread_id, e.collective_id) for e in unique if isinstance(e, ev.ThreadDeleted)
    }
    pruned = {
        (e.thread_id, e.collective_id, e.checkpoint_ns, e.checkpoint_id)
        for e in unique
        if isinstance(e, ev.ThreadCheckpointDeleted)
    }
    checkpoints: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    made: dict[tuple[Any, ...], ev.ThreadCheckpointed] = {}
    for e in unique:
        if isinstance(e, ev.ThreadCheckpointed):
            key = (e.thread_id, e.collective_id, e.checkpoint_ns, e.checkpoint_id)
            if key not in made or (e.event_id, e.hlc) < (made[key].event_id, made[key].hlc):
                made[key] = e
    for key in pruned | set(made):
        if key[:2] in dead_threads:
            continue
        if key in pruned:
            checkpoints[key] = ("deleted",)
        else:
            e = made[key]
            checkpoints[key] = (e.checkpoint, e.metadata, e.run_id, e.parent_checkpoint_id)
    writes: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    chosen: dict[tuple[Any, ...], tuple[ev.ThreadWritten, ev.PendingWrite]] = {}
    for e in unique:
        if not isinstance(e, ev.ThreadWritten):
            continue
        for w in e.writes:
            key = (e.thread_id, e.collective_id, e.checkpoint_ns, e.checkpoint_id, e.task_id, w.idx)
            held = chosen.get(key)
            if held is None or (
                stamp(e) > stamp(held[0]) if w.idx < 0 else stamp(e) < stamp(held[0])
            ):
                chosen[key] = (e, w)
    for key, (e, w) in chosen.items():
        if key[:2] not in dead_threads and key[:4] not in pruned:
            writes[key] = (w.channel, w.value_type, w.value, e.task_path)
    return {
        "checkpoints": checkpoints,
        "writes": writes,
        "threads": {key: ("deleted",) for key in dead_threads},
    }


def held(memory: MemoryState) -> dict[str, dict[tuple[Any, ...], tuple[Any, ...]]]:
    """The state's thread rows, in the model's terms."""
    return {
        "checkpoints": {
            key: ("deleted",) if row.deleted
            else (row.checkpoint, row.metadata, row.run_id, row.parent_checkpoint_id)
            for key, row in memory.checkpoints.items()
        },
        "writes": {
            key: (row.channel, row.value_type, row.value, row.task_path)
            for key, row in memory.pending_writes.items()
        },
        "threads": {key: ("deleted",) for key, row in memory.threads.items() if row.deleted},
    }  # fmt: skip


def folded(events: list[ev.Event], cuts: list[int]) -> MemoryState:
    """The events merged into a state in batches (each folded apart, as the engine does)."""
    memory = MemoryState()
    start = 0
    for end in [*sorted(set(cuts)), len(events)]:
        batch = FoldState()
        for event in events[start:end]:
            batch.apply(event)
        memory.merge(batch)
        start = max(start, end)
    return memory


histories = st.lists(thread_events(), min_size=1, max_size=30)


@given(events=histories, data=st.data())
def test_any_order_duplicates_and_batches_give_the_rows_the_rules_say(
    events: list[ev.Event], data: st.DataObject
) -> None:
    expected = model(events)
    again = data.draw(st.lists(st.sampled_from(events), max_size=10))  # duplicates
    shuffled = data.draw(st.permutations(events + again))
    cuts = data.draw(st.lists(st.integers(0, len(shuffled)), max_size=4))
    assert held(folded(shuffled, cuts)) == expected


@settings(max_examples=15)  # (each opens DuckDB files twice)
@given(events=histories, data=st.data())
def test_duckdb_holds_the_same_rows_after_a_flush_and_a_reopen(
    tmp_path_factory: Any, events: list[ev.Event], data: st.DataObject
) -> None:
    directory = Path(tmp_path_factory.mktemp("threads"))
    shuffled = data.draw(st.permutations(events))
    cut = data.draw(st.integers(0, len(shuffled)))
    projection = Projection(directory)
    try:  # two batches, each written to DuckDB: a tombstone may come after rows it drops
        for seq, part in ((1, shuffled[:cut]), (1 + cut, shuffled[cut:])):
            projection.apply([LogEntry(seq + i, "pulse.test", e) for i, e in enumerate(part)])
            projection.flush()
    finally:
        projection.close()
    reopened = Projection(directory)
    try:
        assert held(reopened.memory) == model(events)
        stored = reopened.store.con.execute(
            "SELECT count(*) FROM checkpoint_rows UNION ALL SELECT count(*) FROM "
            "pending_write_rows UNION ALL SELECT count(*) FROM thread_rows"
        ).fetchall()
        expected = model(events)
        assert [n for (n,) in stored] == [
            len(expected[k]) for k in ("checkpoints", "writes", "threads")
        ]
    finally:
        reopened.close()


def test_a_thread_tombstone_drops_rows_that_came_before_and_after_it() -> None:
    thread = THREADS[0]
    common = {"instance_id": INSTANCES[0], "thread_id": thread, "collective_id": COLLECTIVE}
    checkpoint = ev.ThreadCheckpointed(
        event_id=uuid7(), hlc=1, **common, name="t", checkpoint_id="1ef-01",
        checkpoint_type="msgpack", checkpoint=b"state",
    )  # fmt: skip
    write = ev.ThreadWritten(
        event_id=uuid7(), hlc=2, **common, checkpoint_id="1ef-01", task_id="task-1",
        writes=(ev.PendingWrite(idx=0, channel="c", value_type="msgpack", value=b"v"),),
    )  # fmt: skip
    later = ev.ThreadCheckpointed(
        event_id=uuid7(), hlc=4, **common, name="t", checkpoint_id="1ef-02",
        checkpoint_type="msgpack", checkpoint=b"late",
    )  # fmt: skip
    deleted = ev.ThreadDeleted(event_id=uuid7(), hlc=3, **common)
    memory = folded([checkpoint, write], [])
    assert len(memory.checkpoints) == 1 and len(memory.pending_writes) == 1
    memory.merge(folded([deleted], []).fold)
    memory.merge(folded([later], []).fold)
    assert not memory.checkpoints and not memory.pending_writes
    assert memory.threads[(thread, COLLECTIVE)].deleted
    assert memory.landed_dead(later) == "entity"
    assert not any(memory.dirty[t] for t in (CheckpointRow, PendingWriteRow))
    assert memory.dirty[ThreadRow] == {(thread, COLLECTIVE)}

"""The search path's mechanisms: a search run on its caller's thread while the engine is
between rounds (``Engine.now``), and filter columns appended in place (``queries._Columns``).
Each answers as the mechanism it replaces did: a queued call, a fresh build of the columns."""

from __future__ import annotations

import threading
from pathlib import Path
from uuid import UUID

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections import queries as q
from projections.engine import Engine
from projections.projection import Projection
from tests import factories as f
from tests.harness import by_profile


def entries(events: list[ev.Event], first: int = 1) -> list[LogEntry]:
    return [LogEntry(seq, "pulse.test", event) for seq, event in enumerate(events, start=first)]


# -- searches on the caller's thread ----------------------------------------------------------


async def test_an_inline_read_runs_on_the_callers_thread_only_between_rounds(
    tmp_path: Path,
) -> None:
    """A read marked ``inline`` runs on the awaiting thread when the engine is idle; while
    a round runs it is queued (and answered after that round, on the engine thread); an
    unmarked read is always queued."""
    engine = await Engine.start(tmp_path / "state")
    here = threading.get_ident()

    @q.inline
    def where(_: Projection) -> int:
        return threading.get_ident()

    try:
        # (housekeeping rounds come and go: between two of them, it runs here)
        for _ in range(1000):
            if await engine.run(where) == here:
                break
        else:
            raise AssertionError("never between rounds")
        assert await engine.run(lambda _: threading.get_ident()) != here
        entered, leave = threading.Event(), threading.Event()
        busy = engine.call(lambda _: (entered.set(), leave.wait(10)))  # a round in progress
        assert entered.wait(10)
        assert engine.now(where) == (False, None)  # refused at once, not waited for
        later = engine.call(where)  # (as run does when refused)
        leave.set()
        busy.result(10)
        assert later.result(10) != here
    finally:
        await engine.close()
    assert engine.now(where) == (False, None)  # a stopped engine runs nothing inline


async def test_an_inline_read_sees_every_write_handed_over_before_it(tmp_path: Path) -> None:
    """Work queued before the read (or taken by a round that has not begun) is applied
    before the read runs, as it would be for a queued read: the read is queued behind it."""
    engine = await Engine.start(tmp_path / "state")
    cid = f.uuid7()

    @q.inline
    def seen(p: Projection) -> bool:
        return p.memory.live_collective(cid) is not None

    try:
        engine.round.acquire()  # the engine thread takes the entries and waits for this
        engine.submit(entries([f.collective(cid)]))
        engine.round.release()
        done, found = engine.now(seen)  # (most often before the engine thread gets the lock)
        assert found or not done
        assert await engine.run(seen)
    finally:
        await engine.close()


async def test_a_search_after_a_write_finds_it_inline(tmp_path: Path) -> None:
    """Read-your-writes: an applied write is in the index when the engine lets go."""
    engine = await Engine.start(tmp_path / "state")
    cid = f.uuid7()
    try:
        await engine.apply(entries([f.collective(cid)]))
        for i in range(5):
            written = f.experience(cid, f"lesson {i}")
            await engine.apply(entries([written], 2 + i))
            query = np.full(4, 0.5, np.float32)
            for _ in range(1000):  # (between two housekeeping rounds)
                done, found = engine.now(q.similar_experiences, cid, query, 10)
                if done:
                    break
                await engine.run(lambda _: None)
            assert done, "the engine was idle: the search runs here"
            assert written.experience_id in {h.experience.experience_id for h in found or ()}
    finally:
        await engine.close()


# -- filter columns appended in place ----------------------------------------------------------


def recorded(cid: UUID, i: int, *, importance: float, valid_to: bool) -> list[ev.Event]:
    made = f.experience(cid, f"lesson {i}")
    made = ev.ExperienceRecorded(
        **{
            **{k: getattr(made, k) for k in made.__struct_fields__},
            "importance": importance,
            "source_task": f"task {i % 3}",
        }
    )
    out: list[ev.Event] = [made]
    if valid_to:
        out.append(
            ev.ExperienceInvalidated(
                event_id=uuid7(),
                instance_id=f.INSTANCE,
                hlc=made.hlc + 1,
                experience_id=made.experience_id,
                collective_id=cid,
                reason="stale",
                valid_to_ms=ev.hlc_millis(made.hlc),
            )  # fmt: skip
        )
    return out


def fresh_columns(p: Projection, cid: UUID) -> q._Columns:
    built = q._Columns()
    built.append(p, list(p.memory.live_experiences_of(cid)))
    return built


FILTERS = [
    q.ANY_LIVE,
    q.ExperienceFilter(include_archived=True),
    q.ExperienceFilter(min_importance=0.5),
    q.ExperienceFilter(include_invalid=True),
    q.ExperienceFilter(domains=("testing",)),
    q.ExperienceFilter(source_task="task 1"),
    q.ExperienceFilter(source_task="task 2", include_archived=True),
]


@settings(max_examples=by_profile(ci=10, dev=60), deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.sampled_from(["add", "archive", "delete", "invalid"]), st.floats(0, 1)),
            min_size=1,
            max_size=6,
        ),  # fmt: skip
        min_size=1,
        max_size=6,
    )
)
def test_columns_kept_up_to_date_select_what_a_fresh_build_does(
    tmp_path_factory: object, batches: list[list[tuple[str, float]]]
) -> None:
    """Batches of writes (records, archives, deletes, invalidations), the columns brought
    up to date after each: every filter selects what columns built afresh select, and
    the earliest end of validity (kept, not looked for again) says the same."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        p = Projection(Path(tmp) / "state")
        cid = f.uuid7()
        seq = 1
        p.apply(entries([f.collective(cid)], seq))
        ids: list[UUID] = []
        for batch in batches:
            events: list[ev.Event] = []
            for op, x in batch:
                if op == "add" or not ids:
                    made = recorded(cid, len(ids), importance=x, valid_to=op == "invalid")
                    ids.append(made[0].experience_id)  # type: ignore[attr-defined]
                    events += made
                    continue
                target = ids[int(x * (len(ids) - 1))]
                common = {"event_id": uuid7(), "instance_id": f.INSTANCE,
                          "hlc": ev.pack_hlc(10**13 + seq * 100 + len(events))}  # fmt: skip
                ids_ = {"experience_id": target, "collective_id": cid}
                if op == "archive":
                    events.append(ev.ExperienceArchived(**common, **ids_))  # type: ignore[arg-type]
                elif op == "delete":
                    events.append(ev.ExperienceDeleted(**common, **ids_))  # type: ignore[arg-type]
                else:
                    events.append(
                        ev.ExperienceInvalidated(**common, **ids_, reason="r", valid_to_ms=1)  # type: ignore[arg-type]
                    )
            p.apply(entries(events, seq + 1))
            p.sync_indexes()  # (vec_ids are given as rows are indexed)
            seq += len(events)
            kept = q._columns(p, cid)
            built = fresh_columns(p, cid)
            for flt in FILTERS:
                assert sorted(kept.select(flt).tolist()) == sorted(built.select(flt).tolist())
                assert kept.invalid_any(flt) == built.invalid_any(flt)
                if flt.source_task is not None:  # listed from the columns: as a row pass
                    colliding = fresh_columns(p, cid)  # (every hash equal: the text decides)
                    colliding.task_hashes[:] = hash(flt.source_task)
                    assert sorted(colliding.select(flt).tolist()) == sorted(
                        built.select(flt).tolist()
                    )
                    rows = [
                        r.experience_id
                        for r in p.memory.experiences_in_order(cid, newest_first=True)
                        if q._passes(r, flt)
                    ]
                    listed = q.recent_experiences(p, cid, limit=1000, flt=flt)
                    assert [e.experience_id for e in listed] == rows
        p.close()


def test_a_write_appends_to_the_columns_in_place(tmp_path: Path) -> None:
    """The columns of a collective grow into room they hold (no copy of every column per
    write), and a past's copy appended to never changes the present's."""
    p = Projection(tmp_path / "state")
    cid = f.uuid7()
    p.apply(entries([f.collective(cid)] + [f.experience(cid, f"l{i}") for i in range(3)]))
    p.sync_indexes()  # (vec_ids are given as rows are indexed)
    columns = q._columns(p, cid)
    under = {name: getattr(columns, name).base for name in q._Columns.COLUMNS}
    assert all(base is not None for base in under.values())
    twin = columns.copy()
    p.apply(entries([f.experience(cid, "l3")], 5))
    p.sync_indexes()
    assert q._columns(p, cid) is columns and len(columns.vec_ids) == 4
    for name in q._Columns.COLUMNS:  # the same arrays underneath, one row longer
        assert getattr(columns, name).base is under[name], name
    extra = f.experience(cid, "l4")
    p.apply(entries([extra], 6))
    p.sync_indexes()
    q._columns(p, cid)
    present = columns.vec_ids.copy()
    assert len(present) == 5 and columns.vec_ids.base is under["vec_ids"]
    row = p.memory.live_experience(extra.experience_id)
    assert row is not None
    twin.append(p, [row])  # (into arrays of its own: the present's slot 3 is l3's)
    assert columns.vec_ids.tolist() == present.tolist()
    assert twin.vec_ids.tolist() == [*present[:3].tolist(), present[4]]
    assert not np.shares_memory(twin.vec_ids, columns.vec_ids)
    p.close()


# -- FAISS's thread team on the searching thread -----------------------------------------------


def test_a_flat_search_runs_with_the_search_team_on_any_thread(tmp_path: Path) -> None:
    """A flat index's search sets the calling thread's OpenMP team to ``SEARCH_THREADS``
    as a graph search does (a search now runs on its caller's thread, whose team FAISS
    would otherwise take as every core: idle workers spinning, 20-30x the CPU of the
    search itself on a loaded machine)."""
    import faiss

    from projections.vectors import SEARCH_THREADS, ExactVectors, VectorIndex

    index = VectorIndex(4, ExactVectors(tmp_path / "exact-4.f32", 4))
    index.add([1, 2, 3], np.eye(3, 4, dtype=np.float32), [uuid7() for _ in range(3)])
    seen: list[int] = []

    def search() -> None:  # (a fresh thread: its team is whatever it was given)
        faiss.omp_set_num_threads(SEARCH_THREADS + 2)
        assert [v for v, _ in index.search(np.array([1, 0, 0, 0], np.float32), 1)] == [1]
        seen.append(faiss.omp_get_max_threads())

    thread = threading.Thread(target=search)
    thread.start()
    thread.join()
    assert seen == [SEARCH_THREADS]
    assert not index.is_hnsw


async def test_an_inline_read_gives_the_loops_other_tasks_a_turn(tmp_path: Path) -> None:
    """A caller searching in a loop lets the loop's other tasks run between its searches,
    as an awaited hand-off to the engine thread does (an inline read never suspends)."""
    import asyncio

    engine = await Engine.start(tmp_path / "state")
    inline_runs = 0

    @q.inline
    def counted(_: Projection) -> None:
        nonlocal inline_runs
        inline_runs += threading.get_ident() == here

    here = threading.get_ident()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        await asyncio.sleep(0)
        while inline_runs < 3:  # (rounds of housekeeping come and go)
            before = ticks
            ran = inline_runs
            await engine.run(counted)
            if inline_runs > ran:
                assert ticks > before, "the ticker waited for the inline read"
    finally:
        task.cancel()
        await engine.close()

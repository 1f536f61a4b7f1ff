"""The engine's memory and the analysts' SQL views tell the same story, and the engine
applies group by group without changing the outcome.

``projections.state`` defines what is live for every read; ``projections.schema``'s
views state the same rules in SQL for analysts. On random histories (collisions,
updates before creates, deletes, wrong dimensions, relations across collectives,
triples taken twice) the live sets, the counts and the dead letters must agree."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.log import LogEntry
from projections import queries as q
from projections.engine import Engine
from projections.projection import Projection
from tests.harness import by_profile
from tests.histories import COLLECTIVES, histories, redeliveries


def entries(events: list[ev.Event]) -> list[LogEntry]:
    return [LogEntry(seq, "pulse.test", event) for seq, event in enumerate(events, start=1)]


def memory_story(p: Projection) -> dict[str, object]:
    memory = p.memory
    return {
        "collectives": sorted(c.collective_id for c in q.list_collectives(p)),
        "experiences": sorted(
            (e.experience_id, e.archived, e.applications)
            for cid in COLLECTIVES
            for e in q.recent_experiences(
                p, cid, 1000, q.ExperienceFilter(include_archived=True, include_invalid=True)
            )
        ),
        "relations": sorted(
            rid for rid in (k[0] for k in memory.relations) if memory.live_relation(rid)
        ),
        "insights": sorted(
            iid for iid in (k[0] for k in memory.insights) if memory.live_insight(iid)
        ),
        "dead_letters": sorted((d.entity, str(d.id), d.reason) for d in q.dead_letters(p)),
    }


def sql_story(p: Projection) -> dict[str, object]:
    p.flush()
    con = p.store.con

    def ids(sql: str) -> list[UUID]:
        return sorted(r[0] for r in con.execute(sql).fetchall())

    return {
        "collectives": ids("SELECT collective_id FROM collectives"),
        "experiences": sorted(
            (r[0], r[1], int(r[2]))
            for r in con.execute(
                "SELECT experience_id, archived, applications FROM experiences"
            ).fetchall()
        ),
        "relations": ids("SELECT relation_id FROM relations"),
        "insights": ids("SELECT insight_id FROM insights"),
        "dead_letters": sorted(
            (r[0], str(r[1]), r[2])
            for r in con.execute("SELECT entity, id, reason FROM dead_letters").fetchall()
        ),
    }


@settings(max_examples=by_profile(ci=20, dev=100))  # each example ~0.25 CPU-s
@given(histories)
def test_memory_and_the_sql_views_agree(events: list[ev.Event]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        projection = Projection(Path(tmp))
        projection.apply(entries(events))
        assert memory_story(projection) == sql_story(projection)
        projection.close()


@settings(max_examples=by_profile(ci=12, dev=50))  # each example ~0.5 CPU-s
@given(st.data())
def test_memory_read_back_from_duckdb_tells_the_same_story(data: st.DataObject) -> None:
    """A reopened projection (memory loaded from DuckDB) reads like the one that folded."""
    events = data.draw(histories)
    again = data.draw(redeliveries(events))
    with tempfile.TemporaryDirectory() as tmp:
        first = Projection(Path(tmp))
        cut = data.draw(st.integers(0, len(again)))
        delivered = entries(again)
        first.apply(delivered[:cut])
        first.flush()
        first.apply(delivered[cut:])
        story, digest = memory_story(first), first.digest()
        first.close()
        reopened = Projection(Path(tmp))
        assert memory_story(reopened) == story
        assert reopened.digest() == digest
        reopened.close()


async def test_group_commit_applies_what_queued_as_one_batch(tmp_path: Path) -> None:
    """Entries submitted while the engine is busy are applied together, and DuckDB is
    written once for them, not once per event."""
    from tests import factories as f

    cid = f.uuid7()
    events: list[ev.Event] = [f.collective(cid, dim=4)]
    events += [f.experience(cid, f"lesson {i}", dim=4) for i in range(2000)]
    engine = await Engine.start(tmp_path / "state")
    batches: list[int] = []
    engine.subscribe(lambda applied: batches.append(len(applied.entries)))
    for entry in entries(events):
        engine.submit((entry,))
    assert await engine.run(lambda p: p.seq) == len(events)
    assert sum(batches) == len(events)
    assert len(batches) < len(events) / 10, batches  # grouped, not one by one
    seq, applied = await engine.checkpoint()
    assert seq == applied == len(events)
    await engine.close()


async def test_only_the_engine_thread_changes_the_projection(tmp_path: Path) -> None:
    """One owner: the loop cannot apply or flush behind the engine's back."""
    from tests import factories as f

    engine = await Engine.start(tmp_path / "state")
    projection = await engine.run(lambda p: p)
    batch = entries([f.collective(f.uuid7())])
    with pytest.raises(RuntimeError, match="only by the thread that opened it"):
        projection.apply(batch)
    with pytest.raises(RuntimeError, match="only by the thread that opened it"):
        projection.flush()
    assert await engine.apply(batch) == 1  # handed over, it applies
    await engine.close()


async def test_a_batch_that_raises_is_halved_until_the_one_bad_event_is_found(
    tmp_path: Path,
) -> None:
    """Whatever makes applying one event raise (here: an index that refuses it), the
    engine keeps that event aside and applies every other event of its batch."""
    from tests import factories as f

    cid = f.uuid7()
    events: list[ev.Event] = [f.collective(cid, dim=4)]
    events += [f.experience(cid, f"lesson {i}", dim=4) for i in range(12)]
    poison = events[7]
    engine = await Engine.start(tmp_path / "state")

    def refuse_the_poison(p: Projection) -> None:
        original = p.apply

        def apply(batch: list[LogEntry]) -> object:
            if any(e.event is poison for e in batch):
                raise RuntimeError("the index refused it")
            return original(batch)

        p.apply = apply  # type: ignore[method-assign]

    await engine.run(refuse_the_poison)
    assert await engine.apply(entries(events)) == len(events)

    def outcome(p: Projection) -> tuple[object, ...]:
        kept = [d for d in q.dead_letters(p) if d.entity == "message"]
        live = {e.experience_id for e in q.recent_experiences(p, cid, 100)}
        return [(d.seq, d.reason) for d in kept], live

    kept, live = await engine.run(outcome)
    assert kept == [(8, "cannot apply: the index refused it")]
    expected = {e.experience_id for e in events[1:] if e is not poison}  # type: ignore[attr-defined]
    assert live == expected
    await engine.close()


@settings(max_examples=by_profile(ci=10, dev=40))  # each example ~0.6 CPU-s
@given(st.data())
def test_offers_never_skip_an_event_of_the_tail(data: st.DataObject) -> None:
    """Writers hand their acknowledged events to the engine (``offer``) while the tail
    delivers every event in stream order (``submit``): whatever the interleaving, with
    offers that come early, late, twice or out of order, the engine ends in the state
    of folding the whole stream once, and has applied every sequence."""
    events = data.draw(histories)
    stream = entries(events)
    n = len(stream)
    plan: list[tuple[str, int, int]] = []  # ("tail" | "offer" | "round", first, end)
    tail_at = 0
    while tail_at < n:
        step = data.draw(st.integers(1, max(1, n - tail_at)))
        plan.append(("tail", tail_at, tail_at + step))
        tail_at += step
    for _ in range(data.draw(st.integers(0, 6))):
        first = data.draw(st.integers(0, n - 1))
        end = data.draw(st.integers(first + 1, min(n, first + 4)))
        plan.insert(data.draw(st.integers(0, len(plan))), ("offer", first, end))
    for _ in range(data.draw(st.integers(0, 4))):  # wait for the engine: separate rounds
        plan.insert(data.draw(st.integers(0, len(plan))), ("round", 0, 0))

    async def run() -> tuple[str, int, str]:
        with tempfile.TemporaryDirectory() as tmp:
            engine = await Engine.start(Path(tmp) / "engine")
            for kind, first, end in plan:
                if kind == "tail":
                    engine.submit(stream[first:end])
                elif kind == "offer":
                    engine.offer(stream[first:end])
                else:
                    await engine.run(lambda p: None)
            reached = await engine.run(lambda p: p.seq)
            digest = await engine.digest()
            await engine.close()
            whole = await Engine.start(Path(tmp) / "whole")
            await whole.apply(stream)
            expected = await whole.digest()
            await whole.close()
            return digest, reached, expected

    digest, reached, expected = asyncio.run(run())
    assert reached == n
    assert digest == expected


async def test_a_stopped_engine_refuses_work_instead_of_leaving_it_hanging(tmp_path: Path) -> None:
    from eventlog.errors import PulseError

    engine = await Engine.start(tmp_path / "state")
    assert await engine.apply([]) == 0  # nothing to apply is answered, not left waiting
    await engine.close()
    with pytest.raises(PulseError, match="engine is stopped"):
        await engine.run(lambda p: p.seq)
    with pytest.raises(PulseError, match="engine is stopped"):
        await engine.apply([])

"""Nothing grows without bound: the per-experience reinforcement locks of an instance
go once no call holds or waits for them, and the acknowledged totals it keeps are
bounded (``sync.experiences.OWN_MAX``; a miss reads its entry back from the projection),
while every count stays exact (real NATS)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from eventlog import EmbeddedNats
from eventlog import events as ev
from eventlog.errors import LogUnavailable
from sync import PulseDB
from sync import experiences as experiences_module


@pytest.fixture
def small_own(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(experiences_module, "OWN_MAX", 3)
    return 3


async def _experiences(db: PulseDB, n: int) -> list[UUID]:
    cid = await db.create_collective("owner", "team", 2)
    return await db.record_experiences(
        cid, [{"content": f"note {i}", "embedding": [1.0, float(i)]} for i in range(n)]
    )


async def _announced(db: PulseDB) -> list[tuple[UUID, UUID, int]]:
    """Every reinforcement on the log: (experience, instance, announced total)."""
    found = []
    async for batch in db.log.read(1):
        for entry in batch:
            if isinstance(entry.event, ev.ExperienceReinforced):
                e = entry.event
                found.append((e.experience_id, e.instance_id, e.applications))
    return found


async def _applications(db: PulseDB, eid: UUID) -> int:
    got = await db.get_experience(eid)
    assert got is not None
    return got.applications


async def test_many_reinforcements_leave_no_locks_and_a_bounded_own_map(
    tmp_path: Path, nats_server: EmbeddedNats, small_own: int
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        eids = await _experiences(a, 12)
        wanted = {eid: 1 + i % 4 for i, eid in enumerate(eids)}
        made: Counter[UUID] = Counter()
        for round_ in range(4):  # round robin: every experience is evicted between its calls
            for eid in eids:
                if round_ < wanted[eid]:
                    made[eid] += 1
                    assert await a.reinforce_experience(eid) == made[eid]
                    assert len(a.experiences._own) <= small_own
        assert made == wanted
        assert a.experiences._reinforce_locks == {}
        assert len(a.experiences._own) == small_own
        await b.sync()
        for eid in eids:
            assert await _applications(a, eid) == wanted[eid]
            assert await _applications(b, eid) == wanted[eid]
        announced = await _announced(a)
        for eid in eids:  # this incarnation announced 1, 2, ... n for each: nothing repeated
            assert sorted(t for e, _, t in announced if e == eid) == list(range(1, wanted[eid] + 1))
    finally:
        await a.close()
        await b.close()


async def test_concurrent_reinforcements_are_exact_and_leave_no_locks(
    tmp_path: Path, nats_server: EmbeddedNats, small_own: int
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        hot, *others = await _experiences(a, 6)
        await a.reinforce_experience(hot)
        for eid in others:  # hot is evicted: its concurrent calls begin with a miss
            await a.reinforce_experience(eid)
        assert hot not in a.experiences._own
        calls = [a.reinforce_experience(hot) for _ in range(20)]
        calls += [a.reinforce_experience(eid) for eid in others for _ in range(3)]
        calls += [b.reinforce_experience(hot) for _ in range(5)]
        task = asyncio.gather(*calls)
        waiting = 0  # the calls holding or waiting for the hot experience's lock
        while not task.done() and waiting < 2:
            await asyncio.sleep(0)
            waiting = max(waiting, a.experiences._reinforce_locks.get(hot, (None, 0))[1])
        assert waiting >= 2  # they queued up on one lock
        totals = await task
        assert max(totals[:20]) <= 26
        assert a.experiences._reinforce_locks == {} and b.experiences._reinforce_locks == {}
        assert len(a.experiences._own) <= small_own
        await a.sync()
        await b.sync()
        for db in (a, b):
            assert await _applications(db, hot) == 1 + 20 + 5
            for eid in others:
                assert await _applications(db, eid) == 1 + 3
        # serialised: a's announcements for the hot experience are 1..21, each once
        announced = await _announced(a)
        mine = [t for e, i, t in announced if e == hot and i == a.instance_id]
        assert sorted(mine) == list(range(1, 22))
    finally:
        await a.close()
        await b.close()


async def test_an_evicted_experience_continues_from_its_stored_total(
    tmp_path: Path, nats_server: EmbeddedNats, small_own: int
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        first, *others = await _experiences(a, 1 + small_own)
        await b.sync()
        for _ in range(3):
            await a.reinforce_experience(first)
        assert await b.reinforce_experience(first) == 4  # another instance's entry
        for eid in others:
            await a.reinforce_experience(eid)
        assert first not in a.experiences._own  # evicted
        await a.sync()
        assert await a.reinforce_experience(first) == 5  # a's entry 3 -> 4, not 1
        assert a.experiences._own[first] == 4
        await b.sync()
        assert await _applications(b, first) == 5
        mine = [t for e, i, t in await _announced(a) if e == first and i == a.instance_id]
        assert mine == [1, 2, 3, 4]
    finally:
        await a.close()
        await b.close()


async def test_a_failed_append_is_neither_lost_nor_counted_twice(
    tmp_path: Path, nats_server: EmbeddedNats, small_own: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        first, *others = await _experiences(a, 1 + small_own)
        real_append = a.log.append

        async def refused(event: ev.Event, **kwargs: Any) -> int:
            raise LogUnavailable("not stored")

        async def stored_then_lost(event: ev.Event, **kwargs: Any) -> int:
            await real_append(event, **kwargs)
            raise LogUnavailable("stored, but the acknowledgement was lost")

        await a.reinforce_experience(first)
        await a.reinforce_experience(first)
        monkeypatch.setattr(a.log, "append", refused)
        with pytest.raises(LogUnavailable):
            await a.reinforce_experience(first)
        monkeypatch.setattr(a.log, "append", real_append)
        own, locks = a.experiences._own, a.experiences._reinforce_locks
        assert own[first] == 2 and locks == {}  # the total did not advance
        for eid in others:
            await a.reinforce_experience(eid)
        assert first not in a.experiences._own
        assert await a.reinforce_experience(first) == 3  # the miss continues from 2

        # stored after all, and still kept here: the next call announces the same total
        monkeypatch.setattr(a.log, "append", stored_then_lost)
        with pytest.raises(LogUnavailable):
            await a.reinforce_experience(first)
        monkeypatch.setattr(a.log, "append", real_append)
        assert a.experiences._own[first] == 3 and a.experiences._reinforce_locks == {}
        assert await a.reinforce_experience(first) == 4  # 4 announced twice, counted once
        await a.sync()
        assert await _applications(a, first) == 4
        mine = [t for e, i, t in await _announced(a) if e == first]
        assert mine == [1, 2, 3, 4, 4]
    finally:
        await a.close()


async def test_deletes_leave_no_set_of_deleted_ids(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    """Tombstone rows are the only record of deletes: neither the instance nor the
    engine's memory keeps a set of deleted ids, and writes to them are still refused."""
    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        ids = await _experiences(db, 40)
        for eid in ids:
            await db.delete_experience(eid)
        assert not hasattr(db, "_tombstones")
        await db.engine.flush()  # (the counts to drop from DuckDB are held until then)
        memory_sets = await db.engine.run(
            lambda p: [n for n, v in vars(p.memory).items() if isinstance(v, set) and ids[0] in v]
        )
        assert memory_sets == [], f"deleted ids kept in {memory_sets}"
        with pytest.raises(Exception, match="experience_id: no experience"):
            await db.reinforce_experience(ids[0])  # (a racing write: tests/test_api.py)
        assert db.replication.landed_dead == {}
    finally:
        await db.close()

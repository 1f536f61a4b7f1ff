"""The instance on a real NATS server: read-your-writes, sync, watch, exact
counts across instances, and the three identity rules (restart, copy, restore)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from eventlog import EmbeddedNats
from sync import ExperienceChange, PulseDB, PulseDBSync
from tests.harness import eventually


async def open_db(path: Path, server: EmbeddedNats) -> PulseDB:
    return await PulseDB.open(path, server.url)


async def test_writes_are_readable_at_once_and_reach_other_instances(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    a = await open_db(tmp_path / "a", nats_server)
    b = await open_db(tmp_path / "b", nats_server)
    try:
        cid = await a.create_collective("owner", "team", 3)
        eid = await a.record_experience(cid, "read your writes", [1, 0, 0], domain=("sync",))
        mine = await a.get_experience(eid)  # no sync(): the write returned once applied
        assert mine is not None and mine.content == "read your writes"
        await b.sync()
        theirs = await b.get_experience(eid)
        assert theirs == mine
        assert await a.digest() == await b.digest()
    finally:
        await a.close()
        await b.close()


async def test_watch_sees_every_change_whoever_wrote_it(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    a = await open_db(tmp_path / "a", nats_server)
    b = await open_db(tmp_path / "b", nats_server)
    seen: list[ExperienceChange] = []
    changes = b.watch_experiences()  # registered from this moment

    async def watch() -> None:
        async for change in changes:
            seen.append(change)

    watcher = asyncio.create_task(watch())
    try:
        cid = await a.create_collective("owner", "team", 2)
        eid = await a.record_experience(cid, "watched", [1, 0])
        await a.update_experience(eid, importance=0.9)
        await a.reinforce_experience(eid)
        await a.archive_experience(eid)
        await a.unarchive_experience(eid)
        await a.delete_experience(eid)
        await eventually(lambda: len(seen) == 6, what="six changes on the other instance")
        assert [c.kind for c in seen] == [
            "created",
            "updated",
            "updated",
            "archived",
            "unarchived",
            "deleted",
        ]
        assert {c.experience_id for c in seen} == {eid} and {c.instance_id for c in seen} == {
            a.instance_id
        }
    finally:
        await a.close()
        await b.close()
        await asyncio.wait_for(watcher, 10)  # the watch ends when its instance closes


async def test_counts_add_up_across_instances(tmp_path: Path, nats_server: EmbeddedNats) -> None:
    a = await open_db(tmp_path / "a", nats_server)
    b = await open_db(tmp_path / "b", nats_server)
    try:
        cid = await a.create_collective("owner", "team", 2)
        eid = await a.record_experience(cid, "useful", [0, 1])
        await b.sync()
        calls = [a.reinforce_experience(eid) for _ in range(4)] + [
            b.reinforce_experience(eid) for _ in range(3)
        ]
        totals = await asyncio.gather(*calls)
        assert max(totals) <= 7
        for db in (a, b):
            await db.sync()
            got = await db.get_experience(eid)
            assert got is not None and got.applications == 7
    finally:
        await a.close()
        await b.close()


async def _reinforced(path: Path, server: EmbeddedNats, eid: object, times: int) -> int:
    db = await open_db(path, server)
    try:
        total = 0
        for _ in range(times):
            total = await db.reinforce_experience(eid)  # type: ignore[arg-type]
        return total
    finally:
        await db.close()


async def _setup(path: Path, server: EmbeddedNats) -> tuple[object, object]:
    db = await open_db(path, server)
    cid = await db.create_collective("owner", "team", 2)
    eid = await db.record_experience(cid, "counted", [1, 1])
    await db.close()
    return cid, eid


async def _total(path: Path, server: EmbeddedNats, eid: object) -> int:
    db = await open_db(path, server)
    try:
        await db.sync()
        got = await db.get_experience(eid)  # type: ignore[arg-type]
        assert got is not None
        return got.applications
    finally:
        await db.close()


async def test_a_restarted_instance_neither_loses_nor_double_counts(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    _, eid = await _setup(tmp_path / "a", nats_server)
    assert await _reinforced(tmp_path / "a", nats_server, eid, 3) == 3
    assert await _reinforced(tmp_path / "a", nats_server, eid, 2) == 5  # a new incarnation
    assert await _total(tmp_path / "elsewhere", nats_server, eid) == 5


async def test_a_copied_data_dir_counts_both_copies(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    _, eid = await _setup(tmp_path / "a", nats_server)
    assert await _reinforced(tmp_path / "a", nats_server, eid, 2) == 2
    shutil.copytree(tmp_path / "a", tmp_path / "copy", symlinks=True)
    original = await open_db(tmp_path / "a", nats_server)
    copy = await open_db(tmp_path / "copy", nats_server)
    try:
        assert original.instance_id != copy.instance_id
        await asyncio.gather(
            *[db.reinforce_experience(eid) for db in (original, copy) for _ in range(3)]
        )  # type: ignore[arg-type]
        for db in (original, copy):
            await db.sync()
            got = await db.get_experience(eid)  # type: ignore[arg-type]
            assert got is not None and got.applications == 8
    finally:
        await original.close()
        await copy.close()


async def test_a_data_dir_restored_from_an_old_backup_catches_up(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    _, eid = await _setup(tmp_path / "a", nats_server)
    assert await _reinforced(tmp_path / "a", nats_server, eid, 2) == 2
    shutil.copytree(tmp_path / "a", tmp_path / "backup", symlinks=True)
    assert await _reinforced(tmp_path / "a", nats_server, eid, 3) == 5
    shutil.rmtree(tmp_path / "a")
    shutil.copytree(tmp_path / "backup", tmp_path / "a", symlinks=True)  # the restore
    assert await _total(tmp_path / "a", nats_server, eid) == 5
    assert await _reinforced(tmp_path / "a", nats_server, eid, 1) == 6


def test_the_blocking_facade_with_embedded_nats(tmp_path: Path) -> None:
    with PulseDBSync.open(tmp_path / "solo") as db:  # no URL: an embedded nats-server
        cid = db.create_collective("owner", "team", 2)
        eid = db.record_experience(cid, "no async needed", [0.5, 0.5])
        assert db.reinforce_experience(eid) == 1
        got = db.get_experience(eid)
        assert got.content == "no async needed" and got.applications == 1
        changes = db.watch_experiences()
        db.archive_experience(eid)
        assert next(changes).kind == "archived"
    assert not (tmp_path / "solo" / "nats" / "server.json").exists()  # server stopped

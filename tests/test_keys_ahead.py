"""Data keys made ahead (``Keyring.take``): a new experience takes an id whose key the
store already holds, so its record is one synced write; deleting it, or its collective,
still destroys its key (and the unused ones of the collective); a host restarted with
unused keys left behind reads every event."""

from __future__ import annotations

from pathlib import Path

from eventlog import EmbeddedNats
from eventlog.ids import uuid7
from eventlog.keys import (
    DESTROYED,
    POOL,
    POOL_LOW,
    Keyring,
    MemoryKeyStore,
    collective_prefix,
    key_name,
)
from sync import PulseDB

VECTOR = [0.25, -0.5, 0.75, 1.0]


async def test_a_key_taken_is_in_the_store_and_unwraps_to_the_key_held() -> None:
    store, cid = MemoryKeyStore(), uuid7()
    ring = Keyring(store)
    taken = [await ring.take("experience", cid) for _ in range(POOL + 3)]  # past one pool
    assert all(t is not None for t in taken)
    assert len(set(taken)) == len(taken)
    for entity_id in taken:
        assert entity_id is not None
        name = key_name("experience", entity_id, cid)
        assert isinstance(await store.get(name), bytes)  # stored before it was handed out
        held = await ring.find(name)
        assert held == await Keyring(store).find(name)  # another host unwraps the same key


async def test_a_record_takes_an_id_whose_key_was_stored_before_it_began(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        cid = await a.create_collective("owner", "c", 4)
        await a.record_experience(cid, "the first makes keys ahead", VECTOR)
        store = a.sealer.keyring.store
        stored = set(await store.names(collective_prefix(cid)))
        assert len(stored) >= POOL_LOW
        second = await a.record_experience(cid, "the second takes one", VECTOR)
        assert key_name("experience", second, cid) in stored  # no key written by the record
        await b.sync()
        found = await b.get_experience(second)
        assert found is not None and found.content == "the second takes one"
    finally:
        await a.close()
        await b.close()


async def test_deleting_an_experience_made_from_a_key_made_ahead_destroys_its_key(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        cid = await db.create_collective("owner", "c", 4)
        await db.record_experience(cid, "fills the pool", VECTOR)
        stored = set(await db.sealer.keyring.store.names(collective_prefix(cid)))
        e = await db.record_experience(cid, "the vault code is zebra-9", VECTOR)
        name = key_name("experience", e, cid)
        assert name in stored
        await db.delete_experience(e)
        assert await db.sealer.keyring.store.get(name) is DESTROYED
        assert await db.get_experience(e) is None
    finally:
        await db.close()


async def test_a_collective_delete_destroys_its_unused_keys(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        cid = await db.create_collective("owner", "gone", 4)
        stays = await db.create_collective("owner", "stays", 4)
        await db.record_experience(cid, "one", VECTOR)
        await db.record_experience(stays, "kept", VECTOR)
        store = db.sealer.keyring.store
        made = await store.names(collective_prefix(cid))
        assert len(made) >= POOL_LOW  # the used one and the unused ones
        await db.delete_collective(cid)
        assert await store.names(collective_prefix(cid)) == []
        assert all([await store.get(n) is DESTROYED for n in made])
        assert len(await store.names(collective_prefix(stays))) >= POOL_LOW  # not those
        # the keyring dropped the pool too: a new collective's record makes its own
        again = await db.create_collective("owner", "again", 4)
        e = await db.record_experience(again, "after", VECTOR)
        assert await store.get(key_name("experience", e, again)) is not None
    finally:
        await db.close()


async def test_a_host_restarted_with_unused_keys_reads_every_event(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        cid = await db.create_collective("owner", "c", 4)
        ids = [await db.record_experience(cid, f"before {i}", VECTOR) for i in range(3)]
    finally:
        await db.close()
    db = await PulseDB.open(tmp_path / "a", nats_server.url)  # its pool is gone
    try:
        ids += [await db.record_experience(cid, f"after {i}", VECTOR) for i in range(2)]
        names = await db.sealer.keyring.store.names(collective_prefix(cid))
        assert len(names) <= 2 * POOL  # at most a pool's worth left behind by the first run
    finally:
        await db.close()
    fresh = await PulseDB.open(tmp_path / "c", nats_server.url)  # a host that never wrote
    try:
        await fresh.sync()

        found = [await fresh.get_experience(e) for e in ids]  # (synced: no waiting)
        contents = sorted(f.content for f in found if f is not None)
        assert contents == ["after 0", "after 1", "before 0", "before 1", "before 2"]
    finally:
        await fresh.close()


async def test_a_keyring_stopped_while_making_keys_leaves_no_task_behind() -> None:
    store, cid = MemoryKeyStore(), uuid7()
    ring = Keyring(store)
    await ring.take("experience", cid)
    for _ in range(POOL - POOL_LOW + 1):  # below the low mark: more are being made
        await ring.take("experience", cid)
    making = list(ring._making.values())
    await ring.stop_making()
    assert all(m.done() for m in making)
    assert await ring.take("experience", cid) is not None  # (a new pool, if asked again)

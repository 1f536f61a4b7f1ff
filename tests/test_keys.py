"""Data keys and sealed events (``eventlog.keys``, ``eventlog.sealing``): made once per
entity and shared by every host, destroyed for good, the key-encryption key rotated, a
destroyed key meaning "forgotten" (never an error), and a sealed box checked as input."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import inspect
import os
import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest

from eventlog import EmbeddedNats, JetStreamLog, MemoryLog, StreamSettings
from eventlog import events as ev
from eventlog.codec import HDR_SCHEMA, SCHEMA_VERSION, decode_event, encode_body
from eventlog.errors import DecodeError, NotFoundError, PulseError
from eventlog.ids import uuid7
from eventlog.keys import (
    CURRENT,
    DESTROYED,
    KID_BYTES,
    SCAN_PAGE,
    KeyDestroyed,
    Keyring,
    KeyStore,
    KvKeyStore,
    MemoryKeyStore,
    collective_prefix,
    gather_limited,
    key_name,
)
from eventlog.log import LogEntry
from eventlog.sealing import KEY_MISSING, Sealer, open_with, seal_with, sealed_name
from eventlog.subjects import subject_for
from tests.harness import Message, eventually, intercept, is_delivery

CID = uuid7()


def recorded(content: str = "the launch code is ZEBRA-7781-QUOKKA") -> ev.ExperienceRecorded:
    return ev.ExperienceRecorded(
        event_id=uuid7(), instance_id=uuid7(), hlc=ev.pack_hlc(1_700_000_000_000, 0),
        experience_id=uuid7(), collective_id=CID, content=content,
        embedding=ev.pack_vector([0.25, -0.5, 0.75, 1.0]), experience_type=ev.Generic(),
        importance=0.5, confidence=0.5, source_agent="agent",
    )  # fmt: skip


def entry(event: ev.Event, seq: int = 1) -> LogEntry:
    return LogEntry(seq, subject_for(event), event)


@pytest.fixture(params=["memory", "jetstream"])
async def store(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    if request.param == "memory":
        yield MemoryKeyStore()
        return
    async with _kv_store(tmp_path) as kv:
        yield kv


@pytest.fixture
async def kv_store(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The key store of a JetStream log on a server of the test's own."""
    async with _kv_store(tmp_path) as kv:
        yield kv


@contextlib.asynccontextmanager
async def _kv_store(tmp_path: Path) -> AsyncIterator[KvKeyStore]:
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    log = await JetStreamLog.connect(server.url, StreamSettings())
    try:
        kv = log.key_store()
        assert isinstance(kv, KvKeyStore)
        yield kv
    finally:
        await log.close()
        server.stop()


async def test_a_key_is_made_once_and_every_keyring_finds_it(store: KeyStore) -> None:
    name = key_name("experience", uuid7(), CID)
    a, b = Keyring(store), Keyring(store)
    key = await a.make(name)
    assert len(key) == 32
    assert await a.make(name) == key  # a retry of the same write: the same key
    assert await b.find(name) == key  # another host
    assert await Keyring(store).make(name) == key  # another host "making" it finds it
    assert await b.find(key_name("insight", uuid7(), CID)) is None  # never made


async def test_destroyed_means_forgotten_for_every_host(store: KeyStore) -> None:
    a, b = Keyring(store), Keyring(store)
    event = recorded()
    name = sealed_name(event)
    assert name is not None
    sealed = seal_with(event, await a.make(name), name)
    assert await b.find(name) is not None
    await a.destroy(name)
    await a.destroy(name)  # idempotent
    assert await Keyring(store).find(name) is DESTROYED
    assert await store.get(name) is DESTROYED
    with pytest.raises(KeyDestroyed):  # no new key for a deleted entity
        await Keyring(store).make(name)
    # a host that has not cached it opens nothing: the event stays sealed, no dead letter
    (opened,) = await Sealer(Keyring(store)).open([entry(sealed)])
    assert opened.event == sealed and opened.error is None
    with pytest.raises(NotFoundError, match="experience_id: experience .* was deleted"):
        await Sealer(Keyring(store)).seal(event)


async def test_a_collectives_keys_go_together(store: KeyStore) -> None:
    ring = Keyring(store)
    cid, other = uuid7(), uuid7()
    mine = [key_name(e, uuid7(), cid) for e in ("experience", "insight", "relation", "session")]
    theirs = key_name("experience", uuid7(), other)
    wisdom = key_name("wisdom", uuid7(), None)
    for name in [*mine, theirs, wisdom]:
        await ring.make(name)
    assert await ring.destroy_under(collective_prefix(cid)) == 4
    fresh = Keyring(store)
    assert [await fresh.find(n) for n in mine] == [DESTROYED] * 4
    assert isinstance(await fresh.find(theirs), bytes)
    assert isinstance(await fresh.find(wisdom), bytes)


async def test_rotating_the_kek_keeps_every_key_and_kills_old_copies(store: KeyStore) -> None:
    ring = Keyring(store)
    names = [key_name("experience", uuid7(), CID) for _ in range(5)]
    keys = {n: await ring.make(n) for n in names}
    (old_kek,) = await ring.kek_ids()
    # a copy of one wrapped key taken before its entity is deleted (a block not rewritten yet)
    copy = await store.get(names[0])
    assert isinstance(copy, bytes)
    await ring.destroy(names[0])

    assert await ring.rotate(grace=0) == 4
    (new_kek,) = await ring.kek_ids()
    assert new_kek != old_kek
    assert await store.get(f"{CURRENT}.{old_kek}") is DESTROYED
    fresh = Keyring(store)
    for name in names[1:]:
        assert await fresh.find(name) == keys[name]
        held = await store.get(name)
        assert isinstance(held, bytes) and held[:8].hex() == new_kek
    with pytest.raises(PulseError, match="which is gone"):  # the copy is noise now
        await fresh._unwrap(names[0], copy)
    # the rotation never brought the destroyed key back
    assert await store.get(names[0]) is DESTROYED


def late_deliveries(nc: Any, delay: float = 0.2) -> asyncio.Task[None]:
    """Make a connection hear every JetStream delivery (a message with an ack subject)
    ``delay`` seconds after it arrived, in order, behind the server's answers to requests
    that came after it: the interleaving of a loaded host, where a consumer's messages and
    the server's answer about that consumer travel apart. What comes after a held message
    on the same subscription is held too (NATS keeps one sender's order). The task
    delivers them; cancel it to stop."""
    held: asyncio.Queue[tuple[float, Message]] = asyncio.Queue()
    behind: collections.Counter[int] = collections.Counter()  # held, by subscription

    async def deliver() -> None:
        while True:
            arrived, message = await held.get()
            await asyncio.sleep(max(0.0, arrived + delay - time.monotonic()))
            behind[message[0]] -= 1
            await original(*message)

    def take(message: Message) -> bool:
        # (what follows a held message on its subscription waits behind it: one server's
        # messages to one inbox arrive in order, a pull's closing status after its batch)
        if is_delivery(message) or behind[message[0]] > 0:
            behind[message[0]] += 1
            held.put_nowait((time.monotonic(), message))
            return True
        return False

    original = intercept(nc, take)
    return asyncio.ensure_future(deliver())


async def test_a_scan_of_the_store_finds_every_key_when_its_messages_come_late(
    kv_store: KvKeyStore,
) -> None:
    """A scan (the names under a prefix, or their values: what a rotation wraps again and
    which KEKs it erases, a collective's keys to destroy) reads every name the bucket holds,
    however late its messages reach the host. nats-py's KV watch ended at once with nothing
    when they arrived after the server's answer about its consumer: the rotation test failed
    once under load (two KEKs left), and a rotation could erase the old KEK while data keys
    were still wrapped with it."""
    ring = Keyring(kv_store)
    names = sorted(key_name("experience", uuid7(), CID) for _ in range(5))
    keys = {n: await ring.make(n) for n in names}
    await ring.destroy(names[0])
    late = late_deliveries(kv_store.js._nc)
    try:
        assert await kv_store.names("c.") == names[1:]
        assert sorted(await kv_store.items("c.")) == names[1:]
        assert len(await ring.kek_ids()) == 1
        assert await ring.rotate(grace=0) == 4
        assert len(await ring.kek_ids()) == 1
    finally:
        late.cancel()
    fresh = Keyring(kv_store)
    for name in names[1:]:
        assert await fresh.find(name) == keys[name]
    assert await fresh.find(names[0]) is DESTROYED


async def test_a_rotation_wraps_again_a_key_a_replica_behind_shows_older(
    kv_store: KvKeyStore,
) -> None:
    """A rotation replaces a wrapped key only if it still holds what the scan read; a
    direct get answered by a replica behind the leader shows an older value. That must
    not read as "changed meanwhile": the key would stay wrapped with the old KEK, which
    the rotation then erases. The leader decides."""
    name = key_name("experience", uuid7(), CID)
    kv = await kv_store.kv()
    await kv.create(name, b"first")
    subject = f"$KV.{kv_store.bucket}.{name}"
    older = await kv_store.js.get_msg(kv_store.stream, subject=subject, direct=True)
    await kv.put(name, b"second")  # (what the leader holds, and the scan read)
    get_msg = kv_store.js.get_msg

    async def behind(*args: Any, direct: bool = False, **kwargs: Any) -> Any:
        if direct:
            return older  # (as a replica that has not applied "second" yet)
        return await get_msg(*args, direct=direct, **kwargs)

    kv_store.js.get_msg = behind  # type: ignore[method-assign]
    assert await kv_store.replace(name, b"second", b"third")
    kv_store.js.get_msg = get_msg  # type: ignore[method-assign]
    assert await kv_store.get(name) == b"third"
    assert not await kv_store.replace(name, b"second", b"fourth")  # changed: refused
    assert await kv_store.get(name) == b"third"


async def test_a_read_answered_by_a_replica_behind_still_finds_what_was_written(
    kv_store: KvKeyStore,
) -> None:
    """The bucket's direct gets may be answered by a replica that has not applied the
    latest writes yet (seen on a loaded 3-node cluster: a host's first data key failed
    with "the current key-encryption key ... is missing", the KEK it had just stored).
    Here every direct get is answered so: what was written is still found, what was
    destroyed is still destroyed, and a name never written still holds nothing."""
    get_msg = kv_store.js.get_msg

    async def behind(*args: Any, direct: bool = False, **kwargs: Any) -> Any:
        if direct:
            raise nats.js.errors.NotFoundError  # (as a replica that holds nothing yet)
        return await get_msg(*args, direct=direct, **kwargs)

    kv_store.js.get_msg = behind  # type: ignore[method-assign]
    ring = Keyring(kv_store)
    assert len(await ring.current_kek_id()) == 2 * 8  # made here, then read back
    name, gone = (key_name("experience", uuid7(), CID) for _ in range(2))
    key = await ring.make(name)
    await ring.make(gone)
    await ring.destroy(gone)
    fresh = Keyring(kv_store)
    assert await fresh.find(name) == key
    assert await fresh.find(gone) is DESTROYED
    assert await fresh.find(key_name("insight", uuid7(), CID)) is None


async def test_a_message_erased_twice_is_erased_once_and_done(kv_store: KvKeyStore) -> None:
    """Erasing a key's message from the bucket's files is idempotent: a second erasure of
    the same message (two hosts forgetting the same collective, the service's own erasure
    followed by a collective delete's) answers "sequence not found" (10043), which is
    done, not an error."""
    names = [key_name("experience", uuid7(), uuid7()) for _ in range(2)]
    ring = Keyring(kv_store)
    for name in names:
        await ring.make(name)
    kv = await kv_store.kv()
    first, second = [(await kv.get(name)).revision for name in names]
    await kv_store._erase(first)
    await kv_store._erase(first)  # erased already: done
    await asyncio.gather(kv_store._erase(second), kv_store._erase(second))  # two at once
    for name in names:
        assert await kv_store.get(name) is None


async def test_a_rotation_does_not_bring_back_a_key_destroyed_meanwhile() -> None:
    store = MemoryKeyStore()
    ring = Keyring(store)
    name = key_name("experience", uuid7(), CID)
    await ring.make(name)
    held = await store.get(name)
    assert isinstance(held, bytes)
    await ring.destroy(name)
    assert not await store.replace(name, held, b"x" * 60)  # compare-and-set refuses
    assert await store.get(name) is DESTROYED


async def test_a_box_is_input() -> None:
    event = recorded()
    name = sealed_name(event)
    assert name is not None
    store = MemoryKeyStore()
    key = await Keyring(store).make(name)
    sealed = seal_with(event, key, name)
    assert b"ZEBRA" not in sealed.box
    assert open_with(sealed, key) == event
    sealer = Sealer(Keyring(store))
    (opened,) = await sealer.open([entry(sealed)])
    assert opened.event == event

    flipped = bytearray(sealed.box)
    flipped[20] ^= 1
    tampered = ev.Sealed(**{**_fields(sealed), "box": bytes(flipped)})
    other = ev.Sealed(**{**_fields(sealed), "event_id": uuid7()})  # a box moved to another id
    for bad in (tampered, other):
        (refused,) = await sealer.open([entry(bad, seq=7)])
        assert refused.event is None and refused.error is not None
        assert "box: does not open" in refused.error.reason and refused.error.seq == 7


async def test_a_key_not_there_yet_is_waited_for_then_set_aside() -> None:
    event = recorded()
    name = sealed_name(event)
    assert name is not None
    elsewhere = MemoryKeyStore()  # the writer's store; this host's has no such key yet
    sealed = seal_with(event, await Keyring(elsewhere).make(name), name)
    (refused,) = await Sealer(Keyring(MemoryKeyStore()), key_wait=0.05).open([entry(sealed)])
    assert refused.event is None and refused.error is not None
    assert refused.error.reason.startswith(KEY_MISSING)


async def test_a_destroyed_key_is_erased_from_the_stores_files(tmp_path: Path) -> None:
    """Not only a deletion marker: the wrapped key's bytes leave the bucket's files."""
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    log = await JetStreamLog.connect(server.url, StreamSettings())
    try:
        store = log.key_store()
        assert isinstance(store, KvKeyStore)
        ring = Keyring(store)
        name = key_name("experience", uuid7(), CID)
        await ring.make(name)
        wrapped = await store.get(name)
        assert isinstance(wrapped, bytes)
        assert _files_holding(tmp_path / "nats", wrapped)  # the scan sees it while it is there
        await ring.destroy(name)
        assert _files_holding(tmp_path / "nats", wrapped) == []
    finally:
        await log.close()
        server.stop()
    assert _files_holding(tmp_path / "nats", wrapped) == []  # and after the server stops


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and needle in path.read_bytes():
            found.append(path)
    return found


def _fields(event: ev.Sealed) -> dict[str, object]:
    return {f: getattr(event, f) for f in event.__struct_fields__}


def test_every_sealed_kind_names_its_key() -> None:
    wid = uuid7()
    wisdom = ev.WisdomStored(
        event_id=uuid7(), instance_id=uuid7(), hlc=1, wisdom_id=wid, owner_id="o",
        category="BestPractice", pattern="p", confidence=0.5, embedding=b"\0" * 16,
    )  # fmt: skip
    assert sealed_name(wisdom) == f"w.{wid}"
    reinforced = ev.ExperienceReinforced(
        event_id=uuid7(), instance_id=uuid7(), hlc=1, experience_id=uuid7(),
        collective_id=CID, applications=3,
    )  # fmt: skip
    assert sealed_name(reinforced) is None  # counts carry no text: they stay in the clear


async def test_the_keys_a_host_holds_are_bounded_and_found_again() -> None:
    store = MemoryKeyStore()
    ring = Keyring(store)
    ring.cached = 2
    names = [key_name("experience", uuid7(), CID) for _ in range(3)]
    keys = [await ring.make(n) for n in names]
    assert len(ring._keys) == 2 and names[0] not in ring._keys  # the oldest went
    assert await ring.find(names[0]) == keys[0]  # asked of the store again


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"entity": "collective"}, "entity: must be one of"),
        ({"kind": "insight.stored"}, "kind: a sealed experience event is one of"),
        ({"collective_id": None}, "collective_id: a sealed event names its collective"),
        ({"box": b"\0" * 28}, "box: must be 29.."),
    ],
)
def test_an_envelope_out_of_range_is_refused_naming_the_field(
    change: dict[str, object], reason: str
) -> None:
    event = recorded()
    name = sealed_name(event)
    assert name is not None
    sealed = seal_with(event, b"k" * 32, name)
    assert decode_event(encode_body(sealed), HEADERS) == sealed
    bad = ev.Sealed(**{**_fields(sealed), **change})  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match=reason):
        decode_event(encode_body(bad), HEADERS)


HEADERS = {HDR_SCHEMA: str(SCHEMA_VERSION)}


async def test_a_following_host_hears_of_new_keys_and_destroyed_ones(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    log = await JetStreamLog.connect(server.url, StreamSettings())
    try:
        writer, reader = Keyring(log.key_store()), Keyring(log.key_store())
        known = key_name("insight", uuid7(), CID)
        await writer.make(known)
        await reader.find(known)  # (so it knows the KEK, as a host that read a key does)
        await reader.follow()
        names = [key_name("experience", uuid7(), CID) for _ in range(3)]
        await writer.store.put_fresh(await writer.fresh(names))  # one atomic batch
        await eventually(lambda: all(reader.holds(n) for n in names), what="the keys heard of")
        assert [await reader.find(n) for n in names] == [await writer.find(n) for n in names]
        await writer.destroy(names[0])
        await eventually(lambda: not reader.holds(names[0]), what="the destroyed key dropped")
        with pytest.raises(PulseError, match="exists already"):  # a fresh id is never reused
            await writer.store.put_fresh({names[1]: b"x" * 60})
        await reader.unfollow()
    finally:
        await log.close()
        server.stop()


async def test_an_event_whose_key_came_late_applies_when_the_host_opens_again(
    tmp_path: Path,
) -> None:
    """A reader that gave up waiting for a key keeps the event aside; once the key is in
    the store, the next open reads it again and applies it (as a host reading the log
    for the first time would)."""
    from sync import PulseDB
    from tests import factories as f

    log = MemoryLog()
    db = await PulseDB.attach(tmp_path / "host", log, owns_log=False)
    try:
        cid = await db.create_collective("owner", "late", 4)
        event = f.experience(cid, "sealed before its key was stored")
        name = sealed_name(event)
        assert name is not None
        ring = db.sealer.keyring
        wrapped = (await ring.fresh([name]))[name]
        key = await ring._unwrap(name, wrapped)
        ring.forget(name)  # as another host's key, not here yet
        db.sealer.key_wait = 0.05
        await log.append(seal_with(event, key, name))
        await db.sync()
        (kept,) = await db.dead_letters()
        assert kept.reason.startswith(KEY_MISSING)
        assert await db.get_experience(event.experience_id) is None
        await log.key_store().put_fresh({name: wrapped})  # the key comes, late
    finally:
        await db.close()
    again = await PulseDB.attach(tmp_path / "host", log, owns_log=False)
    try:
        found = await again.get_experience(event.experience_id)
        assert found is not None and found.content == "sealed before its key was stored"
        assert list(await again.dead_letters()) == []
    finally:
        await again.close()


async def test_a_cancelled_gather_leaves_no_coroutine_unawaited() -> None:
    """Cancelling a gather (a close while keys are fetched) leaves none of the coroutines
    still waiting at its gate unawaited: each is closed (no RuntimeWarning from GC)."""
    started = asyncio.Event()

    async def fetch(i: int) -> int:
        started.set()
        await asyncio.sleep(60)
        return i

    gathering = asyncio.ensure_future(gather_limited((fetch(i) for i in range(20)), limit=2))
    await started.wait()
    gathering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gathering
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def test_a_gather_cancelled_before_its_tasks_ran_closes_every_coroutine() -> None:
    """Cancelled at once (its tasks made, none run yet): every coroutine handed to it is
    closed, none left unawaited (the warning seen once when an edge host closed)."""

    async def fetch(i: int) -> int:
        return i

    made = [fetch(i) for i in range(5)]
    gathering = asyncio.ensure_future(gather_limited(iter(made), limit=2))
    await asyncio.sleep(0)  # it runs up to the gather; the tasks it made have not run
    gathering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gathering
    assert [inspect.getcoroutinestate(c) for c in made] == [inspect.CORO_CLOSED] * 5


async def test_a_scan_reads_each_names_last_message_of_several(kv_store: KvKeyStore) -> None:
    """The scan reads every message on the names in stream order, the last of each name
    winning (a consumer of the last per subject took seconds to make at a million names
    on a server just started): a value replaced twice reads as its last, a destroyed one
    not at all, a name destroyed, then made again, as its new value."""
    kv = await kv_store.kv()
    replaced, destroyed, again = (key_name("experience", uuid7(), CID) for _ in range(3))
    await kv.create(replaced, b"first")
    await kv.create(destroyed, b"gone")
    await kv.create(again, b"old")
    assert await kv_store.replace(replaced, b"first", b"second")
    assert await kv_store.replace(replaced, b"second", b"third")
    await kv_store.destroy(destroyed)
    await kv_store.destroy(again)
    await kv.put(again, b"new")
    assert await kv_store.items("c.") == {replaced: b"third", again: b"new"}
    assert await kv_store.names("c.") == sorted([replaced, again])


async def test_a_scan_reads_past_its_first_pages(kv_store: KvKeyStore) -> None:
    """A scan asks for its names a page at a time, until the server says there is no
    more: every name of several pages, none twice."""
    values = {key_name("experience", uuid7(), CID): os.urandom(8) for _ in range(2 * SCAN_PAGE + 7)}
    await kv_store.put_fresh(values)
    assert await kv_store.items("c.") == values


async def test_a_preload_holds_every_key_until_trimmed() -> None:
    """A catch-up preloads every key before it reads the log; past the cap, the oldest
    (the first the catch-up needs) were dropped at once, and each asked of the store
    again: a request per entity through a rebuild of a million. They are held until the
    catch-up trims the keyring back to its cap, the oldest going first."""
    asked: list[str] = []

    class Counting(MemoryKeyStore):
        async def get(self, name: str) -> Any:
            asked.append(name)
            return await super().get(name)

    store = Counting()
    names = [key_name("experience", uuid7(), CID) for _ in range(5)]
    keys = [await Keyring(store).make(n) for n in names]
    ring = Keyring(store)
    ring.cached = 2
    assert await ring.preload() == 5
    asked.clear()
    assert [await ring.find(n) for n in names] == keys
    assert asked == []  # every one held: none asked of the store
    ring.trim()
    assert ring.cached == 2 and list(ring._keys) == names[3:]  # the newest two stay


async def test_a_preload_asks_each_kek_once_and_again_for_a_key_rotated_meanwhile() -> None:
    """A preload unwraps every key itself after one lookup of each key-encryption key
    (a million keys once made a task each, which starved the event loop of the store's
    own answers); a key read wrapped with a KEK that is gone since (a rotation between
    the scan and the unwrap) is asked of the store again, as a single find does."""
    asked: list[str] = []
    stale: set[str] = set()

    class Rotated(MemoryKeyStore):
        async def get(self, name: str) -> Any:
            asked.append(name)
            return await super().get(name)

        async def items(self, prefix: str = "") -> dict[str, bytes]:  # as a scan read them
            found = await super().items(prefix)
            return {n: (bytes(KID_BYTES) + v[KID_BYTES:] if n in stale else v)
                    for n, v in found.items()}  # fmt: skip

    store = Rotated()
    names = [key_name("experience", uuid7(), CID) for _ in range(40)]
    keys = [await Keyring(store).make(n) for n in names]
    stale.update(names[::7])
    ring = Keyring(store)
    asked.clear()
    assert await ring.preload() == len(names)
    assert [await ring.find(n) for n in names] == keys
    keks = [n for n in asked if n.startswith(f"{CURRENT}.")]
    (real,) = set(keks) - {f"{CURRENT}.{bytes(KID_BYTES).hex()}"}
    assert keks.count(real) == 1
    assert sorted(n for n in asked if not n.startswith(f"{CURRENT}.")) == sorted(stale)


async def test_two_erasures_of_one_name_at_once_both_end(kv_store: KvKeyStore) -> None:
    """An edge host's delete erases a name's values, and so does the echo of its own
    marker, at the same moment. nats-py's history of the name could then wait forever
    (the server still counting a message the other erasure removed): a delete hung. Each
    erasure ends, and only the marker stays."""
    other = KvKeyStore(kv_store.js, kv_store.bucket)
    kv = await kv_store.kv()
    for round_ in range(400):  # (about 1% of such pairs hung)
        name = key_name("experience", uuid7(), uuid7())
        await kv.create(name, b"v" * 40)
        await kv.delete(name)  # (the marker)
        async with asyncio.timeout(10):
            await asyncio.gather(kv_store.erase_values(name), other.erase_values(name))
        held = await kv_store.js.get_last_msg(kv_store.stream, f"$KV.{kv_store.bucket}.{name}")
        assert (held.headers or {}).get("KV-Operation") == "DEL", round_
        with pytest.raises(nats.js.errors.NotFoundError):  # (the value: erased)
            await _value_of(kv_store, name)


async def _value_of(store: KvKeyStore, name: str) -> None:
    """Raise NotFoundError unless the name still holds a value (not a marker)."""
    subject, seq = f"$KV.{store.bucket}.{name}", 1
    while True:
        msg = await store.js.get_msg(store.stream, seq, subject=subject, next=True)
        if (msg.headers or {}).get("KV-Operation") is None:
            return
        seq = msg.seq + 1

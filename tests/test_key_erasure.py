"""Erasing a key's message from the key bucket's files is idempotent: a second erasure of
the same message (two hosts forgetting the same collective, the service's own erasure
followed by a collective delete's) finds nothing left and is done, not an error."""

from __future__ import annotations

import asyncio
from pathlib import Path

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog.ids import uuid7
from eventlog.keys import Keyring, KvKeyStore, key_name


async def test_a_message_erased_twice_is_erased_once_and_done(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    log = await JetStreamLog.connect(server.url, StreamSettings())
    try:
        store = log.key_store()
        assert isinstance(store, KvKeyStore)
        names = [key_name("experience", uuid7(), uuid7()) for _ in range(2)]
        ring = Keyring(store)
        for name in names:
            await ring.make(name)
        kv = await store.kv()
        first, second = [(await kv.get(name)).revision for name in names]
        await store._erase(first)
        await store._erase(first)  # erased already: done
        await asyncio.gather(store._erase(second), store._erase(second))  # two at once
        for name in names:
            assert await store.get(name) is None
    finally:
        await log.close()
        server.stop()

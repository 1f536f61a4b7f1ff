"""The JetStream tail in lists (``JetStreamLog.tail_batches``), what replication hands
to the engine in one go: the same entries as ``read``, in order, each list non-empty,
live ones included; and a host's tail hands its engine another host's writes in lists
(a real nats-server per test)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog.log import LogEntry
from sync import PulseDB
from tests import factories as f


async def test_tail_batches_give_what_read_gives_then_live_ones(nats_server: EmbeddedNats) -> None:
    log = await JetStreamLog.connect(nats_server.url, StreamSettings())
    try:
        await log.append_batch([f.collective() for _ in range(30)])
        stored = [entry async for batch in log.read(1) for entry in batch]
        seen: list[LogEntry] = []
        batches = log.tail_batches(1)
        async with contextlib.aclosing(batches):
            async with asyncio.timeout(30):
                async for batch in batches:
                    assert batch  # never an empty list
                    seen.extend(batch)
                    if len(seen) == 30:
                        later = await log.append(f.collective())
                    if len(seen) > 30:
                        break
        assert [(e.seq, e.event) for e in seen[:30]] == [(e.seq, e.event) for e in stored]
        assert [e.seq for e in seen[30:]] == [later]
    finally:
        await log.close()


async def test_a_second_host_folds_what_the_first_wrote(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        cid = await a.create_collective("acme", "team", 4)
        ids = await asyncio.gather(
            *(a.record_experience(cid, f"lesson {i}", [1.0, 0.0, float(i), 1.0]) for i in range(12))
        )
        await b.sync()
        for eid in ids:  # each one, read on b once b caught up
            found = await b.get_experience(eid)
            assert found is not None and found.experience_id == eid
    finally:
        await b.close()
        await a.close()

"""A host's own writes come back through its tail as the events it wrote: known by their
message id before their bodies are decoded, handed to the engine once each (no offer
beside the tail's copy), applied in stream order like every other host's events."""

from __future__ import annotations

import asyncio
from pathlib import Path

from eventlog import EmbeddedNats
from eventlog import events as ev
from eventlog.log import LogEntry
from sync import PulseDB

VECTOR = [0.25, -0.5, 0.75, 1.0]


async def test_concurrent_writes_reach_the_engine_as_written(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    other = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        cid = await db.create_collective("owner", "c", 4)
        ids = [await db.record_experience(cid, f"lesson {i}", VECTOR) for i in range(4)]
        await other.record_experience(cid, "another host's", VECTOR)
        applied: list[LogEntry] = []
        db.replication.listen(each=applied.append)
        written = [
            ev.ExperienceReinforced(
                **db.writer.common(), experience_id=eid, collective_id=cid, applications=n
            )
            for n in range(1, 9)
            for eid in ids
        ]  # fmt: skip
        seqs = await asyncio.gather(*(db.writer.write(e) for e in written))
        by_seq = {entry.seq: entry for entry in applied}
        assert all(by_seq[seq].event is event for seq, event in zip(seqs, written, strict=True))
        assert db.replication._own == {}  # every one taken back by the tail
        await other.sync()
        assert await db.digest() == await other.digest()  # (b decoded them)
    finally:
        await db.close()
        await other.close()

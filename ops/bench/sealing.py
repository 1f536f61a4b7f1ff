"""What sealing costs per event (``eventlog.sealing``), beside the codec alone.

    python -m ops.bench.sealing [--events 20000]

Records of 384-d experiences with 300 characters of content, each of its own entity:

- seal: a key made for each (``Keyring.fresh``) and the event sealed, beside encoding
  the event alone (``codec.encode_body``, what an unsealed write costs here);
- open: a batch of sealed events opened with their keys in memory, beside decoding and
  range-checking the plain bodies (``codec.decode_event``, what a host does per event
  read either way).

- scrub: after a delete, ``PulseDB.compact`` on a host holding ``--experiences`` such
  experiences (embedded NATS), beside copying the state directory's files once (the
  bytes a rewrite writes at least).

Prints one JSON line per figure with its time, the peer's, and the ratio.
Keys live in a ``MemoryKeyStore``: what the key store's round trips cost is in
``ops.bench.engine`` (writes, convergence) and ``ops.bench.projection`` (rebuild).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from eventlog import events as ev
from eventlog.codec import HDR_SCHEMA, SCHEMA_VERSION, decode_event, encode_body
from eventlog.ids import uuid7
from eventlog.keys import Keyring, MemoryKeyStore
from eventlog.log import LogEntry
from eventlog.sealing import Sealer
from eventlog.subjects import subject_for
from ops.bench import emitter
from projections.projection import state_dir

BATCH = 5000


emit = emitter("sealing")


def records(count: int) -> list[ev.Event]:
    rng = np.random.default_rng(7)
    cid = uuid7()
    return [
        ev.ExperienceRecorded(
            event_id=uuid7(),
            instance_id=uuid7(),
            hlc=ev.pack_hlc(1_700_000_000_000, 0),
            experience_id=uuid7(),
            collective_id=cid,
            content=f"lesson {i} " + "word " * 58,
            embedding=ev.pack_vector(rng.standard_normal(384)),
            experience_type=ev.Generic(),
            importance=0.5,
            confidence=0.5,
            source_agent="agent",
        )  # fmt: skip
        for i in range(count)
    ]


async def run(count: int) -> None:
    events = records(count)
    store = MemoryKeyStore()
    writer = Sealer(Keyring(store))
    start = time.perf_counter()
    for at in range(0, count, BATCH):
        sealed, keys = await writer.seal_fresh(events[at : at + BATCH])
        await store.put_fresh(keys)
    seal_us = (time.perf_counter() - start) / count * 1e6
    sealed = []
    for at in range(0, count, BATCH):
        sealed += (await writer.seal_fresh(events[at : at + BATCH]))[0]
    start = time.perf_counter()
    bodies = [encode_body(e) for e in events]
    encode_us = (time.perf_counter() - start) / count * 1e6
    emit("seal", events=count, sealed_us=round(seal_us, 2), encode_us=round(encode_us, 2),
         ratio=round(encode_us / seal_us, 3))  # fmt: skip

    reader = Sealer(Keyring(store))
    await reader.keyring.preload()
    entries = [LogEntry(i + 1, subject_for(e), e) for i, e in enumerate(sealed)]
    start = time.perf_counter()
    for at in range(0, count, BATCH):
        await reader.open(entries[at : at + BATCH])
    open_us = (time.perf_counter() - start) / count * 1e6
    headers = {HDR_SCHEMA: str(SCHEMA_VERSION)}
    start = time.perf_counter()
    for body in bodies:
        decode_event(body, headers)
    decode_us = (time.perf_counter() - start) / count * 1e6
    emit("open", events=count, open_us=round(open_us, 2), decode_and_check_us=round(decode_us, 2),
         ratio=round(decode_us / open_us, 3))  # fmt: skip


async def scrub(experiences: int) -> None:
    from sync import PulseDB  # (the figures above need only eventlog)

    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        db = await PulseDB.open(Path(tmp) / "host")
        try:
            cid = await db.create_collective("bench", "scrub", 384)
            ids = []
            for first in range(0, experiences, 1000):
                batch = [
                    {"content": f"lesson {i} " + "word " * 50,
                     "embedding": rng.standard_normal(384).astype(np.float32)}
                    for i in range(first, min(first + 1000, experiences))
                ]  # fmt: skip
                ids += await db.record_experiences(cid, batch)
            await db.delete_experience(ids[len(ids) // 2])
            start = time.perf_counter()
            done = await db.compact()
            took = time.perf_counter() - start
            state = state_dir(Path(tmp) / "host")  # (the data directory's current state)
            size = sum(p.stat().st_size for p in state.rglob("*") if p.is_file())
            start = time.perf_counter()
            shutil.copytree(state, Path(tmp) / "copy")
            copy = time.perf_counter() - start
        finally:
            await db.close()
    emit("scrub", experiences=experiences, state_bytes=size, compact_s=round(took, 3),
         duckdb_s=round(done.duckdb_seconds, 3), text_s=round(done.text_seconds, 3),
         vectors_s=round(done.vectors_seconds, 3), copy_s=round(copy, 3),
         ratio=round(copy / took, 3))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="records to seal and open")
    parser.add_argument(
        "--experiences", type=int, default=20_000, help="experiences on the host compacted"
    )
    args = parser.parse_args()
    asyncio.run(run(args.events))
    asyncio.run(scrub(args.experiences))


if __name__ == "__main__":
    main()

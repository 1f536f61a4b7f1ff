"""What a refresh of the analysts' snapshot costs (``projections.snapshot``), beside a
plain copy of the same DuckDB file.

    python -m ops.bench.snapshot [--experiences 20000] [--changes 100] [--rounds 7]

An engine (no NATS: the events are handed to it directly, filling is not measured) holds
``--experiences`` experiences (384-d embeddings, about 300 characters of content), each
reinforced once, in one collective. Then, ``--rounds`` times (the changes untimed):

- caught_up: ``--changes`` new experiences (and their reinforcements) applied, then
  ``Snapshot.refresh`` on the engine thread and its copy to the end: what the engine
  does when the state changed (flush, pin the state in a transaction, copy the current
  snapshot's file and merge the rows changed since into it, rename it onto
  ``snapshot.duckdb``);
- whole: one experience deleted, then the same: a delete makes the refresh a logical
  copy of the whole state (``COPY FROM DATABASE``, which forgets what was deleted);
- copy: ``shutil.copyfile`` of the state's ``state.duckdb``, checkpointed first: the
  bytes' cost (the peer; not an alternative: it keeps deleted rows' bytes in free
  blocks, and the engine writes the file meanwhile).

Prints one JSON line per kind of refresh: medians, what of it held the engine thread
(``engine_ms``: the rest runs on the copy's thread), the copy's median, the ratio
refresh / copy, both files' sizes, and the bound the engine states after that kind
(``SnapshotStatus.bound`` with ``snapshot_interval`` 1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from ops.bench import emitter
from projections.engine import Engine
from projections.projection import Projection, ProjectionSettings
from projections.snapshot import SNAPSHOT_DUTY, SNAPSHOT_NAME, Snapshot

BATCH = 1000


emit = emitter("snapshot")


CID = uuid7()
_rng = np.random.default_rng(3)
_common = {"instance_id": uuid7(), "hlc": ev.pack_hlc(1_700_000_000_000, 0)}


def history(experiences: int) -> list[ev.Event]:
    common, cid = _common, CID
    events: list[ev.Event] = [
        ev.CollectiveCreated(event_id=uuid7(), **common, collective_id=cid,  # type: ignore[arg-type]
                             owner_id="bench", name="snapshot", embedding_dimension=384)
    ]  # fmt: skip
    return events + recorded(experiences)


def recorded(experiences: int) -> list[ev.Event]:
    common, cid, rng = _common, CID, _rng
    events: list[ev.Event] = []
    for i in range(experiences):
        eid = uuid7()
        events.append(
            ev.ExperienceRecorded(
                event_id=uuid7(), **common, experience_id=eid, collective_id=cid,  # type: ignore[arg-type]
                content=f"lesson {i} " + "word " * 58,
                embedding=ev.pack_vector(rng.standard_normal(384)),
                experience_type=ev.Generic(), importance=0.5, confidence=0.5,
                source_agent="agent",
            )
        )  # fmt: skip
        events.append(
            ev.ExperienceReinforced(
                event_id=uuid7(), **common, experience_id=eid, collective_id=cid,  # type: ignore[arg-type]
                applications=1,
            )
        )  # fmt: skip
    return events


async def run(experiences: int, changes: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "state"
        # refreshes only when asked here (the bound below is worked out for 1 s)
        engine = await Engine.start(directory, ProjectionSettings(snapshot_interval=3600))
        snapshot = engine.snapshot
        assert snapshot is not None
        seq = 0

        async def apply(events: list[ev.Event]) -> None:
            nonlocal seq
            for at in range(0, len(events), BATCH):
                batch = events[at : at + BATCH]
                await engine.apply(
                    [LogEntry(seq + i + 1, "pulse.bench", e) for i, e in enumerate(batch)]
                )
                seq += len(batch)

        def refresh(p: Projection, s: Snapshot) -> tuple[float, float]:
            start = time.perf_counter()
            copying = s.refresh(p)
            held = time.perf_counter() - start
            copying.result()
            return held, time.perf_counter() - start

        def checkpointed(p: Projection) -> None:
            p.store.checkpoint_file()

        timed: dict[str, list[tuple[float, float]]] = {"caught_up": [], "whole": []}
        copies = []
        try:
            events = history(experiences)
            await apply(events)
            await engine.run(Projection.save)
            await engine.run(refresh, snapshot)  # the first one is whole
            for _ in range(rounds):
                fresh = recorded(changes)
                await apply(fresh)
                timed["caught_up"].append(await engine.run(refresh, snapshot))
                gone = next(e for e in fresh if isinstance(e, ev.ExperienceRecorded))
                await apply([ev.ExperienceDeleted(
                    event_id=uuid7(), **_common, experience_id=gone.experience_id,  # type: ignore[arg-type]
                    collective_id=CID,
                )])  # fmt: skip
                timed["whole"].append(await engine.run(refresh, snapshot))
                await engine.run(checkpointed)
                start = time.perf_counter()
                shutil.copyfile(directory / "state.duckdb", Path(tmp) / "plain-copy.duckdb")
                copies.append(time.perf_counter() - start)
            state_bytes = (directory / "state.duckdb").stat().st_size
            snapshot_bytes = (directory / SNAPSHOT_NAME).stat().st_size
        finally:
            await engine.close()
    copy_s = statistics.median(copies)
    for kind, samples in timed.items():
        took = statistics.median(total for _, total in samples)
        emit(kind, experiences=experiences, events=seq,
             changes=changes if kind == "caught_up" else 1,
             rounds=rounds, refresh_ms=round(took * 1000, 1),
             engine_ms=round(statistics.median(held for held, _ in samples) * 1000, 1),
             copy_ms=round(copy_s * 1000, 1), ratio=round(took / copy_s, 2),
             state_bytes=state_bytes, snapshot_bytes=snapshot_bytes,
             bound_s=round(max(1.0, SNAPSHOT_DUTY * took) + took, 2))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiences", type=int, default=20_000, help="experiences held")
    parser.add_argument("--changes", type=int, default=100, help="experiences added per round")
    parser.add_argument("--rounds", type=int, default=7, help="refreshes and copies timed")
    args = parser.parse_args()
    asyncio.run(run(args.experiences, args.changes, args.rounds))


if __name__ == "__main__":
    main()

"""A projection killed with SIGKILL while a compaction of its HNSW graph runs. Driven by
tests/test_compaction.py.

    python -m tests.compaction_worker STATE_DIR EVENTS_FILE THRESHOLD ACTION \
        RECORDED SAVED TRIGGER [DURING ...]

EVENTS_FILE is a msgpack list of events, stream sequence = position + 1. The worker
applies them through sequence RECORDED (the graph is built), then through SAVED, and
saves (the index files exist); applies those
through TRIGGER in one batch (deletes that start a compaction); then, while the
compaction runs, the batches that end at each DURING sequence; then ACTION: "none",
"flush" (DuckDB ahead of the index files) or "save" (the old graph, with the nodes of
deleted vectors, saved mid-compaction). It then prints "compacting <json>" and kills
itself with SIGKILL, the compaction still under way: before the deletes it holds the
compaction worker (one thread) with a task that waits for an event never set, so the
compaction they start stays queued, not done. If no compaction is under way then, it
prints "no-compaction <stage>" and exits with status 3.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import msgspec

from eventlog.events import Event
from eventlog.log import LogEntry
from projections.projection import Projection, ProjectionSettings
from projections.vectors import _COMPACTOR

BATCH = 5000


def main(argv: list[str]) -> int:
    directory, events_file, threshold, action, *bounds = argv
    recorded, saved, trigger, *during = (int(b) for b in bounds)
    events = msgspec.msgpack.decode(Path(events_file).read_bytes(), type=list[Event])
    entries = [LogEntry(seq, "s", event) for seq, event in enumerate(events, start=1)]
    p = Projection(directory, ProjectionSettings(hnsw_threshold=int(threshold)))
    for start, end in ((0, recorded), (recorded, saved)):
        for first in range(start, end, BATCH):
            p.apply(entries[first : min(first + BATCH, end)])
            p.sync_indexes()
    (index,) = p.vectors.values()
    index.wait()
    p.save()
    gate = threading.Event()  # never set unless something fails
    _COMPACTOR.submit(gate.wait)  # the compaction the deletes start waits behind it
    p.apply(entries[saved:trigger])
    p.sync_indexes()
    compacting = index.compacting
    if compacting is None or compacting.done():
        print("no-compaction trigger", flush=True)
        gate.set()
        return 3
    start = trigger
    for end in during:
        p.apply(entries[start:end])
        p.sync_indexes()
        start = end
    if action == "flush":
        p.flush()
    elif action == "save":
        p.save()
    if index.compacting is not compacting or compacting.done():
        print(f"no-compaction {action}", flush=True)
        gate.set()
        return 3
    state = {"seq": p.seq, "flushed_seq": p.flushed_seq, "saved_seq": p.saved_seq}
    print(f"compacting {json.dumps(state)}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return 4  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

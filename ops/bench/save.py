"""What the periodic index save costs a write queued behind it.

    python -m ops.bench.save [--n 50000] [--rounds 10] [--batch 200]

One projection (no log: events applied directly, as the engine applies them) of ``n``
experiences of 384 dimensions in one collective (an HNSW graph past
``hnsw_threshold``). Each round applies ``batch`` more records, then saves, alternately
the way the engine saved before (``Projection.save()``: the engine thread writes DuckDB's
checkpoint, the text index and every FAISS file) and the way it saves now
(``save(background=True)``: the thread hands the work over and returns), then at once
applies one more record and brings the indexes up (a write that was queued behind the
save). Printed per mode: the engine thread's time in the save call (wall and its own
CPU), the queued write's latency from the start of the save, and, for the background
mode, how long the files took to be written beside it. One JSON line per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Iterator

from eventlog.log import LogEntry
from ops.bench.projection import Corpus
from projections.projection import Projection


def _entries(corpus: Corpus) -> Iterator[LogEntry]:
    for seq, event in enumerate(corpus.events(), 1):
        yield LogEntry(seq, "s", event)


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 2)


def run(n: int, rounds: int, batch: int) -> None:
    corpus = Corpus(n + 2 * rounds * (batch + 1))
    entries = _entries(corpus)
    with tempfile.TemporaryDirectory(prefix="pulse-bench-save-") as work:
        p = Projection(os.path.join(work, "state"))
        chunk: list[LogEntry] = []
        for entry in entries:
            chunk.append(entry)
            if len(chunk) == 5000 or entry.seq == n + 1:
                p.apply(chunk)
                p.sync_indexes()
                chunk = []
            if entry.seq == n + 1:
                break
        p.save()
        figures: dict[str, dict[str, list[float]]] = {
            mode: {"call_ms": [], "call_cpu_ms": [], "queued_write_ms": [], "files_ms": []}
            for mode in ("engine_thread", "background")
        }
        for r in range(2 * rounds):
            mode = "engine_thread" if r % 2 == 0 else "background"
            more = [next(entries) for _ in range(batch)]
            p.apply(more)
            p.sync_indexes()
            p.flush()
            queued = next(entries)
            start, cpu = time.perf_counter(), time.thread_time()
            p.save(background=mode == "background")
            called = time.perf_counter()
            cpu_ms = 1000 * (time.thread_time() - cpu)
            p.apply([queued])
            p.sync_indexes()
            written = time.perf_counter()
            p.saved()
            done = time.perf_counter()
            got = figures[mode]
            got["call_ms"].append(1000 * (called - start))
            got["call_cpu_ms"].append(cpu_ms)
            got["queued_write_ms"].append(1000 * (written - start))
            got["files_ms"].append(1000 * (done - start))
        p.close()
    load = os.getloadavg()
    for mode, got in figures.items():
        line = {"figure": f"save_{mode}", "experiences": n, "rounds": rounds}
        for name, samples in got.items():
            line[f"{name}_p50"] = _pct(samples, 50)
            line[f"{name}_max"] = round(max(samples), 2)
        line["load_average"] = [round(x, 1) for x in load]
        print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50_000, help="experiences (50,000)")
    parser.add_argument("--rounds", type=int, default=10, help="saves of each mode (10)")
    parser.add_argument("--batch", type=int, default=200, help="records between saves (200)")
    options = parser.parse_args()
    run(options.n, options.rounds, options.batch)


if __name__ == "__main__":
    main()

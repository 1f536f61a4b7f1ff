"""Benchmark: what one periodic DuckDB write of a projection costs (``Projection.flush``:
the engine thread hands the batch over every ``flush_interval`` while writes arrive, and
the projection's flusher thread writes it), beside DuckDB's own floor in the same run.

    python -m ops.bench.flush [--n 20000] [--rounds 40] [--kind record reinforce 1]

One thread, no engine, loop or NATS: a projection of ``--n`` experiences (384-d vectors,
one collective), then ``--rounds`` rounds of: fold a batch, then flush (timed: wall and
process CPU, DuckDB's own threads included; ``engine_thread_ms``: the part of it the
engine thread spends, ``Projection.hand_off``, the rest is the flusher's). Batches
(``--kind``):

- record: 25 ``experience.recorded`` (new rows, an audit row each);
- reinforce: 25 ``experience.reinforced`` of existing experiences (changed count rows,
  a count-history row each);
- 1: one ``experience.recorded`` (the fixed cost of a flush).

The peer: the same DuckDB connection committing a transaction that appends the same
number of rows of one BIGINT to a keyed table of its own (a begin, one INSERT of a
parameter list, a commit): DuckDB's floor for "a few rows, durably", which no flush of
a wide table can go below. Printed per kind, one JSON line: medians of both, their ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path
from uuid import UUID

import numpy as np

from eventlog import events as ev
from eventlog import subjects
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections.projection import Projection, ProjectionSettings


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Feed:
    def __init__(self) -> None:
        self.rng = np.random.default_rng(1)
        self.collective, self.instance = uuid7(), uuid7()
        self.hlc = ev.pack_hlc(int(time.time() * 1000))
        self.seq = 0
        self.recorded: list[UUID] = []
        self.counts: dict[UUID, int] = {}

    def entry(self, event: ev.Event) -> LogEntry:
        self.seq += 1
        self.hlc += 1
        return LogEntry(self.seq, subjects.subject_for(event), event)

    def created(self) -> LogEntry:
        return self.entry(
            ev.CollectiveCreated(
                event_id=uuid7(), instance_id=self.instance, hlc=self.hlc,
                collective_id=self.collective, owner_id="o", name="c", embedding_dimension=384,
                author_owner="o", author_agent="a",
            )
        )  # fmt: skip

    def record(self) -> LogEntry:
        words = " ".join(f"w{int(x)}" for x in self.rng.integers(0, 2000, 30))
        experience = uuid7()
        self.recorded.append(experience)
        return self.entry(
            ev.ExperienceRecorded(
                event_id=uuid7(), instance_id=self.instance, hlc=self.hlc,
                experience_id=experience, collective_id=self.collective, content=words[:200],
                embedding=self.rng.normal(size=384).astype(np.float32).tobytes(),
                experience_type=ev.Generic(), importance=0.5, confidence=0.5,
                source_agent="a", author_owner="o", author_agent="a",
            )
        )  # fmt: skip

    def reinforce(self) -> LogEntry:
        experience = self.recorded[int(self.rng.integers(0, len(self.recorded)))]
        self.counts[experience] = self.counts.get(experience, 0) + 1
        return self.entry(
            ev.ExperienceReinforced(
                event_id=uuid7(), instance_id=self.instance, hlc=self.hlc,
                experience_id=experience, collective_id=self.collective,
                applications=self.counts[experience], author_owner="o", author_agent="a",
            )
        )  # fmt: skip


def run(n: int, rounds: int, kinds: list[str]) -> None:
    feed = _Feed()
    with tempfile.TemporaryDirectory() as tmp:
        projection = Projection(Path(tmp) / "state", ProjectionSettings(snapshot_interval=None))
        projection.apply([feed.created()])
        for start in range(0, n, 2000):
            projection.apply([feed.record() for _ in range(min(2000, n - start))])
            projection.flush()
        con = projection.store.con
        con.execute("CREATE TABLE bench_peer (id BIGINT PRIMARY KEY)")
        next_id = 0

        def peer(rows: int) -> None:
            nonlocal next_id
            con.begin()
            con.execute(
                "INSERT INTO bench_peer SELECT unnest(?::BIGINT[])",
                [list(range(next_id, next_id + rows))],
            )
            con.commit()
            next_id += rows

        for kind in kinds:
            size = 1 if kind == "1" else 25
            make = feed.reinforce if kind == "reinforce" else feed.record
            flush_wall, flush_cpu, peer_wall, peer_cpu, taking = [], [], [], [], []
            for _ in range(rounds):
                projection.apply([make() for _ in range(size)])
                projection.sync_indexes()  # (not the flush's: the engine does it before)
                wall, cpu = time.perf_counter(), _cpu()
                projection.hand_off()  # what the engine thread does
                taking.append(time.perf_counter() - wall)
                projection.flush()  # ... and the flusher's write, waited for
                flush_wall.append(time.perf_counter() - wall)
                flush_cpu.append(_cpu() - cpu)
                wall, cpu = time.perf_counter(), _cpu()
                peer(size)
                peer_wall.append(time.perf_counter() - wall)
                peer_cpu.append(_cpu() - cpu)
            ms = {
                name: round(float(np.median(v)) * 1000, 2)
                for name, v in (
                    ("flush_wall_ms", flush_wall), ("flush_cpu_ms", flush_cpu),
                    ("peer_wall_ms", peer_wall), ("peer_cpu_ms", peer_cpu),
                )
            }  # fmt: skip
            print(
                json.dumps(
                    {
                        "figure": f"flush_{kind}" if kind != "1" else "flush_1_row",
                        "n": n, "rows": size, "rounds": rounds, **ms,
                        "flush_wall_p90_ms": round(float(np.percentile(flush_wall, 90)) * 1000, 2),
                        "engine_thread_ms": round(float(np.median(taking)) * 1000, 3),
                        "cpu_ratio": round(ms["flush_cpu_ms"] / max(ms["peer_cpu_ms"], 1e-3), 2),
                    }
                ),
                flush=True,
            )  # fmt: skip
        projection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="experiences before (20,000)")
    parser.add_argument("--rounds", type=int, default=40, help="flushes per kind (40)")
    parser.add_argument("--kind", nargs="+", default=["record", "reinforce", "1"],
                        choices=["record", "reinforce", "1"], help="batches (all)")  # fmt: skip
    options = parser.parse_args()
    run(options.n, options.rounds, options.kind)


if __name__ == "__main__":
    main()

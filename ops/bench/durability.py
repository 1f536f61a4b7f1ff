"""Benchmark: the write rate of a 3-node cluster in each durability, with 1 and more
partition streams, for raw nats-py publishers and for Pulse's write path, in one run.

    python -m ops.bench.durability [--seconds S] [--partitions 1,4] [--callers N]

For each durability (``fsync``: ``sync_interval: always``; ``replicated``: the server's
default interval), three local nats-server processes are started as ``ops.cluster``
makes them, and:

- raw: one client process keeps ``--inflight`` acknowledged publishes in flight, of the
  bytes of an experience (500 characters, 384 floats: about 2 KB), spread over P
  streams of 3 replicas each (P of ``--partitions``), for ``--seconds``;
- log: one client process, Pulse's log layer (``JetStreamLog`` on one stream,
  ``eventlog.partitioned.PartitionedLog`` on P partitions), keeping ``--inflight``
  appends of experience events in flight (each a new event of one of 64 collectives:
  encoded, routed to its partition, acknowledged, its position returned);
- pulse: one client process, a Pulse host on the same cluster (streams of 3 replicas,
  in P partitions), with ``--callers`` concurrent ``record_experience`` calls into P
  collectives, for ``--seconds``;
- batch: the same host, with ``--callers`` / 8 concurrent ``record_experiences`` calls of
  ``--batch`` experiences each (an agent saving what it learned in one go; an importer):
  one atomic batch published, and applied, per call.

Each row prints the rate, its ratio to one fsync stream's raw rate (the write ceiling
the issue measures against), Pulse's ratio to raw on the same durability and one stream,
and the CPU the client and the three servers used over the wall time ("cores busy"):
this machine has 2, so a row at about 2 has run out of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nats

from eventlog import JetStreamLog, StreamSettings
from eventlog.codec import encode_event
from eventlog.ids import uuid7
from eventlog.partitioned import PartitionedLog
from ops.bench.log_throughput import make_events
from ops.cluster import LocalCluster

DIM = 384


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU seconds of this process and the cluster's servers, between start and stop."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.pids = [p.pid for p in cluster.processes if p is not None]

    def __enter__(self) -> Cpu:
        self.started = time.perf_counter()
        self.client0 = time.process_time()
        self.servers0 = sum(map(cpu_seconds, self.pids))
        return self

    def __exit__(self, *_: object) -> None:
        self.wall = time.perf_counter() - self.started
        self.client = time.process_time() - self.client0
        self.servers = sum(map(cpu_seconds, self.pids)) - self.servers0

    def busy(self) -> dict[str, float]:
        """Cores busy over the wall time: the client's, the servers', both."""
        return {"client_cores": round(self.client / self.wall, 2),
                "server_cores": round(self.servers / self.wall, 2),
                "cores": round((self.client + self.servers) / self.wall, 2)}  # fmt: skip


async def raw_rate(urls: list[str], partitions: int, inflight: int, seconds: float,
                   cluster: LocalCluster) -> tuple[float, Cpu]:  # fmt: skip
    """Acknowledged publishes per second over ``partitions`` R3 streams."""
    nc = await nats.connect(urls)
    js = nc.jetstream()
    names = [f"RAW{partitions}_{k}" for k in range(partitions)]
    for k, name in enumerate(names):
        await js.add_stream(name=name, subjects=[f"raw{partitions}.{k}.>"], num_replicas=3)
    payload = encode_event(make_events(1)[0]).payload
    done = 0
    stop = time.perf_counter() + seconds

    async def publisher(n: int) -> None:
        nonlocal done
        subject = f"raw{partitions}.{n % partitions}.e{n}"
        while time.perf_counter() < stop:
            await js.publish(subject, payload, timeout=30)
            done += 1

    with Cpu(cluster) as cpu:
        await asyncio.gather(*(publisher(n) for n in range(inflight)))
    for name in names:
        await js.delete_stream(name)
    await nc.close()
    return done / cpu.wall, cpu


async def log_rate(urls: list[str], partitions: int, inflight: int, seconds: float,
                   cluster: LocalCluster) -> tuple[float, Cpu]:  # fmt: skip
    """Appends per second through Pulse's log layer over ``partitions`` R3 streams."""
    name = f"LOG{partitions}"
    settings = StreamSettings(name=name, activity_name=f"{name}_ACTIVITY", replicas=3,
                              partitions=partitions)  # fmt: skip
    log: JetStreamLog | PartitionedLog
    if partitions == 1:
        log = await JetStreamLog.connect(urls, settings, connect_timeout=30)
    else:
        log = await PartitionedLog.connect(urls, settings, connect_timeout=30)
    template = make_events(1)[0]
    collectives = [uuid7() for _ in range(64)]
    done = 0
    stop = time.perf_counter() + seconds

    async def appender(n: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop:
            event = msgspec.structs.replace(
                template, event_id=uuid7(), experience_id=uuid7(),
                collective_id=collectives[(n + i) % len(collectives)],
            )  # fmt: skip
            await log.append(event)
            done += 1
            i += 1

    try:
        with Cpu(cluster) as cpu:
            await asyncio.gather(*(appender(n) for n in range(inflight)))
    finally:
        await log.close()
        await _drop_streams(urls, name, partitions)
    return done / cpu.wall, cpu


async def pulse_rate(urls: list[str], root: Path, partitions: int, callers: int,
                     seconds: float, cluster: LocalCluster,
                     batch: int = 1) -> tuple[float, Cpu]:  # fmt: skip
    """Experiences recorded a second by ``callers`` concurrent callers, into as many
    collectives as partitions (each in its own, where the hash allows): one
    ``record_experience`` a call, or (``batch`` > 1) ``record_experiences`` of ``batch``."""
    from sync import PulseDB

    name = f"HOST{partitions}"
    settings = StreamSettings(name=name, activity_name=f"{name}_ACTIVITY", replicas=3,
                              partitions=partitions)  # fmt: skip
    db = await PulseDB.open(root, urls, stream_settings=settings)
    try:
        teams = [await db.create_collective("bench", f"durability {n}", DIM)
                 for n in range(max(1, partitions))]  # fmt: skip
        vector = [((i * 7919) % 1000) / 1000.0 for i in range(DIM)]
        text = "retry with the same event id. " * 17
        done = 0
        stop = time.perf_counter() + seconds

        async def caller(n: int) -> None:
            nonlocal done
            i = 0
            while time.perf_counter() < stop:
                team = teams[n % len(teams)]
                if batch == 1:
                    await db.record_experience(team, f"{n}.{i} {text}"[:500], vector)
                else:
                    await db.record_experiences(team, [
                        {"content": f"{n}.{i}.{j} {text}"[:500], "embedding": vector}
                        for j in range(batch)
                    ])  # fmt: skip
                done += batch
                i += 1

        with Cpu(cluster) as cpu:
            await asyncio.gather(*(caller(n) for n in range(callers)))
        return done / cpu.wall, cpu
    finally:
        await db.close()
        await _drop_streams(urls, name, partitions)


async def _drop_streams(urls: list[str], name: str, partitions: int) -> None:
    """Delete a run's streams and key bucket: the next run's take the same subjects."""
    nc = await nats.connect(urls)
    js = nc.jetstream()
    streams = [name, f"{name}_ACTIVITY", f"KV_{name}_KEYS"]
    streams += [f"{name}_P{k}" for k in range(1, partitions + 1) if partitions > 1]
    for stream in streams:
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
    await nc.close()


@dataclass
class Row:
    durability: str
    kind: str  # the writer: raw, log (Pulse's log layer), pulse or batch (a host)
    partitions: int
    per_s: float
    busy: dict[str, float]


async def main(
    seconds: float, partitions: list[int], callers: int, inflight: int, batch: int
) -> None:
    rows: list[Row] = []
    for durability in ("fsync", "replicated"):
        with tempfile.TemporaryDirectory() as tmp:
            cluster = LocalCluster(Path(tmp) / "cluster", 3, durability=durability)
            urls = cluster.start()
            try:
                for p in partitions:
                    rate, cpu = await raw_rate(urls, p, inflight, seconds, cluster)
                    rows.append(Row(durability, "raw", p, rate, cpu.busy()))
                for p in partitions:
                    rate, cpu = await log_rate(urls, p, inflight, seconds, cluster)
                    rows.append(Row(durability, "log", p, rate, cpu.busy()))
                for p in partitions:
                    rate, cpu = await pulse_rate(urls, Path(tmp) / f"pulse{p}", p, callers,
                                                 seconds, cluster)  # fmt: skip
                    rows.append(Row(durability, "pulse", p, rate, cpu.busy()))
                for p in partitions:
                    rate, cpu = await pulse_rate(urls, Path(tmp) / f"batch{p}", p,
                                                 max(1, callers // 8), seconds, cluster,
                                                 batch)  # fmt: skip
                    rows.append(Row(durability, "batch", p, rate, cpu.busy()))
            finally:
                cluster.stop()

    def raw_of(durability: str, partitions: int = 1) -> float:  # raw's rate on as many
        return next(r.per_s for r in rows if (r.kind, r.durability, r.partitions)
                    == ("raw", durability, partitions))  # fmt: skip

    ceiling = raw_of("fsync")
    print(f"{'durability':<11} {'writer':<6} {'streams':>7} {'writes/s':>9} "
          f"{'vs fsync 1 raw':>14} {'vs raw same':>11} {'cores: client':>13} "
          f"{'servers':>7} {'all':>5}")  # fmt: skip
    for row in rows:
        same, busy = raw_of(row.durability, row.partitions), row.busy
        client, servers, both = busy["client_cores"], busy["server_cores"], busy["cores"]
        print(f"{row.durability:<11} {row.kind:<6} {row.partitions:>7} {row.per_s:>9,.0f} "
              f"{row.per_s / ceiling:>13.2f}x {row.per_s / same:>10.2f}x "
              f"{client:>13} {servers:>7} {both:>5}")  # fmt: skip
        print(json.dumps({"bench": "durability", "durability": row.durability,
                          "writer": row.kind, "partitions": row.partitions,
                          "per_s": round(row.per_s), **busy,
                          "vs_fsync_one_stream_raw": round(row.per_s / ceiling, 3),
                          "vs_raw_same": round(row.per_s / same, 3)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="each row's run (5)")
    parser.add_argument("--partitions", default="1,4",
                        help="streams of raw and of the log layer: a list (1,4)")  # fmt: skip
    parser.add_argument("--callers", type=int, default=32, help="Pulse's concurrent calls (32)")
    parser.add_argument("--inflight", type=int, default=256,
                        help="raw publishes in flight (256)")  # fmt: skip
    parser.add_argument(
        "--batch",
        type=int,
        default=100,
        help="experiences a record_experiences call of the batch rows (100)",
    )
    args = parser.parse_args()
    parts = [int(p) for p in args.partitions.split(",") if p.strip()]
    asyncio.run(main(args.seconds, parts, args.callers, args.inflight, args.batch))

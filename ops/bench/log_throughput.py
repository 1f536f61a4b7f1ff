"""Benchmark: the event log's append and drain rates beside raw nats-py in the same run.

    python -m ops.bench.log_throughput [--single N] [--batch N] [--no-sync]

Starts an embedded nats-server (sync_interval always, as Pulse runs by default) in a
temporary directory and measures, with the same payload bytes (an experience with 500
characters of content and a 384-dimension embedding):

- single:  acknowledged appends one at a time   vs  awaited ``js.publish`` in a loop
- batch:   ``append_batch`` in chunks of 1000  vs  ``js.publish_async`` + completion
- drain:   ``read(1)`` of the whole stream, decoding every event
           vs  a nats-py ordered push consumer with a callback, not decoding

Each figure is one JSON line with both rates and ``ratio`` = pulse / raw (1.0 = as fast
as raw nats-py). Rounds alternate pulse and raw; the median round is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from typing import Awaitable, Callable

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog.codec import WireMessage, encode_event
from eventlog.events import ExperienceRecorded, Fact, pack_hlc, pack_vector
from eventlog.ids import uuid7
from ops.bench.peers import raw_drain as raw_drain_peer

DIM = 384


def make_events(n: int) -> list[ExperienceRecorded]:
    collective, instance = uuid7(), uuid7()
    vector = pack_vector([((i * 7919) % 1000) / 1000.0 for i in range(DIM)])
    now = time.time_ns() // 1_000_000
    return [
        ExperienceRecorded(
            event_id=uuid7(),
            instance_id=instance,
            hlc=pack_hlc(now, i % 60000),
            experience_id=uuid7(),
            collective_id=collective,
            content=(f"lesson {i}: " + "retry with the same event id. " * 20)[:500],
            embedding=vector,
            experience_type=Fact(statement="benchmark", source="ops.bench"),
            importance=0.5,
            confidence=0.5,
            source_agent="bench",
            domain=("bench",),
        )
        for i in range(n)
    ]


def figure(name: str, n: int, pulse: list[float], raw: list[float]) -> None:
    p, r = statistics.median(pulse), statistics.median(raw)
    print(
        json.dumps(
            {
                "bench": "log_throughput",
                "figure": name,
                "n": n,
                "pulse_per_s": round(p),
                "raw_nats_py_per_s": round(r),
                "ratio": round(p / r, 3),
                "rounds": len(pulse),
            }
        ),
        flush=True,
    )


async def timed(action: Callable[[], Awaitable[int]]) -> float:
    started = time.perf_counter()
    count = await action()
    return count / (time.perf_counter() - started)


async def main(single: int, batch: int, rounds: int, sync: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(tmp, sync_always=sync) as server:
        log = await JetStreamLog.connect(server.url, StreamSettings(), append_timeout=30)
        js = log.js

        async def pulse_single() -> int:
            for event in make_events(single):
                await log.append(event)
            return single

        async def raw_single() -> int:
            for wire in map(encode_event, make_events(single)):
                await js.publish(wire.subject, wire.payload, headers=wire.headers)
            return single

        async def pulse_batch() -> int:
            events = make_events(batch)
            for start in range(0, batch, 1000):
                await log.append_batch(events[start : start + 1000])
            return batch

        async def raw_batch() -> int:
            wires: list[WireMessage] = [encode_event(e) for e in make_events(batch)]
            for start in range(0, batch, 1000):
                for wire in wires[start : start + 1000]:
                    await js.publish_async(wire.subject, wire.payload, headers=wire.headers)
                await js.publish_async_completed()
            return batch

        for name, n, pulse, raw in (
            ("single_append", single, pulse_single, raw_single),
            ("batch_append", batch, pulse_batch, raw_batch),
        ):
            p_rates: list[float] = []
            r_rates: list[float] = []
            for i in range(rounds):
                order = [(pulse, p_rates), (raw, r_rates)]
                for action, rates in order if i % 2 == 0 else reversed(order):
                    rates.append(await timed(action))
            figure(name, n, p_rates, r_rates)

        total = await log.last_seq()

        async def pulse_drain() -> int:
            count = 0
            async for entries in log.read(1, batch_size=1000):
                count += sum(1 for e in entries if e.event is not None)
            assert count == total, (count, total)
            return count

        async def raw_drain() -> int:
            return await raw_drain_peer(js, "pulse.c.>", total)

        p_rates = []
        r_rates = []
        for i in range(rounds):
            order = [(pulse_drain, p_rates), (raw_drain, r_rates)]
            for action, rates in order if i % 2 == 0 else reversed(order):
                rates.append(await timed(action))
        figure("drain", total, p_rates, r_rates)
        await log.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--single", type=int, default=2000, help="events per single-append round")
    parser.add_argument("--batch", type=int, default=20000, help="events per batch round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per figure (median)")
    parser.add_argument("--no-sync", action="store_true", help="fsync periodically, not per write")
    args = parser.parse_args()
    asyncio.run(main(args.single, args.batch, args.rounds, not args.no_sync))

"""Benchmark: convergence lag between two instances and reinforcement throughput, beside
raw nats-py round trips in the same run.

    python -m ops.bench.sync [--writes 300] [--reinforcements 1000]

With one embedded NATS server (sync_interval always) and two instances A and B:

- convergence: ``A.record_experience`` called until B's ``watch_experiences`` yields it
  (A's append, A's read-your-writes, B's replication and fold), p50 / p99 ms; beside a
  raw nats-py JetStream publish on one connection until an ordered push consumer on
  another connection receives it;
- reinforcements: acknowledged ``reinforce_experience`` calls per second on A (append,
  local apply, total read back), one caller and then 16 concurrent callers on 16
  experiences; beside awaited raw ``js.publish`` calls per second, the same way;
- idempotent writes: ``record_experience`` calls per second with an idempotency key,
  without one, and the same keyed calls retried (each answered from JetStream's
  duplicate window on B, which never saw them, or from A's memory of its keys); beside
  raw ``js.publish`` calls carrying a ``Nats-Msg-Id``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import nats
import numpy as np
from nats.js import api

from eventlog import EmbeddedNats
from ops.bench import emitter
from sync import PulseDB

emit = emitter("sync")


def pct(samples: list[float], p: float) -> float:
    return round(float(np.percentile(np.array(samples), p)), 3)


async def main(writes: int, reinforcements: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        a = await PulseDB.open(Path(tmp) / "a", server.url)
        b = await PulseDB.open(Path(tmp) / "b", server.url)
        cid = await a.create_collective("bench", "sync", 16)
        await b.sync()
        rng = np.random.default_rng(1)

        changes = b.watch_experiences()
        pulse_ms: list[float] = []
        for i in range(writes):
            started = time.perf_counter()
            eid = await a.record_experience(cid, f"lesson {i}", rng.random(16).astype(np.float32))
            async for change in changes:
                if change.experience_id == eid and change.kind == "created":
                    break
            pulse_ms.append((time.perf_counter() - started) * 1000)
        changes.close()

        publisher = await nats.connect(server.url)
        subscriber = await nats.connect(server.url)
        js_pub, js_sub = publisher.jetstream(), subscriber.jetstream()
        # the peer's own stream (same storage), so the instances do not fold its messages
        await js_pub.add_stream(name="RAW", subjects=["raw.bench"], storage=api.StorageType.FILE)
        payload = b"x" * 200
        arrived: asyncio.Queue[float] = asyncio.Queue()

        async def on_message(msg: object) -> None:
            arrived.put_nowait(time.perf_counter())

        sub = await js_sub.subscribe(
            "raw.bench", cb=on_message, ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.NEW,
        )  # fmt: skip
        raw_ms: list[float] = []
        for _ in range(writes):
            started = time.perf_counter()
            await js_pub.publish("raw.bench", payload)
            raw_ms.append((await arrived.get() - started) * 1000)
        await sub.unsubscribe()
        emit("convergence_lag", writes=writes, pulse_p50_ms=pct(pulse_ms, 50),
             pulse_p99_ms=pct(pulse_ms, 99), raw_js_p50_ms=pct(raw_ms, 50),
             raw_js_p99_ms=pct(raw_ms, 99),
             ratio_p50=round(statistics.median(pulse_ms) / statistics.median(raw_ms), 3),
        )  # fmt: skip

        eid = await a.record_experience(cid, "reinforced", rng.random(16).astype(np.float32))
        started = time.perf_counter()
        for _ in range(reinforcements):
            await a.reinforce_experience(eid)
        pulse_rate = reinforcements / (time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(reinforcements):
            await js_pub.publish("raw.bench", payload)
        raw_rate = reinforcements / (time.perf_counter() - started)
        await b.sync()
        got = await b.get_experience(eid)
        assert got is not None and got.applications == reinforcements
        emit("reinforcements", calls=reinforcements, pulse_per_s=round(pulse_rate),
             raw_js_publish_per_s=round(raw_rate), ratio=round(pulse_rate / raw_rate, 3),
        )  # fmt: skip

        callers = 16
        targets = [
            await a.record_experience(cid, f"hot {i}", rng.random(16).astype(np.float32))
            for i in range(callers)
        ]
        rounds = reinforcements // callers

        async def caller(target: UUID) -> None:
            for _ in range(rounds):
                await a.reinforce_experience(target)

        async def raw_caller() -> None:
            for _ in range(rounds):
                await js_pub.publish("raw.bench", payload)

        started = time.perf_counter()
        await asyncio.gather(*(caller(t) for t in targets))
        concurrent = rounds * callers / (time.perf_counter() - started)
        started = time.perf_counter()
        await asyncio.gather(*(raw_caller() for _ in range(callers)))
        raw_concurrent = rounds * callers / (time.perf_counter() - started)
        emit("reinforcements_16_callers", calls=rounds * callers,
             pulse_per_s=round(concurrent), raw_js_publish_per_s=round(raw_concurrent),
             ratio=round(concurrent / raw_concurrent, 3),
        )  # fmt: skip

        def vector() -> np.ndarray:
            return rng.random(16).astype(np.float32)

        async def rate(calls: list[Any]) -> float:
            started = time.perf_counter()
            for call in calls:
                await call()
            return len(calls) / (time.perf_counter() - started)

        n = writes
        plain = await rate([lambda i=i: a.record_experience(cid, f"plain {i}", vector())
                            for i in range(n)])  # fmt: skip
        keyed_calls = [(f"keyed {i}", vector()) for i in range(n)]

        def keyed_on(db: PulseDB) -> list[Any]:
            return [lambda c=c: db.record_experience(cid, c[0], c[1], idempotency_key=c[0])
                    for c in keyed_calls]  # fmt: skip

        keyed = await rate(keyed_on(a))
        await b.sync()
        retried_b = await rate(keyed_on(b))
        retried_a = await rate(keyed_on(a))
        raw = await rate([lambda i=i: js_pub.publish("raw.bench", payload,
                                                     headers={"Nats-Msg-Id": f"raw-{i}"})
                          for i in range(n)])  # fmt: skip
        stats = await a.get_collective_stats(cid)
        assert stats.experiences == writes + 2 * n + 1 + callers, stats  # retries stored nothing
        emit("idempotent_writes", calls=n, keyed_per_s=round(keyed), plain_per_s=round(plain),
             retried_on_other_host_per_s=round(retried_b),
             retried_on_same_host_per_s=round(retried_a),
             raw_js_publish_msg_id_per_s=round(raw), ratio_keyed_to_plain=round(keyed / plain, 3),
             ratio_keyed_to_raw=round(keyed / raw, 3),
        )  # fmt: skip

        await publisher.close()
        await subscriber.close()
        await a.close()
        await b.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--reinforcements", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(main(args.writes, args.reinforcements))

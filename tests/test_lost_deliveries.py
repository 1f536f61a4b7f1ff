"""A delivery lost between the server and this host: a consumer that acknowledges
nothing never sends it again (a reconnect, the route through a server that died, a
connection the server cut as a slow consumer). The hosts test found one host that never
applied ten events every other host applied. Every reader here counts the consumer's
deliveries and, at a gap in that count, reads again from what it has: the tail, a read,
and the key store's scan (a real nats-server per test; the loss is made on this side of
the connection, the one place a test can choose which message goes missing)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from eventlog import JetStreamLog
from eventlog.ids import uuid7
from eventlog.keys import KvKeyStore, key_name
from eventlog.log import LogEntry
from tests import factories as f
from tests.harness import Message, intercept, is_delivery

EVENTS = 40


def lose_deliveries(nc: Any, which: set[int]) -> list[str]:
    """Make connection ``nc`` drop its ``n``-th JetStream delivery (a message with an
    ack subject, counted from 1 over the connection) for each ``n`` in ``which``; returns
    the list the lost ones' ack subjects are added to."""
    lost: list[str] = []
    count = 0

    def take(message: Message) -> bool:
        nonlocal count
        if not is_delivery(message):
            return False
        count += 1
        if count in which:
            lost.append(message[2].decode())
            return True
        return False

    intercept(nc, take)
    return lost


async def test_the_tail_reads_again_what_was_lost_on_the_way(
    jetstream_log: JetStreamLog,
) -> None:
    log = jetstream_log
    await log.append_batch([f.collective() for _ in range(EVENTS)])
    lost = lose_deliveries(log.nc, {5, 17})
    seen: list[LogEntry] = []
    tail = log.tail_batches(1)
    async with contextlib.aclosing(tail):
        async with asyncio.timeout(30):
            async for batch in tail:
                seen.extend(batch)
                if len(seen) >= EVENTS:
                    break
    assert len(lost) == 2
    assert [e.seq for e in seen] == list(range(1, EVENTS + 1))


async def test_the_tail_reads_again_the_last_delivery_lost(jetstream_log: JetStreamLog) -> None:
    """The last delivery before a quiet spell: no later one shows the gap, the next idle
    heartbeat does (it carries the count of the consumer's last delivery)."""
    log = jetstream_log
    await log.append_batch([f.collective() for _ in range(5)])
    lost = lose_deliveries(log.nc, {5})
    seen: list[LogEntry] = []
    tail = log.tail_batches(1)
    async with contextlib.aclosing(tail):
        async with asyncio.timeout(20):  # (a heartbeat a second; nothing is written meanwhile)
            async for batch in tail:
                seen.extend(batch)
                if len(seen) >= 5:
                    break
    assert len(lost) == 1
    assert [e.seq for e in seen] == [1, 2, 3, 4, 5]


async def test_a_read_reads_again_what_was_lost_on_the_way(jetstream_log: JetStreamLog) -> None:
    log = jetstream_log
    await log.append_batch([f.collective() for _ in range(EVENTS)])
    lost = lose_deliveries(log.nc, {3, 21})
    async with asyncio.timeout(30):
        seqs = [e.seq async for batch in log.read(1, batch_size=10) for e in batch]
    assert len(lost) == 2
    assert seqs == list(range(1, EVENTS + 1))


async def test_the_key_scan_reads_again_what_was_lost_on_the_way(
    jetstream_log: JetStreamLog,
) -> None:
    store = jetstream_log.key_store()
    assert isinstance(store, KvKeyStore)
    cid = uuid7()
    values = {key_name("experience", uuid7(), cid): os.urandom(8) for _ in range(30)}
    await store.put_fresh(values)
    lost = lose_deliveries(store.js._nc, {7})
    assert await store.items("c.") == values
    assert len(lost) == 1

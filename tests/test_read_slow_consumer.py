"""A long read of the log whose consumer holds the event loop for longer than the read
timeout between batches (as the log reader's child does while its pipe is full: the
rebuilding side busy with a batch) goes on: the consumer's time is not the log's
silence."""

from __future__ import annotations

import time

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings


async def test_a_read_goes_on_after_its_consumer_held_the_loop(nats_server: EmbeddedNats) -> None:
    from eventlog import events as ev
    from eventlog.ids import uuid7
    from tests import factories as f

    log = await JetStreamLog.connect(nats_server.url, StreamSettings())
    log.read_timeout = 1.0
    try:
        cid = uuid7()
        events: list[ev.Event] = [f.collective(cid, dim=4)]
        events += [f.experience(cid, f"lesson {i}", dim=4) for i in range(59)]
        await log.append_batch(events)
        seqs: list[int] = []
        async for batch in log.read(1, batch_size=20):
            seqs += [e.seq for e in batch]
            time.sleep(1.5)  # the loop held (a blocking write to a full pipe) past the timeout
        assert seqs == list(range(1, 61))
    finally:
        await log.close()

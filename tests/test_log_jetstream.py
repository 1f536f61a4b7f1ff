"""The EventLog contract on NATS JetStream (a real nats-server per test)."""

from __future__ import annotations

from typing import AsyncIterator, Mapping

import pytest

from eventlog import EmbeddedNats, EventLog, JetStreamLog, StreamSettings
from tests.log_contract import LogContract


class TestJetStreamLog(LogContract):
    @pytest.fixture
    async def log(self, nats_server: EmbeddedNats) -> AsyncIterator[JetStreamLog]:
        jetstream = await JetStreamLog.connect(nats_server.url, StreamSettings())
        yield jetstream
        await jetstream.close()

    async def inject_raw(
        self, log: EventLog, subject: str, payload: bytes, headers: Mapping[str, str]
    ) -> None:
        assert isinstance(log, JetStreamLog)
        await log.js.publish(subject, payload, headers=dict(headers))


async def test_a_long_read_in_a_child_process_gives_what_read_gives(
    nats_server: EmbeddedNats,
) -> None:
    """``read_bulk`` past its threshold reads in a second process (``eventlog.reader``):
    the same entries as ``read``, dead letters (with reason and writer) included."""
    from eventlog import events as ev
    from eventlog.codec import HDR_SCHEMA, encode_event
    from eventlog.ids import uuid7
    from eventlog.reader import read_in_child
    from tests import factories as f

    log = await JetStreamLog.connect(nats_server.url, StreamSettings())
    try:
        cid = uuid7()
        events: list[ev.Event] = [f.collective(cid, dim=4)]
        events += [f.experience(cid, f"lesson {i}", dim=4) for i in range(3000)]
        for start in range(0, len(events), 1000):
            await log.append_batch(events[start : start + 1000])
        bad = [encode_event(f.experience(cid, "bad", dim=4)) for _ in range(3)]
        await log.js.publish(bad[0].subject, b"\xc1 not msgpack", headers=bad[0].headers)
        await log.js.publish(
            bad[1].subject, bad[1].payload, headers={**bad[1].headers, HDR_SCHEMA: "9"}
        )
        other = encode_event(events[7])  # a body on another experience's subject
        await log.js.publish(bad[2].subject, other.payload, headers=bad[2].headers)
        await log.append_batch([f.experience(cid, f"more {i}", dim=4) for i in range(200)])

        expected = [e async for batch in log.read(1, batch_size=700) for e in batch]
        last = await log.last_seq()
        found = [  # what read_bulk uses past its threshold, called directly
            e async for batch in read_in_child(log.servers, "PULSE", 1, last, 700) for e in batch
        ]
        assert [e.seq for e in found] == [e.seq for e in expected] == list(range(1, 3205))
        assert [(e.subject, e.event) for e in found] == [(e.subject, e.event) for e in expected]
        dead = [(e.seq, str(e.error), e.error.instance_id) for e in found if e.error]  # type: ignore[union-attr]
        assert len(dead) == 3
        assert dead == [
            (e.seq, str(e.error), e.error.instance_id)
            for e in expected
            if e.error  # type: ignore[union-attr]
        ]
        assert [e.seq async for batch in log.read_bulk(3100, child_from=10) for e in batch] == list(
            range(3100, 3205)
        )
    finally:
        await log.close()

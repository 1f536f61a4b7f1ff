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


async def test_the_tail_gives_back_what_this_host_wrote_as_written(
    nats_server: EmbeddedNats,
) -> None:
    """``tail(own=...)``: a message this host wrote is known by its id before its body is
    decoded and given back as the event written (the same object: never decoded); one on
    another subject than the one written, or stored too long after its clock (a dead
    letter on every host), is decoded as any other."""
    import msgspec

    from eventlog import events as ev
    from eventlog.ids import uuid7
    from eventlog.limits import CLOCK_AHEAD_MS
    from eventlog.subjects import subject_for
    from tests import factories as f

    log = await JetStreamLog.connect(nats_server.url, StreamSettings())
    try:
        cid = uuid7()
        mine = [f.experience(cid, f"mine {i}") for i in range(3)]
        other = f.experience(cid, "another host's")
        ahead = ev.pack_hlc(ev.hlc_millis(mine[0].hlc) + 2 * CLOCK_AHEAD_MS, 0)
        fast = msgspec.structs.replace(f.experience(cid, "a clock too fast"), hlc=ahead)
        written = {str(e.event_id): (subject_for(e), e) for e in [*mine, fast]}
        misplaced = f.experience(cid, "not where it was written")
        written[str(misplaced.event_id)] = ("pulse.elsewhere", misplaced)
        asked: list[str] = []

        def own(msg_id: str, subject: str) -> ev.Event | None:
            asked.append(msg_id)
            found = written.pop(msg_id, None)
            return found[1] if found is not None and found[0] == subject else None

        for event in [mine[0], other, mine[1], misplaced, fast, mine[2]]:
            await log.append(event)
        entries = []
        async for entry in log.tail(1, own=own):
            entries.append(entry)
            if len(entries) == 6:
                break
        got = [e.event for e in entries]
        assert got[0] is mine[0] and got[2] is mine[1] and got[5] is mine[2]
        assert got[1] == other and got[1] is not other  # decoded
        assert got[3] == misplaced and got[3] is not misplaced  # decoded: another subject
        assert got[4] is None and "ahead" in str(entries[4].error)  # a dead letter
        assert all(e.stored_ms for e in entries)
        assert len(asked) == 6 and written == {}
    finally:
        await log.close()

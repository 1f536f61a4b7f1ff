"""A 3-node JetStream cluster on loopback with an R3 stream: a node dies while appends go on."""

from __future__ import annotations

import asyncio
from uuid import UUID

from eventlog import JetStreamLog, LogUnavailable, StreamSettings
from eventlog.codec import encode_event
from eventlog.events import Event
from ops.cluster import LocalCluster
from tests import factories as f
from tests.log_contract import read_all

EVENTS = 240
KILL_AFTER = 80


async def test_acknowledged_events_survive_a_node_failure(cluster: LocalCluster) -> None:
    settings = StreamSettings(replicas=3)
    log = await JetStreamLog.connect(cluster.urls, settings, append_timeout=20, connect_timeout=30)
    info = await log.js.stream_info(settings.name)
    assert info.config.num_replicas == 3

    cid = f.uuid7()
    events: list[Event] = [f.collective(cid)] + [
        f.experience(cid, f"lesson {i}") for i in range(EVENTS - 1)
    ]
    acked: dict[UUID, int] = {}
    unavailable = 0
    killed: int | None = None
    for i, event in enumerate(events):
        if i == KILL_AFTER:  # kill the stream's leader mid-stream: a new one must be elected
            leader = (await log.js.stream_info(settings.name)).cluster.leader  # type: ignore[union-attr]
            killed = int(leader.removeprefix("n"))  # type: ignore[union-attr]
            cluster.kill(killed)
        while event.event_id not in acked:
            try:
                acked[event.event_id] = await log.append(event)
            except LogUnavailable:
                unavailable += 1  # retry the same event: it must not be stored twice
                assert unavailable < 10, "the cluster did not recover"
    assert killed is not None
    new_leader = (await log.js.stream_info(settings.name)).cluster.leader  # type: ignore[union-attr]
    assert new_leader != f"n{killed}"

    entries = await read_all(log)
    stored = [e.event.event_id for e in entries if e.event is not None]
    assert len(stored) == len(set(stored)) == EVENTS, "every event exactly once"
    assert {e.event.event_id: e.seq for e in entries if e.event is not None} == acked
    assert [e.event for e in entries] == events

    # a duplicate after a lost acknowledgement, with one node still down
    extra = f.experience(cid, "sent twice")
    wire = encode_event(extra)
    await log.nc.publish(wire.subject, wire.payload, headers=wire.headers)  # ack never read
    await log.nc.flush()
    seq = await log.append(extra)
    assert seq == EVENTS + 1 and await log.last_seq() == EVENTS + 1

    # the dead node comes back and catches up; the cluster is whole again
    cluster.start_node(killed)
    await log.close()
    only_revived = await JetStreamLog.connect(
        cluster.urls[killed], settings, connect_timeout=30, create_streams=False
    )
    try:
        await _until_caught_up(only_revived, settings.name, EVENTS + 1)
    finally:
        await only_revived.close()


async def _until_caught_up(log: JetStreamLog, stream: str, count: int) -> None:
    for _ in range(300):
        try:
            info = await log.js.stream_info(stream)
            if info.state.messages == count:
                return
        except Exception:  # the revived node may not have joined the stream's group yet
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"stream on the revived node never reached {count} messages")

"""JetStream-specific behaviour: stream settings, an unreachable server, restarts, lost acks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import pytest

from eventlog import (
    EmbeddedNats,
    JetStreamLog,
    LogEntry,
    LogUnavailable,
    StreamSettings,
    ValidationError,
    ensure_streams,
)
from eventlog.codec import encode_event
from ops.cluster import free_port
from tests import factories as f
from tests.harness import eventually


async def test_stream_creation_is_idempotent_and_configurable(nats_server: EmbeddedNats) -> None:
    settings = StreamSettings(name="MEMORY", activity_name="PRESENCE", duplicate_window=30)
    log = await JetStreamLog.connect(nats_server.url, settings)
    await ensure_streams(log.js, settings)  # again: nothing changes, nothing fails
    await log.append(f.collective())
    main = await log.js.stream_info("MEMORY")
    assert main.config.num_replicas == 1
    assert main.config.duplicate_window == 30
    assert main.config.max_msg_size == 1024 * 1024
    assert main.config.subjects == ["pulse.c.>", "pulse.w.>", "pulse.t.>"]
    presence = await log.js.stream_info("PRESENCE")
    assert presence.config.max_msgs_per_subject == 1
    assert presence.config.allow_msg_ttl is True
    await log.close()

    wider = StreamSettings(
        name="MEMORY", activity_name="PRESENCE", duplicate_window=90, max_msg_size=2 * 1024 * 1024
    )
    log = await JetStreamLog.connect(nats_server.url, wider)
    main = await log.js.stream_info("MEMORY")
    assert main.config.duplicate_window == 90
    assert main.config.max_msg_size == 2 * 1024 * 1024
    assert main.state.messages == 1  # updating the stream kept its events
    await log.close()


async def test_a_stream_of_an_older_version_gains_the_token_subject(
    nats_server: EmbeddedNats,
) -> None:
    """An instance never reconfigures a stream (``update_streams=False``), except to add
    a subject this version writes to: the tokens' ``pulse.t.>``. Nothing else changes."""
    settings = StreamSettings(name="OLDER", activity_name="OLDER_PRESENCE")
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    older = settings.main_config()
    older.subjects = ["pulse.c.>", "pulse.w.>"]  # what versions before tokens made
    older.duplicate_window = 45
    await js.add_stream(older)
    await nc.close()
    log = await JetStreamLog.connect(nats_server.url, settings, update_streams=False)
    try:
        main = await log.js.stream_info("OLDER")
        assert main.config.subjects == ["pulse.c.>", "pulse.w.>", "pulse.t.>"]
        assert main.config.duplicate_window == 45  # the operator's setting stays
        await log.append(f.token())
        assert (await log.js.stream_info("OLDER")).state.messages == 1
    finally:
        await log.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"replicas": 0}, "replicas"),
        ({"replicas": 7}, "replicas"),
        ({"duplicate_window": 0}, "duplicate_window"),
        ({"max_msg_size": 1000}, "max_msg_size"),
        ({"name": "has.dot"}, "name"),
        ({"activity_name": ""}, "activity_name"),
        ({"activity_ttl": 0}, "activity_ttl"),
    ],
)
def test_bad_stream_settings_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=f"^{field}:"):
        StreamSettings(**kwargs)  # type: ignore[arg-type]


async def test_connecting_to_nothing_fails_within_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(LogUnavailable, match="cannot reach NATS"):
        await JetStreamLog.connect(f"nats://127.0.0.1:{free_port()}", connect_timeout=1.0)
    assert time.monotonic() - started < 5.0


async def test_append_raises_log_unavailable_when_the_server_is_gone(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path)
    server.start()
    log = await JetStreamLog.connect(server.url, append_timeout=1.0)
    cid = f.uuid7()
    await log.append(f.collective(cid))
    server.stop()
    for attempt in (log.append(f.experience(cid)), log.append_batch([f.experience(cid)] * 3)):
        started = time.monotonic()
        with pytest.raises(LogUnavailable, match="not acknowledged|no acknowledgement|closed"):
            await attempt
        assert time.monotonic() - started < 1.0 + 3.0  # bounded by append_timeout, plus slack
    await log.close()


async def test_tail_resumes_after_the_server_restarts(tmp_path: Path) -> None:
    port = free_port()
    server = EmbeddedNats(tmp_path, port=port)
    server.start()
    log = await JetStreamLog.connect(server.url, append_timeout=15.0)
    cid = f.uuid7()
    await log.append_batch([f.collective(cid), f.experience(cid)])
    seen: list[LogEntry] = []

    async def follow() -> None:
        async for entry in log.tail(1):
            seen.append(entry)

    task = asyncio.create_task(follow())
    try:
        await eventually(lambda: len(seen) == 2, what="the first two events")
        server.stop()
        server = EmbeddedNats(tmp_path, port=port)
        server.start()
        after = f.experience(cid, "after the restart")
        assert await log.append(after) == 3  # the client reconnects; the append waits for it
        await eventually(lambda: len(seen) == 3, timeout=20, what="the event after the restart")
        assert [e.seq for e in seen] == [1, 2, 3] and seen[2].event == after
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await log.close()
        server.stop()


async def test_append_after_a_lost_acknowledgement_is_stored_once(
    jetstream_log: JetStreamLog,
) -> None:
    cid = f.uuid7()
    event = f.collective(cid)
    wire = encode_event(event)
    # publish without waiting for the ack (it is lost), as a writer that crashed would
    await jetstream_log.nc.publish(wire.subject, wire.payload, headers=wire.headers)
    await jetstream_log.nc.flush()
    await eventually(lambda: _has_one(jetstream_log), what="the first copy to be stored")
    assert await jetstream_log.append(event) == 1
    assert await jetstream_log.last_seq() == 1


async def _has_one(log: JetStreamLog) -> bool:
    return await log.last_seq() == 1


async def test_a_closed_connection_is_reported(nats_server: EmbeddedNats) -> None:
    log = await JetStreamLog.connect(nats_server.url)
    await log.nc.close()
    with pytest.raises(LogUnavailable, match="closed"):
        await log.append(f.collective())
    raw = await nats.connect(nats_server.url)  # the server itself is fine
    await raw.close()

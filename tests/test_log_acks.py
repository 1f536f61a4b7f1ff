"""An append's acknowledgement on JetStream (``JetStreamLog._acknowledged``): the reply
comes to the log's own inbox and resolves that append's future, with nats-py's errors
when there is no stream or no answer (a real nats-server per test)."""

from __future__ import annotations

import asyncio
import time

import nats.errors
import nats.js.errors
import pytest

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog.errors import LogUnavailable
from tests import factories as f


async def test_concurrent_appends_each_get_their_own_sequence(nats_server: EmbeddedNats) -> None:
    log = await JetStreamLog.connect(nats_server.url, StreamSettings())
    try:
        events = [f.collective() for _ in range(40)]
        seqs = await asyncio.gather(*(log.append(e) for e in events))
        assert sorted(seqs) == list(range(1, 41))
        stored = [entry async for batch in log.read(1) for entry in batch]
        by_seq = {entry.seq: entry.event for entry in stored}
        assert [by_seq[s] for s in seqs] == events  # each append heard its own ack
        assert log._acks == {}  # nothing left waiting
        again = await log.append(events[0])  # a retry: the first copy's sequence
        assert again == seqs[0]
    finally:
        await log.close()


async def test_no_stream_and_no_answer_raise_as_nats_py_does(nats_server: EmbeddedNats) -> None:
    log = await JetStreamLog.connect(nats_server.url, StreamSettings())
    try:
        with pytest.raises(nats.js.errors.NoStreamResponseError):
            await log._acknowledged("nowhere.at.all", b"x", {}, None, 2.0)
        silent = await log.nc.subscribe("silent.subject")  # takes it, never answers
        started = time.monotonic()
        with pytest.raises(nats.errors.TimeoutError):
            await log._acknowledged("silent.subject", b"x", {}, None, 0.3)
        assert time.monotonic() - started < 5
        await silent.unsubscribe()
        assert log._acks == {}
    finally:
        await log.close()


async def test_an_append_nobody_acknowledges_is_unavailable_within_its_budget(
    nats_server: EmbeddedNats,
) -> None:
    log = await JetStreamLog.connect(nats_server.url, StreamSettings(), append_timeout=0.6)
    try:
        await log.admin.delete_stream(log.settings.name)  # no stream takes the subject now
        started = time.monotonic()
        with pytest.raises(LogUnavailable, match="no acknowledgement"):
            await log.append(f.collective())
        assert time.monotonic() - started < 5
    finally:
        await log.close()

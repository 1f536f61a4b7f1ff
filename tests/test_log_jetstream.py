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

"""The EventLog contract on an edge host's log (``LeafLog``): a leaf nats-server linked to
a hub, per test. The contract runs while the link is up, as an edge host mostly is; what
a cut link changes is tested in ``test_leaf``."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator, Mapping

import pytest

from eventlog import EmbeddedNats, EventLog, JetStreamLog, StreamSettings
from eventlog.leaf import LeafLog
from tests.harness import eventually, hub_server
from tests.log_contract import LogContract


class TestLeafLog(LogContract):
    @pytest.fixture
    async def log(self, tmp_path: Path) -> AsyncIterator[LeafLog]:
        hub, leaf_url = hub_server(tmp_path)
        leaf_server = EmbeddedNats(tmp_path / "leaf-nats", leaf_of=leaf_url)
        hub_log = leaf = None
        try:
            hub_log = await JetStreamLog.connect(hub.url, StreamSettings())  # the hub's PULSE
            leaf_server.start()
            leaf = await LeafLog.open_leaf(leaf_server, StreamSettings())
            opened = leaf
            await eventually(lambda: opened.heals > 0, what="the link to the hub")
            yield leaf
        finally:
            for log in (leaf, hub_log):
                if log is not None:
                    await log.close()
            leaf_server.stop()
            hub.stop()

    async def inject_raw(
        self, log: EventLog, subject: str, payload: bytes, headers: Mapping[str, str]
    ) -> None:
        """Published as the host's own writes are, to PULSE_OUT; the log reads PULSE, which
        sources PULSE_OUT a moment later. ``append`` waits for that (read-your-writes);
        foreign bytes are waited for here."""
        assert isinstance(log, LeafLog)
        before = await log.last_seq()
        await log.js.publish(subject, payload, headers=dict(headers))

        async def arrived() -> bool:
            return await log.last_seq() > before

        await eventually(arrived, what="the message sourced into PULSE")

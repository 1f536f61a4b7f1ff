"""The EventLog contract on the in-memory backend."""

from __future__ import annotations

from typing import AsyncIterator, Mapping

import pytest

from eventlog import EventLog, MemoryLog
from tests.log_contract import LogContract


class TestMemoryLog(LogContract):
    @pytest.fixture
    async def log(self) -> AsyncIterator[MemoryLog]:
        memory = MemoryLog()
        yield memory
        await memory.close()

    async def inject_raw(
        self, log: EventLog, subject: str, payload: bytes, headers: Mapping[str, str]
    ) -> None:
        assert isinstance(log, MemoryLog)
        await log.append_raw(subject, payload, headers)

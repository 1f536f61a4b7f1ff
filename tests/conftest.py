"""Shared fixtures: real nats-server processes on free loopback ports with temp stores."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from ops.cluster import LocalCluster

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "data")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def jetstream_log(nats_server: EmbeddedNats) -> AsyncIterator[JetStreamLog]:
    log = await JetStreamLog.connect(nats_server.url, StreamSettings())
    yield log
    await log.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    nodes = LocalCluster(tmp_path / "cluster", size=3)
    nodes.start()
    yield nodes
    nodes.stop()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Any]:
    """``pulse up`` on a data directory of its own (``tests.test_service.Service``)."""
    from tests.test_service import start, stop

    running = start(tmp_path / "data")
    yield running
    if running.process.poll() is None:
        stop(running)


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll ``check`` until it is true, failing the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(interval)

"""Shared fixtures: real nats-server processes on free loopback ports with temp stores."""

from __future__ import annotations

import os
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, settings

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from ops.cluster import LocalCluster
from tests.access_cases import walk_service, world  # noqa: F401 (the access walk's, per process)
from tests.harness import Service, start, stop
from tests.harness import eventually as eventually  # (where older tests import it from)

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


@pytest.fixture(scope="session")
def shared_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One ``pulse up`` per test process, for the tests that only read what they stored
    themselves or are refused: starting one costs about 3 CPU-seconds, more than most of
    those tests. A test that needs a service as it was started, or counts what every
    test stored (metrics, listings, the sequence), takes ``service``."""
    running = start(tmp_path_factory.mktemp("shared-service") / "data")
    yield running
    if running.process.poll() is None:
        stop(running)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    """``pulse up`` on a data directory of its own (``tests.harness.Service``)."""
    running = start(tmp_path / "data")
    yield running
    if running.process.poll() is None:
        stop(running)

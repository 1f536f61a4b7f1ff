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


# -- the order of the tests under `make test` ---------------------------------------------------

# The modules with the longest tests (a schemathesis run, drawn worlds, clients generated
# and built, benchmarks run small), and a rough weight of each (seconds of the whole module
# in tests/durations at 56a375b: relative figures, not a budget). Under `make test` each
# test process starts with a share of these (see below), so none is left to begin near the
# end of the run while the other processes, done, leave their cores idle.
EARLY = {
    "tests/test_contract.py": 430,
    "tests/test_sql_access.py": 430,
    "tests/test_sql_sandbox.py": 430,
    "tests/test_service.py": 450,
    "tests/test_backup.py": 350,
    "tests/test_cli.py": 340,
    "tests/test_as_of.py": 330,
    "tests/test_token_cli.py": 310,
    "tests/test_docs.py": 240,
    "tests/test_noninterference.py": 220,
    "tests/test_generated_clients.py": 210,
    "tests/test_session_forgetting.py": 200,
    "tests/test_search_quality.py": 180,
    "tests/test_projection_order.py": 180,
    "tests/test_bench_pg.py": 180,
    "tests/test_replicas.py": 150,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's worksteal (`make test`), each of the N test processes first
    takes a contiguous share of the collected tests (the first len/N, then half of the
    rest, ...) and then steals the tail of another's share. So the modules of ``EARLY``
    are dealt out, heaviest first each to the share with the least weight so far, at the
    start of the shares, and the other modules fill the shares in file order: the long
    tests start at once on every process, and what is stolen at the end is short. A
    module's tests stay together (its module-wide servers start once). The same order in
    every process (xdist checks it); without xdist (`make test-cpu`), file order."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    weights = [0] * workers
    for name in sorted(set(EARLY) & set(modules), key=lambda m: (-EARLY[m], m)):
        lightest = weights.index(min(weights))
        shares[lightest].extend(modules.pop(name))
        weights[lightest] += EARLY[name]
    rest = [item for module in modules.values() for item in module]
    left = len(items)
    for k, share in enumerate(shares):
        size = left // (workers - k)  # what xdist deals share k (as worksteal's schedule)
        take = max(0, size - len(share)) if k < workers - 1 else len(rest)
        share.extend(rest[:take])
        del rest[:take]
        left -= len(share)
    items[:] = [item for share in shares for item in share]

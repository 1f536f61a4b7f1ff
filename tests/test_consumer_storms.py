"""Hosts by the thousand: a consumer's create goes through JetStream's meta leader, so
hosts whose consumers a server restart dropped make theirs again apart (a random part
of a spread), and a create that fails is asked again after a jittered, growing
back-off (``eventlog.jetstream.backoff``)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.js import api

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog.errors import ValidationError
from eventlog.jetstream import backoff
from ops.cluster import LocalCluster
from tests import factories as f
from tests.harness import eventually


@given(
    failures=st.integers(1, 200),
    first=st.floats(0.001, 2.0),
    most=st.floats(0.01, 60.0),
)
def test_the_back_off_doubles_to_its_cap_and_waits_in_the_upper_half(
    failures: int, first: float, most: float
) -> None:
    bound = first
    for _ in range(failures - 1):  # doubled once per failure after the first, up to most
        bound = min(bound * 2, most)
        if bound == most:
            break
    bound = min(bound, most)
    waits = [backoff(failures, first=first, most=most) for _ in range(20)]
    assert all(bound / 2 <= w <= bound for w in waits), (bound, waits)


def test_the_back_off_is_drawn_apart_for_hosts_that_failed_together() -> None:
    waits = {round(backoff(3), 9) for _ in range(50)}
    assert len(waits) > 40  # (50 draws from a 0.4 s interval: equal ones are rare)


async def test_tails_a_restart_dropped_come_back_apart_and_read_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Twenty hosts' live tails on a 3-node cluster; the server holding their consumers
    is killed and started again: every tail reads the next write, and the consumers
    were made again over a spread, not in one burst."""
    cluster = LocalCluster(tmp_path / "cluster", size=3)
    cluster.start()
    logs: list[JetStreamLog] = []
    tasks: list[asyncio.Task[None]] = []
    seen: list[list[int]] = []
    try:
        writer = await JetStreamLog.connect(cluster.urls, StreamSettings(replicas=3))
        logs.append(writer)
        cid = f.collective().collective_id
        await writer.append(f.collective(cid))
        for _ in range(20):
            log = await JetStreamLog.connect(cluster.urls, StreamSettings(replicas=3))
            logs.append(log)
            got: list[int] = []
            seen.append(got)

            async def follow(log: JetStreamLog = log, got: list[int] = got) -> None:
                async for entry in log.tail(1):
                    got.append(entry.seq)

            tasks.append(asyncio.create_task(follow()))
        await eventually(lambda: all(got == [1] for got in seen), timeout=30, what="tails at 1")
        caplog.set_level(logging.INFO, logger="pulse.eventlog")

        # every consumer gone at once (as a restart drops them): made again apart
        caplog.clear()
        dropped = time.time()
        names = [c.name for c in await writer.admin.consumers_info("PULSE")]
        assert len(names) == 20
        await asyncio.gather(*(writer.admin.delete_consumer("PULSE", n) for n in names))
        await eventually(lambda: len(_made(caplog, dropped)) >= 20, timeout=30,
                         what="every consumer made again")  # fmt: skip
        made = _made(caplog, dropped)
        assert made[-1] - made[0] >= 0.15, made  # (all at once: within a few milliseconds)
        assert made[-1] - dropped >= 0.2, made

        # the server holding the stream killed and started again: every tail reads on
        caplog.clear()
        info = await writer.admin.stream_info("PULSE")
        leader = int(str(info.cluster.leader).removeprefix("n"))  # type: ignore[union-attr]
        killed = time.time()
        cluster.kill(leader)
        cluster.start_node(leader)

        async def written() -> bool:
            try:
                await writer.append(f.experience(cid))
            except Exception:  # (a leader elected meanwhile)
                return False
            return True

        await eventually(written, timeout=60, what="a write after the restart")
        await eventually(lambda: all(len(got) >= 2 for got in seen), timeout=60,
                         what="every tail reading the write after the restart")  # fmt: skip
        assert _made(caplog, killed), "consumers made again after the restart"
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for log in logs:
            await log.close()
        cluster.stop()


def _made(caplog: pytest.LogCaptureFixture, since: float) -> list[float]:
    """When consumers were made since a moment (their creates' log lines)."""
    return sorted(
        r.created for r in caplog.records
        if r.created > since and r.getMessage().startswith("consumer ")
    )  # fmt: skip


def test_the_hosts_benchmark_runs_small() -> None:
    """`python -m ops.bench.hosts` (docs/benchmarks.md), at a size a test affords: a row
    per step, with creates, lags, dropped requests, memory and the knee."""
    ran = subprocess.run(
        [sys.executable, "-m", "ops.bench.hosts", "--steps", "4,8", "--collectives", "5",
         "--rate", "50", "--seconds", "1", "--processes", "1"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    rows = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert [r["hosts"] for r in rows] == [4, 8]
    for row in rows:
        assert row["written"] > 0 and row["lag_p99_ms"] is not None and row["lag_p99_ms"] > 0
        # (how many consumers the restart dropped depends on where JetStream put them)
        assert isinstance(row["storm_creates"], int) and row["dropped_api_requests"] == 0
        assert row["server_memory_mb"] > 0
        # every host restarted at once made its consumer again, and none was left waiting
        assert row["restart_creates"] >= row["hosts"] and row["restart_hosts_waiting"] == 0
        assert row["restart_dropped_api_requests"] == 0
        # every host's tail ended when the restart cancelled it; a light load asks nothing
        # twice (a host that starts in a storm asks its connect and first read again)
        assert row["restart_hosts_stuck"] == 0 and row["retried"] == 0
    assert "knee:" in ran.stdout


def test_the_subjects_benchmark_runs_small() -> None:
    """`python -m ops.bench.subjects` (docs/benchmarks.md), at a size a test affords: a
    row per step, with memory per entity, a purge's stall and a restart's time."""
    ran = subprocess.run(
        [sys.executable, "-m", "ops.bench.subjects", "--steps", "2000,4000", "--replicas", "1"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    rows = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert [(r["entities"], r["subjects"]) for r in rows] == [(2000, 2000), (4000, 4001)]
    for row in rows:  # (the second step holds the first's purged-then-written subject too)
        assert row["server_memory_mb"] > 0 and row["purge_ms"] > 0 and row["restart_s"] > 0
        assert row["writer_worst_during_purge_ms"] > 0
    assert "knee:" in ran.stdout


async def test_a_stream_takes_more_than_a_thousand_hosts(tmp_path: Path) -> None:
    """nats-server 2.15 caps a stream that sets no consumer limit at 1,000 consumers:
    the 1,001st host's tail was refused ("maximum consumers limit reached", found by
    `ops.bench.hosts` at 3,000 hosts). Pulse's streams say their own limit."""
    with EmbeddedNats(tmp_path / "nats") as server:
        log = await JetStreamLog.connect(server.url, StreamSettings())
        try:
            info = await log.admin.stream_info("PULSE")
            assert info.config.max_consumers == StreamSettings().max_consumers == 100_000
            config = api.ConsumerConfig(ack_policy=api.AckPolicy.NONE, mem_storage=True,
                                        inactive_threshold=60)  # fmt: skip
            for _ in range(1_001):
                await log.admin.add_consumer("PULSE", config=config)
            held = (await log.admin.stream_info("PULSE")).state.consumer_count
            assert held == 1_001
        finally:
            await log.close()
    with pytest.raises(ValidationError, match="max_consumers: must be 1000..10000000, got 5"):
        StreamSettings(max_consumers=5)


def test_the_hosts_benchmark_runs_small_on_partitions() -> None:
    """`python -m ops.bench.hosts --partitions 3`: each host makes a consumer on every
    partition holding what it follows, and on the first (wisdom, tokens)."""
    ran = subprocess.run(
        [sys.executable, "-m", "ops.bench.hosts", "--steps", "4", "--collectives", "5",
         "--rate", "50", "--seconds", "1", "--processes", "1", "--partitions", "3"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    (row,) = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert row["partitions"] == 3 and row["written"] > 0 and row["lag_p99_ms"] > 0
    # every host made two consumers at least (a collective's partition and the first)
    assert row["restart_creates"] >= 2 * row["hosts"] and row["restart_hosts_waiting"] == 0
    assert row["restart_dropped_api_requests"] == 0

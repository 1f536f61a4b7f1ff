"""Durability is a stated choice: `pulse nats-config --durability` writes nodes that sync
every write (fsync) or sync on the server's interval (replicated), each tagged with it;
`--durability` places Pulse's streams and key bucket on the nodes of one kind, and
`pulse up --durability` moves them to the other kind later, their messages with them."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
import pytest
from nats.js import api

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog.errors import ValidationError
from eventlog.streams import durability_of, rewritten
from ops.cli import main as pulse_main
from ops.cluster import LocalCluster, free_ports
from ops.natsconf import Node, write_cluster
from sync import PulseDB
from tests.harness import clean_env, eventually, start, stop


def _varz(where: int | str) -> dict[str, Any]:
    """A server's /varz: its monitoring port on loopback, or its monitoring URL."""
    base = where if isinstance(where, str) else f"http://127.0.0.1:{where}"
    with urllib.request.urlopen(f"{base}/varz", timeout=5) as answer:
        found: dict[str, Any] = json.load(answer)
    return found


async def _placed(log: JetStreamLog, stream: str) -> tuple[str | None, list[str]]:
    """(the server leading a stream, the tags of its placement)."""
    info = await log.admin.stream_info(stream)
    tags = list(info.config.placement.tags or []) if info.config.placement else []
    return (info.cluster.leader if info.cluster else None), tags


async def test_streams_go_to_the_nodes_of_the_durability_chosen_and_move_when_it_changes(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path / "cluster", size=3)
    taken = {*cluster.client_ports, *cluster.route_ports, *cluster.monitor_ports}
    leaf_ports = [p for p in free_ports(9) if p not in taken][:3]
    kinds = ["fsync", "replicated", "replicated"]
    nodes = [
        Node(f"n{i}", "127.0.0.1", cluster.client_ports[i], cluster.route_ports[i],
             leaf_ports[i], cluster.monitor_ports[i], listen="127.0.0.1", durability=kinds[i])
        for i in range(3)
    ]  # fmt: skip
    # (the deployment's own choice is replicated: two nodes of it hold one replica each)
    written = write_cluster(tmp_path / "conf", nodes, replicas=1, durability="replicated")
    cluster.configs = [written.nodes[n.name] for n in nodes]
    cluster.start()
    options: dict[str, Any] = {"nats_credentials": written.client_credentials,
                               "nats_ca": written.ca}  # fmt: skip
    try:
        # each node says its durability: its sync setting and its tag
        for i, kind in enumerate(kinds):
            varz = _varz(cluster.monitor_ports[i])
            assert bool(varz["jetstream"]["config"].get("sync_always")) is (kind == "fsync")
            assert varz["tags"] == [f"pulse-durability:{kind}"]

        # a host placing the streams on fsync: the one fsync node holds them
        on_fsync = StreamSettings(durability="fsync")
        a = await PulseDB.open(tmp_path / "a", cluster.urls, stream_settings=on_fsync, **options)
        try:
            team = await a.create_collective("ops", "team", 2)
            first = await a.record_experience(team, "fsync holds this", [1, 0])
            status = await a.status()
            assert (status.stream.durability, status.stream.leader) == ("fsync", "n0")
            log = await JetStreamLog.connect(
                cluster.urls, StreamSettings(), credentials=written.client_credentials,
                tls_ca=written.ca, update_streams=False,
            )  # fmt: skip
            try:
                for stream in ("PULSE", "PULSE_ACTIVITY", "KV_PULSE_KEYS"):
                    assert await _placed(log, stream) == ("n0", ["pulse-durability:fsync"])

                async def refusal(settings: StreamSettings) -> str:
                    with pytest.raises(ValidationError) as refused:
                        await JetStreamLog.connect(
                            cluster.urls, settings, credentials=written.client_credentials,
                            tls_ca=written.ca,
                        )  # fmt: skip
                    return str(refused.value)

                # three replicas of fsync on one fsync node: refused, naming the choice;
                # a move and three replicas at once: refused before anything moves
                assert "durability: no 3 server(s) tagged 'pulse-durability:fsync'" in (
                    await refusal(StreamSettings(replicas=3, durability="fsync"))
                )
                assert "replicas, durability: PULSE has 1 replica(s) on fsync servers" in (
                    await refusal(StreamSettings(replicas=3, durability="replicated"))
                )
                for stream in ("PULSE", "PULSE_ACTIVITY", "KV_PULSE_KEYS"):  # as they were
                    assert await _placed(log, stream) == ("n0", ["pulse-durability:fsync"])

                # later, the operator's `pulse up --durability replicated` (as pulse.service
                # runs it) moves the streams and the key bucket to the replicated nodes
                env = clean_env(
                    PULSE_NATS_URL=",".join(cluster.urls),
                    PULSE_NATS_CREDS=str(written.client_credentials),
                    PULSE_NATS_CA=str(written.ca),
                    PULSE_DURABILITY="replicated",
                )
                service = start(tmp_path / "up", env=env)
                try:

                    async def moved() -> bool:
                        try:
                            placed = [await _placed(log, s) for s in ("PULSE", "KV_PULSE_KEYS")]
                        except (nats.errors.TimeoutError, nats.js.errors.APIError):
                            return False  # (asked while the stream changes leaders)
                        return all(
                            leader in ("n1", "n2") and tags == ["pulse-durability:replicated"]
                            for leader, tags in placed
                        )

                    await eventually(moved, timeout=60, what="the streams on replicated nodes")
                finally:
                    stop(service)
            finally:
                await log.close()

            # the host that placed them goes on writing and reading where they went, and
            # a new host finds everything, the messages written before the move too
            async def recorded_again() -> bool:
                try:
                    await a.record_experience(team, "replicated holds this", [0, 1])
                except Exception:  # (the stream's leader changing hands)
                    return False
                return True

            await eventually(recorded_again, timeout=30, what="a write after the move")
            assert (await a.status()).stream.durability == "replicated"
        finally:
            await a.close()
        b = await PulseDB.open(tmp_path / "b", cluster.urls, **options)
        try:

            async def both() -> bool:
                found = await b.get_experience(first)
                return found is not None and len(await b.list_experiences(team)) == 2

            await eventually(both, timeout=30, what="host b reading both experiences")
        finally:
            await b.close()
    finally:
        cluster.stop()


def test_an_embedded_server_is_fsync_and_refuses_another_durability(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One node replicates nothing: `--durability replicated` (or fsync with --no-sync)
    is refused before anything starts, naming the field; the server itself is tagged
    fsync (what a cluster of such servers would place by)."""
    with EmbeddedNats(tmp_path / "tagged") as server:
        assert _varz(server.monitor_url)["tags"] == ["pulse-durability:fsync"]
    data = tmp_path / "data"
    code = pulse_main(["--data-dir", str(data), "--durability", "replicated", "up"])
    err = capsys.readouterr().err
    assert code == 1 and "durability: replicated needs a cluster (--nats-url)" in err, err
    code = pulse_main(["--data-dir", str(data), "--durability", "fsync", "up", "--no-sync"])
    err = capsys.readouterr().err
    assert code == 1 and "durability: fsync contradicts --no-sync" in err, err
    assert not (data / "nats").exists(), "no server started"


def test_the_benchmark_runs_small() -> None:
    """`python -m ops.bench.durability` (docs/benchmarks.md), at a size a test affords:
    a row for each durability, writer and number of streams (Pulse's log layer and a
    Pulse host, one record a call and a batch a call, on 2 partitions too:
    ``eventlog.partitioned``), beside raw's."""
    ran = subprocess.run(
        [sys.executable, "-m", "ops.bench.durability", "--seconds", "0.5", "--partitions",
         "1,2", "--callers", "2", "--inflight", "8", "--batch", "3"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    rows = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert [(r["durability"], r["writer"], r["partitions"]) for r in rows] == [
        (d, w, p)
        for d in ("fsync", "replicated")
        for w in ("raw", "log", "pulse", "batch")
        for p in (1, 2)
    ]
    assert all(r["per_s"] > 0 and r["cores"] > 0 for r in rows)
    assert rows[0]["vs_fsync_one_stream_raw"] == 1.0
    assert "vs fsync 1 raw" in ran.stdout


def test_a_placement_keeps_its_cluster_and_other_tags() -> None:
    """Only the durability tag changes: a placement's cluster (in a super-cluster) and
    the operator's own tags stay."""
    held = api.Placement(cluster="east", tags=["ssd", "pulse-durability:fsync"])
    assert rewritten(held, "replicated") == api.Placement(
        cluster="east", tags=["ssd", "pulse-durability:replicated"]
    )
    assert rewritten(None, "fsync") == api.Placement(tags=["pulse-durability:fsync"])
    assert durability_of(rewritten(held, "replicated")) == "replicated"


def test_nats_config_takes_the_global_durability(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pulse --durability replicated nats-config` (or $PULSE_DURABILITY) writes
    replicated nodes; the command's own option, when given, decides."""
    out = tmp_path / "conf"
    argv = ["nats-config", "--hosts", "a,b,c", "--out", str(out), "--json"]
    assert pulse_main(["--durability", "replicated", *argv]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["durability"] == "replicated"
    assert set(written["node_durability"].values()) == {"replicated"}
    conf = (out / "a" / "nats.conf").read_text()
    assert 'server_tags: ["pulse-durability:replicated"]' in conf
    assert "sync_interval" not in conf
    assert pulse_main([*argv, "--durability", "fsync"]) == 0
    assert json.loads(capsys.readouterr().out)["durability"] == "fsync"
    assert "sync_interval: always" in (out / "a" / "nats.conf").read_text()

"""NATS needs credentials: the embedded server refuses clients without the data directory's
user and password, and `pulse nats-config` gives a cluster (and leaf nodes) TLS and
credentials that Pulse connects with."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS

from eventlog import EmbeddedNats, JetStreamLog, LogUnavailable, StreamSettings
from eventlog.embedded import NatsCredentials, find_nats_server
from ops.cli import main as pulse_main
from ops.cluster import LocalCluster, free_ports
from ops.natsconf import Leaf, Node, Written, write_cluster
from sync import PulseDB
from tests import factories as f
from tests.harness import eventually, start, stop

PULSE = str(Path(sys.executable).parent / "pulse")


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


async def _quiet(exc: Exception) -> None:
    pass


async def refused(url: str, **options: Any) -> BaseException:
    """The error of a raw nats-py connection that must fail (no retries)."""
    client = NATS()
    try:
        await client.connect(
            url, allow_reconnect=False, connect_timeout=5, error_cb=_quiet, **options
        )
    except Exception as exc:
        await client.close()  # nats-py leaves the socket of a refused connection open
        return exc
    await client.close()
    raise AssertionError(f"{url} took a connection it should refuse ({options})")


async def works(url: str, **options: Any) -> None:
    client = await nats.connect(url, allow_reconnect=False, connect_timeout=5, **options)
    await client.flush()
    await client.close()


# -- the embedded server ------------------------------------------------------------------------


async def test_the_embedded_server_refuses_clients_without_its_credentials(
    nats_server: EmbeddedNats,
) -> None:
    creds = nats_server.credentials
    assert creds is not None and len(creds.password) >= 40
    assert NatsCredentials.load(nats_server.credentials_file) == creds
    assert mode(nats_server.credentials_file) == 0o600
    assert mode(nats_server.dir / "nats.conf") == 0o600  # it holds the password
    assert nats_server.url == nats_server.plain_url.replace("://", f"://pulse:{creds.password}@")

    error = await refused(nats_server.plain_url)
    assert "Authorization Violation" in str(error)
    wrong = NatsCredentials("pulse", "not-the-password").in_url(nats_server.plain_url)
    assert "Authorization Violation" in str(await refused(wrong))
    await works(nats_server.url)  # what the tests and benchmarks pass around
    await works(nats_server.plain_url, user=creds.user, password=creds.password)

    with pytest.raises(LogUnavailable, match="refused the connection: authorization violation"):
        await JetStreamLog.connect(nats_server.plain_url, connect_timeout=30)  # fails at once
    log = await JetStreamLog.connect(
        nats_server.plain_url, credentials=nats_server.credentials_file
    )
    await log.close()

    # the secret is in no file others may read, and in no process's argv
    assert creds.password not in (nats_server.dir / "server.json").read_text()
    assert creds.password not in Path(f"/proc/{nats_server.pid}/cmdline").read_text()
    assert creds.password not in (nats_server.dir / "nats.log").read_text()


async def test_reused_and_adopted_servers_keep_the_credentials(tmp_path: Path) -> None:
    first = EmbeddedNats(tmp_path)
    first.start()
    try:
        second = EmbeddedNats(tmp_path)  # the lock is taken: it reuses the running server
        assert second.start() == first.url and not second.owned
        await works(second.url)
        first._release()  # the owner goes away without stopping its server (a crash)
        adopter = EmbeddedNats(tmp_path)
        adopter.start()
        assert adopter.owned and adopter.pid == first.pid, "the running server is adopted"
        assert adopter.url == first.url
        await works(adopter.url)
        assert "Authorization Violation" in str(await refused(adopter.plain_url))
        adopter.stop()
    finally:
        first.stop()
    with EmbeddedNats(tmp_path) as again:  # a restart keeps them too
        assert again.url.replace(again.plain_url.split("//")[1], "") == first.url.replace(
            first.plain_url.split("//")[1], ""
        )
        await works(again.url)


async def test_a_data_dir_from_before_credentials_upgrades_on_the_next_start(
    tmp_path: Path,
) -> None:
    """A data directory of an older Pulse: no credentials file, a readable nats.conf, and
    its server (which asks for no credentials) still running after its owner crashed."""
    old = EmbeddedNats(tmp_path)
    old.dir.mkdir(parents=True)
    old._spawn()  # what an older Pulse ran: no authorization, no credentials file
    assert old._process is not None
    os.chmod(old.dir / "nats.conf", 0o644)
    assert not old.credentials_file.exists() and "authorization" not in old.config_text()
    log = await JetStreamLog.connect(old.url)  # anyone could, then
    cid = f.uuid7()
    await log.append(f.collective(cid))
    await log.close()

    with EmbeddedNats(tmp_path) as server:
        assert server.credentials is not None and mode(server.credentials_file) == 0o600
        assert mode(server.dir / "nats.conf") == 0o600
        assert server.pid != old._process.pid, "the unprotected server was replaced"
        assert old._process.wait(timeout=10) is not None
        assert "Authorization Violation" in str(await refused(server.plain_url))
        log = await JetStreamLog.connect(server.url)
        entries = [e async for batch in log.read() for e in batch]
        await log.close()
        assert [e.event.collective_id for e in entries if e.event] == [cid]  # type: ignore[attr-defined]


async def test_the_log_reader_process_gets_the_credentials_outside_its_argv(
    nats_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[tuple[str, ...]] = []
    spawn = asyncio.create_subprocess_exec

    async def recording(*args: str, **kwargs: Any) -> asyncio.subprocess.Process:
        started.append(args)
        return await spawn(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", recording)
    log = await JetStreamLog.connect(nats_server.url, StreamSettings())
    try:
        cid = f.uuid7()
        await log.append_batch([f.collective(cid)] + [f.experience(cid) for _ in range(20)])
        read = [e.seq async for batch in log.read_bulk(1, child_from=1) for e in batch]
    finally:
        await log.close()
    assert read == list(range(1, 22))
    assert started and started[0][1:] == ("-m", "eventlog.reader_child")
    assert nats_server.credentials is not None
    assert not any(nats_server.credentials.password in arg for args in started for arg in args)


def test_pulse_up_says_how_other_hosts_connect(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    data_dir = tmp_path / "data"
    service = start(data_dir, env=env)
    try:
        text = service.banner
        last = text.splitlines()[-1]
        creds_file = data_dir / "nats" / "credentials.json"
        url = re.search(r"NATS\s+(nats://127\.0\.0\.1:\d+)\s", text)
        assert url, text
        assert re.search(rf"creds\s+{re.escape(str(creds_file))}\s", text), text
        assert f"PULSE_NATS_URL={url.group(1)} PULSE_NATS_CREDS={creds_file}" in last, last
        creds = NatsCredentials.load(creds_file)
        assert creds.password not in text, "the password itself is never printed"
        for line in ("streams  PULSE", "state    ", "HTTP     http://127.0.0.1:"):
            assert line in text, f"{line!r} missing from {text!r}"

        async def check() -> None:
            assert "Authorization Violation" in str(await refused(url.group(1)))
            log = await JetStreamLog.connect(url.group(1), credentials=creds_file)
            await log.close()

        asyncio.run(check())
    finally:
        stop(service)


# -- a cluster of one's own: `pulse nats-config` ------------------------------------------------


def test_nats_config_writes_a_ca_configs_and_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "conf"
    hosts = "n1.example.org,n2.example.org,10.0.0.7"
    code = pulse_main(["nats-config", "--hosts", hosts, "--out", str(out), "--leaf", "laptop",
                       "--install-dir", "/etc/pulse-nats"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "--nats-url tls://n1.example.org:4222,tls://n2.example.org:4222,tls://10.0.0.7:4222" in (
        printed
    )
    secret = [out / "ca-key.pem", out / "secrets.json", out / "client-credentials.json"]
    for host in hosts.split(","):
        secret += [out / host / "nats.conf", out / host / "server-key.pem"]
        assert mode(out / host / "server-cert.pem") == 0o644
    secret.append(out / "leaf-laptop" / "nats.conf")
    for path in secret:
        assert mode(path) == 0o600, f"{path} holds a secret and is {oct(mode(path))}"

    conf = (out / "n1.example.org" / "nats.conf").read_text()
    passwords = json.loads((out / "secrets.json").read_text())
    assert passwords["route"]["password"] in conf and passwords["client"]["password"] in conf
    assert '"nats-route://route:' in conf and "@n2.example.org:6222" in conf
    assert 'cert_file: "/etc/pulse-nats/server-cert.pem"' in conf
    assert 'store_dir: "/etc/pulse-nats/store"' in conf
    leaf = (out / "leaf-laptop" / "nats.conf").read_text()
    assert f"tls://leaf:{passwords['leaf']['password']}@10.0.0.7:7422" in leaf
    assert NatsCredentials.load(out / "client-credentials.json").user == "pulse"

    # a rerun keeps the CA and the passwords: a leaf added later joins the same cluster
    ca = (out / "ca.pem").read_bytes()
    assert pulse_main(["nats-config", "--hosts", hosts, "--out", str(out), "--leaf", "l2"]) == 0
    assert (out / "ca.pem").read_bytes() == ca
    assert json.loads((out / "secrets.json").read_text()) == passwords
    assert (out / "leaf-l2" / "nats.conf").exists()
    capsys.readouterr()
    assert pulse_main(["nats-config", "--hosts", hosts, "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ca"] == str((out / "ca.pem").absolute())

    with pytest.raises(SystemExit):
        pulse_main(["nats-config", "--out", str(out)])  # --hosts is required
    assert pulse_main(["nats-config", "--hosts", "a,a", "--out", str(tmp_path / "x")]) == 1
    assert "hosts: a appears twice" in capsys.readouterr().err


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, Written, Leaf]]:
    """Three nodes and a leaf node on loopback, run from `pulse nats-config`'s files."""
    cluster = LocalCluster(tmp_path / "cluster", size=3)
    taken = {*cluster.client_ports, *cluster.route_ports, *cluster.monitor_ports}
    more = [p for p in free_ports(12) if p not in taken][:5]  # leaf ports, all different
    nodes = [
        Node(f"n{i}", "127.0.0.1", cluster.client_ports[i], cluster.route_ports[i],
             more[i], cluster.monitor_ports[i], listen="127.0.0.1")
        for i in range(3)
    ]  # fmt: skip
    leaf = Leaf("edge", more[3], more[4])
    written = write_cluster(tmp_path / "conf", nodes, leaves=[leaf])
    cluster.configs = [written.nodes[node.name] for node in nodes]
    cluster.start()
    leaf_node = subprocess.Popen(
        [find_nats_server(), "-c", str(written.leaves["edge"])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield cluster, written, leaf
    finally:
        leaf_node.terminate()
        leaf_node.wait(10)
        cluster.stop()


async def test_pulse_works_over_a_tls_cluster_with_credentials(
    tmp_path: Path, tls_cluster: tuple[LocalCluster, Written, Leaf]
) -> None:
    cluster, written, leaf = tls_cluster
    url = cluster.urls[0]
    creds = NatsCredentials.load(written.client_credentials)
    trusted = ssl.create_default_context(cafile=str(written.ca))

    # refused: no credentials; wrong ones; no TLS at all
    assert "Authorization Violation" in str(await refused(url, tls=trusted))
    bad = await refused(url, tls=trusted, user="pulse", password="guess")
    assert "Authorization Violation" in str(bad)
    # (a server certificate Pulse cannot verify: test_pulse_names_the_missing_credentials_or_ca)
    with socket.create_connection(("127.0.0.1", cluster.client_ports[0]), timeout=5) as sock:
        stream = sock.makefile("rwb")
        info = json.loads(stream.readline().partition(b" ")[2])
        assert info["tls_required"] and info["auth_required"]
        connect = {"user": creds.user, "pass": creds.password, "verbose": False}
        stream.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        stream.flush()
        answer = stream.readline()
        assert not answer.startswith(b"PONG"), f"a plain-text client was served: {answer!r}"
    await works(url, tls=trusted, user=creds.user, password=creds.password)

    # the leaf node joined over TLS with the leaf credentials: its local clients (with the
    # client credentials, on loopback) reach clients of the cluster
    local = await nats.connect(f"nats://127.0.0.1:{leaf.client_port}", user=creds.user,
                               password=creds.password, connect_timeout=5)  # fmt: skip
    hub = await nats.connect(url, tls=trusted, user=creds.user, password=creds.password)
    try:
        sub = await hub.subscribe("leaf.hello")
        await hub.flush()

        async def crossed() -> bool:
            await local.publish("leaf.hello", b"from the leaf")
            try:
                return (await sub.next_msg(timeout=0.2)).data == b"from the leaf"
            except nats.errors.TimeoutError:
                return False

        await eventually(crossed, timeout=30, what="a message from the leaf node's side")
    finally:
        await local.close()
        await hub.close()
    assert "Authorization Violation" in str(await refused(f"nats://127.0.0.1:{leaf.client_port}"))

    # Pulse on two hosts of the cluster (R3)
    options: dict[str, Any] = {
        "nats_credentials": written.client_credentials, "nats_ca": written.ca,
        "stream_settings": StreamSettings(replicas=3),
    }  # fmt: skip
    a = await PulseDB.open(tmp_path / "a", cluster.urls, **options)
    b = await PulseDB.open(tmp_path / "b", ",".join(reversed(cluster.urls)), **options)
    try:
        team = await a.create_collective("ops", "team", 2)
        lesson = await a.record_experience(team, "rotate NATS certificates yearly", [1, 0])

        async def seen(db: PulseDB) -> bool:
            found = await db.get_experience(lesson)
            return found is not None and found.content == "rotate NATS certificates yearly"

        await eventually(lambda: seen(b), timeout=30, what="host b seeing host a's experience")
        back = await b.record_experience(team, "and b's answer", [0, 1])
        await eventually(lambda: a.get_experience(back), timeout=30, what="host a seeing b's")
    finally:
        for db in (a, b):
            await db.close()


async def test_pulse_names_the_missing_credentials_or_ca(
    tmp_path: Path, tls_cluster: tuple[LocalCluster, Written, Leaf], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, written, _ = tls_cluster
    monkeypatch.delenv("PULSE_NATS_CREDS", raising=False)
    monkeypatch.setenv("PULSE_NATS_CA", str(written.ca))
    with pytest.raises(LogUnavailable, match=r"authorization violation.*PULSE_NATS_CREDS"):
        await PulseDB.open(tmp_path / "a", cluster.urls)
    monkeypatch.delenv("PULSE_NATS_CA")
    monkeypatch.setenv("PULSE_NATS_CREDS", str(written.client_credentials))
    with pytest.raises(LogUnavailable, match=r"TLS certificate cannot be verified.*PULSE_NATS_CA"):
        await PulseDB.open(tmp_path / "a", cluster.urls)
    monkeypatch.setenv("PULSE_NATS_CA", str(written.ca))  # both from the environment
    db = await PulseDB.open(tmp_path / "a", cluster.urls)
    await db.close()

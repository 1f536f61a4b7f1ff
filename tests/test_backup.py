"""`pulse backup` and `pulse restore`, run as an operator runs them (the installed script)
against real nats-servers and real files: a restored deployment rebuilds to the digest of
the one backed up; damaged backups and existing streams are refused, leaving nothing."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import nats
import pytest

from eventlog import EmbeddedNats, JetStreamLog
from eventlog.embedded import NatsCredentials
from eventlog.snapshots import (
    SnapshotError,
    delete_stream,
    restore_stream,
    snapshot_stream,
    stream_exists,
)
from tests import factories as f
from tests.harness import pulse, start, stop


@dataclass
class Source:
    """A deployment with history, its two backups, and what its host had folded."""

    data_dir: Path
    live: Path  # a backup directory, taken while `pulse up` served the data directory
    archive: Path  # a .tar, taken once it had stopped
    digest: dict[str, Any]  # `pulse digest --json` of the source once caught up
    events: list[dict[str, Any]]  # `pulse tail --json` of its whole stream
    printed: dict[str, Any]  # what `pulse backup --json` printed (the live one)
    served: str  # what `pulse restore` said into the data directory `pulse up` served


def ok(*args: str, data_dir: Path) -> str:
    result = pulse(*args, data_dir=data_dir)
    assert result.returncode == 0, f"pulse {' '.join(args)}: {result.stderr}"
    return result.stdout


def as_json(*args: str, data_dir: Path) -> Any:
    return json.loads(ok(*args, "--json", data_dir=data_dir))


def refused(*args: str, data_dir: Path) -> str:
    """The one-line error of a command that must fail (after any progress lines)."""
    result = pulse(*args, data_dir=data_dir)
    assert result.returncode == 1, f"pulse {' '.join(args)} did not fail: {result.stdout}"
    errors = [line for line in result.stderr.splitlines() if not line.startswith("restoring ")]
    assert len(errors) == 1 and errors[0].startswith("pulse: error: "), result.stderr
    return errors[0]


async def _placement(server: EmbeddedNats) -> dict[str, list[str]]:
    """The placement tags of the streams a restore made."""
    creds = NatsCredentials.load(server.credentials_file)
    nc = await nats.connect(server.plain_url, user=creds.user, password=creds.password)
    try:
        found = {}
        for name in ("PULSE", "KV_PULSE_KEYS"):
            config = (await nc.jetstream().stream_info(name)).config
            found[name] = list(config.placement.tags or []) if config.placement else []
        return found
    finally:
        await nc.close()


def tail(data_dir: Path, count: int, *connect: str) -> list[dict[str, Any]]:
    out = ok(*connect, "tail", "--limit", str(count), "--json", data_dir=data_dir)
    return [json.loads(line) for line in out.splitlines()]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Source]:
    root = tmp_path_factory.mktemp("backup")
    data = root / "source"
    service = start(data)
    try:
        operator = {"Authorization": f"Bearer {service.token}"}
        with httpx.Client(base_url=service.url, timeout=60, headers=operator) as client:

            def call(method: str, **body: Any) -> Any:
                response = client.post(f"/v1/{method}", json=body)
                assert response.status_code == 200, response.text
                return response.json()

            team = call("create_collective", owner_id="ana", name="team", embedder="hash")
            lessons = [
                call("record_experience", collective_id=team, content=text, domain=["nats"])
                for text in ("retry publishes with the same message id",
                             "timeouts came from slow fsync", "sync_interval always costs speed")
            ]  # fmt: skip
            for experience in (lessons[0], lessons[0], lessons[0], lessons[1]):
                call("reinforce_experience", experience_id=experience)
            call("store_relation", source_id=lessons[2], target_id=lessons[1],
                 relation_type="Supports")  # fmt: skip
        # taken while `pulse up` serves the data directory: the CLI reuses its NATS server
        live = as_json("backup", str(root / "live"), "--with-keys", data_dir=data)
        served = refused("restore", str(root / "live"), data_dir=data)
    finally:
        stop(service)
    # and once it has stopped: the CLI starts the embedded server for the while
    ok("backup", str(root / "stopped.tar"), "--with-keys", data_dir=data)
    ok("catch-up", data_dir=data)
    digest = as_json("digest", data_dir=data)
    assert digest["seq"] == live["last_seq"] == 9  # 1 collective, 3 records, 4 + 1
    yield Source(data, root / "live", root / "stopped.tar", digest,
                 tail(data, digest["seq"]), live, served)  # fmt: skip


def test_a_backup_holds_the_stream_and_the_credentials_in_private_files(source: Source) -> None:
    manifest = json.loads((source.live / "manifest.json").read_text())
    assert manifest == source.printed
    assert (manifest["stream"], manifest["first_seq"], manifest["last_seq"],
            manifest["messages"]) == ("PULSE", 1, 9, 9)  # fmt: skip
    assert manifest["event_schema"] >= 1 and manifest["state_schema"] >= 1
    assert manifest["credentials"].endswith("(embedded server)")
    assert set(manifest["files"]) == {
        "stream.json", "stream.snapshot", "credentials.json", "keys.json", "keys.snapshot"
    }  # fmt: skip
    assert manifest["keys"] == "KV_PULSE_KEYS"
    for name, entry in manifest["files"].items():
        data = (source.live / name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["size"], entry["sha256"])
        assert mode(source.live / name) == 0o600, name
    assert mode(source.live) == 0o700 and mode(source.archive) == 0o600
    assert (source.live / "credentials.json").read_bytes() == (
        source.data_dir / "nats" / "credentials.json"
    ).read_bytes()
    description = json.loads((source.live / "stream.json").read_text())
    assert description["config"]["name"] == "PULSE" and description["state"]["messages"] == 9
    # a backup never overwrites anything, and says what to do instead
    again = refused("backup", str(source.live), data_dir=source.data_dir)
    assert f"destination: {source.live} is a directory that is not empty" in again
    nothing = refused("backup", str(source.live.parent / "x.tar"), data_dir=source.live / "no")
    assert "holds no embedded NATS server" in nothing
    assert not (source.live.parent / "x.tar").exists() and not (source.live / "no").exists()


@pytest.mark.parametrize("kind", ["live", "archive"])
def test_a_restored_data_directory_rebuilds_to_the_same_digest(
    source: Source, tmp_path: Path, kind: str
) -> None:
    backup = source.live if kind == "live" else source.archive
    target = tmp_path / "restored"
    restored = as_json("restore", str(backup), data_dir=target)
    assert (restored["stream"], restored["messages"], restored["last_seq"]) == ("PULSE", 9, 9)
    assert restored["credentials"].startswith("restored into")
    assert restored["keys"] == "restored from the backup (KV_PULSE_KEYS)"
    credentials = target / "nats" / "credentials.json"
    assert credentials.read_bytes() == (source.data_dir / "nats" / "credentials.json").read_bytes()
    assert mode(credentials) == 0o600

    rebuilt = as_json("rebuild", data_dir=target)
    assert rebuilt["digest"] == source.digest["digest"]
    assert as_json("digest", data_dir=target) == source.digest  # digest, sequence, events
    assert tail(target, 9) == source.events  # the same events at the same sequences


def test_restore_through_nats_url_then_a_fresh_host_catches_up(
    source: Source, tmp_path: Path
) -> None:
    with EmbeddedNats(tmp_path / "server") as server:  # a server of its own credentials
        connect = ("--nats-url", server.plain_url, "--nats-creds", str(server.credentials_file))
        placed = (*connect, "--durability", "fsync")  # (the embedded server is tagged fsync)
        restored = as_json(*placed, "restore", str(source.archive), data_dir=tmp_path / "x")
        assert restored["messages"] == 9 and "untouched" in restored["credentials"]
        assert asyncio.run(_placement(server)) == {
            "PULSE": ["pulse-durability:fsync"],
            "KV_PULSE_KEYS": ["pulse-durability:fsync"],
        }
        assert not (tmp_path / "x").exists()  # with --nats-url, no data directory is made
        host = tmp_path / "fresh-host"
        caught = as_json(*connect, "catch-up", data_dir=host)
        assert (caught["digest"], caught["seq"]) == (source.digest["digest"], 9)
        # and the same server backed up through --nats-url, its credentials file with it
        again = tmp_path / "again.tar"
        manifest = as_json(*connect, "backup", str(again), data_dir=host)
        assert (manifest["messages"], manifest["last_seq"]) == (9, 9)
        assert manifest["credentials"] == f"--nats-creds {server.credentials_file}"
        assert manifest["source"] == server.plain_url and mode(again) == 0o600


def _copy(source: Source, tmp_path: Path) -> Path:
    copy = tmp_path / "backup"
    shutil.copytree(source.live, copy)
    return copy


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _damage(kind: str, source: Source, tmp_path: Path) -> Path:
    if kind == "truncated archive":
        damaged = tmp_path / "cut.tar"
        damaged.write_bytes(source.archive.read_bytes()[: source.archive.stat().st_size // 2])
        return damaged
    damaged = _copy(source, tmp_path)
    if kind == "flipped byte":
        _flip_a_byte(damaged / "stream.snapshot")
    elif kind == "truncated snapshot":
        data = (damaged / "stream.snapshot").read_bytes()
        (damaged / "stream.snapshot").write_bytes(data[: len(data) - 100])
    elif kind == "no manifest":
        (damaged / "manifest.json").unlink()
    elif kind == "edited stream description":
        _flip_a_byte(damaged / "stream.json")
    return damaged


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("flipped byte", "stream.snapshot does not match its SHA-256 in the manifest"),
        ("truncated snapshot", "stream.snapshot has "),
        ("truncated archive", "damaged"),
        ("no manifest", "has no manifest.json: not a Pulse backup, or an incomplete one"),
        ("edited stream description", "stream.json does not match its SHA-256"),
    ],
)
def test_a_damaged_backup_is_refused_before_anything_is_touched(
    source: Source, tmp_path: Path, kind: str, message: str
) -> None:
    damaged = _damage(kind, source, tmp_path)
    target = tmp_path / "target"
    error = refused("restore", str(damaged), data_dir=target)
    assert error.startswith(f"pulse: error: backup: {damaged}") and message in error
    assert not target.exists()  # no server started, no credentials written


async def test_a_snapshot_the_server_refuses_leaves_no_stream_and_no_credentials(
    source: Source, tmp_path: Path
) -> None:
    # checksums that match a snapshot that is not one: only the server can tell
    forged = _copy(source, tmp_path)
    garbage = hashlib.sha512(b"not a snapshot").digest() * 64
    (forged / "stream.snapshot").write_bytes(garbage)
    manifest = json.loads((forged / "manifest.json").read_text())
    manifest["files"]["stream.snapshot"] = {
        "size": len(garbage),
        "sha256": hashlib.sha256(garbage).hexdigest(),
    }
    (forged / "manifest.json").write_text(json.dumps(manifest))
    target = tmp_path / "target"
    error = refused("restore", str(forged), data_dir=target)
    assert "restore of PULSE: the server refused the snapshot" in error
    assert not (target / "nats" / "credentials.json").exists()  # taken back
    assert not (target / "nats" / "nats.conf").exists()  # (it held the password too)
    assert not await _holds_stream(target)


def test_restore_over_an_existing_stream_is_refused(source: Source, tmp_path: Path) -> None:
    target = tmp_path / "restored"
    ok("restore", str(source.live), data_dir=target)
    later = ok("record", "-c", "team", "written after the restore", data_dir=target).strip()
    error = refused("restore", str(source.archive), data_dir=target)
    assert error.startswith(
        f"pulse: error: stream: PULSE exists already on the embedded server of {target}; "
        "a restore never overwrites or merges into a stream"
    )
    assert "fresh data directory" in error
    assert source.served.startswith("pulse: error: stream: PULSE exists already on the ")
    assert "(`pulse up` serves this data directory, pid " in source.served
    events = tail(target, 10)  # untouched: the restored nine and the one written since
    assert events[:9] == source.events
    assert events[9]["event"]["experience_id"] == later


async def test_a_backup_without_keys_restores_where_they_are_and_forgets_what_they_forgot(
    tmp_path: Path,
) -> None:
    """By default a backup holds no data key: it restores into the deployment whose key
    bucket holds them (the stream lost, the keys kept), where what was deleted after the
    backup stays forgotten (its events are back, sealed, with their key destroyed); a
    deployment without those keys refuses it, touching nothing."""
    data = tmp_path / "deployment"
    ok("collective", "create", "team", "--owner", "ana", "--embedder", "hash", data_dir=data)
    kept = ok("record", "-c", "team", "retry with the same message id", data_dir=data).strip()
    gone = ok("record", "-c", "team", "the launch code is ZEBRA-7781", data_dir=data).strip()
    plain = tmp_path / "plain"
    manifest = as_json("backup", str(plain), data_dir=data)
    assert manifest["keys"] is None and not any(n.startswith("keys") for n in manifest["files"])

    fresh = tmp_path / "fresh"
    error = refused("restore", str(plain), data_dir=fresh)
    assert "holds no data keys (it was taken without --with-keys)" in error
    assert not (fresh / "nats" / "credentials.json").exists()
    assert not await _holds_stream(fresh)

    ok("delete", gone, data_dir=data)
    with EmbeddedNats(data) as server:  # the stream lost; the key bucket kept
        log = await JetStreamLog.connect(server.url, create_streams=False)
        try:
            await delete_stream(log.nc, "PULSE")
        finally:
            await log.close()
    restored = as_json("restore", str(plain), data_dir=data)
    assert restored["keys"].startswith("the deployment's own (KV_PULSE_KEYS, kept")
    ok("rebuild", data_dir=data)
    assert as_json("get", kept, data_dir=data)["content"] == "retry with the same message id"
    assert "no experience" in refused("get", gone, data_dir=data)
    events = tail(data, 3)  # the deleted record is back on the stream, still sealed
    assert any(e["event"].get("entity_id") == gone for e in events)
    assert not any("ZEBRA" in json.dumps(e) for e in events)


async def _holds_stream(data_dir: Path) -> bool:
    """Whether the embedded server of ``data_dir`` has the PULSE stream."""
    with EmbeddedNats(data_dir) as server:
        log = await JetStreamLog.connect(server.url, create_streams=False)
        try:
            return await stream_exists(log.nc, "PULSE")
        finally:
            await log.close()


async def _entries(log: JetStreamLog) -> list[tuple[int, str, object]]:
    return [(e.seq, e.subject, e.event) async for batch in log.read() for e in batch]


async def test_a_snapshot_of_many_chunks_is_acknowledged_and_restores_whole(
    tmp_path: Path,
) -> None:
    """The protocol itself, with chunks and a window small enough that the server waits
    for acks many times over; and a restored stream that is not what the snapshot
    claims is deleted again."""
    with EmbeddedNats(tmp_path / "a") as first, EmbeddedNats(tmp_path / "b") as second:
        log = await JetStreamLog.connect(first.url)
        copy = await JetStreamLog.connect(second.url, create_streams=False)
        try:
            cid = f.uuid7()
            # random text compresses to about half: some 150 KiB of snapshot
            await log.append_batch(
                [f.collective(cid)] + [f.experience(cid, os.urandom(500).hex()) for _ in range(300)]
            )
            data = io.BytesIO()
            seen: list[tuple[int, int]] = []
            snapshot = await snapshot_stream(
                log.nc, "PULSE", data.write, chunk_size=1024, window_size=4096,
                progress=lambda done, total: seen.append((done, total)),
            )  # fmt: skip
            assert snapshot.size == len(data.getvalue()) > 100 * 1024  # > 100 chunks
            assert (snapshot.state["messages"], snapshot.state["last_seq"]) == (301, 301)
            assert snapshot.config["name"] == "PULSE" and seen[-1] == (snapshot.size,) * 2
            assert [done for done, _ in seen] == sorted(done for done, _ in seen)

            claimed = dict(snapshot.state, messages=302, last_seq=302)  # not what it holds
            with pytest.raises(SnapshotError, match="the restored stream has messages 301"):
                data.seek(0)
                await restore_stream(copy.nc, snapshot.config, claimed, data.read, snapshot.size)
            assert not await stream_exists(copy.nc, "PULSE")

            data.seek(0)
            state = await restore_stream(
                copy.nc, snapshot.config, snapshot.state, data.read, snapshot.size
            )
            assert (state["messages"], state["last_seq"]) == (301, 301)
            assert await _entries(copy) == await _entries(log)
        finally:
            await copy.close()
            await log.close()

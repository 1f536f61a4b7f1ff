"""`pulse backup` and `pulse restore`: a JetStream snapshot of the event stream plus the
NATS credentials, and its restore into a deployment that has no such stream.

A backup is a directory, or the same files in one uncompressed ``.tar`` (the snapshot is
compressed already):

    manifest.json     what this is: the stream, its sequences and message count, when,
                      which Pulse (event and state schemas), and the size and SHA-256 of
                      every other file; written last
    stream.json       the stream's JetStream configuration and state at the snapshot
    stream.snapshot   the snapshot's bytes, as the server sent them (opaque here)
    credentials.json  the user and password NATS asks of clients: the embedded server's
                      <data dir>/nats/credentials.json, or the --nats-creds file (if any)

A log in partitions (``eventlog.partitions``) adds each partition stream's description
and snapshot, ``part-<k>.json`` and ``part-<k>.snapshot`` for k = 1..N, and the manifest
names them (``parts``); a restore makes all of them, or none.

Every file is mode 0600 and the directory 0700 (the snapshot holds every memory, the
credentials the password). Only the main streams (``PULSE``, its partitions) are backed
up: the activity
stream holds presence, the last heartbeat of each agent, expiring within the hour; a
restored deployment starts with nobody active, and its hosts create that stream.

A restore checks the whole backup (manifest, sizes, checksums, schema) before it touches
anything, creates the stream through JetStream's restore API (``eventlog.snapshots``),
and checks the restored stream holds the snapshot's messages; if anything fails the
stream is deleted again. It never replaces an existing stream.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import hashlib
import importlib.metadata
import json
import os
import shutil
import tarfile
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import msgspec

from eventlog import ValidationError
from eventlog.errors import NotFoundError
from ops.progress import ProgressBar
from ops.remote import running_service
from projections.schema import SCHEMA_VERSION as STATE_SCHEMA

if TYPE_CHECKING:  # (NATS is imported where it is used: `pulse --help` goes without)
    from nats.aio.client import Client as NATS

    from eventlog import EmbeddedNats
    from eventlog.embedded import NatsCredentials

FORMAT = "pulse-backup"
FORMAT_VERSION = 3  # 2: the key bucket, with --with-keys; 3: the partitions of a log in them
MANIFEST, STREAM, SNAPSHOT, CREDENTIALS = (
    "manifest.json", "stream.json", "stream.snapshot", "credentials.json"
)  # fmt: skip
KEYS, KEYS_SNAPSHOT = "keys.json", "keys.snapshot"  # --with-keys: the key bucket
_FILES = (STREAM, SNAPSHOT, CREDENTIALS, KEYS, KEYS_SNAPSHOT)  # what a manifest may list
_BLOCK = 1024 * 1024


class FileEntry(msgspec.Struct, frozen=True):
    size: int
    sha256: str


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """``manifest.json``. Later versions only add fields with defaults."""

    format: str
    format_version: int
    created: str  # ISO 8601, UTC
    pulse_version: str
    event_schema: int  # eventlog.codec.SCHEMA_VERSION of the Pulse that took it
    state_schema: int  # projections.schema.SCHEMA_VERSION, likewise
    stream: str
    first_seq: int
    last_seq: int
    messages: int
    bytes: int  # bytes the stream stored (the snapshot is smaller: compressed)
    nats_server: str  # the version of the server that took the snapshot
    source: str  # "embedded server of <data dir>", or the NATS URL(s), without passwords
    credentials: str | None  # where credentials.json came from; None: no credentials
    files: dict[str, FileEntry]
    # the key bucket's stream when the backup holds the data keys (--with-keys); None:
    # it holds none, and what the events seal opens only with the deployment's own keys
    keys: str | None = None
    # a log in partitions: the partition streams, 1..N (part-<k>.json, part-<k>.snapshot),
    # and the messages each held; empty: a log of one stream
    parts: list[str] = []
    part_messages: list[int] = []


def _part_files(k: int) -> tuple[str, str]:
    """The description and snapshot files of partition ``k`` (1..N)."""
    return f"part-{k}.json", f"part-{k}.snapshot"


_encoder = msgspec.json.Encoder()
_manifest_decoder = msgspec.json.Decoder(Manifest)


def _pulse_version() -> str:
    try:
        return importlib.metadata.version("pulse-memory")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# -- connecting ---------------------------------------------------------------------------


def _hosts(urls: str) -> str:
    """The NATS URLs of --nats-url fit for a message (no user or password)."""
    parts = [urllib.parse.urlsplit(u.strip()) for u in urls.split(",") if u.strip()]
    return ", ".join(f"{p.scheme}://{p.netloc.rpartition('@')[2]}" for p in parts)


@contextlib.asynccontextmanager
async def _connected(args: argparse.Namespace) -> AsyncIterator[tuple[NATS, EmbeddedNats | None]]:
    """A NATS connection to the deployment (``ops.connect.open_log``), creating no
    stream. An edge host's data directory is refused: its events are in the hub's."""
    from eventlog import EmbeddedNats
    from ops.connect import first_stream, open_log

    if not args.nats_url and EmbeddedNats.remembered_leaf(args.data_dir) is not None:
        raise ValidationError(
            f"data_dir: {args.data_dir} is an edge host's (a leaf node of a hub); back up "
            "the hub's deployment instead: the edge host's events are in it"
        )
    async with open_log(args, create_streams=False) as (log, server):
        yield first_stream(log).nc, server


def _where(args: argparse.Namespace) -> str:
    if args.nats_url:
        return _hosts(args.nats_url)
    return f"embedded server of {Path(args.data_dir).resolve()}"


# -- taking a backup ----------------------------------------------------------------------


class _HashingFile:
    """A file being written (mode 0600) and the SHA-256 and size of what went in."""

    def __init__(self, path: Path) -> None:
        self.out = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.hash.update(data)
        self.size += len(data)

    def close(self) -> FileEntry:
        self.out.flush()
        os.fsync(self.out.fileno())
        self.out.close()
        return FileEntry(self.size, self.hash.hexdigest())


def _write_file(path: Path, data: bytes) -> FileEntry:
    out = _HashingFile(path)
    try:
        out.write(data)
    finally:
        entry = out.close()
    return entry


def _check_destination(destination: Path) -> None:
    if destination.is_dir() and any(destination.iterdir()):
        raise ValidationError(
            f"destination: {destination} is a directory that is not empty; a backup never "
            "overwrites anything: give a new path (a directory, or a file ending in .tar)"
        )
    if destination.exists() and not destination.is_dir():
        raise ValidationError(
            f"destination: {destination} exists; a backup never overwrites anything: give a "
            "new path (a directory, or a file ending in .tar)"
        )
    if not destination.parent.is_dir():
        raise ValidationError(
            f"destination: the directory {destination.parent} does not exist; create it first"
        )


async def take_backup(
    nc: NATS,
    destination: Path,
    *,
    stream: str,
    credentials: tuple[bytes, str] | None,
    source: str,
    progress: ProgressBar | None = None,
    keys: str | None = None,
) -> Manifest:
    """Snapshot ``stream`` into ``destination`` (a directory, or one ``.tar`` file), with
    ``credentials`` (the file's bytes and where they came from), and with ``keys`` the
    stream of the key bucket too. Written beside the destination and renamed into place
    when complete: a failed backup leaves nothing."""
    from eventlog import SCHEMA_VERSION as EVENT_SCHEMA
    from eventlog.partitions import Layout, partitions_in
    from eventlog.snapshots import snapshot_stream

    _check_destination(destination)
    staging = destination.parent / f".{destination.name}.staging-{os.getpid()}"
    staging.mkdir(mode=0o700)
    try:
        files: dict[str, FileEntry] = {}

        async def taken(name: str, described: str, snapshotted: str, **more: Any) -> Any:
            """A snapshot of stream ``name`` into ``snapshotted``, its description into
            ``described``, both listed in ``files``."""
            out = _HashingFile(staging / snapshotted)
            try:
                held = await snapshot_stream(nc, name, out.write, **more)
            finally:
                files[snapshotted] = out.close()
            files[described] = _write_file(
                staging / described, _encoder.encode({"config": held.config, "state": held.state})
            )
            return held

        try:
            snapshot = await taken(stream, STREAM, SNAPSHOT, progress=progress)
        finally:
            if progress is not None:
                progress.finish()
        count = partitions_in(snapshot.config.get("metadata"))
        parts = [Layout(count, stream).stream(k) for k in range(1, count + 1)] if count > 1 else []
        part_messages = [
            int((await taken(name, *_part_files(k))).state.get("messages") or 0)
            for k, name in enumerate(parts, 1)
        ]
        if keys is not None:
            await taken(keys, KEYS, KEYS_SNAPSHOT)
        if credentials is not None:
            files[CREDENTIALS] = _write_file(staging / CREDENTIALS, credentials[0])
        state = snapshot.state
        manifest = Manifest(
            format=FORMAT,
            format_version=FORMAT_VERSION if parts else 2,  # (2 restores in Pulses before 3)
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            pulse_version=_pulse_version(),
            event_schema=EVENT_SCHEMA,
            state_schema=STATE_SCHEMA,
            stream=stream,
            first_seq=int(state.get("first_seq") or 0),
            last_seq=int(state.get("last_seq") or 0),
            messages=int(state.get("messages") or 0),
            bytes=int(state.get("bytes") or 0),
            nats_server=str(nc.connected_server_version),
            source=source,
            credentials=credentials[1] if credentials else None,
            files=files,
            keys=keys,
            parts=parts,
            part_messages=part_messages,
        )
        _write_file(staging / MANIFEST, msgspec.json.format(_encoder.encode(manifest)) + b"\n")
        if destination.suffix == ".tar":
            _archive(staging, destination)
            shutil.rmtree(staging)
        else:
            _sync_directory(staging)
            os.rename(staging, destination)  # (an empty directory there is replaced)
        _sync_directory(destination.parent)
        return manifest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _archive(staging: Path, destination: Path) -> None:
    """The staging directory's files as one tar (mode 0600), the manifest first."""
    partial = destination.with_name(f".{destination.name}.partial-{os.getpid()}")
    try:
        with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for name in (MANIFEST, STREAM, CREDENTIALS, SNAPSHOT, KEYS, KEYS_SNAPSHOT):
                    if (staging / name).exists():
                        info = tar.gettarinfo(str(staging / name), arcname=name)
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        with open(staging / name, "rb") as data:
                            tar.addfile(info, data)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, destination)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def _sync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _credentials_of(args: argparse.Namespace) -> tuple[bytes, str] | None:
    """The credentials file the deployment's clients use, and where it came from."""
    from eventlog.embedded import NatsCredentials

    if args.nats_url:
        if not args.nats_creds:
            return None
        NatsCredentials.load(args.nats_creds)  # a usable file, or an error naming it
        return Path(args.nats_creds).read_bytes(), f"--nats-creds {args.nats_creds}"
    path = Path(args.data_dir) / "nats" / "credentials.json"
    if not path.exists():  # a server of a Pulse from before credentials
        return None
    NatsCredentials.load(path)
    return path.read_bytes(), f"{path} (embedded server)"


def cmd_backup(args: argparse.Namespace) -> int:
    """`pulse backup` (declared, with its help, in ``ops.cli.maintenance``)."""
    from eventlog import StreamSettings

    destination = Path(args.destination)
    _check_destination(destination)
    if not args.nats_url and not (Path(args.data_dir) / "nats").is_dir():
        raise ValidationError(
            f"data dir: {args.data_dir} holds no embedded NATS server (no nats/ in it): "
            "nothing to back up; give the deployment's --data-dir, or --nats-url"
        )
    credentials = _credentials_of(args)
    stream = StreamSettings().name
    keys = f"KV_{stream}_KEYS" if args.with_keys else None

    async def run() -> Manifest:
        async with _connected(args) as (nc, _server):
            try:
                return await take_backup(
                    nc, destination, stream=stream, credentials=credentials,
                    source=_where(args), progress=ProgressBar("backing up", unit="bytes"),
                    keys=keys,
                )  # fmt: skip
            except NotFoundError:
                raise NotFoundError(
                    f"stream: {stream} does not exist on the {_where(args)}: nothing to back "
                    "up (`pulse up` creates it)"
                ) from None

    manifest = asyncio.run(run())
    if args.json:
        print(msgspec.json.encode(manifest).decode(), flush=True)
    else:
        parts = (
            f" and its {len(manifest.parts)} partitions ({sum(manifest.part_messages):,} "
            "events)" if manifest.parts else ""
        )  # fmt: skip
        print(
            f"backed up stream {manifest.stream} ({manifest.messages:,} events, sequences "
            f"{manifest.first_seq}..{manifest.last_seq}){parts} to {destination}: "
            f"{manifest.files[SNAPSHOT].size:,} bytes of snapshot; credentials: "
            f"{manifest.credentials or 'none (the server asks for none)'}; data keys: "
            + ("the key bucket" if manifest.keys else "none (they stay in the deployment)"),
            flush=True,
        )
    return 0


# -- reading and checking a backup ---------------------------------------------------------


class _BackupFiles:
    """The files of a backup, a directory or a .tar, read in place (never extracted)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tar: tarfile.TarFile | None = None
        if path.is_dir():
            return
        if not path.exists():
            raise ValidationError(
                f"backup: {path} does not exist; give the directory or .tar file that "
                "`pulse backup` wrote"
            )
        try:
            self.tar = tarfile.open(path, mode="r:")
            self.members = {m.name: m for m in self.tar.getmembers()}
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ValidationError(
                f"backup: {path} is not a complete backup archive ({exc}); it is damaged or "
                "truncated: use another backup"
            ) from None

    def has(self, name: str) -> bool:
        if self.tar is None:
            return (self.path / name).is_file()
        member = self.members.get(name)
        return member is not None and member.isfile()

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        if self.tar is None:
            with open(self.path / name, "rb") as data:
                yield data
            return
        member = self.tar.extractfile(self.members[name])
        assert member is not None  # (a regular file: checked by has)
        with member:
            yield member

    def read(self, name: str) -> bytes:
        with self.open(name) as data:
            return data.read()

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()


@dataclass
class CheckedBackup:
    """A backup whose every file matched its manifest."""

    path: Path
    manifest: Manifest
    config: dict[str, Any]
    state: dict[str, Any]
    credentials: NatsCredentials | None
    files: _BackupFiles
    keys_config: dict[str, Any] | None = None  # the key bucket's stream, when it holds it
    keys_state: dict[str, Any] | None = None
    # a log in partitions: each partition stream's (config, state), 1..N
    parts: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)


def _damaged(path: Path, what: str) -> ValidationError:
    return ValidationError(f"backup: {path}: {what}; the backup is damaged: use another one")


def check_backup(path: Path) -> CheckedBackup:
    """Open ``path`` and check it whole: the manifest, then the size and SHA-256 of every
    file it lists, the stream's description and the schema versions. ``ValidationError``
    saying what is wrong, and nothing else done, if anything is."""
    from eventlog import SCHEMA_VERSION as EVENT_SCHEMA
    from eventlog.embedded import NatsCredentials
    from eventlog.partitions import partitions_in

    files = _BackupFiles(path)
    try:
        if not files.has(MANIFEST):
            raise ValidationError(
                f"backup: {path} has no {MANIFEST}: not a Pulse backup, or an incomplete one"
            )
        try:
            manifest = _manifest_decoder.decode(files.read(MANIFEST))
        except (msgspec.DecodeError, tarfile.TarError, OSError, EOFError) as exc:
            raise _damaged(path, f"{MANIFEST} is unreadable ({exc})") from None
        if manifest.format != FORMAT:
            raise ValidationError(
                f"backup: {path}: {MANIFEST} is of format {manifest.format!r}, not "
                f"{FORMAT!r}: not a backup of `pulse backup`"
            )
        if manifest.format_version > FORMAT_VERSION:
            raise ValidationError(
                f"backup: {path}: {MANIFEST} says {manifest.format} version "
                f"{manifest.format_version}; this Pulse reads {FORMAT} up to version "
                f"{FORMAT_VERSION}: upgrade Pulse"
            )
        if manifest.event_schema > EVENT_SCHEMA:
            raise ValidationError(
                f"backup: {path} holds events of schema {manifest.event_schema}; this Pulse "
                f"reads up to {EVENT_SCHEMA}: upgrade Pulse, then restore"
            )
        for name in (STREAM, SNAPSHOT):
            if name not in manifest.files:
                raise _damaged(path, f"{MANIFEST} lists no {name}")
        if len(manifest.part_messages) != len(manifest.parts):
            raise _damaged(path, f"{MANIFEST} counts the messages of another number of parts")
        allowed = {*_FILES, *(f for k in range(1, len(manifest.parts) + 1) for f in _part_files(k))}
        for name, entry in manifest.files.items():
            if name not in allowed:
                raise _damaged(path, f"{MANIFEST} lists an unknown file {name!r}")
            _check_file(files, path, name, entry)
        parts = []
        for k, stream in enumerate(manifest.parts, 1):
            for name in _part_files(k):
                if name not in manifest.files:
                    raise _damaged(path, f"{MANIFEST} names partition {stream} but lists no {name}")
            said = _part_files(k)[0]
            try:
                described = json.loads(files.read(said))
                parts.append((dict(described["config"]), dict(described["state"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise _damaged(path, f"{said} is not a stream description ({exc})") from None
            if parts[-1][0].get("name") != stream:
                raise _damaged(path, f"{said} does not describe {stream} of {MANIFEST}")
        try:
            described = json.loads(files.read(STREAM))
            config, state = dict(described["config"]), dict(described["state"])
        except (ValueError, KeyError, TypeError) as exc:
            raise _damaged(path, f"{STREAM} is not a stream description ({exc})") from None
        if config.get("name") != manifest.stream or state.get("last_seq") != manifest.last_seq:
            raise _damaged(path, f"{STREAM} does not describe the stream of {MANIFEST}")
        count = partitions_in(config.get("metadata"))
        if count != max(1, len(manifest.parts)):
            raise _damaged(
                path, f"{STREAM} says {count} partition(s), {MANIFEST} names {len(manifest.parts)}"
            )
        keys_config = keys_state = None
        if manifest.keys is not None:
            for name in (KEYS, KEYS_SNAPSHOT):
                if name not in manifest.files:
                    raise _damaged(path, f"{MANIFEST} names the key bucket but lists no {name}")
            try:
                described = json.loads(files.read(KEYS))
                keys_config, keys_state = dict(described["config"]), dict(described["state"])
            except (ValueError, KeyError, TypeError) as exc:
                raise _damaged(path, f"{KEYS} is not a stream description ({exc})") from None
            if keys_config.get("name") != manifest.keys:
                raise _damaged(path, f"{KEYS} does not describe the key bucket of {MANIFEST}")
        credentials = None
        if CREDENTIALS in manifest.files:
            try:
                found = json.loads(files.read(CREDENTIALS))
                credentials = NatsCredentials(str(found["user"]), str(found["password"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise _damaged(path, f"{CREDENTIALS} is unreadable ({exc})") from None
        return CheckedBackup(
            path, manifest, config, state, credentials, files, keys_config, keys_state, parts
        )
    except BaseException:
        files.close()
        raise


def _check_file(files: _BackupFiles, path: Path, name: str, entry: FileEntry) -> None:
    if not files.has(name):
        where = " (a truncated archive?)" if files.tar is not None else ""
        raise _damaged(path, f"{name} is missing{where}")
    digest, size = hashlib.sha256(), 0
    try:
        with files.open(name) as data:
            while block := data.read(_BLOCK):
                digest.update(block)
                size += len(block)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise _damaged(path, f"{name} cannot be read whole ({exc})") from None
    if size != entry.size:
        raise _damaged(
            path, f"{name} has {size:,} bytes, the manifest says {entry.size:,} (truncated?)"
        )
    if digest.hexdigest() != entry.sha256:
        raise _damaged(path, f"{name} does not match its SHA-256 in the manifest")


# -- restoring -----------------------------------------------------------------------------


async def restore_backup(
    nc: NATS,
    backup: CheckedBackup,
    *,
    replicas: int = 1,
    progress: ProgressBar | None = None,
    durability: str | None = None,
) -> dict[str, Any]:
    """Create the backup's stream on the server of ``nc`` (``replicas`` copies; with
    ``durability``, on the servers of that tag, else where the backup's were), and its
    key bucket if it holds one and the deployment has none; the restored stream's state,
    with ``keys`` saying whose keys the deployment now reads. ``StreamExists`` if the
    stream exists (left alone); on any failure what was restored is deleted again
    (``eventlog.snapshots.restore_stream``). A backup without keys is refused, before
    anything is touched, by a deployment that has none either: what its events seal
    could not be read."""
    from eventlog.snapshots import StreamExists, delete_stream, restore_stream, stream_exists
    from eventlog.streams import durability_tag

    manifest = backup.manifest
    bucket = f"KV_{manifest.stream}_KEYS"
    keys_here = await stream_exists(nc, bucket)
    if not keys_here and backup.keys_config is None and manifest.event_schema >= 2:
        raise ValidationError(
            f"backup: {backup.path} holds no data keys (it was taken without --with-keys) "
            f"and this deployment has no key bucket ({bucket}): the text and vectors its "
            "events seal could not be read. Restore it into the deployment whose keys it "
            "was taken with, or restore a backup taken with --with-keys"
        )
    placed: dict[str, Any] = {"num_replicas": replicas}
    if durability is not None:
        placed["placement"] = {"tags": [durability_tag(durability)]}
    for name in manifest.parts:  # (none made before all are known to be missing)
        if await stream_exists(nc, name):
            raise StreamExists(f"stream {name} exists", stream=name)
    config = dict(backup.config, **placed)
    entry = manifest.files[SNAPSHOT]
    try:
        with backup.files.open(SNAPSHOT) as data:
            checked = _CheckedReader(data, entry, backup.path)
            state = await restore_stream(
                nc, config, backup.state, checked.read, entry.size, progress=progress
            )
    finally:
        if progress is not None:
            progress.finish()
    made: list[str] = []
    try:
        for k, (part_config, part_state) in enumerate(backup.parts, 1):
            snapshotted = _part_files(k)[1]
            held = manifest.files[snapshotted]
            with backup.files.open(snapshotted) as data:
                checked = _CheckedReader(data, held, backup.path, snapshotted)
                restored = await restore_stream(
                    nc, dict(part_config, **placed), part_state, checked.read, held.size
                )
            made.append(str(part_config["name"]))
            state["messages"] = int(state.get("messages") or 0) + int(restored.get("messages") or 0)
    except BaseException:
        for name in [*made, manifest.stream]:  # all or nothing
            with contextlib.suppress(Exception):
                await delete_stream(nc, name)
        raise
    if keys_here:
        state["keys"] = f"the deployment's own ({bucket}, kept: it knows every delete made since)"
    elif backup.keys_config is not None and backup.keys_state is not None:
        held = manifest.files[KEYS_SNAPSHOT]
        try:
            with backup.files.open(KEYS_SNAPSHOT) as data:
                checked = _CheckedReader(data, held, backup.path)
                await restore_stream(
                    nc, dict(backup.keys_config, **placed), backup.keys_state,
                    checked.read, held.size,
                )  # fmt: skip
        except BaseException:
            for name in [*manifest.parts, manifest.stream]:  # all or nothing
                with contextlib.suppress(Exception):
                    await delete_stream(nc, name)
            raise
        state["keys"] = f"restored from the backup ({bucket})"
    else:
        state["keys"] = "none (the backup's events seal nothing)"
    return state


class _CheckedReader:
    """The snapshot as it is sent, checked against the manifest again on its last read,
    before the server is told to commit: a file that changed since ``check_backup``
    read it fails the restore (and nothing is restored)."""

    def __init__(self, data: IO[bytes], entry: FileEntry, path: Path, name: str = SNAPSHOT) -> None:
        self.data, self.entry, self.path, self.name = data, entry, path, name
        self.hash = hashlib.sha256()
        self.size = 0

    def read(self, n: int) -> bytes:
        from eventlog.snapshots import SnapshotError

        block = self.data.read(n)
        self.hash.update(block)
        self.size += len(block)
        if self.size >= self.entry.size and self.hash.hexdigest() != self.entry.sha256:
            raise SnapshotError(
                f"backup: {self.path}: {self.name} changed while it was being restored"
            )
        return block


def cmd_restore(args: argparse.Namespace) -> int:
    """`pulse restore` (declared, with its help, in ``ops.cli.maintenance``)."""
    backup = check_backup(Path(args.backup))  # before anything is touched
    try:
        credentials, installed = _install_credentials(args, backup)
        try:
            state = asyncio.run(_restore(args, backup))
        except BaseException:
            if installed is not None:  # the restore did not happen: take them back
                for written in (installed, installed.with_name("nats.conf")):  # (its copy)
                    with contextlib.suppress(OSError):
                        written.unlink()
            raise
    finally:
        backup.files.close()
    manifest = backup.manifest
    target = args.data_dir if not args.nats_url else _hosts(args.nats_url)
    record = {
        "stream": manifest.stream,
        "messages": int(state.get("messages") or 0),
        "first_seq": int(state.get("first_seq") or 0),
        "last_seq": int(state.get("last_seq") or 0),
        "credentials": credentials,
        "keys": state.get("keys"),
        "next": (
            f"pulse --data-dir {args.data_dir} rebuild"
            if not args.nats_url
            else "pulse rebuild on every host of the deployment"
        ),
    }
    if args.json:
        print(json.dumps(record), flush=True)
    else:
        print(
            f"restored stream {manifest.stream} ({record['messages']:,} events, sequences "
            f"{record['first_seq']}..{record['last_seq']}) from {args.backup} into {target}\n"
            f"credentials: {credentials}\n"
            f"data keys: {record['keys']}\n"
            f"next: {record['next']} (builds the state from the stream)",
            flush=True,
        )
    return 0


def _install_credentials(
    args: argparse.Namespace, backup: CheckedBackup
) -> tuple[str, Path | None]:
    """Give a data directory without NATS credentials the backup's, before its embedded
    server starts; what was done, and the file written (None: nothing written)."""
    from eventlog.embedded import NatsCredentials

    if args.nats_url:
        kept = f" (the backup's are in {backup.path})" if backup.credentials else ""
        return f"those of --nats-creds, untouched{kept}", None
    target = Path(args.data_dir) / "nats" / "credentials.json"
    if backup.credentials is None:
        return "none in the backup; the data directory's own", None
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        backup.credentials.save(target)
        return f"restored into {target} (0600)", target
    if NatsCredentials.load(target) == backup.credentials:
        return f"{target}, the same as the backup's", None
    return (
        f"kept {target}, which differs from the backup's: hosts connect with a copy of "
        "it (PULSE_NATS_CREDS)"
    ), None


async def _restore(args: argparse.Namespace, backup: CheckedBackup) -> dict[str, Any]:
    from eventlog.snapshots import SnapshotError, StreamExists

    async with _connected(args) as (nc, server):
        try:
            return await restore_backup(
                nc, backup, replicas=args.replicas, durability=args.durability,
                progress=ProgressBar("restoring", unit="bytes"),
            )  # fmt: skip
        except StreamExists as exc:
            service = running_service(args.data_dir) if server is not None else None
            held = (
                f" (`pulse up` serves this data directory, pid {service.get('pid')})"
                if service
                else ""
            )
            raise StreamExists(
                f"stream: {exc.stream} exists already on the {_where(args)}{held}; a restore "
                "never overwrites or merges into a stream: restore into a fresh data directory "
                f"(pulse --data-dir NEW restore {args.backup}) or a NATS server without it, "
                f"or delete it first on purpose (nats stream rm {exc.stream}) and then "
                "rebuild every host (pulse rebuild)",
                stream=exc.stream,
            ) from None
        except SnapshotError as exc:
            raise SnapshotError(f"{exc}; nothing was restored") from None

"""Stream snapshots and restores through the JetStream API, which nats-py has no helper for.

The protocol, as nats-server (2.10 to 2.15) implements it in ``server/jetstream_api.go``
(``jsStreamSnapshotRequest``, ``streamSnapshot``, ``jsStreamRestoreRequest``,
``processStreamRestore``) and the nats CLI drives it (jsm.go ``snapshots.go``):

Snapshot. Subscribe to an inbox first, then request ``$JS.API.STREAM.SNAPSHOT.<stream>``
with ``{"deliver_subject": inbox, "no_consumers": true, "chunk_size", "window_size",
"jsck"}``. The answer holds the stream's ``config`` and its ``state`` at the snapshot
(or an ``error``). The server then sends the snapshot to the inbox in chunks, in order.
Each chunk's reply subject is ``$JS.SNAPSHOT.ACK.<stream>.<id>.<chunk length>.<index>``
(index from 1): publishing anything to it acknowledges the chunk, and the server keeps at
most ``window_size`` bytes unacknowledged (it gives up after a few seconds without an
ack). A last, shorter chunk may come with no reply subject. The end is a message with an
empty body: with no status or status 204 it is complete; 408 (no interest, no flow
response) or 500 (the server failed) says why it is not. The bytes are opaque here (an
s2-compressed tar, or the server's own archive format in newer servers); this module
checks that no chunk went missing (the index is contiguous, each length is as announced).

Restore. Request ``$JS.API.STREAM.RESTORE.<stream>`` with ``{"config", "state"}`` (the
stream name must be the snapshot's: the server refuses to rename, and refuses with code
10130 if the stream exists). The answer names a ``deliver_subject``; send the snapshot
there as requests, one chunk each (an empty reply means "go on", a JSON body is an
error), then an empty request: its reply, once the server has rebuilt the stream, is a
stream-create response (``config`` and ``state``, or ``error``). The server abandons a
restore that receives no chunk for 5 seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS

from eventlog.errors import LogUnavailable, NotFoundError, PulseError

SNAPSHOT_API = "$JS.API.STREAM.SNAPSHOT.{}"
RESTORE_API = "$JS.API.STREAM.RESTORE.{}"
INFO_API = "$JS.API.STREAM.INFO.{}"
DELETE_API = "$JS.API.STREAM.DELETE.{}"

CHUNK_SIZE = 128 * 1024  # the server's default; it clamps requests to 1 KiB..1 MiB
WINDOW_SIZE = 8 * 1024 * 1024  # bytes the server sends ahead of our acks (its default)

_STREAM_NOT_FOUND = 10059
_STREAM_EXISTS = 10130  # "stream name already in use, cannot restore"

Progress = Callable[[int, int], None]  # (bytes done, bytes expected)


class SnapshotError(PulseError):
    """A snapshot or restore did not complete; the message says why and what to do."""


class StreamExists(SnapshotError):
    """A restore was asked for a stream that exists already (``stream`` names it)."""

    def __init__(self, message: str, *, stream: str) -> None:
        super().__init__(message)
        self.stream = stream


@dataclass(frozen=True)
class StreamSnapshot:
    """What a finished snapshot was: the stream's configuration and state when it was
    taken (JetStream's JSON, as the restore request takes them), and its size in bytes."""

    config: dict[str, Any]
    state: dict[str, Any]
    size: int


async def _api(nc: NATS, subject: str, body: dict[str, Any] | None, timeout: float) -> Any:
    """A JetStream API request and its JSON answer (retried while JetStream says it is not
    ready, within ``timeout``); ``LogUnavailable`` if it never answers."""
    deadline = time.monotonic() + timeout
    payload = json.dumps(body).encode() if body is not None else b""
    while True:
        remaining = deadline - time.monotonic()
        try:
            reply = await nc.request(subject, payload, timeout=max(remaining, 0.1))
            answer = json.loads(reply.data or b"{}")
            error = answer.get("error") if isinstance(answer, dict) else None
            if not (error and error.get("code") == 503) or remaining <= 0:
                return answer
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
            if time.monotonic() >= deadline:
                raise LogUnavailable(
                    f"JetStream did not answer {subject} within {timeout:g}s ({exc!r}); "
                    "is JetStream enabled and its cluster up?"
                ) from None
        except ValueError as exc:
            raise SnapshotError(f"{subject}: the server's answer is not JSON ({exc})") from None
        await asyncio.sleep(0.1)


def _error_of(answer: Any) -> tuple[int, str] | None:
    """(JetStream error code, description) of an API answer that is an error."""
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        error = answer["error"]
        return int(error.get("err_code") or error.get("code") or 0), str(
            error.get("description", error)
        )
    return None


async def stream_exists(nc: NATS, stream: str, *, timeout: float = 10.0) -> bool:
    answer = await _api(nc, INFO_API.format(stream), None, timeout)
    error = _error_of(answer)
    if error is None:
        return True
    if error[0] == _STREAM_NOT_FOUND:
        return False
    raise SnapshotError(f"stream {stream}: JetStream cannot say whether it exists ({error[1]})")


async def delete_stream(nc: NATS, stream: str, *, timeout: float = 10.0) -> None:
    error = _error_of(await _api(nc, DELETE_API.format(stream), None, timeout))
    if error is not None and error[0] != _STREAM_NOT_FOUND:
        raise SnapshotError(f"stream {stream}: cannot delete it ({error[1]})")


def _ack_position(reply: str) -> tuple[int, int]:
    """(chunk length, chunk index) announced by a chunk's ack subject."""
    tokens = reply.split(".")
    try:
        return int(tokens[-2]), int(tokens[-1])
    except (IndexError, ValueError):
        raise SnapshotError(f"snapshot: unexpected ack subject {reply!r} from the server") from None


async def snapshot_stream(
    nc: NATS,
    stream: str,
    write: Callable[[bytes], object],
    *,
    chunk_size: int = CHUNK_SIZE,
    window_size: int = WINDOW_SIZE,
    timeout: float = 30.0,
    progress: Progress | None = None,
) -> StreamSnapshot:
    """Take a snapshot of ``stream`` (messages, no consumers), handing each chunk of its
    bytes to ``write`` in order. ``timeout``: seconds to wait for the server's answer and
    then for each chunk. Raises ``NotFoundError`` if there is no such stream,
    ``SnapshotError`` if the snapshot is cut short (nothing is then complete)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, pending_bytes_limit=4 * window_size + 2 * chunk_size)
    try:
        request = {
            "deliver_subject": inbox,
            "no_consumers": True,
            "chunk_size": chunk_size,
            "window_size": window_size,
            "jsck": True,  # servers before the v2 format check messages' checksums first
        }
        answer = await _api(nc, SNAPSHOT_API.format(stream), request, timeout)
        error = _error_of(answer)
        if error is not None:
            if error[0] == _STREAM_NOT_FOUND:
                raise NotFoundError(f"stream {stream} does not exist on this NATS server")
            raise SnapshotError(f"snapshot of {stream}: JetStream refused it ({error[1]})")
        config, state = dict(answer.get("config") or {}), dict(answer.get("state") or {})
        expected = int(state.get("bytes") or 0)  # stored bytes: the snapshot is compressed
        size, index, last = 0, 1, False
        while True:
            try:
                msg = await sub.next_msg(timeout=timeout)
            except nats.errors.TimeoutError:
                raise SnapshotError(
                    f"snapshot of {stream}: no data from the server for {timeout:g}s after "
                    f"{size:,} bytes; try again"
                ) from None
            if not msg.data:  # the end: complete, unless a status says otherwise
                status = (msg.headers or {}).get("Status")
                if status not in (None, "204"):
                    why = (msg.headers or {}).get("Description", "")
                    raise SnapshotError(
                        f"snapshot of {stream}: the server stopped it after {size:,} bytes "
                        f"(status {status} {why}); try again"
                    )
                break
            if last:
                raise SnapshotError(f"snapshot of {stream}: data after the last chunk")
            if msg.reply:
                length, position = _ack_position(msg.reply)
                if position != index or length != len(msg.data):
                    raise SnapshotError(
                        f"snapshot of {stream}: chunk {index} missing (got chunk {position} of "
                        f"{len(msg.data):,} bytes, announced {length:,}); a slow disk or "
                        "network? try again"
                    )
                await nc.publish(msg.reply, b"")  # ack first: the data is in memory already
                index += 1
            else:
                last = True  # a last short chunk comes without an ack subject
            write(msg.data)
            size += len(msg.data)
            if progress is not None:
                progress(size, max(expected, size))
        if progress is not None:
            progress(size, size)
        return StreamSnapshot(config, state, size)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def restore_stream(
    nc: NATS,
    config: dict[str, Any],
    state: dict[str, Any],
    read: Callable[[int], bytes],
    size: int,
    *,
    timeout: float = 30.0,
    finish_timeout: float = 600.0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Create the stream ``config["name"]`` from a snapshot of ``size`` bytes, read in
    chunks with ``read(n)``; return the restored stream's state (JetStream's JSON).

    Raises ``StreamExists`` if the stream exists (it is left alone). If anything fails
    once the restore has begun, or the restored stream does not hold the messages of
    ``state``, the stream is deleted again before ``SnapshotError`` is raised: a restore
    is whole or absent. ``finish_timeout``: seconds the server may take to rebuild the
    stream after the last chunk."""
    stream = str(config.get("name") or "")
    if not stream:
        raise SnapshotError("restore: the stream configuration has no name")
    exists = (
        f"stream {stream} exists already; a restore creates it, it never merges into or "
        "overwrites one"
    )
    if await stream_exists(nc, stream, timeout=timeout):
        raise StreamExists(exists, stream=stream)
    answer = await _api(nc, RESTORE_API.format(stream), {"config": config, "state": state}, timeout)
    error = _error_of(answer)
    if error is not None:
        if error[0] == _STREAM_EXISTS:
            raise StreamExists(exists, stream=stream)
        raise SnapshotError(f"restore of {stream}: JetStream refused it ({error[1]})")
    deliver = str(answer.get("deliver_subject") or "")
    # below the server's max_payload, whatever it is
    chunk_size = max(1024, min(CHUNK_SIZE, int(nc.max_payload or CHUNK_SIZE) - 4096))
    try:
        sent = 0
        while sent < size:
            chunk = read(min(chunk_size, size - sent))
            if not chunk:
                raise SnapshotError(f"restore of {stream}: the snapshot ended at {sent:,} bytes")
            _raise_on(await _chunk(nc, deliver, chunk, timeout), stream)
            sent += len(chunk)
            if progress is not None:
                progress(sent, size)
        final = await _chunk(nc, deliver, b"", finish_timeout)
        _raise_on(final, stream)
        restored = dict(final.get("state") or {}) if isinstance(final, dict) else {}
        for key in ("messages", "last_seq"):
            if int(restored.get(key) or 0) != int(state.get(key) or 0):
                raise SnapshotError(
                    f"restore of {stream}: the restored stream has {key} "
                    f"{restored.get(key)}, the snapshot {state.get(key)}"
                )
        return restored
    except BaseException:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await delete_stream(nc, stream, timeout=timeout)
        raise


async def _chunk(nc: NATS, subject: str, data: bytes, timeout: float) -> Any:
    try:
        reply = await nc.request(subject, data, timeout=timeout)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        raise SnapshotError(
            f"restore: the server did not take the data within {timeout:g}s ({exc!r}); try again"
        ) from None
    if not reply.data:
        return None
    try:
        return json.loads(reply.data)
    except ValueError:
        raise SnapshotError(f"restore: unexpected answer from the server: {reply.data!r}") from None


def _raise_on(answer: Any, stream: str) -> None:
    error = _error_of(answer)
    if error is not None:
        raise SnapshotError(f"restore of {stream}: the server refused the snapshot ({error[1]})")

"""Reading a long stretch of the log with a second process: rebuilds and catch-ups.

Reading through nats-py costs about as much Python time per message as folding it, and
one process runs Python on one core at a time. For a long read, a child process
(``python -m eventlog.reader``) does the NATS side and the checking half of decoding
(``codec.decode_event``: types, value ranges, subject), and hands over frames of
checked bodies; this process only turns them back into events (a plain msgpack decode)
and folds them, so the two halves run on two cores. What the child found unreadable
arrives as a dead letter with its reason, exactly as ``JetStreamLog.read`` reports it.

Frames on the child's stdout: a 4-byte little-endian length, then msgpack of a list
of ``[seq, subject, body or None, reason or None, writer or None]``. A body is always of
the current schema version (the child upcasts older ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import sys
from collections.abc import AsyncGenerator, Sequence
from typing import Any
from uuid import UUID

import msgspec
from nats.aio.msg import Msg

from eventlog.codec import HDR_SCHEMA, SCHEMA_VERSION, decode_event, encode_body
from eventlog.errors import DecodeError, LogUnavailable
from eventlog.events import Event
from eventlog.log import LogEntry

_LENGTH = struct.Struct("<I")
_Item = tuple[int, str, bytes | None, str | None, str | None]
_frames = msgspec.msgpack.Encoder()
_frame_decoder = msgspec.msgpack.Decoder(list[_Item])
_checked = msgspec.msgpack.Decoder(Event)  # bodies the child has already checked
_CURRENT = str(SCHEMA_VERSION)


def ack_position(reply: str) -> tuple[int, int, int]:
    """(stream sequence, messages still pending, the time JetStream stored the message in
    ms since the epoch) from the ack subject a delivered message carries."""
    tokens = reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
        return int(tokens[5]), int(tokens[8]), int(tokens[7]) // 1_000_000
    # $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>...
    return int(tokens[7]), int(tokens[10]), int(tokens[9]) // 1_000_000


def _verdict(msg: Msg, seq: int, stored_ms: int) -> _Item:
    """One message as the child hands it over: checked, or refused with the reason."""
    try:
        event = decode_event(
            msg.data, msg.headers, subject=msg.subject, seq=seq, stored_ms=stored_ms
        )
    except DecodeError as exc:
        writer = getattr(exc, "instance_id", None)
        return (seq, msg.subject, None, exc.reason, str(writer) if writer else None)
    current = (msg.headers or {}).get(HDR_SCHEMA) == _CURRENT
    return (seq, msg.subject, msg.data if current else encode_body(event), None, None)


def _entry(item: _Item) -> LogEntry:
    seq, subject, body, reason, writer = item
    if body is not None:
        return LogEntry(seq, subject, _checked.decode(body))
    error = DecodeError(
        reason or "unreadable", subject=subject, seq=seq,
        instance_id=UUID(writer) if writer else None,
    )  # fmt: skip
    return LogEntry(seq, subject, None, error)


async def read_in_child(
    servers: Sequence[str],
    stream: str,
    from_seq: int,
    end_seq: int,
    batch_size: int,
    *,
    credentials: str | None = None,
    tls_ca: str | None = None,
) -> AsyncGenerator[list[LogEntry], None]:
    """Batches of entries ``from_seq``..``end_seq`` read by a child process.

    The child gets what to read, and how to connect, as one JSON line on its stdin, never
    in its argv: server URLs may carry credentials, and any local user can read a
    process's argv (``ps``)."""
    spec = {
        "servers": list(servers), "stream": stream, "from_seq": from_seq, "end_seq": end_seq,
        "batch_size": batch_size, "credentials": credentials, "tls_ca": tls_ca,
    }  # fmt: skip
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "eventlog.reader",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, limit=2**26,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    child.stdin.write(json.dumps(spec).encode() + b"\n")
    child.stdin.close()  # the child reads one line; a broken pipe shows as its exit status
    errors = asyncio.ensure_future(child.stderr.read())
    try:
        while True:
            try:
                head = await child.stdout.readexactly(_LENGTH.size)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise LogUnavailable("the log reader process stopped mid-frame") from None
                break
            frame = await child.stdout.readexactly(_LENGTH.unpack(head)[0])
            yield [_entry(item) for item in _frame_decoder.decode(frame)]
        code = await child.wait()
        if code != 0:
            detail = (await errors).decode(errors="replace").strip().splitlines()
            raise LogUnavailable(
                f"the log reader process failed (exit {code}): {detail[-1] if detail else '?'}"
            )
    finally:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
        errors.cancel()


async def _serve(spec: dict[str, Any]) -> None:
    from eventlog.jetstream import JetStreamLog, _pull

    log = await JetStreamLog.connect(
        spec["servers"], create_streams=False, update_streams=False, name="pulse-reader",
        credentials=spec.get("credentials"), tls_ca=spec.get("tls_ca"),
    )  # fmt: skip
    out = sys.stdout.buffer
    try:
        async for items in _pull(
            log, spec["stream"], spec["from_seq"], None, spec["batch_size"], live=False,
            end_seq=spec["end_seq"], decode=_verdict,
        ):  # fmt: skip
            data = _frames.encode(items)
            out.write(_LENGTH.pack(len(data)))
            out.write(data)
            out.flush()
    finally:
        await log.close()


if __name__ == "__main__":
    try:
        asyncio.run(_serve(json.loads(sys.stdin.readline())))
    except BrokenPipeError:  # the reading side went away: nothing left to do
        sys.exit(1)

"""Reading a long stretch of the log with a second process: rebuilds and catch-ups.

Reading through nats-py costs about as much Python time per message as folding it, and
one process runs Python on one core at a time. For a long read, a child process
(``python -m eventlog.reader_child``) does the NATS side and the checking half of decoding
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
from uuid import UUID

import msgspec

from eventlog.codec import SCHEMA_VERSION
from eventlog.errors import DecodeError, LogUnavailable
from eventlog.events import Event
from eventlog.log import LogEntry

# a frame (the child, ``eventlog.reader_child``, writes them): its length, then its items
LENGTH = struct.Struct("<I")
Item = tuple[int, str, bytes | None, str | None, str | None]
FRAMES = msgspec.msgpack.Encoder()
_frame_decoder = msgspec.msgpack.Decoder(list[Item])
_checked = msgspec.msgpack.Decoder(Event)  # bodies the child has already checked
CURRENT_SCHEMA = str(SCHEMA_VERSION)  # the version of every body in a frame


def _entry(item: Item) -> LogEntry:
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
        sys.executable, "-m", "eventlog.reader_child",
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
                head = await child.stdout.readexactly(LENGTH.size)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise LogUnavailable("the log reader process stopped mid-frame") from None
                break
            frame = await child.stdout.readexactly(LENGTH.unpack(head)[0])
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

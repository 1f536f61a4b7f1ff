"""The child process of ``eventlog.reader``: it reads a stretch of the log from
JetStream, checks each message (``codec.decode_event``) and writes frames of checked
bodies to its stdout (the frame format is ``eventlog.reader``'s).

A module of its own, run as ``python -m eventlog.reader_child``, because it is a
JetStream client (``eventlog.jetstream``), which reads through ``eventlog.reader``:
the parent's side and the child's side in one module would import each other.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, BinaryIO

from nats.aio.msg import Msg

from eventlog.codec import HDR_SCHEMA, decode_event, encode_body
from eventlog.errors import DecodeError
from eventlog.jetstream import JetStreamLog, _pull
from eventlog.reader import CURRENT_SCHEMA, FRAMES, LENGTH, Item


def _verdict(msg: Msg, seq: int, stored_ms: int) -> Item:
    """One message as the child hands it over: checked, or refused with the reason."""
    try:
        event = decode_event(
            msg.data, msg.headers, subject=msg.subject, seq=seq, stored_ms=stored_ms
        )
    except DecodeError as exc:
        writer = getattr(exc, "instance_id", None)
        return (seq, msg.subject, None, exc.reason, str(writer) if writer else None)
    current = (msg.headers or {}).get(HDR_SCHEMA) == CURRENT_SCHEMA
    return (seq, msg.subject, msg.data if current else encode_body(event), None, None)


def _write(out: BinaryIO, data: bytes) -> None:
    out.write(data)
    out.flush()


async def _serve(spec: dict[str, Any]) -> None:
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
            data = FRAMES.encode(items)
            # written from a thread: while the pipe is full (the reading side busy) this
            # loop keeps reading what the server sends for the pulls under way; blocked,
            # the server would drop the connection as a slow consumer after its 10 s
            # write deadline and the read would fail (no new pull before this returns)
            await asyncio.to_thread(_write, out, LENGTH.pack(len(data)) + data)
    finally:
        await log.close()


if __name__ == "__main__":
    try:
        asyncio.run(_serve(json.loads(sys.stdin.readline())))
    except BrokenPipeError:  # the reading side went away: nothing left to do
        sys.exit(1)

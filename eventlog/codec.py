"""The wire format of Pulse events: msgpack bodies, metadata in NATS headers.

    headers   Nats-Msg-Id   the event id (JetStream stores a retried publish once)
              Pulse-Event   the event type, e.g. experience.recorded (readable by tools)
              Pulse-Schema  the schema version the body was written with
    body      msgpack map of the tagged struct; UUIDs as 16-byte bin, embeddings as
              raw little-endian float32 bin

Older schema versions are upcast on read: ``UPCASTERS[v]`` turns a raw body of version
``v`` (a plain dict) into version ``v + 1``; the chain runs up to ``SCHEMA_VERSION``.
Bytes that are not a readable event raise ``DecodeError`` naming the subject and stream
sequence, never anything else, so a consumer can set them aside and go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import msgspec

from eventlog.errors import DecodeError
from eventlog.events import Event, EventBase, event_type_name
from eventlog.subjects import subject_for

SCHEMA_VERSION = 1

HDR_MSG_ID = "Nats-Msg-Id"
HDR_EVENT_TYPE = "Pulse-Event"
HDR_SCHEMA = "Pulse-Schema"

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
# from_version -> function producing the body of from_version + 1
UPCASTERS: dict[int, Upcaster] = {}

_encoder = msgspec.msgpack.Encoder(uuid_format="bytes")
_decoder = msgspec.msgpack.Decoder(Event)
_raw_decoder = msgspec.msgpack.Decoder(dict[str, Any])


@dataclass(frozen=True, slots=True)
class WireMessage:
    """An encoded event, ready to publish."""

    subject: str
    headers: dict[str, str]
    payload: bytes


def encode_body(event: EventBase) -> bytes:
    """The msgpack body of an event (what the golden vectors freeze)."""
    return _encoder.encode(event)


def encode_event(event: EventBase) -> WireMessage:
    """Subject, headers and body for one event."""
    return WireMessage(
        subject=subject_for(event),  # type: ignore[arg-type]
        headers={
            HDR_MSG_ID: str(event.event_id),
            HDR_EVENT_TYPE: event_type_name(event),
            HDR_SCHEMA: str(SCHEMA_VERSION),
        },
        payload=_encoder.encode(event),
    )


def register_upcaster(from_version: int, upcaster: Upcaster) -> None:
    """Teach the decoder to read bodies of ``from_version`` (turning them into the next)."""
    if not 0 <= from_version < SCHEMA_VERSION:
        raise ValueError(f"upcasters exist for versions below {SCHEMA_VERSION}, not {from_version}")
    UPCASTERS[from_version] = upcaster


def schema_version_of(headers: Mapping[str, str] | None, *, subject: str, seq: int | None) -> int:
    raw = (headers or {}).get(HDR_SCHEMA)
    if raw is None:
        raise DecodeError(f"no {HDR_SCHEMA} header: not written by Pulse", subject=subject, seq=seq)
    try:
        return int(raw)
    except ValueError:
        reason = f"{HDR_SCHEMA} header {raw!r} is not a number"
        raise DecodeError(reason, subject=subject, seq=seq) from None


def decode_event(
    payload: bytes,
    headers: Mapping[str, str] | None,
    *,
    subject: str = "",
    seq: int | None = None,
) -> Event:
    """The event in a message body; raises ``DecodeError`` (only) when it is not one."""
    version = schema_version_of(headers, subject=subject, seq=seq)
    if version > SCHEMA_VERSION:
        raise DecodeError(
            f"written with schema {version}, this Pulse reads up to {SCHEMA_VERSION}: "
            "upgrade Pulse",
            subject=subject,
            seq=seq,
        )
    try:
        if version == SCHEMA_VERSION:
            return _decoder.decode(payload)
        body = _raw_decoder.decode(payload)
        for step in range(version, SCHEMA_VERSION):
            upcaster = UPCASTERS.get(step)
            if upcaster is None:
                raise DecodeError(
                    f"schema {step} has no upcaster to {step + 1}", subject=subject, seq=seq
                )
            body = upcaster(body)
        return _decoder.decode(_encoder.encode(body))
    except DecodeError:
        raise
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(str(exc), subject=subject, seq=seq) from exc
    except Exception as exc:  # an upcaster that failed on a malformed old body
        raise DecodeError(f"upcasting failed: {exc!r}", subject=subject, seq=seq) from exc

"""The wire format of Pulse events: msgpack bodies, metadata in NATS headers.

    headers   Nats-Msg-Id   the event id (JetStream stores a retried publish once)
              Pulse-Event   the event type, e.g. experience.recorded (readable by tools)
              Pulse-Schema  the schema version the body was written with
    body      msgpack map of the tagged struct; UUIDs as 16-byte bin, embeddings as
              raw little-endian float32 bin

Schema versions. Every message says which version wrote its body; this Pulse writes
``SCHEMA_VERSION`` and reads every version up to it:

- an older body is upcast on read: ``UPCASTERS[v]`` turns a raw body of version ``v`` (a
  plain dict) into version ``v + 1``; the chain runs up to ``SCHEMA_VERSION``;
- a newer body is refused (``DecodeError``: "written with schema N, this Pulse reads up to
  M: upgrade Pulse"), never half read: a host keeps it as a dead letter, goes on with the
  rest, and reads it once upgraded (see the README, "Upgrades").

So any change to what a release writes, a new field (even with a default), a new event
type or experience variant, a changed one, bumps ``SCHEMA_VERSION`` and registers the
upcaster of the version before it (``lambda body: body`` when old bodies read as they are)
here, at import: every process reads with them, ``eventlog.reader``'s child too. An added
field without a bump would be dropped in silence by older hosts (the decoder ignores
fields it does not know), and their state would differ for good. ``SCHEMA_VERSION`` and
``UPCASTERS`` are read at each call, so a test can stand in for the next release by
setting both (``tests/test_upgrade.py``).

A message on the log is input from another host, so reading one is checking it: the body
must be a well-typed event, every value in range (``eventlog.limits.check_ranges``: the
data model's limits, clocks, counts, dimensions, finite floats), its clock not further
ahead of the time the stream stored it than ``limits.CLOCK_AHEAD_MS`` and, on a Pulse subject,
the subject must be the one the body names (``subject_for``, with or without the bucket
of a log in partitions, which the body's collective fixes). Anything else raises
``DecodeError`` naming the subject, the stream sequence and, when the body says, the
instance that wrote it; never anything else, so a consumer can set it aside and go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping
from uuid import UUID

import msgspec

from eventlog.errors import DecodeError
from eventlog.events import EVENT_TYPES, EXPERIENCE_TYPES, Event, EventBase, event_type_name
from eventlog.languages import AUTO, ENGLISH, of_name
from eventlog.limits import check_clock, check_ranges
from eventlog.subjects import PREFIX, subject_for

SCHEMA_VERSION = 5  # 2: sealed events (eventlog.sealing); 3: a collective's language;
# 4: threads (an agent framework's checkpoints: ThreadCheckpointed and the rest); 5: a
# language per document ("auto" recorded as such, a text's detected language)

HDR_MSG_ID = "Nats-Msg-Id"
HDR_EVENT_TYPE = "Pulse-Event"
HDR_SCHEMA = "Pulse-Schema"

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
# from_version -> function producing the body of from_version + 1
UPCASTERS: dict[int, Upcaster] = {}

_encoder = msgspec.msgpack.Encoder(uuid_format="bytes")
_decoder = msgspec.msgpack.Decoder(Event)
_raw_decoder = msgspec.msgpack.Decoder(dict[str, Any])


class _Writer(msgspec.Struct):
    """Just the writer of a body (every other field ignored): for naming it in errors."""

    instance_id: UUID


_writer_decoder = msgspec.msgpack.Decoder(_Writer)


class _Tags(msgspec.Struct):
    """Just the tags of a body (every other field ignored): for naming an unknown one."""

    type: Any = None
    experience_type: Any = None


_tags_decoder = msgspec.msgpack.Decoder(_Tags)
_EVENT_TAGS = frozenset(str(t.__struct_config__.tag) for t in EVENT_TYPES)
_KIND_TAGS = frozenset(str(t.__struct_config__.tag) for t in EXPERIENCE_TYPES)
_PULSE_SUBJECT = f"{PREFIX}."


@dataclass(frozen=True, slots=True)
class WireMessage:
    """An encoded event, ready to publish."""

    subject: str
    headers: dict[str, str]
    payload: bytes


def encode_body(event: EventBase) -> bytes:
    """The msgpack body of an event (what the golden vectors freeze)."""
    return _encoder.encode(event)


def encode_event(event: EventBase, *, bucketed: bool = False) -> WireMessage:
    """Subject, headers and body for one event (``bucketed``: its subject in a log in
    partitions, ``eventlog.partitions``)."""
    return WireMessage(
        subject=subject_for(event, bucketed=bucketed),  # type: ignore[arg-type]
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


register_upcaster(1, lambda body: body)  # version 2 added a type; version 1 reads as it is
register_upcaster(2, lambda body: body)  # version 3 added a field whose default is the past
register_upcaster(3, lambda body: body)  # version 4 added types


def _languages_per_document(body: dict[str, Any]) -> dict[str, Any]:
    """Version 5 records "auto" as such; before, a collective created with "auto" (the
    default) recorded the language its name's script chose (``languages.of_name``). Such
    a created event reads as "auto" now, so a collective nobody fixed a language for
    analyzes each text in its own (the bodies of every other type read as they are)."""
    if body.get("type") == "collective.created" and isinstance(body.get("name"), str):
        if (body.get("language") or ENGLISH) == of_name(body["name"]):
            body["language"] = AUTO
    return body


register_upcaster(4, _languages_per_document)


def schema_version_of(headers: Mapping[str, str] | None, *, subject: str, seq: int | None) -> int:
    raw = (headers or {}).get(HDR_SCHEMA)
    if raw is None:
        raise DecodeError(f"no {HDR_SCHEMA} header: not written by Pulse", subject=subject, seq=seq)
    try:
        return int(raw)
    except ValueError:
        reason = f"{HDR_SCHEMA} header {raw!r} is not a number"
        raise DecodeError(reason, subject=subject, seq=seq) from None


def writer_of(payload: bytes) -> UUID | None:
    """The ``instance_id`` of a body that is not a readable event, if it names one."""
    try:
        return _writer_decoder.decode(payload).instance_id
    except (msgspec.DecodeError, RecursionError):
        return None


def decode_event(
    payload: bytes,
    headers: Mapping[str, str] | None,
    *,
    subject: str = "",
    seq: int | None = None,
    stored_ms: int | None = None,
    bucketed: bool | None = None,
) -> Event:
    """The event in a message body; raises ``DecodeError`` (only) when it is not one: not
    a well-typed event, a value out of range, a clock too far ahead of ``stored_ms`` (the
    time the log stored the message, when known: ``eventlog.limits.check_clock``), or (on
    a ``pulse.`` subject) a subject other than the body's own. Without a subject (or a
    foreign one) the subject is not checked. ``bucketed``: the body's own subject is the
    one of a log in partitions (True), of one stream (False), or either (None)."""
    version = schema_version_of(headers, subject=subject, seq=seq)
    if version > SCHEMA_VERSION:
        raise _refusal(
            f"written with schema {version}, this Pulse reads up to {SCHEMA_VERSION}: "
            "upgrade Pulse",
            payload,
            subject,
            seq,
        )
    try:
        event = _decoder.decode(payload) if version == SCHEMA_VERSION else _upcast(payload, version)
    except _Unreadable as exc:
        raise _refusal(str(exc), payload, subject, seq) from exc.__cause__
    except msgspec.ValidationError as exc:
        reason = (version == SCHEMA_VERSION and _unknown_tag(payload)) or str(exc)
        raise _refusal(reason, payload, subject, seq) from exc
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise _refusal(str(exc), payload, subject, seq) from exc
    try:
        check_ranges(event)
        if stored_ms is not None:
            check_clock(event, stored_ms)
    except ValueError as exc:
        raise _refusal(str(exc), payload, subject, seq, event.instance_id) from None
    if subject.startswith(_PULSE_SUBJECT):
        own = subject_for(event, bucketed=bool(bucketed))
        if subject != own and (
            bucketed is not None or subject != subject_for(event, bucketed=True)
        ):
            raise _refusal(
                f"subject {subject} does not match the event's own subject {own}",
                payload,
                subject,
                seq,
                event.instance_id,
            )
    return event


def _unknown_tag(payload: bytes) -> str | None:
    """Why a well-formed body of this version is not an event, when its event type or
    experience variant is one this Pulse does not know (a newer one that added it without
    a new schema version, or not Pulse); None for any other reason."""
    try:
        tags = _tags_decoder.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        return None
    what = None
    if isinstance(tags.type, str) and tags.type not in _EVENT_TAGS:
        what = f"event type {tags.type!r}"
    elif isinstance(tags.experience_type, dict):
        kind = tags.experience_type.get("kind")
        if isinstance(kind, str) and kind not in _KIND_TAGS:
            what = f"experience type {kind!r}"
    if what is None:
        return None
    return (
        f"{what} is unknown to this Pulse (schema {SCHEMA_VERSION}): "
        "upgrade Pulse if a newer one wrote it"
    )


class _Unreadable(Exception):
    """An old body that cannot be upcast (the reason is the message)."""


def _upcast(payload: bytes, version: int) -> Event:
    body = _raw_decoder.decode(payload)
    for step in range(version, SCHEMA_VERSION):
        upcaster = UPCASTERS.get(step)
        if upcaster is None:
            raise _Unreadable(f"schema {step} has no upcaster to {step + 1}")
        try:
            body = upcaster(body)
        except Exception as exc:  # an upcaster that failed on a malformed old body
            raise _Unreadable(f"upcasting failed: {exc!r}") from exc
    try:
        upcast = _encoder.encode(body)
    except Exception as exc:  # an upcaster that returned what is not a body (TypeError,
        raise _Unreadable(f"upcasting failed: {exc!r}") from exc  # OverflowError, ...)
    try:
        return _decoder.decode(upcast)
    except msgspec.ValidationError as exc:
        raise _Unreadable(_unknown_tag(upcast) or str(exc)) from exc


def _refusal(
    reason: str,
    payload: bytes,
    subject: str,
    seq: int | None,
    writer: UUID | None = None,
) -> DecodeError:
    if writer is None:
        writer = writer_of(payload)
    return DecodeError(reason, subject=subject, seq=seq, instance_id=writer)

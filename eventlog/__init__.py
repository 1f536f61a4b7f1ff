"""Pulse's write side: event types, their wire codec, and the event log (JetStream and
in-memory backends behind one interface), plus the embedded nats-server; and who may
see what (``eventlog.access``: principals and the rule of "visible to"), below every
layer that filters by it.

The errors come with the package; the other names are imported on first use (PEP 562),
so that a light module of it (``eventlog.errors``, ``eventlog.events``) does not bring
the NATS client into a process that only needs that, such as ``pulse --help``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eventlog.errors import (
    ConflictError,
    DecodeError,
    LogUnavailable,
    NotFoundError,
    PulseError,
    ValidationError,
)
from eventlog.lazy import lazy_names

if TYPE_CHECKING:
    from eventlog.codec import SCHEMA_VERSION, WireMessage, decode_event, encode_event
    from eventlog.embedded import EmbeddedNats, EmbeddedNatsError
    from eventlog.events import Event
    from eventlog.ids import uuid7
    from eventlog.jetstream import JetStreamLog
    from eventlog.log import EventLog, LogEntry
    from eventlog.memory import MemoryLog
    from eventlog.streams import StreamSettings, ensure_streams

_HOMES = {
    "SCHEMA_VERSION": "eventlog.codec",
    "WireMessage": "eventlog.codec",
    "decode_event": "eventlog.codec",
    "encode_event": "eventlog.codec",
    "EmbeddedNats": "eventlog.embedded",
    "EmbeddedNatsError": "eventlog.embedded",
    "Event": "eventlog.events",
    "uuid7": "eventlog.ids",
    "JetStreamLog": "eventlog.jetstream",
    "EventLog": "eventlog.log",
    "LogEntry": "eventlog.log",
    "MemoryLog": "eventlog.memory",
    "StreamSettings": "eventlog.streams",
    "ensure_streams": "eventlog.streams",
}

__all__ = [
    "SCHEMA_VERSION",
    "ConflictError",
    "DecodeError",
    "EmbeddedNats",
    "EmbeddedNatsError",
    "Event",
    "EventLog",
    "JetStreamLog",
    "LogEntry",
    "LogUnavailable",
    "MemoryLog",
    "NotFoundError",
    "PulseError",
    "StreamSettings",
    "ValidationError",
    "WireMessage",
    "decode_event",
    "encode_event",
    "ensure_streams",
    "uuid7",
]


__getattr__ = lazy_names(__name__, _HOMES)

"""Pulse's write side: event types, their wire codec, and the event log (JetStream and
in-memory backends behind one interface), plus the embedded nats-server."""

from eventlog.codec import SCHEMA_VERSION, WireMessage, decode_event, encode_event
from eventlog.embedded import EmbeddedNats, EmbeddedNatsError
from eventlog.errors import (
    ConflictError,
    DecodeError,
    LogUnavailable,
    NotFoundError,
    PulseError,
    ValidationError,
)
from eventlog.events import Event
from eventlog.ids import uuid7
from eventlog.jetstream import JetStreamLog
from eventlog.log import EventLog, LogEntry
from eventlog.memory import MemoryLog
from eventlog.streams import StreamSettings, ensure_streams

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

"""Pulse's own error types. Backend errors (nats-py, JetStream API codes) are translated
into these at the adapter, so callers never handle a library's exceptions."""

from __future__ import annotations

from uuid import UUID


class PulseError(Exception):
    """Base class of every error Pulse raises on purpose."""


class ValidationError(PulseError, ValueError):
    """Input broke a constraint of the data model; the message names the field and limit."""


class NotFoundError(PulseError, LookupError):
    """A referenced entity does not exist (or was deleted)."""


class NotFollowed(NotFoundError):
    """The collective exists, but this host does not follow it (it follows only some
    collectives: ``projections.scope``); the message names what it follows."""


class ConflictError(PulseError):
    """An optimistic-concurrency check failed: the subject moved on since it was read.

    ``expected`` is the last subject sequence the writer assumed; re-read and retry.
    """

    def __init__(self, message: str, *, subject: str = "", expected: int | None = None) -> None:
        super().__init__(message)
        self.subject = subject
        self.expected = expected


class LogUnavailable(PulseError):
    """The event log (NATS JetStream) could not be reached or did not acknowledge in time.

    Nothing was acknowledged; the write may or may not have been stored. Retrying the
    same event is safe: appends are idempotent by event id.
    """


class DecodeError(PulseError):
    """Bytes on the log that are not a Pulse event this version can read, or an event
    whose values or subject this Pulse refuses (see ``eventlog.codec``).

    ``instance_id`` is the instance that wrote it when the body got far enough to say
    (``None`` otherwise), so a dead letter can name the host to look at.
    """

    def __init__(
        self,
        reason: str,
        *,
        subject: str = "",
        seq: int | None = None,
        instance_id: UUID | None = None,
    ) -> None:
        where = f"subject {subject or '?'}, stream sequence {seq if seq is not None else '?'}"
        if instance_id is not None:
            where += f", written by instance {instance_id}"
        super().__init__(f"cannot decode event at {where}: {reason}")
        self.reason = reason
        self.subject = subject
        self.seq = seq
        self.instance_id = instance_id


class QueryLimitExceeded(PulseError):
    """A read-only SQL query (``PulseDB.sql``) ran into a limit of the SQL sandbox
    (``projections.analytics.SqlLimits``): ``limit`` names it ("time" or "memory") and
    ``setting`` the environment variable that sets it. Nothing changed; ask for less."""

    def __init__(self, message: str, *, limit: str, setting: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.setting = setting


class QueryTimedOut(QueryLimitExceeded):
    """The query ran past its time limit and was interrupted (HTTP 408)."""


class QueryOutOfMemory(QueryLimitExceeded):
    """The query needed more memory (and temp-file space) than the sandbox allows
    (HTTP 413)."""


class QueryTooLarge(QueryLimitExceeded):
    """The query's text is longer than the sandbox takes (HTTP 413)."""


class QueryTooComplex(QueryLimitExceeded, ValidationError):
    """The query's parse tree has more nodes, or is nested deeper, than the sandbox takes
    (HTTP 422): binding and planning it could take longer than any time limit reaches."""


class QueryCancelled(PulseError):
    """The query was stopped so that the files could be rewritten after a delete
    (forgetting never waits for readers); nothing is wrong with it: retry (HTTP 503)."""


class Unauthorized(PulseError):
    """No principal could be resolved: no token, an unknown, revoked or expired one."""


class Forbidden(PulseError):
    """The principal is known but may not do this (its scope, or not a member)."""


# the errors another process tells by name (an HTTP error body, a SQL worker's reply)
TOLD = (ValidationError, NotFollowed, NotFoundError, ConflictError, LogUnavailable,
        QueryTimedOut, QueryOutOfMemory, QueryTooLarge, QueryTooComplex, QueryCancelled,
        Unauthorized, Forbidden, PulseError)  # fmt: skip
_TOLD: dict[str, type[PulseError]] = {cls.__name__: cls for cls in TOLD}


def told(kind: str, message: str, *, limit: str = "", setting: str = "") -> PulseError:
    """The error another process names ``kind`` (one of ``TOLD``; a PulseError for any
    other name), with its message; a SQL limit's with its ``limit`` and ``setting``."""
    cls = _TOLD.get(kind, PulseError)
    if issubclass(cls, QueryLimitExceeded):
        return cls(message, limit=limit, setting=setting)
    return cls(message)

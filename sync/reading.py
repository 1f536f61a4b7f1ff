"""Reads of an instance's state: run on the engine thread and awaited, as of now or as of
a moment of the past (``as_of``: a stream sequence, or a time).

Every read of a domain service goes through ``Reader.read``. Inside ``Reader.at`` (a
method decorated with ``as_of_read``) every read answers from the state as of that
moment (``projections.past``), and filters say "true then".
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ParamSpec, Protocol, TypeVar

import msgspec

from eventlog.errors import Forbidden, ValidationError
from eventlog.log import EventLog
from projections import past, queries
from projections.engine import Engine
from sync import models
from sync.access import Principal, Viewer
from sync.hlc import wall_ms
from sync.replication import Replication

T = TypeVar("T")
P = ParamSpec("P")

# the stream sequence the reads of the call in progress answer as of (None: now)
_AS_OF: contextvars.ContextVar[int | None] = contextvars.ContextVar("pulse_as_of", default=None)
# ... and its time (Unix ms): what "true now" means in them
_AS_OF_MS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "pulse_as_of_ms", default=None
)


class Reading(Protocol):
    """What ``as_of_read`` needs of the object whose method it wraps."""

    @property
    def reads(self) -> Reader: ...


def as_of_read(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """A read that takes ``as_of`` (a stream sequence, or a time: Unix ms as a string of
    digits is a sequence, so a time is an ISO 8601 text or a ``datetime``): the method
    runs with every ``Reader.read`` answered from the state as of then
    (``projections.past``). The method lists ``as_of`` in its signature (the request
    models and the docs read it) and leaves it to this wrapper."""

    @functools.wraps(method)
    async def read(self: Reading, *args: Any, as_of: Any = None, **kwargs: Any) -> T:
        async with self.reads.at(as_of):
            return await method(self, *args, **kwargs)  # type: ignore[arg-type]

    return typing.cast(Callable[P, Awaitable[T]], read)


class Reader:
    """Reads on the engine thread, as of the moment of the call in progress.
    ``me``: who the call acts for (a sequence is an admin's moment); ``sync``: waits
    until the host applied what the log holds (a time's moment is read after it)."""

    def __init__(
        self,
        engine: Engine,
        log_: EventLog,
        replication: Replication,
        me: Callable[[], Principal],
        sync: Callable[[], Awaitable[int]],
        partial: Callable[[], bool],
    ) -> None:
        self.engine, self.log, self.replication = engine, log_, replication
        self._me, self._sync, self._partial = me, sync, partial

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a read (``fn(projection, *args, **kwargs)``, e.g. a ``projections.queries``
        function) on the engine thread and await it; as of a moment inside ``at``."""
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        as_of = _AS_OF.get()
        if as_of is not None:
            return await self.engine.run(past.read_as_of, as_of, fn, *args)
        return await self.engine.run(fn, *args)

    @staticmethod
    def as_of() -> int | None:
        """The sequence the reads in progress answer as of (None: now)."""
        return _AS_OF.get()

    @staticmethod
    def moment() -> int | None:
        """The time of the moment the reads in progress answer as of (None: now)."""
        return _AS_OF_MS.get()

    @contextlib.asynccontextmanager
    async def at(self, as_of: Any) -> AsyncIterator[int | None]:
        """Reads inside answer as of ``as_of`` (None: now); yields the sequence."""
        found = None if as_of is None else await self.as_of_seq(as_of)
        if found is None:
            yield None
            return
        seq, ms = found
        if ms is None:  # a sequence: the time of its latest event
            ms = await self.engine.run(past.moment_of, seq)
        token, token_ms = _AS_OF.set(seq), _AS_OF_MS.set(ms)
        try:
            yield seq
        finally:
            _AS_OF.reset(token)
            _AS_OF_MS.reset(token_ms)

    async def as_of_seq(self, as_of: Any) -> tuple[int, int | None] | None:
        """The stream sequence of a moment, and its time when a time was given (None:
        now). A sequence this host has not applied yet is waited for; one past the end
        of the log is refused. A time is the last sequence written at or before it
        (``projections.past.sequence_at``), once this host has applied what the log
        holds."""
        kind, value = models.as_of_value(as_of)
        if kind == "seq":
            me = self._me()
            if not me.admin:  # (what is at a sequence tells how many came before)
                raise Forbidden(
                    f"as_of: a stream sequence counts every host's writes, those "
                    f"{me.describe()} may not see among them; give a time (ISO 8601)"
                )
            replication = self.replication
            if value > replication.applied:
                last = await self.log.last_seq()
                if value > last:
                    raise ValidationError(
                        f"as_of: sequence {value} is past the end of the log (it holds "
                        f"up to {last})"
                    )
                # (a host that follows some collectives waits for the last of their
                # events up to there: it never applies the others)
                if self._partial():
                    last_read = await self.log.last_seq(replication.filters())
                    await replication.wait_applied(min(value, last_read))
                else:
                    await replication.wait_applied(value)
            return value, None
        if value >= wall_ms():
            return None  # now, or a moment still to come: the state now
        await self._sync()
        return await self.engine.run(past.sequence_at, value), value

    # -- filters --------------------------------------------------------------------------

    def filter(self, flt: Any, viewer: Viewer | None = None) -> queries.ExperienceFilter:
        """The filter of a read, and with ``viewer`` what the caller may see."""
        found = given_filter(flt)
        moment = _AS_OF_MS.get()
        if moment is not None and found.at_ms is None:  # as of a moment: "true then"
            found = msgspec.structs.replace(found, at_ms=moment)
        return found if viewer is None else msgspec.structs.replace(found, viewer=viewer)


def given_filter(flt: Any) -> queries.ExperienceFilter:
    """A caller's filter (a ``FilterIn``, its fields, or an ``ExperienceFilter``)."""
    if flt is None:
        return queries.ANY_LIVE
    if isinstance(flt, queries.ExperienceFilter):
        return flt
    model = flt if isinstance(flt, models.FilterIn) else models.validated(models.FilterIn, **flt)
    return queries.ExperienceFilter(
        domains=tuple(model.domains) if model.domains is not None else None,
        source_task=model.source_task,
        experience_types=(
            tuple(model.experience_types) if model.experience_types is not None else None
        ),
        min_importance=model.min_importance,
        min_confidence=model.min_confidence,
        since_ms=model.since_ms,
        include_archived=model.include_archived,
        include_invalid=model.include_invalid,
        valid_at_ms=model.valid_at,
    )

"""The event log on NATS JetStream.

Appends are JetStream publishes with ``Nats-Msg-Id`` set to the event id, retried on
transient failures until ``append_timeout`` runs out (a retry is stored once thanks to
the id), then ``LogUnavailable``. Batches are pipelined (``publish_async``) rather than
JetStream atomic batches, because atomic batches refuse ``Nats-Msg-Id`` and Pulse values
idempotent retries over all-or-nothing batches.

Reads and tails drive an ephemeral pull consumer with raw ``CONSUMER.MSG.NEXT``
requests (no acks, in memory, one replica): two batches requested ahead, idle
heartbeats on live tails, and a fresh consumer from the last delivered sequence + 1
whenever the old one stalls or vanishes (a reconnect, a node that died, a server
restart). That gives resumption without relying on nats-py's ordered consumer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import heapq
import itertools
import json
import logging
import os
import random
import ssl
import time
from collections import deque
from typing import Any, AsyncGenerator, Callable, Iterable, Sequence
from uuid import UUID

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api

from eventlog.codec import HDR_MSG_ID, HDR_SCHEMA, SCHEMA_VERSION, decode_event, encode_event
from eventlog.embedded import NatsCredentials
from eventlog.errors import ConflictError, DecodeError, LogUnavailable, PulseError, ValidationError
from eventlog.events import Event
from eventlog.keys import KeyStore, KvKeyStore
from eventlog.limits import check_clock
from eventlog.log import (
    EXPECTED_LAST_SUBJECT_SEQ,
    HDR_IDEMPOTENCY,
    ConsumerState,
    EventLog,
    LogEntry,
    OwnEvents,
    StreamState,
    key_conflict,
)
from eventlog.reader import read_in_child
from eventlog.streams import (
    TRANSIENT,
    StreamSettings,
    ack_position,
    durability_of,
    ensure_streams,
    publish_atomic,
    subscribe_direct,
)
from eventlog.subjects import PREFIX, is_activity_subject, subject_for, with_bucket

log = logging.getLogger("pulse.eventlog")

# JetStream atomic batches (server 2.12, stream option allow_atomic): raw headers, as
# nats-py has no helper; a batch holds at most 1,000 messages
ATOMIC_BATCH_MAX = 1000

_CONFLICT_CODES = {10071, 10164}  # wrong last sequence (subject / stream)
_TOO_LARGE_CODES = {10054}  # message size exceeds maximum allowed
_IN_FLIGHT_CODES = {10158}  # duplicate message id is in process: the first copy is being stored
_RETRY_PAUSE = 0.05
# how long a round of pipelined publishes waits for its acknowledgements before what is
# missing is published again: 2 s, and 2 ms more per publish (a thousand on a cluster
# that syncs each write take about one second)
_ROUND, _ROUND_EACH = 2.0, 0.002
_SCHEMA = str(SCHEMA_VERSION)  # the schema header of what this Pulse writes
_LIVE_HEARTBEAT = 1.0  # seconds between idle heartbeats on a live tail
_LIVE_EXPIRES = 10.0  # seconds a live pull request stays open
_CONSUMER_IDLE = 60.0  # an abandoned consumer is removed by the server after this
# A consumer's create goes through JetStream's meta leader, whose API queue drops every
# pending request once it holds 10,000: hosts by the thousand must not ask at once. A
# consumer made again (a stall, a server restarted, a leader changed: every host's at
# the same moment) waits a random part of _RECREATE_SPREAD first; a create refused or
# unanswered is asked again after an exponential, jittered back-off (``backoff``).
_RECREATE_SPREAD = 0.5  # seconds (a live tail's lag after a restart grows by half of it)
_BACKOFF_FIRST, _BACKOFF_MOST = 0.2, 5.0  # seconds: the first back-off, and the largest


class _Ack(msgspec.Struct):
    """JetStream's answer to a publish (what Pulse reads of it)."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: dict[str, Any] | None = None


_ack_decoder = msgspec.json.Decoder(_Ack)


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(nats.errors.TimeoutError())


def _translate(
    exc: BaseException, *, subject: str, expected: int | None = None
) -> PulseError | None:
    """Pulse's error for a failed publish, or None when it is worth retrying."""
    if isinstance(exc, nats.js.errors.ServiceUnavailableError):
        return None
    if isinstance(exc, nats.js.errors.APIError):
        if exc.err_code in _IN_FLIGHT_CODES or "in process" in (exc.description or ""):
            return None  # retry: the answer will be the first copy's sequence
        if exc.err_code in _CONFLICT_CODES:
            return ConflictError(
                f"{subject} has moved on (expected last sequence {expected}): {exc.description}; "
                "re-read and retry",
                subject=subject,
                expected=expected,
            )
        if exc.err_code in _TOO_LARGE_CODES:
            return ValidationError(f"event: too large for the log ({exc.description})")
        return LogUnavailable(f"JetStream refused the append to {subject}: {exc.description}")
    if isinstance(exc, nats.errors.MaxPayloadError):
        return ValidationError(f"event: too large for the NATS server's max_payload ({exc})")
    if isinstance(exc, TRANSIENT):
        return None
    if isinstance(exc, (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError)):
        return LogUnavailable("the NATS connection is closed")
    return None


def _without_password(url: str) -> str:
    """``url`` fit for a message: a password in it replaced by ``***``."""
    scheme, sep, rest = url.rpartition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url
    return f"{scheme}{sep}{userinfo.partition(':')[0]}:***@{host}"


def _refusal(exc: BaseException) -> str | None:
    """Why the server refused a connection for good (credentials, certificate), if so."""
    if isinstance(exc, nats.errors.AuthorizationError) or "authorization" in str(exc).lower():
        return (
            "authorization violation: wrong or missing credentials (give the credentials "
            "file: --nats-creds / $PULSE_NATS_CREDS)"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"its TLS certificate cannot be verified ({exc.verify_message}): give the CA "
            "that signed it (--nats-ca / $PULSE_NATS_CA)"
        )
    return None


class JetStreamLog(EventLog):
    """``EventLog`` on NATS JetStream; see the module docstring for how it behaves."""

    def __init__(
        self,
        nc: NATS,
        settings: StreamSettings | None = None,
        *,
        append_timeout: float = 5.0,
        read_timeout: float = 10.0,
        owns_connection: bool = True,
    ) -> None:
        if append_timeout <= 0:
            raise ValidationError(f"append_timeout: must be > 0 seconds, got {append_timeout}")
        self.nc = nc
        self.servers: list[str] = []  # the URLs connected to (a child reader uses them)
        self.credentials: str | None = None  # the credentials file and CA connected with
        self.tls_ca: str | None = None
        self.js = nc.jetstream(timeout=append_timeout)
        # API calls (stream info, consumers) get short timeouts and are retried, so one
        # request lost during a leader election does not eat a whole time budget
        self.admin = nc.jetstream(timeout=2.0)
        self.settings = settings or StreamSettings()
        self._atomic: bool | None = None  # does the main stream take atomic batches?
        self.append_timeout = append_timeout
        self.read_timeout = read_timeout
        self._owns_connection = owns_connection
        # the acknowledgements of appends: one inbox, an answer per reply subject
        self._acks: dict[str, asyncio.Future[Msg]] = {}
        self._ack_prefix: str | None = None
        self._ack_tokens = itertools.count()
        self._ack_subscribing: asyncio.Future[None] | None = None

    def key_store(self) -> KeyStore:
        """The data keys live in the key-value bucket ``<stream>_KEYS`` (``PULSE_KEYS``),
        replicated like the stream, which it never enters (``eventlog.keys``)."""
        store = self._key_store
        if store is None:
            store = self._key_store = KvKeyStore(  # short requests, asked again: one lost
                self.admin, f"{self.settings.name}_KEYS", self.settings.replicas,  # in an
                budget=max(10.0, self.append_timeout),  # election does not eat the budget
                placement=self.settings.placement(),
            )  # fmt: skip
        return store

    @classmethod
    async def connect(
        cls,
        servers: str | Sequence[str],
        settings: StreamSettings | None = None,
        *,
        append_timeout: float = 5.0,
        connect_timeout: float = 5.0,
        create_streams: bool = True,
        update_streams: bool = True,
        name: str = "pulse",
        credentials: str | os.PathLike[str] | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
    ) -> JetStreamLog:
        """Connect to NATS (one URL or a cluster's URLs) and make sure the streams exist.

        ``credentials``: a Pulse credentials file (JSON ``{"user", "password"}``, as
        ``pulse nats-config`` and the embedded server write them); credentials in a URL
        (``nats://user:password@host:port``) work too. ``tls_ca``: the CA certificate
        (PEM) that signed the servers' certificates, for a server that requires TLS.

        Raises ``LogUnavailable`` if NATS cannot be reached within ``connect_timeout``
        or JetStream does not become ready (a cluster electing its leader) in that time,
        and at once if the server refuses the credentials or its certificate.
        """
        urls = [servers] if isinstance(servers, str) else list(servers)
        where = ", ".join(_without_password(url) for url in urls)
        options: dict[str, Any] = {}
        if credentials is not None:
            user = NatsCredentials.load(credentials)
            options.update(user=user.user, password=user.password)
        if tls_ca is not None:
            try:
                options["tls"] = ssl.create_default_context(cafile=os.fspath(tls_ca))
            except (OSError, ssl.SSLError) as exc:
                raise ValidationError(f"nats CA: cannot load {tls_ca} ({exc})") from None
        refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def quiet(exc: Exception) -> None:
            log.debug("nats: %r", exc)
            reason = _refusal(exc)
            if reason and not refused.done():
                refused.set_result(reason)

        nc = NATS()
        connecting: asyncio.Future[Any] = asyncio.ensure_future(
            nc.connect(
                servers=urls,
                name=name,
                connect_timeout=min(connect_timeout, 2.0),  # type: ignore[arg-type]  # seconds
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,  # type: ignore[arg-type]  # (nats-py hints say int)
                error_cb=quiet,
                **options,
            )
        )
        try:
            waiting: set[asyncio.Future[Any]] = {connecting, refused}
            done, _ = await asyncio.wait(
                waiting, timeout=connect_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if connecting in done:
                connecting.result()
            elif refused in done:
                raise LogUnavailable(f"NATS at {where} refused the connection: {refused.result()}")
            else:
                raise TimeoutError(f"no connection within {connect_timeout:g}s")
        except BaseException as exc:
            if not connecting.done():
                connecting.cancel()
                with contextlib.suppress(BaseException):
                    await connecting
            with contextlib.suppress(Exception):  # a connection being set up is closed too
                await asyncio.wait_for(nc.close(), 2.0)  # (nats-py may hang after a TLS error)
            if isinstance(exc, (TimeoutError, OSError, nats.errors.Error)):
                raise LogUnavailable(
                    f"cannot reach NATS at {where} within {connect_timeout:g}s ({exc!r}); "
                    "is the server running? (`pulse up` starts one)"
                ) from exc
            raise
        self = cls(nc, settings, append_timeout=append_timeout)
        self.servers = urls
        self.credentials = os.fspath(credentials) if credentials is not None else None
        self.tls_ca = os.fspath(tls_ca) if tls_ca is not None else None
        if create_streams:
            try:
                await self._retry(
                    lambda: ensure_streams(self.admin, self.settings, update=update_streams),
                    connect_timeout,
                )
                await self.key_store().ready(connect_timeout)  # (its bucket)
            except BaseException:
                await nc.close()
                raise
        return self

    async def _retry(self, action: Any, budget: float) -> Any:
        """Run ``action`` until it succeeds, retrying JetStream's 'not ready yet' errors.
        ``NotFoundError`` (no such stream / message) is an answer, not a failure: it
        propagates as it is."""
        deadline = time.monotonic() + budget
        while True:
            try:
                return await action()
            except nats.js.errors.NotFoundError:
                raise
            except (nats.js.errors.APIError, *TRANSIENT) as exc:
                if isinstance(exc, nats.js.errors.APIError) and exc.code not in (None, 503, 500):
                    raise LogUnavailable(f"JetStream refused: {exc.description}") from exc
                if time.monotonic() >= deadline:
                    raise LogUnavailable(
                        f"JetStream not ready within {budget:g}s ({exc!r})"
                    ) from exc
                await asyncio.sleep(0.1)

    # -- writing ---------------------------------------------------------------------------

    def _publish_args(
        self, event: Event, expected: int | None
    ) -> tuple[str, bytes, dict[str, str], float | None]:
        wire = encode_event(event, bucketed=self.settings.bucketed)
        headers = dict(wire.headers)
        if expected is not None:
            headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected)
        ttl = self.settings.activity_ttl if is_activity_subject(wire.subject) else None
        return wire.subject, wire.payload, headers, ttl

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> int:
        return int((await self._publish(event, expected_last_subject_seq)).seq)

    async def append_keyed(self, event: Event, fingerprint: str) -> tuple[int, Event | None]:
        ack = await self._publish(event, None, {HDR_IDEMPOTENCY: fingerprint})
        seq = int(ack.seq)
        if not ack.duplicate:
            return seq, None
        # a retry: JetStream kept the first copy; what was it asked to do?
        subject = subject_for(event, bucketed=self.settings.bucketed)
        try:
            stored = await self._retry(
                lambda: self.admin.get_msg(self._stream_of(subject), seq), self.append_timeout
            )
        except nats.js.errors.NotFoundError:  # purged (a delete) since
            return seq, event
        if (stored.headers or {}).get(HDR_IDEMPOTENCY) != fingerprint:
            raise key_conflict(subject)
        try:
            return seq, decode_event(stored.data or b"", stored.headers, subject=subject, seq=seq)
        except DecodeError:
            return seq, event

    async def _publish(
        self, event: Event, expected: int | None, extra: dict[str, str] | None = None
    ) -> _Ack:
        """Publish one event until JetStream acknowledges it (retrying what is transient
        within ``append_timeout``); ``extra``: more headers."""
        subject, payload, headers, ttl = self._publish_args(event, expected)
        headers.update(extra or {})
        deadline = time.monotonic() + self.append_timeout
        last_error: BaseException | None = None
        while (remaining := deadline - time.monotonic()) > 0:
            if self.nc.is_closed:
                raise LogUnavailable("the NATS connection is closed")
            try:
                return await self._acknowledged(subject, payload, headers, ttl, min(remaining, 2.0))
            except Exception as exc:  # translated below; unknown errors propagate
                error = _translate(exc, subject=subject, expected=expected)
                if isinstance(error, ConflictError) and expected is not None:
                    # JetStream checks the expected sequence before deduplication, so the
                    # retry of a conditional append whose ack was lost looks like a conflict.
                    # It is not one if this very event is already on the subject.
                    stored = await self._stored_seq(event, subject, expected)
                    if stored:
                        return _Ack(stream=self._stream_of(subject), seq=stored)
                if error is not None:
                    raise error from exc
                if not isinstance(exc, (*TRANSIENT, nats.js.errors.APIError)):
                    raise
                last_error = exc
            await asyncio.sleep(min(_RETRY_PAUSE, max(0.0, deadline - time.monotonic())))
        raise LogUnavailable(
            f"no acknowledgement from JetStream for {subject} within {self.append_timeout:g}s "
            f"(last error: {last_error!r}); the event may or may not be stored, and retrying "
            "it is safe"
        )

    async def _acknowledged(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        ttl: float | None,
        timeout: float,
    ) -> _Ack:
        """``js.publish`` with fewer layers: the reply comes to this log's own inbox (one
        subscription, its messages handed over without a task between: ``_Sink``) and
        resolves a future that one timer bounds; the ack is decoded by msgspec. The
        errors are nats-py's, as ``js.publish`` raises them."""
        if ttl is not None:
            headers[api.Header.MSG_TTL] = str(int(ttl))
        prefix = self._ack_prefix or await self._ack_inbox()
        reply = f"{prefix}{next(self._ack_tokens)}"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Msg] = loop.create_future()
        acks = self._acks
        acks[reply] = future
        try:
            await self.nc.publish(subject, payload, reply=reply, headers=headers)
            timer = loop.call_later(timeout, _expire, future)
            try:
                msg = await future
            finally:
                timer.cancel()
        finally:
            acks.pop(reply, None)
        if msg.headers and msg.headers.get(api.Header.STATUS) == "503":
            raise nats.js.errors.NoStreamResponseError
        try:
            ack = _ack_decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            raise nats.js.errors.APIError(description=f"not an acknowledgement: {exc}") from None
        if ack.error is not None:
            raise nats.js.errors.APIError.from_error(ack.error)
        return ack

    async def _ack_inbox(self) -> str:
        """The prefix of the reply subjects of appends, subscribed to once (nats-py
        subscribes again after a reconnect)."""
        if self._ack_subscribing is None:
            self._ack_subscribing = asyncio.get_running_loop().create_future()
            prefix = f"{self.nc.new_inbox()}."
            try:
                await subscribe_direct(self.nc, f"{prefix}*", self._on_ack)
            except BaseException as exc:
                self._ack_subscribing.set_exception(exc)
                self._ack_subscribing.exception()  # (retrieved: the next append retries)
                self._ack_subscribing = None
                raise
            self._ack_prefix = prefix
            self._ack_subscribing.set_result(None)
        else:
            await asyncio.shield(self._ack_subscribing)
        assert self._ack_prefix is not None
        return self._ack_prefix

    def _on_ack(self, msg: Msg) -> None:
        future = self._acks.pop(msg.subject, None)
        if future is not None and not future.done():
            future.set_result(msg)

    def _stream_of(self, subject: str) -> str:
        return self.settings.activity_name if is_activity_subject(subject) else self.settings.name

    def _held(self, subject: str) -> str:
        """A subject (or filter) as this stream holds it: a collective's with its bucket
        in a stream of bucketed subjects (``eventlog.partitions``; an edge host of a hub
        in partitions), where callers name it without."""
        return with_bucket(subject) if self.settings.bucketed else subject

    def _here(self, subjects: Sequence[str] | None) -> Sequence[str] | None:
        return subjects if subjects is None else [self._held(s) for s in subjects]

    async def _stored_seq(self, event: Event, subject: str, after: int) -> int:
        """The sequence of ``event`` on ``subject`` after sequence ``after``, or 0."""
        stream = self._stream_of(subject)
        async for batch in _pull(self, stream, after + 1, [subject], 256, live=False):
            for entry in batch:
                if entry.event is not None and entry.event.event_id == event.event_id:
                    return int(entry.seq)
        return 0

    async def append_batch(self, events: Sequence[Event], *, atomic: bool = False) -> list[int]:
        """Several events as pipelined publishes; with ``atomic``, as one JetStream atomic
        batch when the stream allows it (one commit and one disk sync for all of them:
        several times faster than pipelined publishes with ``sync_interval: always``).

        An atomic batch cannot carry ``Nats-Msg-Id``, so JetStream does not deduplicate
        it: a batch retried after a lost acknowledgement may be stored twice. The fold is
        idempotent by event id (a create under a known id changes nothing), so a second
        copy changes no state; it only takes room in the stream."""
        if (
            atomic
            and 1 < len(events) <= ATOMIC_BATCH_MAX
            and not any(is_activity_subject(subject_for(e)) for e in events)
        ):
            if self._atomic is None:
                self._atomic = await self._allows_atomic()
            if self._atomic:
                stored = await self._append_atomic(events)
                if stored is not None:
                    return stored
        return await self._append_pipelined(events)

    async def _allows_atomic(self) -> bool:
        try:
            info = await self.admin.stream_info(self.settings.name)
        except Exception:  # unknown: the pipelined path reports what is wrong
            return False
        return bool(getattr(info.config, "allow_atomic", False))

    async def _append_atomic(self, events: Sequence[Event]) -> list[int] | None:
        """Publish ``events`` as one JetStream atomic batch; their sequences, or None when
        the batch was not stored for sure (the caller publishes them the other way)."""
        messages = []
        for event in events:
            wire = encode_event(event, bucketed=self.settings.bucketed)
            headers = {k: v for k, v in wire.headers.items() if k != HDR_MSG_ID}
            messages.append((wire.subject, wire.payload, headers))
        answer = await publish_atomic(self.nc, messages, self.append_timeout)
        if answer is None:
            log.warning("atomic batch not acknowledged; publishing it one by one")
            return None
        last = len(events)
        error = answer.get("error")
        if error is not None or int(answer.get("count", 0)) != last:
            if error is not None and "atomic" in str(error.get("description", "")).lower():
                self._atomic = False  # the stream does not take them: stop trying
            log.warning("atomic batch refused (%s); publishing it one by one", error or answer)
            return None
        end = int(answer["seq"])
        return list(range(end - last + 1, end + 1))

    async def _append_pipelined(self, events: Sequence[Event]) -> list[int]:
        prepared = [self._publish_args(event, None) for event in events]
        seqs = [0] * len(prepared)
        pending = list(range(len(prepared)))
        deadline = time.monotonic() + self.append_timeout
        last_error: BaseException | None = None
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LogUnavailable(
                    f"{len(pending)} of {len(prepared)} events not acknowledged within "
                    f"{self.append_timeout:g}s (last error: {last_error!r}); retrying the batch "
                    "is safe"
                )
            if self.nc.is_closed:
                raise LogUnavailable("the NATS connection is closed")
            futures: dict[int, asyncio.Future[api.PubAck]] = {}
            try:
                # one deadline for the whole round (no per-message timers: they cost more
                # than the publish itself), short enough that what a dying server lost is
                # published again (to the next) within the budget: each is deduplicated
                # by its id, so a second copy of one that did land is dropped
                async with asyncio.timeout(min(remaining, _ROUND + _ROUND_EACH * len(pending))):
                    for i in pending:
                        subject, payload, headers, ttl = prepared[i]
                        futures[i] = await self.js.publish_async(
                            subject, payload, headers=headers, msg_ttl=ttl
                        )
                    await asyncio.wait(futures.values())
            except TimeoutError:
                last_error = TimeoutError("no acknowledgement in time")
            except Exception as exc:
                error = _translate(exc, subject=prepared[i][0])
                if error is not None:
                    raise error from exc
                last_error = exc
            still: list[int] = []
            for i in pending:
                future = futures.get(i)
                if future is None or not future.done():
                    if future is not None:
                        future.cancel()
                    still.append(i)
                    continue
                failure = future.exception()
                if failure is None:
                    seqs[i] = int(future.result().seq)
                    continue
                error = _translate(failure, subject=prepared[i][0])
                if error is not None:
                    raise error from failure
                last_error = failure
                still.append(i)
            pending = still
            if pending:
                await asyncio.sleep(_RETRY_PAUSE)
        return seqs

    # -- reading ---------------------------------------------------------------------------

    async def read(
        self,
        from_seq: int = 1,
        *,
        batch_size: int = 1000,
        subjects: Sequence[str] | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        if batch_size < 1:
            raise ValidationError(f"batch_size: must be >= 1, got {batch_size}")
        end = await self.last_seq()
        if from_seq > end:
            return
        subjects = self._here(subjects)
        if subjects is not None and len(subjects) > 1:
            async for batch in _merged(self, from_seq, subjects, batch_size, end):
                yield batch
            return
        async for batch in _pull(
            self, self.settings.name, from_seq, subjects, batch_size, live=False, end_seq=end
        ):
            yield batch

    async def read_bulk(
        self, from_seq: int = 1, *, batch_size: int = 5000, child_from: int = 20_000
    ) -> AsyncGenerator[list[LogEntry], None]:
        """``read`` for a long stretch (a rebuild, a catch-up): from ``child_from``
        events on, a child process reads and checks while this one folds
        (``eventlog.reader``); the same entries, dead letters included."""
        end = await self.last_seq()
        if end - from_seq + 1 < child_from or not self.servers:
            async for batch in self.read(from_seq, batch_size=batch_size):
                yield batch
            return
        async for batch in read_in_child(
            self.servers, self.settings.name, from_seq, end, batch_size,
            credentials=self.credentials, tls_ca=self.tls_ca,
        ):  # fmt: skip
            yield batch

    async def tail(
        self,
        from_seq: int = 1,
        *,
        subjects: Sequence[str] | None = None,
        own: OwnEvents | None = None,
    ) -> AsyncGenerator[LogEntry, None]:
        async for batch in self.tail_batches(from_seq, subjects=subjects, own=own):
            for entry in batch:
                yield entry

    async def tail_batches(
        self,
        from_seq: int = 1,
        *,
        subjects: Sequence[str] | None = None,
        own: OwnEvents | None = None,
    ) -> AsyncGenerator[list[LogEntry], None]:
        """``tail``, what the consumer's inbox held at a time as one list (never empty):
        what a reader hands on in one go (``sync.replication``)."""
        decode = None
        if own is not None:  # (bucketed: a stream of a log in partitions)
            decode = functools.partial(_decode_own, own, bucketed=self.settings.bucketed)
        async for batch in _pull(
            self,
            self.settings.name,
            from_seq,
            self._here(subjects),
            256,
            live=True,
            decode=decode,
        ):
            if batch:
                yield batch

    async def stream_state(self) -> StreamState:
        name = self.settings.name
        try:
            info = await self._retry(lambda: self.admin.stream_info(name), self.read_timeout)
            readers = await self._retry(lambda: self.admin.consumers_info(name), self.read_timeout)
        except nats.js.errors.NotFoundError as exc:
            raise LogUnavailable(f"stream {name} does not exist; `pulse up` creates it") from exc
        consumers = tuple(
            ConsumerState(
                name=str(c.name),
                filters=tuple(
                    c.config.filter_subjects
                    or ([c.config.filter_subject] if c.config.filter_subject else [])
                ),
                delivered_seq=int(c.delivered.stream_seq if c.delivered else 0),
                pending=int(c.num_pending or 0),
            )
            for c in readers
        )
        sources = tuple(
            {"name": src.name, "lag": int(src.lag or 0), "active_ns": int(src.active or 0)}
            for src in (info.sources or [])
        )
        state, config = info.state, info.config
        return StreamState(
            name=name, messages=int(state.messages), bytes=int(state.bytes),
            first_seq=int(state.first_seq), last_seq=int(state.last_seq),
            replicas=int(config.num_replicas or 1),
            leader=info.cluster.leader if info.cluster else None,
            consumers=consumers, sources=sources,
            # (one server, not a cluster, takes any placement and places nothing by it)
            durability=durability_of(config.placement)
            if info.cluster is not None and info.cluster.name else None,
        )  # fmt: skip

    async def last_seq(self, subjects: Sequence[str] | None = None) -> int:
        if subjects is not None:  # the last message on each filter (wildcards work)
            found = await asyncio.gather(*(self._last_on(self._held(s)) for s in subjects))
            return max(found, default=0)
        try:
            info = await self._retry(
                lambda: self.admin.stream_info(self.settings.name), self.read_timeout
            )
        except nats.js.errors.NotFoundError as exc:
            raise LogUnavailable(
                f"stream {self.settings.name} does not exist; `pulse up` creates it"
            ) from exc
        return int(info.state.last_seq)

    async def _last_on(self, subjects: str) -> int:
        try:
            msg = await self._retry(
                lambda: self.admin.get_last_msg(self.settings.name, subjects), self.read_timeout
            )
        except nats.js.errors.NotFoundError:
            return 0
        return int(msg.seq)

    async def last_subject_seq(self, subject: str) -> int:
        subject = self._held(subject)
        stream = self._stream_of(subject)
        try:
            msg = await self._retry(
                lambda: self.admin.get_last_msg(stream, subject), self.read_timeout
            )
        except nats.js.errors.NotFoundError:
            return 0
        return int(msg.seq)

    async def latest_activities(self, collective_id: UUID | None = None) -> list[LogEntry]:
        subject = f"{PREFIX}.a.{collective_id}.>" if collective_id else f"{PREFIX}.a.>"
        entries: list[LogEntry] = []
        async for batch in _pull(
            self, self.settings.activity_name, 1, [subject], 1000, live=False, last_per_subject=True
        ):
            entries.extend(batch)
        return entries

    async def purge(self, subject: str, *, before_seq: int | None) -> None:
        if before_seq is not None and before_seq < 1:
            raise ValueError(f"before_seq: must be >= 1, got {before_seq}")
        subject = self._held(subject)
        stream = self._stream_of(subject)
        await self._retry(
            lambda: self.admin.purge_stream(stream, seq=before_seq, subject=subject),
            self.append_timeout,
        )

    async def close(self) -> None:
        if self._owns_connection and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.close()


# -- the pull consumer behind read, tail and latest_activities -------------------------------


class _Inbox:
    """Messages delivered to one consumer incarnation's inbox, in arrival order."""

    def __init__(self) -> None:
        self.items: deque[Msg] = deque()
        self.arrived = asyncio.Event()

    def put(self, msg: Msg) -> None:
        self.items.append(msg)
        self.arrived.set()


def _placed(info: api.ConsumerInfo) -> str:
    """The server a consumer runs on (its leader), as the server told."""
    cluster = info.cluster
    return str(cluster.leader) if cluster is not None and cluster.leader else "this server"


def _decode(msg: Msg, seq: int, when: int, bucketed: bool = False) -> LogEntry:
    try:
        event = decode_event(
            msg.data, msg.headers, subject=msg.subject, seq=seq, stored_ms=when,
            bucketed=bucketed,
        )  # fmt: skip
    except DecodeError as exc:
        return LogEntry(seq, msg.subject, None, exc, when)
    return LogEntry(seq, msg.subject, event, None, when)


def _decode_own(own: OwnEvents, msg: Msg, seq: int, when: int, bucketed: bool = False) -> LogEntry:
    """``_decode``, but an event this host wrote (known by its message id and subject)
    comes back as written: only what depends on where the log put it (the time it
    stored it: ``check_clock``) is checked; its body is not decoded again."""
    headers = msg.headers
    msg_id = headers.get(HDR_MSG_ID) if headers else None
    if msg_id is not None and headers.get(HDR_SCHEMA) == _SCHEMA:  # type: ignore[union-attr]
        event = own(msg_id, msg.subject)
        if event is not None:
            try:
                check_clock(event, when)
            except ValueError:
                pass  # a dead letter, as every host reads it: decoded for its reason
            else:
                return LogEntry(seq, msg.subject, event, None, when)
    return _decode(msg, seq, when, bucketed)


async def _merged(
    owner: JetStreamLog, from_seq: int, subjects: Sequence[str], batch_size: int, end: int
) -> AsyncGenerator[list[LogEntry], None]:
    """A read on several subject filters, in stream order: one consumer per filter, their
    entries merged by sequence. nats-server serves a consumer with several filters at a
    cost per message many times that of one filter (measured on 2.15: 60,000 messages
    through 22 filters in ~15 s, through one consumer per filter in ~1.3 s), which would
    make a host that follows many collectives catch up slower than one that follows all
    (``ops.bench.following``). Filters that overlap give an entry once."""
    name = owner.settings.name
    readers = [
        _pull(owner, name, from_seq, [subject], batch_size, live=False, end_seq=end)
        for subject in dict.fromkeys(subjects)
    ]
    held: list[collections.deque[LogEntry]] = [collections.deque() for _ in readers]
    heads: list[tuple[int, int]] = []  # (sequence of a reader's next entry, reader)

    async def refill(i: int) -> None:
        async for batch in readers[i]:
            if batch:
                held[i].extend(batch)
                heapq.heappush(heads, (held[i][0].seq, i))
                return
        # (that reader is done)

    try:
        await asyncio.gather(*(refill(i) for i in range(len(readers))))
        out: list[LogEntry] = []
        last = 0
        while heads:
            _, i = heapq.heappop(heads)
            entry = held[i].popleft()
            if entry.seq != last:  # (overlapping filters deliver one message twice)
                out.append(entry)
                last = entry.seq
            if held[i]:
                heapq.heappush(heads, (held[i][0].seq, i))
            else:
                await refill(i)
            if len(out) >= batch_size:
                yield out
                out = []
        if out:
            yield out
    finally:
        for reader in readers:
            await reader.aclose()


async def cancelled(
    tasks: Iterable[asyncio.Future[Any]], *, within: float = 10.0
) -> set[asyncio.Future[Any]]:
    """Cancel ``tasks`` and wait until they end, cancelling those still running again
    every 0.25 s: nats-py can swallow a cancellation (its ``_flush_pending`` catches
    ``CancelledError``), and a tail cancelled once then reads on. Returns the tasks
    still running after ``within`` seconds (what they raised is taken, not logged)."""
    pending = set(tasks)
    deadline = time.monotonic() + within
    while True:
        for task in [t for t in pending if t.done()]:
            pending.discard(task)
            if not task.cancelled():
                task.exception()  # (retrieved: it ended as it was stopped)
        if not pending or time.monotonic() >= deadline:
            return pending
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=min(0.25, deadline - time.monotonic()))


def backoff(failures: int, *, first: float = _BACKOFF_FIRST, most: float = _BACKOFF_MOST) -> float:
    """Seconds to wait after ``failures`` (>= 1) failed creates in a row: the bound
    doubles from ``first`` up to ``most``, and the wait is drawn from its upper half (so
    hosts that failed together ask again apart, and none asks sooner than half of it)."""
    bound = min(most, first * 2.0 ** min(failures - 1, 32))
    return bound / 2 + random.uniform(0.0, bound / 2)


async def _pull(
    owner: JetStreamLog,
    stream: str,
    from_seq: int,
    subjects: Sequence[str] | None,
    batch_size: int,
    *,
    live: bool,
    end_seq: int | None = None,
    last_per_subject: bool = False,
    decode: Callable[[Msg, int, int], Any] | None = None,
) -> AsyncGenerator[list[Any], None]:
    """Batches of entries from an ephemeral pull consumer, recreated after any stall
    (``decode`` makes each message an entry: ``eventlog.reader_child`` passes its own;
    None: ``_decode``, of the subjects the owner's stream holds)."""
    if from_seq < 1:
        raise ValidationError(f"from_seq: must be >= 1, got {from_seq}")
    if decode is None:
        bucketed = owner.settings.bucketed
        decode = functools.partial(_decode, bucketed=True) if bucketed else _decode
    nc = owner.nc
    next_seq = from_seq
    consumer: str | None = None
    sub: Subscription | None = None
    inbox = _Inbox()
    outstanding = 0  # messages requested but not delivered yet
    delivered = 0  # what the consumer delivered so far, as it counts them
    stall_after = 3 * _LIVE_HEARTBEAT if live else owner.read_timeout
    quiet_since = time.monotonic()  # last time we heard anything, or made progress
    failures = 0  # creates refused or unanswered in a row
    made = False  # a consumer was made before: the next one is made again (spread)

    async def drop() -> None:
        nonlocal consumer, sub, outstanding
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if consumer is not None and not nc.is_closed:
            name = consumer
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await owner.admin.delete_consumer(stream, name)
        consumer, sub, outstanding = None, None, 0

    try:
        while True:
            if consumer is None:
                if nc.is_closed:
                    raise LogUnavailable("the NATS connection is closed")
                if made and failures == 0:  # (every host after a restart: not at once)
                    await asyncio.sleep(random.uniform(0.0, _RECREATE_SPREAD if live else 0.05))
                config = api.ConsumerConfig(
                    ack_policy=api.AckPolicy.NONE,
                    mem_storage=True,
                    num_replicas=1,
                    inactive_threshold=_CONSUMER_IDLE,
                )
                if last_per_subject:
                    config.deliver_policy = api.DeliverPolicy.LAST_PER_SUBJECT
                else:
                    config.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
                    config.opt_start_seq = next_seq
                if subjects:
                    if len(subjects) == 1:
                        config.filter_subject = subjects[0]
                    else:
                        config.filter_subjects = list(subjects)
                try:
                    info = await owner.admin.add_consumer(stream, config=config)
                except Exception as exc:
                    if _translate(exc, subject=stream) is not None and not live:
                        raise LogUnavailable(f"cannot read {stream}: {exc!r}") from exc
                    if not live and time.monotonic() - quiet_since > stall_after:
                        raise LogUnavailable(
                            f"cannot read {stream}: no answer within {stall_after:g}s ({exc!r})"
                        ) from exc
                    failures += 1  # (a read asks again sooner, and not past its budget)
                    wait = backoff(failures, most=_BACKOFF_MOST if live else 1.0)
                    if not live:
                        left = stall_after - (time.monotonic() - quiet_since)
                        wait = max(0.0, min(wait, left))
                    await asyncio.sleep(wait)
                    continue
                consumer, delivered, failures, made = info.name, 0, 0, True
                log.log(
                    logging.INFO if live else logging.DEBUG,
                    "consumer %s on %s from %d (filters %s): on %s, %d pending",
                    consumer, stream, next_seq, subjects, _placed(info), info.num_pending,
                )  # fmt: skip
                inbox = _Inbox()
                sub = await subscribe_direct(nc, nc.new_inbox(), inbox.put)
                outstanding = 0
                quiet_since = time.monotonic()
                if not live and info.num_pending == 0:
                    return  # nothing (more) to read

            # Keep up to two batches requested, so the server never waits for our next
            # request while we decode the last batch.
            while outstanding <= batch_size and sub is not None:
                request: dict[str, Any] = {"batch": batch_size}
                if live:
                    request["expires"] = int(_LIVE_EXPIRES * 1e9)
                    request["idle_heartbeat"] = int(_LIVE_HEARTBEAT * 1e9)
                else:
                    request["expires"] = int(stall_after * 1e9)
                try:
                    await nc.publish(
                        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
                        json.dumps(request).encode(),
                        reply=sub.subject,
                    )
                except Exception:  # reconnecting or buffer full: treat as a stall
                    await drop()
                    await asyncio.sleep(0.2)
                    break
                outstanding += batch_size
            if sub is None:
                continue

            timeout = max(0.0, stall_after - (time.monotonic() - quiet_since))
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
                # cancellation that arrives as the awaited event fires (a heartbeat), and a
                # cancelled tail would then run on forever
                async with asyncio.timeout(timeout):
                    await inbox.arrived.wait()
            except TimeoutError:
                if not live:
                    raise LogUnavailable(
                        f"reading {stream}: no answer within {stall_after:g}s"
                    ) from None
                log.info("pull consumer on %s stalled; resuming from %d", stream, next_seq)
                await drop()
                continue
            inbox.arrived.clear()
            quiet_since = time.monotonic()

            entries: list[Any] = []
            finished = False
            while inbox.items:
                msg = inbox.items.popleft()
                status = msg.headers.get("Status") if msg.headers and not msg.reply else None
                if status is None:
                    seq, count, pending, when = ack_position(msg.reply)
                    outstanding -= 1
                    if count != delivered + 1:  # lost on the way: this consumer never resends
                        log.warning(
                            "consumer %s on %s: delivery %d came after %d (stream sequence "
                            "%d); reading again from %d", consumer, stream, count, delivered,
                            seq, next_seq,
                        )  # fmt: skip
                        await drop()
                        break
                    delivered = count
                    if seq < next_seq and not last_per_subject:
                        continue  # already delivered by an earlier consumer incarnation
                    if end_seq is not None and seq > end_seq:
                        finished = True
                        continue
                    entries.append(decode(msg, seq, when))
                    next_seq = seq + 1
                    if not live and pending == 0:
                        finished = True
                elif status == "100":  # idle heartbeat: the consumer is alive
                    last = msg.headers.get("Nats-Last-Consumer")  # type: ignore[union-attr]
                    if last is not None and int(last) > delivered:  # the last ones lost
                        log.warning(
                            "consumer %s on %s: delivered %s, %d came; reading again "
                            "from %d", consumer, stream, last, delivered, next_seq,
                        )  # fmt: skip
                        await drop()
                        break
                    continue
                elif status in ("404", "408"):  # nothing more now / a request expired
                    unfilled = msg.headers.get("Nats-Pending-Messages")  # type: ignore[union-attr]
                    outstanding = max(0, outstanding - int(unfilled)) if unfilled else 0
                else:  # 409 (consumer deleted, leader change, ...) or anything else: start over
                    log.info("pull consumer on %s: status %s; recreating", stream, status)
                    await drop()
                    break
            if end_seq is not None and next_seq > end_seq:
                finished = True
            for start in range(0, len(entries), batch_size):
                yield entries[start : start + batch_size]
            # handing them over is progress: the consumer's time (a reader child blocked
            # on a full pipe holds this loop) is not the log's silence
            quiet_since = time.monotonic()
            if finished:
                return
    finally:
        await drop()

"""The event log of an edge host: a NATS leaf node with a JetStream domain of its own,
which takes writes while its link to the hub is down and converges when it returns.

Topology (proved on nats-server 2.15; the embedded server's leaf options are in
``eventlog.embedded``)::

    hub  (domain "hub")    PULSE       subjects pulse.c.> pulse.w.> pulse.t.>
                                       + a source per leaf: its PULSE_OUT via $JS.<leaf>.API
    leaf (domain <leaf>)   PULSE_OUT   the same subjects: this host's own writes land here
                           PULSE       no subjects; sources PULSE_OUT (locally) and the
                                       hub's PULSE via $JS.<hub>.API; what the host reads
                           PULSE_ACTIVITY  local: presence on an edge host is local

The link denies ``pulse.>`` both ways, so events cross only as stream sources (never
captured twice). The leaf's PULSE keeps a 24 h duplicate window: the leaf's own events
come back through the hub and are dropped as duplicates (after a longer partition they
are stored again, and the fold, idempotent by event id, ignores the copy).

Sequences. A publish is acknowledged with PULSE_OUT's sequence, but the instance reads
PULSE, and read-your-writes waits for the PULSE sequence of the event. So ``append``
registers the event id before publishing, and ``tail`` resolves it when the event comes
by (PULSE sources PULSE_OUT locally within milliseconds); when no tail runs, or the
publish was a duplicate (an idempotent retry whose first copy went by long ago), the
event is looked up on its subject in PULSE by id. Writes are never atomic batches here
(``Nats-Msg-Id`` on every message: a source must not store a retry twice).

``last_subject_seq`` and expected-last-subject-sequence appends are checked against
PULSE_OUT, this host's own writes: while partitioned there is no global check (no Pulse
write relies on one today).

Forgetting (``purge``) purges the leaf's PULSE and PULSE_OUT, then the hub's PULSE
through the hub's domain, before the tombstone there; when the hub cannot be reached the
purge raises ``LogUnavailable`` and the delete stays owed (``sync.owed``): the instance
finishes it when the link comes back (``on_link_up``) or when it opens again. A delete
made elsewhere purged the hub's PULSE; when the leaf applies its tombstone, or opens
after being away (``sync.instance``), the instance purges the leaf's own copies
(``purge_copy``: its PULSE before the tombstone; its PULSE_OUT before the tombstone if
this host wrote it, else the whole subject). A tombstone is looked for on its own subject
(an entity's few messages, never a whole collective's).

The hub's PULSE has one source per leaf, kept in its configuration, which a leaf reads,
changes and writes whole (JetStream has no compare-and-set on it): two leaves doing so
at once may undo each other's change, so a leaf reads it again until its source is
there, and checks every few seconds while linked that it still is.

Data keys (``eventlog.keys``) follow the same shape::

    hub                    KV_PULSE_KEYS      + a source per leaf: its KV_PULSE_KEYS_OUT,
                                              its subjects mapped to the hub bucket's
    leaf                   KV_PULSE_KEYS_OUT  the keys this host makes (offline too)
                           KV_PULSE_KEYS      no subjects; sources the hub's bucket

so the keys of the hub's events reach the leaf over the link with the events, and the
keys a leaf made offline reach the hub when the link returns (re-added first, before the
events' sources). The leaf reads its own bucket first, then its copy of the hub's
(``LeafKeyStore``). Destroying a key on a leaf writes its marker in its own bucket (the
hub takes it from there) and erases the values in its buckets and, through the hub's
domain, the hub's; offline, that last part stays owed with the delete's purge. A key
destroyed elsewhere is erased from the leaf's buckets when the leaf applies the
tombstone (``destroy_copy``). A leaf does not rotate the key-encryption key (a hub host
does; the new one reaches the leaf with the rewrapped keys).

A hub in partitions (``eventlog.partitions``). An edge host of a hub whose collectives
are spread over ``PULSE_P1`` .. ``PULSE_PN`` keeps one stream of each kind, and writes a
collective's events on their bucketed subjects (``pulse.c.<id>.b<bucket>. ...``), as the
hub's hosts do; it is given the hub's ``partitions`` (``pulse --partitions N``), which
its PULSE_OUT remembers. Then::

    hub   PULSE                 + a source per leaf: its PULSE_OUT, filtered to
                                  pulse.w.> and pulse.t.>
          PULSE_Pk (each k)     + a source per leaf: its PULSE_OUT, filtered to the
                                  buckets of partition k
    leaf  PULSE                 sources PULSE_OUT, and the hub's PULSE and every PULSE_Pk

so each of the edge's events goes to the one hub stream that holds its subject, and
the hub's sourcing of edges is spread over its partitions' leaders rather than one.
The edge learns the hub's N from the hub's PULSE (its metadata) each time it checks its
sources: raised at the hub (``pulse repartition``, which re-filters the edges' sources
at the hub), the edge adds the new partitions to what its PULSE sources. The bucket of
a subject does not depend on N, so an edge's subjects stay as they are. A hub of one
stream and an edge given partitions (or the other way round) would write subjects the
other side refuses: the edge does not register, and says why (``LeafStatus.problem``).

The link. A task polls the leaf server's monitor (``/leafz``, every 0.5 s). The first
time it sees the hub it adds this leaf's PULSE_OUT to the sources of the hub's PULSE;
on every return of the link it drops and re-adds the two cross-domain sources, which
then resume at once instead of after the server's own retry back-off (20-120 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, AsyncGenerator, Sequence, cast

import msgspec
import nats.js.errors
from nats.js import JetStreamContext, api

from eventlog.codec import HDR_MSG_ID, decode_event
from eventlog.embedded import EmbeddedNats
from eventlog.errors import DecodeError, LogUnavailable, PulseError, ValidationError
from eventlog.events import Event
from eventlog.jetstream import JetStreamLog, _pull, cancelled
from eventlog.keys import (
    Arrived,
    Destroyed,
    Found,
    KeyStore,
    KvKeyStore,
    Stop,
    bucket_config,
)
from eventlog.log import HDR_IDEMPOTENCY, LogEntry, OwnEvents, key_conflict
from eventlog.partitions import TARGET_KEY, Layout, partitions_in
from eventlog.streams import StreamSettings
from eventlog.subjects import DURABLE_SUBJECTS, is_activity_subject, subject_for

log = logging.getLogger("pulse.eventlog.leaf")

LEAF_DUPLICATE_WINDOW = 24 * 3600.0  # seconds: own events coming back through the hub
LINK_POLL = 0.5  # seconds between looks at the link
CHECK_EVERY = 10  # link polls between checks that the hub still sources this leaf
_FIRST_WAIT = 1.0  # seconds an append waits for the tail before looking the event up


class LeafStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A leaf host's link to its hub, in ``PulseDB.status`` (``pulse status``).

    ``outbound_backlog``: this host's events the hub does not hold yet; exact while the
    link is up (``backlog_exact``), else at least that many (counted from the last time
    the hub was seen). ``inbound_lag``: the hub's events this host has not sourced yet,
    as last known. ``last_up_ms``: the last time the link was seen up (None: not since
    this host opened)."""

    link: str  # "up" or "down"
    domain: str  # this leaf's JetStream domain
    hub_domain: str
    hub: str | None  # the hub server's name (link up)
    rtt: str | None
    outbound_backlog: int
    backlog_exact: bool
    inbound_lag: int | None
    last_up_ms: int | None
    # why this host does not send its events to the hub although the link is up (its
    # log's form and the hub's differ: ``partitions``); None: nothing keeps it from it
    problem: str | None = None


def out_name(settings: StreamSettings) -> str:
    return f"{settings.name}_OUT"


def keys_name(settings: StreamSettings) -> str:
    """The key bucket every host reads (the hub's; an edge host's copy of it)."""
    return f"{settings.name}_KEYS"


def keys_out_name(settings: StreamSettings) -> str:
    """An edge host's own key bucket: the keys it makes."""
    return f"{settings.name}_KEYS_OUT"


def keys_out_source(settings: StreamSettings, **external: Any) -> api.StreamSource:
    """A leaf's own key bucket as a source of the hub's, its subjects mapped to it."""
    return api.StreamSource(
        name=f"KV_{keys_out_name(settings)}",
        subject_transforms=[
            api.SubjectTransform(
                src=f"$KV.{keys_out_name(settings)}.>", dest=f"$KV.{keys_name(settings)}.>"
            )
        ],
        **external,
    )


def hub_streams(settings: StreamSettings, partitions: int) -> list[str]:
    """The hub's streams of durable events (``partitions``: the hub's N): its first
    stream, then its partitions."""
    if partitions == 1:
        return [settings.name]
    layout = Layout(partitions, settings.name)
    return [layout.stream(part) for part in layout.parts]


def out_source(
    settings: StreamSettings, partitions: int, part: int, **external: Any
) -> api.StreamSource:
    """A leaf's PULSE_OUT as a source of the hub's stream ``part`` (of ``partitions``):
    filtered to the subjects that stream holds (a hub of one stream: all of it)."""
    transforms = None
    if partitions > 1:
        transforms = [
            api.SubjectTransform(src=subject, dest="")  # (no destination: a filter)
            for subject in Layout(partitions, settings.name).subjects(part)
        ]
    return api.StreamSource(name=out_name(settings), subject_transforms=transforms, **external)


def _form(partitions: int) -> str:
    return "in partitions" if partitions > 1 else "of one stream"


def _api(domain: str) -> str:
    return f"$JS.{domain}.API"


def _is_external(source: Any, prefix: str) -> bool:
    external = source.get("external") if isinstance(source, dict) else source.external
    if external is None:
        return False
    return (external.get("api") if isinstance(external, dict) else external.api) == prefix


def _source_key(source: api.StreamSource) -> tuple[str, str | None]:
    return source.name, source.external.api if source.external else None


async def edge_settings(js: JetStreamContext, settings: StreamSettings) -> StreamSettings:
    """The settings of an edge host's log: ``settings`` with the partitions its PULSE_OUT
    remembers when they name none (1, the default: a data directory opened again without
    them), else checked against them (subjects of a hub of one stream, or of one in
    partitions: a stream holds one form)."""
    try:
        info = await js.stream_info(out_name(settings))
    except nats.js.errors.NotFoundError:
        return settings
    held = partitions_in(info.config.metadata)
    if settings.partitions == 1:
        return dataclasses.replace(settings, partitions=held)
    if held == 1:
        raise ValidationError(
            f"partitions: this edge host's log was made for a hub of one stream and "
            f"{settings.partitions} partitions were given; open it without --partitions, or "
            "on a new data directory with the hub's (it catches up from the hub)"
        )
    return settings


async def ensure_leaf_streams(
    js: JetStreamContext, settings: StreamSettings, hub_domain: str
) -> None:
    """Create a leaf's streams if missing (see the module docstring); safe to repeat."""
    out = dataclasses.replace(
        settings.main_config(),
        name=out_name(settings),
        subjects=list(DURABLE_SUBJECTS),  # (a hub in partitions: collectives' too)
        description="Pulse edge host: the events written here, sourced by the hub",
        # a delete made offline is retried when the link returns, maybe hours later: its
        # tombstone must still be known here, not stored (and sourced to the hub) again
        duplicate_window=max(settings.duplicate_window, LEAF_DUPLICATE_WINDOW),
        allow_atomic=False,
    )
    main = dataclasses.replace(
        settings.main_config(),
        description="Pulse edge host: every durable event (this host's and the hub's)",
        subjects=None,
        duplicate_window=max(settings.duplicate_window, LEAF_DUPLICATE_WINDOW),
        allow_atomic=False,
        sources=[
            api.StreamSource(name=out.name or ""),
            *(
                api.StreamSource(name=stream, external=api.ExternalStream(api=_api(hub_domain)))
                for stream in hub_streams(settings, settings.partitions)
            ),
        ],
    )
    keys_out = bucket_config(
        keys_out_name(settings), settings.replicas,
        description="Pulse edge host: the data keys made here, sourced by the hub",
    )  # fmt: skip
    keys = dataclasses.replace(
        bucket_config(
            keys_name(settings), settings.replicas, subjects=False,
            sources=[api.StreamSource(
                name=f"KV_{keys_name(settings)}",
                external=api.ExternalStream(api=_api(hub_domain)),
            )],
            description="Pulse edge host: the hub's data keys",
        ),
        # a subject nothing publishes on: a stream left with neither subjects nor sources
        # (its source dropped to be re-added, see LeafLog._readd_sources) would be given
        # its own name as one
        subjects=[f"_PULSE.{keys_name(settings)}.copy"],
    )  # fmt: skip
    for config in (out, main, settings.activity_config(), keys_out, keys):
        try:
            info = await js.stream_info(config.name or "")
        except nats.js.errors.NotFoundError:
            await js.add_stream(config)
            continue
        if config is main or config is keys:
            if config is main and info.config.subjects:
                raise ValidationError(
                    f"leaf_of: this data directory's stream {settings.name} takes subjects: "
                    "it belongs to a host that was not a leaf; give the leaf a new data "
                    "directory (it catches up from the hub)"
                )
            held = list(info.config.sources or [])
            have = {_source_key(h) for h in held}
            missing = [s for s in main.sources or [] if _source_key(s) not in have]
            if missing:
                await js.update_stream(dataclasses.replace(info.config, sources=held + missing))


class LeafKeyStore(KeyStore):
    """An edge host's data keys (see the module docstring): made in its own bucket,
    read from it and from its copy of the hub's."""

    def __init__(self, leaf: LeafLog) -> None:
        settings = leaf.settings
        self.own = KvKeyStore(leaf.admin, keys_out_name(settings), settings.replicas)
        # its copy of the hub's bucket (made by ensure_leaf_streams), and the hub's own
        # through the hub's domain (only to erase there)
        self.hubs = KvKeyStore(leaf.admin, keys_name(settings), settings.replicas, create=False)
        self.hub = KvKeyStore(
            leaf.nc.jetstream(domain=leaf.hub_domain, timeout=1.0), keys_name(settings),
            create=False, budget=1.0,
        )  # fmt: skip

    async def ready(self, budget: float | None = None) -> None:
        await self.own.ready(budget)

    async def get(self, name: str) -> Found:
        own = await self.own.get(name)
        if isinstance(own, Destroyed):
            return own
        copied = await self.hubs.get(name)
        if copied is not None or own is not None:
            return own if copied is None else copied
        try:  # not in the copy yet (its source resuming after the link came back)
            return await self.hub.get(name)
        except Exception:  # the link is down: not here yet
            return None

    async def create(self, name: str, value: bytes) -> Found:
        copied = await self.hubs.get(name)
        if copied is not None:  # made (or destroyed) at the hub: that one
            return copied
        return await self.own.create(name, value)

    async def put_fresh(self, values: dict[str, bytes]) -> None:
        await self.own.put_fresh(values)  # (new entities: nothing of them at the hub)

    async def replace(self, name: str, old: bytes, value: bytes) -> bool:
        raise PulseError(
            "rotating the key-encryption key is done on a host of the hub, not an edge host"
        )

    async def destroy(self, name: str) -> None:
        await self.own.destroy(name)  # its marker: the hub takes it from this bucket
        await self.hubs.erase_values(name)
        try:
            await self.hub.erase_values(name)
        except Exception as exc:  # the link is down: the delete stays owed (sync.owed)
            raise LogUnavailable(f"erasing the hub's copy of {name}: {exc!r}") from exc

    async def destroy_copy(self, name: str) -> None:
        await self.own.erase_values(name)
        await self.hubs.erase_values(name)

    async def watch(self, arrived: Arrived) -> Stop:
        """The keys arriving in the copy of the hub's bucket; a deletion marker arriving
        there erases what the copy (and this host's bucket) holds of its name, so a
        value that reached the copy after its tombstone was applied does not stay."""
        erasing: set[asyncio.Future[None]] = set()

        def heard(name: str, value: bytes | None) -> None:
            arrived(name, value)
            if value is None:
                task = asyncio.ensure_future(self._erase_late(name))
                erasing.add(task)
                task.add_done_callback(erasing.discard)

        stop_hearing = await self.hubs.watch(heard)

        async def stop() -> None:
            await stop_hearing()
            await cancelled(erasing, within=5)

        return stop

    async def _erase_late(self, name: str) -> None:
        try:
            await self.destroy_copy(name)
        except Exception:
            log.warning("erasing this host's copy of the key %s failed", name, exc_info=True)

    async def names(self, prefix: str = "") -> list[str]:
        return sorted({*await self.own.names(prefix), *await self.hubs.names(prefix)})

    async def items(self, prefix: str = "") -> dict[str, bytes]:
        return {**await self.own.items(prefix), **await self.hubs.items(prefix)}


class LeafLog(JetStreamLog):
    """``JetStreamLog`` of a leaf host; see the module docstring."""

    server: EmbeddedNats
    hub_domain: str
    domain: str

    @classmethod
    async def open_leaf(
        cls,
        server: EmbeddedNats,
        settings: StreamSettings | None = None,
        *,
        hub_domain: str = "hub",
        append_timeout: float = 5.0,
        connect_timeout: float = 30.0,
    ) -> LeafLog:
        """Connect to a started leaf ``server``, make its streams, watch its link."""
        if server.leaf_of is None or server.domain is None:
            raise ValidationError("leaf_of: the server is not a leaf node")
        if hub_domain == server.domain:
            raise ValidationError(
                f"hub_domain: {hub_domain!r} is the leaf's own domain; they must differ"
            )
        self = cast(
            LeafLog,
            await cls.connect(
                [server.url], settings, append_timeout=append_timeout,
                connect_timeout=connect_timeout, create_streams=False,
            ),
        )  # fmt: skip
        self.server, self.hub_domain, self.domain = server, hub_domain, server.domain
        try:
            self.settings = await self._retry(
                lambda: edge_settings(self.admin, self.settings),
                connect_timeout,
            )
            self._hub_partitions = self.settings.partitions  # (until the hub says)
            await self._retry(
                lambda: ensure_leaf_streams(self.admin, self.settings, hub_domain),
                connect_timeout,
            )
        except BaseException:
            await self.nc.close()
            raise
        self._link_task = asyncio.create_task(self._watch_link(), name="pulse-leaf-link")
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._awaiting: dict[str, tuple[asyncio.Future[int], int]] = {}  # id -> (seq, users)
        self._tails = 0
        self._link_task: asyncio.Task[None] | None = None
        self._link_up = False
        self._hub_name: str | None = None
        self._rtt: str | None = None
        self._last_up_ms: int | None = None
        self._hub_seq = 0  # the last of PULSE_OUT the hub was seen holding
        self._hub_partitions = 1  # the hub's N, as last read (open_leaf, _register_with_hub)
        self._problem: str | None = None  # why this host does not register (LeafStatus)
        self.heals = 0  # times the link came back and the sources were re-added
        # called (in the background) each time the link comes back: the instance finishes
        # the purges a delete made offline still owes the hub (``sync.owed``)
        self.on_link_up: Callable[[], Awaitable[object]] | None = None
        self._reacting: asyncio.Future[object] | None = None

    # -- writing ---------------------------------------------------------------------------

    def _stream_of(self, subject: str) -> str:
        if is_activity_subject(subject):
            return self.settings.activity_name
        return out_name(self.settings)

    def _register(self, event: Event) -> asyncio.Future[int]:
        key = str(event.event_id)
        found = self._awaiting.get(key)
        if found is None or found[0].done():
            found = (asyncio.get_running_loop().create_future(), 0)
        self._awaiting[key] = (found[0], found[1] + 1)
        return found[0]

    def _release(self, event: Event) -> None:
        key = str(event.event_id)
        found = self._awaiting.get(key)
        if found is not None:
            if found[1] <= 1:
                del self._awaiting[key]
            else:
                self._awaiting[key] = (found[0], found[1] - 1)

    async def _main_seq(
        self, event: Event, future: asyncio.Future[int], deadline: float, *, look_now: bool
    ) -> int:
        """The sequence in PULSE of ``event`` (published to PULSE_OUT): from the tail,
        or looked up on its subject (see the module docstring)."""
        wait = 0.0 if look_now or not self._tails else _FIRST_WAIT
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(wait, deadline - time.monotonic()))):
                    return await asyncio.shield(future)
            if future.done():
                return future.result()
            found = await self._find_in_main(event)
            if found:
                return found
            if time.monotonic() >= deadline:
                raise LogUnavailable(
                    f"event {event.event_id} was stored in {out_name(self.settings)} but did "
                    f"not reach {self.settings.name} within {self.append_timeout:g}s; it "
                    "will (the stream sources it), and retrying the write is safe"
                )
            wait = 0.1

    async def _find_in_main(self, event: Event) -> int:
        subject = subject_for(event, bucketed=self.settings.bucketed)
        async for batch in _pull(self, self.settings.name, 1, [subject], 256, live=False):
            for entry in batch:
                if entry.event is not None and entry.event.event_id == event.event_id:
                    return int(entry.seq)
        return 0

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> int:
        if is_activity_subject(subject_for(event)):
            return await super().append(event, expected_last_subject_seq=expected_last_subject_seq)
        future = self._register(event)
        try:
            deadline = time.monotonic() + self.append_timeout
            ack = await self._publish(event, expected_last_subject_seq)
            return await self._main_seq(event, future, deadline, look_now=bool(ack.duplicate))
        finally:
            self._release(event)

    async def append_keyed(self, event: Event, fingerprint: str) -> tuple[int, Event | None]:
        future = self._register(event)
        try:
            deadline = time.monotonic() + self.append_timeout
            ack = await self._publish(event, None, {HDR_IDEMPOTENCY: fingerprint})
            if not ack.duplicate:
                return await self._main_seq(event, future, deadline, look_now=False), None
            # a retry: PULSE_OUT kept the first copy; what was it asked to do?
            subject = subject_for(event, bucketed=self.settings.bucketed)
            try:
                stored = await self._retry(
                    lambda: self.admin.get_msg(out_name(self.settings), int(ack.seq)),
                    self.append_timeout,
                )
            except nats.js.errors.NotFoundError:  # purged (a delete) since
                return await self._find_in_main(event), event
            if (stored.headers or {}).get(HDR_IDEMPOTENCY) != fingerprint:
                raise key_conflict(subject)
            seq = await self._main_seq(event, future, deadline, look_now=True)
            try:
                return seq, decode_event(
                    stored.data or b"", stored.headers, subject=subject, seq=seq
                )
            except DecodeError:
                return seq, event
        finally:
            self._release(event)

    async def append_batch(self, events: Sequence[Event], *, atomic: bool = False) -> list[int]:
        """Pipelined publishes to PULSE_OUT, each deduplicated by id (never atomic here:
        see the module docstring); their sequences in PULSE."""
        if any(is_activity_subject(subject_for(e)) for e in events):
            return [await self.append(e) for e in events]
        futures = [self._register(e) for e in events]
        try:
            deadline = time.monotonic() + self.append_timeout
            await self._append_pipelined(events)
            return [
                await self._main_seq(e, f, deadline, look_now=False)
                for e, f in zip(events, futures, strict=True)
            ]
        finally:
            for e in events:
                self._release(e)

    # -- reading ---------------------------------------------------------------------------

    async def tail(
        self,
        from_seq: int = 1,
        *,
        subjects: Sequence[str] | None = None,
        own: OwnEvents | None = None,
    ) -> AsyncGenerator[LogEntry, None]:
        self._tails += 1
        try:
            async for entry in super().tail(from_seq, subjects=subjects, own=own):
                if self._awaiting and entry.event is not None:
                    found = self._awaiting.get(str(entry.event.event_id))
                    if found is not None and not found[0].done():
                        found[0].set_result(entry.seq)
                yield entry
        finally:
            self._tails -= 1

    # -- forgetting ------------------------------------------------------------------------

    async def purge(self, subject: str, *, before_seq: int | None) -> None:
        """Purge the leaf's PULSE, its PULSE_OUT and the hub's PULSE (module docstring);
        ``LogUnavailable`` when the hub cannot be reached (the purge stays owed)."""
        if is_activity_subject(subject):
            await super().purge(subject, before_seq=before_seq)
            return
        subject = self._held(subject)
        tombstone, own_subject = await self._purge_here(subject, before_seq)
        hub_stream = self._hub_stream_of(subject)
        hub = self.nc.jetstream(domain=self.hub_domain, timeout=2.0)
        hub_seq: int | None = None
        if tombstone is not None:
            deadline = time.monotonic() + self.append_timeout
            while not (hub_seq := await self._seq_by_id(hub, hub_stream, own_subject, tombstone)):
                if time.monotonic() >= deadline:
                    raise LogUnavailable(
                        f"forgetting {subject}: the hub (domain {self.hub_domain}) does not "
                        f"hold the tombstone yet (link {'up' if self._link_up else 'down'}); "
                        "purged on this host, and the hub's copy is purged when the instance "
                        "opens again (an owed purge) or when the delete is repeated"
                    )
                await asyncio.sleep(0.1)
        try:
            await hub.purge_stream(hub_stream, seq=hub_seq, subject=subject)
        except Exception as exc:
            raise LogUnavailable(
                f"forgetting {subject}: cannot purge the hub's {hub_stream} ({exc!r})"
            ) from exc

    def _hub_stream_of(self, subject: str) -> str:
        """The hub's stream that holds ``subject`` (bucketed, of one collective)."""
        if self._hub_partitions == 1:
            return self.settings.name
        layout = Layout(self._hub_partitions, self.settings.name)
        part = layout.part_of_subject(subject)
        if part is None:
            raise ValidationError(f"subject: {subject!r} spans partitions; purge one collective")
        return layout.stream(part)

    async def purge_copy(self, subject: str, *, before_seq: int) -> None:
        """Forget, in this leaf's own streams, what a delete forgot (``sync.core`` calls
        this for every tombstone it applies, whoever wrote it): the hub's copy is the
        deleting host's to purge, the leaf's are this host's (``_purge_here``)."""
        await self._purge_here(subject, before_seq)

    async def _purge_here(self, subject: str, before_seq: int | None) -> tuple[str | None, str]:
        """Purge the leaf's PULSE before the tombstone at ``before_seq`` (everything:
        None), and its PULSE_OUT: before the tombstone there when this host wrote it (the
        hub may not have it yet), else the whole subject (what this host wrote of a
        deleted entity is dead, before the tombstone or after). Returns the tombstone's
        event id (None: not in the leaf's PULSE) and its own subject (where it is
        looked for: an entity's subject holds a few messages, a collective's many)."""
        if before_seq is not None and before_seq < 1:
            raise ValueError(f"before_seq: must be >= 1, got {before_seq}")
        subject = self._held(subject)
        tombstone: str | None = None
        own_subject = subject
        if before_seq is not None:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                msg = await self._retry(
                    lambda: self.admin.get_msg(self.settings.name, before_seq), self.append_timeout
                )
                tombstone = (msg.headers or {}).get(HDR_MSG_ID)
                own_subject = msg.subject or subject
        await self._retry(
            lambda: self.admin.purge_stream(self.settings.name, seq=before_seq, subject=subject),
            self.append_timeout,
        )
        out = out_name(self.settings)
        out_seq = 0
        if tombstone is not None:
            out_seq = await self._seq_by_id(self.admin, out, own_subject, tombstone, local=True)
        await self._retry(
            lambda: self.admin.purge_stream(out, seq=out_seq or None, subject=subject),
            self.append_timeout,
        )
        return tombstone, own_subject

    async def _seq_by_id(
        self, js: JetStreamContext, stream: str, subject: str, msg_id: str, *, local: bool = False
    ) -> int:
        """The sequence of the message ``msg_id`` on ``subject`` in ``stream`` (0: none),
        walking the subject's messages (``next_by_subj``) one request at a time."""
        seq = 1
        while True:
            try:
                msg = await js.get_msg(stream, seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                return 0
            except Exception:
                if local:
                    raise
                return 0
            found = int(msg.seq or 0)
            if (msg.headers or {}).get(HDR_MSG_ID) == msg_id or not found:
                return found
            seq = found + 1

    # -- the link --------------------------------------------------------------------------

    def _leafz(self) -> dict[str, Any]:
        url = f"{self.server.monitor_url}/leafz"
        with urllib.request.urlopen(url, timeout=1.0) as response:  # noqa: S310 (loopback)
            return dict(json.loads(response.read()))

    async def _look_at_link(self) -> bool:
        try:
            leafz = await asyncio.to_thread(self._leafz)
        except (OSError, ValueError):
            return False
        leafs = leafz.get("leafs") or []
        up = bool(leafz.get("leafnodes")) and bool(leafs)
        self._hub_name = str(leafs[0].get("name")) if up else None
        self._rtt = str(leafs[0].get("rtt")) if up else None
        if up:
            self._last_up_ms = int(time.time() * 1000)
        return up

    async def _watch_link(self) -> None:
        registered = False
        rounds = 0
        while True:
            up = await self._look_at_link()
            rounds += 1
            if up and self._link_up and rounds % CHECK_EVERY == 0:
                try:  # (another leaf's change of the hub's sources may have undone ours;
                    await self._register_with_hub()  # the hub's partitions may be more)
                except Exception as exc:
                    log.info("checking this leaf's sources at the hub failed (%r)", exc)
            if up and not self._link_up:
                try:
                    if not registered:
                        await self._register_with_hub()
                        registered = True
                    await self._readd_sources()
                    self.heals += 1
                    if self.on_link_up is not None and (
                        self._reacting is None or self._reacting.done()
                    ):
                        self._reacting = asyncio.ensure_future(self.on_link_up())
                    log.info("link to the hub (domain %s) up; sources resumed", self.hub_domain)
                except ValidationError:  # (_register_with_hub told it: the status says it)
                    up = False
                except Exception as exc:  # the hub's API may need a moment: next round
                    log.info("link up but the hub's JetStream did not answer yet (%r)", exc)
                    up = False
            elif self._link_up and not up:
                log.warning("link to the hub (domain %s) down; writing locally", self.hub_domain)
            self._link_up = up
            await asyncio.sleep(LINK_POLL)

    async def _register_with_hub(self) -> None:
        """Have this leaf's key bucket among the sources of the hub's, its PULSE_OUT among
        those of each of the hub's streams (filtered to what each holds), and each of the
        hub's streams among those of its PULSE (keys first: an event is opened with its
        key). The hub's N is read here (its PULSE's metadata): more after a raise."""
        hub = self.nc.jetstream(domain=self.hub_domain, timeout=2.0)
        metadata = (await hub.stream_info(self.settings.name)).config.metadata or {}
        if TARGET_KEY in metadata:  # (its sources are being re-filtered: after that)
            raise LogUnavailable(f"the hub's partitions are being raised to {metadata[TARGET_KEY]}")
        partitions = partitions_in(metadata)
        if (partitions > 1) != self.settings.bucketed:  # (a raise from one stream, too)
            problem = (
                f"partitions: the hub's log is {_form(partitions)} ({partitions} "
                f"partition(s)) and this edge host's was made {_form(self.settings.partitions)}"
                f" ({self.settings.partitions}): their subjects differ, so this host's events "
                "do not go to the hub; open it on a new data directory with the hub's "
                "--partitions (it catches up from the hub)"
            )
            if self._problem != problem:  # (told once; the status says it until mended)
                log.error("%s", problem)
            self._problem = problem
            raise ValidationError(problem)
        self._problem = None
        self._hub_partitions = partitions
        mine, theirs = _api(self.domain), _api(self.hub_domain)
        external = api.ExternalStream(api=mine)
        keys = keys_out_source(self.settings, external=external)
        await self._add_source(hub, f"KV_{keys_name(self.settings)}", keys)
        streams = hub_streams(self.settings, partitions)
        for part, stream in enumerate(streams):
            source = out_source(self.settings, partitions, part, external=external)
            await self._add_source(hub, stream, source)
        for stream in streams:
            source = api.StreamSource(name=stream, external=api.ExternalStream(api=theirs))
            await self._add_source(self.admin, self.settings.name, source)

    async def _add_source(self, js: JetStreamContext, stream: str, source: Any) -> None:
        """Add ``source`` to the sources of ``js``'s ``stream`` unless one of its name and
        domain is there (its filters as they are: a raise of the hub's partitions sets
        them). A stream's configuration is read, changed and written whole, with no check
        that nobody changed it meanwhile: two leaves doing so at once can undo each
        other's change. So it is read again until the source is there (and the link
        watcher checks every few seconds that it still is)."""
        key = _source_key(source)
        for _ in range(10):
            config = (await js.stream_info(stream)).config
            if any(_source_key(s) == key for s in config.sources or []):
                return
            await js.update_stream(
                dataclasses.replace(config, sources=[*(config.sources or []), source])
            )
        raise LogUnavailable(f"cannot keep source {key[0]} ({key[1]}) on {stream}")

    async def _readd_sources(self) -> None:
        """Drop and re-add the cross-domain sources: they resume now (where they were).
        The key buckets' first: an event is opened with its key."""
        hub = self.nc.jetstream(domain=self.hub_domain, timeout=2.0)
        mine, theirs = _api(self.domain), _api(self.hub_domain)
        buckets = f"KV_{keys_name(self.settings)}"
        targets = [
            (self.admin, buckets, theirs), (hub, buckets, mine),
            (self.admin, self.settings.name, theirs),
            *((hub, stream, mine) for stream in hub_streams(self.settings, self._hub_partitions)),
        ]  # fmt: skip
        readded: list[tuple[JetStreamContext, str, list[Any]]] = []
        for js, stream, prefix in targets:
            config = (await js.stream_info(stream)).config
            sources = list(config.sources or [])
            keep = [s for s in sources if not _is_external(s, prefix)]
            if len(keep) == len(sources):
                continue
            await js.update_stream(dataclasses.replace(config, sources=keep))
            ours = [s for s in sources if _is_external(s, prefix)]
            for source in ours:
                await self._add_source(js, stream, source)
            readded.append((js, stream, ours))
        for js, stream, ours in readded:  # once more, all done: another leaf may have
            for source in ours:  # undone one meanwhile
                await self._add_source(js, stream, source)

    def key_store(self) -> KeyStore:
        """This host's key bucket and its copy of the hub's (``LeafKeyStore``)."""
        store = self._key_store
        if store is None:
            store = self._key_store = LeafKeyStore(self)
        return store

    async def leaf_status(self) -> LeafStatus:
        up = await self._look_at_link()
        out = await self._retry(
            lambda: self.admin.stream_info(out_name(self.settings)), self.read_timeout
        )
        last = int(out.state.last_seq)
        inbound: int | None = None
        with contextlib.suppress(Exception):
            info = json.loads(
                (await self.nc.request(f"$JS.API.STREAM.INFO.{self.settings.name}", b"", 2.0)).data
            )
            for source in info.get("sources") or []:
                if _is_external(source, _api(self.hub_domain)):
                    inbound = (inbound or 0) + int(source.get("lag") or 0)
        exact = False
        backlog = None
        if up:  # each of the hub's streams' source of this host's PULSE_OUT
            streams = hub_streams(self.settings, self._hub_partitions)
            seen: list[tuple[int, int]] = []  # (the last of PULSE_OUT it took, its lag)
            for stream in streams:
                with contextlib.suppress(Exception):
                    subject = f"{_api(self.hub_domain)}.STREAM.INFO.{stream}"
                    info = json.loads((await self.nc.request(subject, b"", 2.0)).data)
                    for source in info.get("sources") or []:
                        if _is_external(source, _api(self.domain)):
                            seen.append((int(source.get("seq") or 0), int(source.get("lag") or 0)))
            if len(seen) == len(streams):
                exact = True
                self._hub_seq = max(seq for seq, _ in seen)
                # (a filtered source takes the last of its own: the rest, its lag)
                backlog = sum(lag for _, lag in seen) if len(streams) > 1 else None
        return LeafStatus(
            link="up" if up else "down", domain=self.domain, hub_domain=self.hub_domain,
            hub=self._hub_name, rtt=self._rtt, backlog_exact=exact,
            outbound_backlog=max(0, last - self._hub_seq) if backlog is None else backlog,
            inbound_lag=inbound, last_up_ms=self._last_up_ms, problem=self._problem,
        )  # fmt: skip

    async def close(self) -> None:
        await cancelled((t for t in (self._link_task, self._reacting) if t is not None), within=2)
        self._link_task = self._reacting = None
        await super().close()

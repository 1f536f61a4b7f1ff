"""Stream settings and their idempotent creation on JetStream.

``PULSE`` holds every durable event (subjects ``pulse.c.>`` and ``pulse.w.>``), kept
forever (only forgetting purges it); in a log in partitions (``partitions`` >= 2:
``eventlog.partitions``) it holds wisdom and tokens, and ``PULSE_P1`` ... ``PULSE_PN``
the collectives. ``PULSE_ACTIVITY`` holds presence: the last message
per agent subject (``max_msgs_per_subject=1``), each expiring after ``activity_ttl``.

Durability is the servers' (``sync_interval`` is a server setting, and nats-server 2.15
cannot change it by a reload: a node is restarted). A server Pulse's tools configure is
tagged with its durability (``durability_tag``): ``fsync`` (``sync_interval: always``:
an acknowledged write is on disk on a quorum) or ``replicated`` (acknowledged once a
quorum holds it, written to disk on the server's interval). ``StreamSettings.durability``
places Pulse's streams, and its key bucket, on servers of that tag (JetStream placement
tags), so one cluster may hold both kinds of server, and ``pulse up --durability``
moves the streams from one kind to the other (JetStream moves a stream whose placement
changes, its messages with it). Unset, the streams go where JetStream puts them, and an
update keeps the placement they have.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError as JsNotFound

from eventlog.errors import LogUnavailable, ValidationError
from eventlog.partitions import METADATA_KEY, Layout, check_partitions, partitions_in
from eventlog.subjects import ACTIVITY_SUBJECTS, DURABLE_SUBJECTS

log = logging.getLogger("pulse.eventlog")

# what NATS answers while a stream is not ready (created a moment ago, electing a leader,
# a reconnect): worth asking again, within a time budget
TRANSIENT = (
    nats.errors.TimeoutError,
    asyncio.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)

BATCH_ID, BATCH_SEQ, BATCH_COMMIT = "Nats-Batch-Id", "Nats-Batch-Sequence", "Nats-Batch-Commit"
BATCH_MAX = 1000  # messages one JetStream atomic batch may hold


async def publish_atomic(
    nc: Any, messages: Sequence[tuple[str, bytes, dict[str, str]]], timeout: float
) -> dict[str, Any] | None:
    """Publish ``messages`` (subject, payload, headers; at most ``BATCH_MAX``) as one
    JetStream atomic batch: all stored or none, one commit. The server's answer to the
    commit (``seq``, ``count``, or ``error``), or None when none came in time."""
    batch_id = uuid.uuid4().hex
    last = len(messages)
    try:
        async with asyncio.timeout(timeout):
            for number, (subject, payload, headers) in enumerate(messages, 1):
                sent = {**headers, BATCH_ID: batch_id, BATCH_SEQ: str(number)}
                if number < last:
                    await nc.publish(subject, payload, headers=sent)
                    continue
                sent[BATCH_COMMIT] = "1"
                reply = await nc.request(subject, payload, headers=sent, timeout=timeout)
    except (TimeoutError, nats.errors.Error):
        return None  # (the caller says what it does instead)
    try:
        answer = json.loads(reply.data)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


DURABILITY = ("fsync", "replicated")
DURABILITY_TAG = "pulse-durability:"  # a server tag: this prefix, then one of DURABILITY


def durability_tag(durability: str) -> str:
    """The server tag of servers of a durability (``pulse-durability:fsync``)."""
    return DURABILITY_TAG + durability


def check_durability(durability: str | None, field: str = "durability") -> None:
    if durability is not None and durability not in DURABILITY:
        raise ValidationError(
            f"{field}: must be one of {', '.join(DURABILITY)}, got {durability!r}"
        )


def durability_of(placement: api.Placement | None) -> str | None:
    """The durability a stream's placement asks for (None: it asks for none)."""
    for tag in (placement.tags if placement is not None else None) or []:
        if tag.startswith(DURABILITY_TAG) and tag[len(DURABILITY_TAG) :] in DURABILITY:
            return tag[len(DURABILITY_TAG) :]
    return None


# 100 KB of content plus a 4096-dimension float32 embedding (16 KB) plus tags, files and
# a structured experience type fit with room to spare; nats-server's default max_payload.
DEFAULT_MAX_MSG_SIZE = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """How Pulse's two streams are configured (the same on every host of a deployment)."""

    name: str = "PULSE"
    activity_name: str = "PULSE_ACTIVITY"
    replicas: int = 1
    duplicate_window: float = 120.0  # seconds within which a retried event id is dropped
    max_msg_size: int = DEFAULT_MAX_MSG_SIZE
    activity_ttl: float = 3600.0  # seconds an activity message is kept without a heartbeat
    # the servers that hold the streams and the key bucket: those tagged with this
    # durability (``durability_tag``); None: wherever JetStream puts them
    durability: str | None = None
    # consumers a stream may hold at once: a host's tail is one, a read one while it
    # reads. nats-server 2.15 caps a stream that sets none (or -1) at 1,000, so the
    # 1,001st host of a deployment would be refused ("maximum consumers limit reached")
    max_consumers: int = 100_000
    # how many streams hold the collectives (``eventlog.partitions``): 1, this stream
    # holds everything; N >= 2, this one holds wisdom and tokens, N others collectives
    partitions: int = 1
    # which of them these settings make: 0, the stream named ``name``; k >= 1, partition
    # k (``partition(k)`` gives its settings, named after the first)
    part: int = 0

    def __post_init__(self) -> None:
        check_durability(self.durability)
        check_partitions(self.partitions)
        if not 0 <= self.part <= (0 if self.partitions == 1 else self.partitions):
            raise ValidationError(
                f"part: must be 0..{self.partitions if self.partitions > 1 else 0}, got {self.part}"
            )
        if not 1 <= self.replicas <= 5:
            raise ValidationError(
                f"replicas: must be 1..5 (1 or 3 in practice), got {self.replicas}"
            )
        if self.duplicate_window <= 0:
            raise ValidationError(
                f"duplicate_window: must be > 0 seconds, got {self.duplicate_window}"
            )
        if not 64 * 1024 <= self.max_msg_size <= 64 * 1024 * 1024:
            raise ValidationError(
                f"max_msg_size: must be 64 KiB..64 MiB, got {self.max_msg_size} bytes"
            )
        if not 1_000 <= self.max_consumers <= 10_000_000:
            raise ValidationError(
                f"max_consumers: must be 1000..10000000, got {self.max_consumers}"
            )
        if self.activity_ttl < 1:
            raise ValidationError(f"activity_ttl: must be >= 1 second, got {self.activity_ttl}")
        for field in ("name", "activity_name"):
            value = getattr(self, field)
            if not value or any(c in value for c in " .*>\t\n/\\"):
                raise ValidationError(f"{field}: {value!r} is not a valid stream name")

    @property
    def bucketed(self) -> bool:
        """Are collectives' subjects those of a log in partitions (with their bucket)?"""
        return self.partitions > 1

    def partition(self, part: int) -> StreamSettings:
        """The settings of stream ``part`` of a log in partitions (``eventlog.partitions``:
        0 is this one)."""
        name = Layout(self.partitions, self.name).stream(part)
        return dataclasses.replace(self, name=name, part=part)

    def main_config(self) -> api.StreamConfig:
        if self.partitions == 1:
            subjects = list(DURABLE_SUBJECTS)
            what = "every durable event (collectives, experiences, relations, insights, wisdom)"
        elif self.part == 0:
            subjects = Layout(self.partitions).subjects(0)
            what = f"wisdom and access tokens (collectives: {self.partitions} partitions)"
        else:
            subjects = Layout(self.partitions).subjects(self.part)
            what = f"the collectives of partition {self.part} of {self.partitions}"
        return api.StreamConfig(
            name=self.name,
            description=f"Pulse: {what}",
            subjects=subjects,
            metadata={METADATA_KEY: str(self.partitions)} if self.partitions > 1 else None,
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            num_replicas=self.replicas,
            duplicate_window=self.duplicate_window,
            max_msg_size=self.max_msg_size,
            allow_direct=True,
            allow_atomic=True,  # batch writes commit together (see JetStreamLog.append_batch)
            placement=self.placement(),
            max_consumers=self.max_consumers,
        )

    def placement(self) -> api.Placement | None:
        """Where the streams go: the servers tagged with ``durability``."""
        return None if self.durability is None else rewritten(None, self.durability)

    def activity_config(self) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.activity_name,
            description="Pulse: agent activities, the last message per agent, expiring",
            subjects=list(ACTIVITY_SUBJECTS),
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            num_replicas=self.replicas,
            duplicate_window=min(self.duplicate_window, self.activity_ttl),
            max_msg_size=self.max_msg_size,
            max_msgs_per_subject=1,
            max_age=max(self.activity_ttl, self.duplicate_window),
            allow_msg_ttl=True,
            allow_direct=True,
            placement=self.placement(),
            max_consumers=self.max_consumers,
        )


async def ensure_streams(
    js: JetStreamContext, settings: StreamSettings, *, update: bool = True
) -> None:
    """Create both streams if missing; with ``update``, bring existing ones to
    ``settings``. Safe to repeat.

    Instances pass ``update=False``: one host started with other settings (say R1 on a
    cluster that runs R3) must not reconfigure the deployment's streams behind the
    operator's back; ``pulse up`` (the operator's command) updates them. The one change
    made without ``update`` is additive: a subject this version writes to that a stream
    made by an older one lacks (``pulse.t.>`` for tokens) is added to it, and nothing
    else of its configuration is touched.
    """
    configs: tuple[api.StreamConfig, ...] = (settings.main_config(),)
    if settings.part == 0:  # (the activity stream is one, a partition's settings make none)
        configs += (settings.activity_config(),)
    infos: list[api.StreamInfo | None] = []
    for config in configs:  # (each stream asked about once)
        try:
            infos.append(await js.stream_info(config.name))  # type: ignore[arg-type]
        except JsNotFound:
            infos.append(None)
    if infos[0] is not None and settings.part == 0:
        _same_partitions(infos[0], settings)
    if update and settings.durability is not None:
        for info in infos:
            if info is not None:
                _no_move_and_scale(info, settings)
        held: api.StreamInfo | None = None  # (the log's one key bucket: the first stream's)
        if settings.part == 0:  # the key bucket first: refused, it leaves the streams be
            with contextlib.suppress(JsNotFound):  # (none: made on first use, placed)
                held = await js.stream_info(f"KV_{settings.name}_KEYS")
        if held is not None and durability_of(held.config.placement) != settings.durability:
            moved = dataclasses.replace(
                held.config, placement=rewritten(held.config.placement, settings.durability)
            )
            replicas = int(held.config.num_replicas or 1)
            await placed(js.update_stream(moved), settings, replicas=replicas)
    for config, info in zip(configs, infos, strict=True):
        if info is None:
            await placed(js.add_stream(config), settings)
            continue
        if update:  # keeping the sources added since (the leaf nodes': eventlog.leaf)
            if info.config.sources and not config.sources:
                config = dataclasses.replace(config, sources=info.config.sources)
            # the placement: kept, but for its durability tag (its cluster, other tags)
            where: api.Placement | None = info.config.placement
            if settings.durability is not None:
                where = rewritten(where, settings.durability)
            config = dataclasses.replace(config, placement=where)
            await placed(js.update_stream(config), settings)
            continue
        subjects = list(info.config.subjects or [])
        missing = [s for s in config.subjects or [] if s not in subjects]
        if missing:
            await js.update_stream(dataclasses.replace(info.config, subjects=subjects + missing))


def partitions_of(info: api.StreamInfo) -> int:
    """How many partitions the log whose first stream is ``info`` has (its metadata; a
    stream made before partitions, or of one, says none: 1)."""
    return partitions_in(info.config.metadata)


def _same_partitions(info: api.StreamInfo, settings: StreamSettings) -> None:
    """Refuse settings of another number of partitions than the log's: the streams'
    subjects would move buckets from one stream to another, their messages left behind."""
    held = partitions_of(info)
    if held != settings.partitions:
        raise ValidationError(
            f"partitions: the log {info.config.name} is in {held} partition(s) and "
            f"{settings.partitions} were asked; a deployment's partitions are set when it is "
            "made (give every host the same number)"
        )


def _no_move_and_scale(info: api.StreamInfo, settings: StreamSettings) -> None:
    """Refuse, before anything changes, an update that would move a stream and change its
    replicas at once: JetStream does one or the other."""
    held = durability_of(info.config.placement)
    replicas = int(info.config.num_replicas or 1)
    if held != settings.durability and replicas != settings.replicas:
        raise ValidationError(
            f"replicas, durability: {info.config.name} has {replicas} replica(s) on "
            f"{held or 'untagged'} servers; JetStream moves a stream or changes its "
            f"replicas, not both at once: run `pulse up` with --replicas {replicas} and the "
            "new --durability, then with the new --replicas"
        )


def rewritten(placement: api.Placement | None, durability: str) -> api.Placement:
    """A placement asking for the servers of ``durability``: its cluster and its other
    tags kept, its durability tag (if any) replaced."""
    if placement is None:
        return api.Placement(tags=[durability_tag(durability)])
    tags = [t for t in placement.tags or [] if not t.startswith(DURABILITY_TAG)]
    return api.Placement(cluster=placement.cluster, tags=[*tags, durability_tag(durability)])


NO_PEERS = 10005  # JetStream's error codes: no servers fit the placement;
MOVE_AND_SCALE = 10123  # a move and a change of replicas asked in one update;
MOVING = 10124  # a move asked while one is under way


async def placed(request: Any, settings: StreamSettings, *, replicas: int | None = None) -> Any:
    """A stream's create or update, with JetStream's refusals to place it told as what
    the operator asked for (``durability``, ``replicas``) and what to do."""
    try:
        return await request
    except nats.js.errors.APIError as exc:
        count = settings.replicas if replicas is None else replicas
        if exc.err_code == NO_PEERS and settings.durability is not None:
            raise ValidationError(
                f"durability: no {count} server(s) tagged "
                f"{durability_tag(settings.durability)!r} to hold {count} replica(s) "
                f"({exc.description}); a server Pulse configured carries its tag "
                "(`pulse nats-config --durability`, or `server_tags` in nats.conf)"
            ) from exc
        if exc.err_code == MOVE_AND_SCALE:
            raise ValidationError(
                "replicas, durability: JetStream moves a stream or changes its replicas, "
                f"not both at once ({exc.description}); run `pulse up` with the stream's "
                "present --replicas and the new --durability, then with the new --replicas"
            ) from exc
        if exc.err_code == MOVING:
            raise LogUnavailable(
                f"durability: the stream is being moved ({exc.description}); start "
                "`pulse up` again once the move is done (`pulse status` shows its leader)"
            ) from exc
        raise


# -- what a delivery says of itself ----------------------------------------------------


def ack_position(reply: str) -> tuple[int, int, int, int]:
    """(stream sequence, the consumer's count of deliveries with this one, messages still
    pending, the time JetStream stored the message in ms since the epoch) from the ack
    subject a delivered message carries. A consumer that acknowledges nothing counts
    1, 2, 3, ...: a count that skips one is a delivery lost on its way (a reconnect, a
    route to a server that died), which the consumer never sends again."""
    tokens = reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
        return int(tokens[5]), int(tokens[6]), int(tokens[8]), int(tokens[7]) // 1_000_000
    # $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>...
    return int(tokens[7]), int(tokens[8]), int(tokens[10]), int(tokens[9]) // 1_000_000


# -- a subscription without nats-py's callback task -------------------------------------


class Sink:
    """Stands in for the queue where nats-py leaves a subscription's messages (its
    ``_pending_queue``, of a subscription made without a callback): each message is
    handed to ``put`` as nats-py reads it, on the loop. A callback would run in a task
    of the subscription's own, one more wake-up of the loop per message (an ack and a
    tail message per write)."""

    __slots__ = ("put_nowait",)

    def __init__(self, put: Callable[[Msg], None]) -> None:
        self.put_nowait = put

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True


async def subscribe_direct(nc: NATS, subject: str, put: Callable[[Msg], None]) -> Subscription:
    """A subscription to ``subject`` whose messages go to ``put`` (see ``Sink``); no
    slow-consumer bound (``put`` keeps nothing waiting in nats-py)."""
    sub = await nc.subscribe(subject, pending_bytes_limit=0)
    queue = sub._pending_queue
    sub._pending_queue = Sink(put)  # type: ignore[assignment]
    while not queue.empty():  # (none can have arrived: nothing asked for them yet)
        put(queue.get_nowait())
    return sub

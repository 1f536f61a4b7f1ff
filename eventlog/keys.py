"""Data keys: what makes forgetting reach every copy (crypto-shredding).

Every experience, insight, relation, session and wisdom has its own data key (AES-256).
The events that carry its text or its vector are sealed with it (``eventlog.sealing``),
so the log, every host's NATS store and every backup hold only ciphertext of them.
Deleting the entity destroys its key: every copy of those events, wherever it lies, is
noise from then on.

The keys live apart from the log, in a key store every host reads (``KeyStore``): a
JetStream key-value bucket (``KvKeyStore``: ``PULSE_KEYS``, replicated like the stream)
or, beside a ``MemoryLog``, a dict. A key is stored wrapped (encrypted) with the
key-encryption key (KEK), itself in the store under ``kek.<id>``, the current one named by
``kek``. ``Keyring.rotate`` makes a new KEK, wraps every data key again with it and
erases the old one, so a copy of a destroyed data key that outlived its erasure
(a store's block not yet rewritten, a copy of the bucket) can no longer be unwrapped.

A key is destroyed by leaving a deletion marker in its place and erasing its value
from the store (overwritten on disk, not only unlinked: ``KvKeyStore.destroy``). The
marker is what lets a host tell "destroyed" (the entity is forgotten: its sealed events
fold to nothing) from "not here yet" (a key another host wrote that has not reached this
store: wait for it). Markers hold only the name.

Names: ``c.<collective id>.<entity>.<entity id>`` for what lives in a collective (so a
collective's keys are destroyed together), ``w.<wisdom id>`` for wisdom.

Keys made ahead (``Keyring.take``): a host keeps, per kind of entity and collective, a
few ids of entities to come whose keys it already stored, made ``POOL`` at a time in one
write of the store (one disk sync). A new entity then takes one, and its record is a
single synced write (its event) instead of two (the event and its key). Such a key is
stored before any event sealed with it exists, so a reader never waits for it; a
collective's delete destroys the unused ones with the rest of its prefix; a host that
stops leaves at most ``POOL`` unused keys per pool behind (keys of nothing: they wrap
no data, and go with their collective).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import json
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar
from uuid import UUID

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    ServiceUnavailableError,
)
from nats.js.errors import NotFoundError as JsNotFound
from nats.js.kv import KeyValue

from eventlog.errors import LogUnavailable, PulseError
from eventlog.ids import uuid7
from eventlog.streams import (
    BATCH_MAX,
    NO_PEERS,
    TRANSIENT,
    ack_position,
    publish_atomic,
    subscribe_direct,
)

T = TypeVar("T")
Arrived = Callable[[str, bytes | None], None]
Stop = Callable[[], Awaitable[None]]

log = logging.getLogger(__name__)

KEY_BYTES = 32  # AES-256
KID_BYTES = 8  # a KEK's id
NONCE_BYTES = 12
CURRENT = "kek"  # the name of the pointer to the current KEK
CURRENT_TTL = 1.0  # seconds a host trusts its idea of the current KEK (see rotate)
ROTATION_GRACE = 3.0  # seconds between a rotation's first pass and erasing the old KEK
SCAN_PAGE = 1000  # names a scan asks for at a time
SCAN_WAIT = 10.0  # seconds a scan waits for the next of them, then begins again
_EXPECT_NOTHING = "Nats-Expected-Last-Subject-Sequence"  # "0": the subject holds nothing
CONCURRENCY = 256  # store requests in flight at once
PRELOAD_STRETCH = 10_000  # keys a preload unwraps between two pauses for the event loop
KEYS_CACHED = 500_000  # data keys a host keeps unwrapped in memory (about 100 MB at most)
POOL = 64  # keys made ahead per (entity, collective), stored in one write (Keyring.take)
POOL_LOW = 32  # ... made again in the background once fewer are left
Made = tuple[UUID, str, bytes]  # a key made ahead: its entity's id, its name, the key
Scope = tuple[str, UUID | None]  # a pool's: (entity, collective id)


def key_name(entity: str, entity_id: UUID, collective_id: UUID | None) -> str:
    """The store name of an entity's data key."""
    if entity == "wisdom":
        return f"w.{entity_id}"
    if collective_id is None:
        raise ValueError(f"a {entity}'s key is named under its collective")
    return f"c.{collective_id}.{entity}.{entity_id}"


def collective_prefix(collective_id: UUID) -> str:
    """The prefix of every key name of a collective's entities."""
    return f"c.{collective_id}."


class Destroyed:
    """What the store holds for a destroyed key: its marker."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DESTROYED"


DESTROYED = Destroyed()
Found = bytes | Destroyed | None  # a value, a deletion marker, or nothing (yet)


class KeyStore(abc.ABC):
    """Where wrapped keys live: names to opaque values, shared by every host."""

    @abc.abstractmethod
    async def get(self, name: str) -> Found:
        """The value stored under ``name``, ``DESTROYED``, or None (never stored)."""

    @abc.abstractmethod
    async def create(self, name: str, value: bytes) -> Found:
        """Store ``value`` unless ``name`` already holds something; returns what ``name``
        holds now (``value``, an earlier value, or ``DESTROYED``)."""

    @abc.abstractmethod
    async def replace(self, name: str, old: bytes, value: bytes) -> bool:
        """Store ``value`` under ``name`` if it still holds ``old`` (a KEK rotation: never
        bringing back a key destroyed meanwhile); returns whether it did."""

    @abc.abstractmethod
    async def destroy(self, name: str) -> None:
        """Erase the value of ``name`` for good and leave its deletion marker. Idempotent."""

    @abc.abstractmethod
    async def names(self, prefix: str = "") -> list[str]:
        """The names that hold a value, under ``prefix``."""

    async def items(self, prefix: str = "") -> dict[str, bytes]:
        """Every name under ``prefix`` that holds a value, with it."""
        names = await self.names(prefix)
        found = await gather_limited(self.get(n) for n in names)
        return {n: v for n, v in zip(names, found, strict=False) if isinstance(v, bytes)}

    async def ready(self, budget: float | None = None) -> None:
        """Wait until the store answers (a bucket made a moment ago, a leader elected
        after a node failed), up to ``budget`` seconds (the store's own by default)."""
        return None

    async def put_fresh(self, values: dict[str, bytes]) -> None:
        """Store the keys of entities made just now (fresh ids: their names never held
        anything), all at once. Raises if a name held something already."""
        for name, value in values.items():
            held = await self.create(name, value)
            if held != value:
                raise PulseError(f"{name}: a data key exists already for a new entity")

    async def watch(self, arrived: Arrived) -> Stop:
        """Call ``arrived(name, value or None for a marker)`` for every key written from
        now on, where the store can tell (a host learns of other hosts' new keys before
        it needs them); returns what stops it."""

        async def stop() -> None:
            return None

        return stop

    async def destroy_copy(self, name: str) -> None:
        """Erase this host's own copy of a key destroyed by another host, where it has
        one (an edge host's buckets: ``eventlog.leaf``); a store every host shares has
        none."""
        return None

    async def close(self) -> None:
        return None


async def gather_limited(coros: Iterable[object], limit: int = CONCURRENCY) -> list[object]:
    """Await coroutines with at most ``limit`` in flight; their results in order."""
    gate = asyncio.Semaphore(limit)
    pending = list(coros)
    started: set[int] = set()

    async def one(at: int, coro: object) -> object:
        started.add(at)
        try:
            async with gate:
                return await coro  # type: ignore[misc]
        finally:  # cancelled while it waited at the gate: never started, closed unawaited
            coro.close()  # type: ignore[attr-defined]

    try:
        return list(await asyncio.gather(*(one(at, c) for at, c in enumerate(pending))))
    finally:  # cancelled before some of them began (their tasks never ran): close those
        for at, coro in enumerate(pending):
            if at not in started:
                coro.close()  # type: ignore[attr-defined]


class MemoryKeyStore(KeyStore):
    """The key store beside a ``MemoryLog``: a dict (tests and simulations)."""

    def __init__(self) -> None:
        self._values: dict[str, bytes | Destroyed] = {}

    async def get(self, name: str) -> Found:
        return self._values.get(name)

    async def create(self, name: str, value: bytes) -> Found:
        return self._values.setdefault(name, value)

    async def replace(self, name: str, old: bytes, value: bytes) -> bool:
        if self._values.get(name) != old:
            return False
        self._values[name] = value
        return True

    async def destroy(self, name: str) -> None:
        self._values[name] = DESTROYED

    async def names(self, prefix: str = "") -> list[str]:
        return sorted(
            n for n, v in self._values.items() if n.startswith(prefix) and isinstance(v, bytes)
        )

    async def items(self, prefix: str = "") -> dict[str, bytes]:
        return {
            n: v for n, v in self._values.items() if n.startswith(prefix) and isinstance(v, bytes)
        }


def bucket_config(
    bucket: str,
    replicas: int,
    *,
    subjects: bool = True,
    sources: list[api.StreamSource] | None = None,
    description: str = "Pulse: the data keys of entities (eventlog.keys)",
    placement: api.Placement | None = None,
) -> api.StreamConfig:
    """The stream of a key bucket: as nats-py makes a KV bucket's
    (``nats.js.client.create_key_value``) but for ``deny_delete``, since a destroyed key's
    message must be erased by its sequence. ``subjects=False``: a bucket filled by its
    ``sources`` only (an edge host's copy of the hub's)."""
    return api.StreamConfig(
        name=f"KV_{bucket}",
        description=description,
        subjects=[f"$KV.{bucket}.>"] if subjects else None,
        sources=sources,
        allow_direct=True,
        allow_rollup_hdrs=True,
        deny_delete=False,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=120.0,
        max_consumers=-1,
        max_msgs=-1,
        max_msgs_per_subject=2,  # a marker keeps the value it replaces until it is erased
        num_replicas=replicas,
        allow_atomic=True,  # the keys of a batch of new entities, stored together
        storage=api.StorageType.FILE,
        placement=placement,  # the stream's durability (eventlog.streams)
    )


class KvKeyStore(KeyStore):
    """Keys in a JetStream key-value bucket (one value per name, replicated like the
    stream). Destroying a key writes its deletion marker (``KeyValue.delete``), then
    erases the value it replaced through ``STREAM.MSG.DELETE``, which overwrites the
    record in the store's block on every replica (a purge, or the marker alone, would
    leave the bytes there). Requests NATS answers with "not ready" (a bucket created a
    moment ago, a leader election) are asked again for up to ``budget`` seconds, then
    raise ``LogUnavailable``."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        replicas: int = 1,
        *,
        budget: float = 10.0,
        create: bool = True,
        placement: api.Placement | None = None,
    ) -> None:
        self.js = js
        self.placement = placement
        self.bucket = bucket
        self.replicas = replicas
        self.budget = budget
        self.create_missing = create  # False: a bucket made elsewhere (an edge host's copy)
        self._queued: list[tuple[dict[str, bytes], asyncio.Future[None]]] = []
        self._flushing: asyncio.Future[None] | None = None
        self._kv: KeyValue | None = None
        self._opening = asyncio.Lock()

    @property
    def stream(self) -> str:
        return f"KV_{self.bucket}"

    async def _retrying(self, action: Callable[[], Awaitable[T]]) -> T:
        deadline = time.monotonic() + self.budget
        pause = 0.02
        while True:
            try:
                return await action()
            except TRANSIENT as exc:
                if time.monotonic() >= deadline:
                    raise LogUnavailable(
                        f"the key store {self.bucket} did not answer within {self.budget:g}s "
                        f"({exc!r})"
                    ) from exc
                await asyncio.sleep(pause)
                pause = min(2 * pause, 0.5)

    async def kv(self) -> KeyValue:
        if self._kv is None:
            async with self._opening:
                if self._kv is None:
                    self._kv = await self._retrying(self._open)
        return self._kv

    async def ready(self, budget: float | None = None) -> None:
        """Create the bucket if it is missing, and wait until it answers reads."""
        usual = self.budget
        self.budget = max(usual, budget or 0.0)  # (opening: nothing else asks meanwhile)
        try:
            await self.get(CURRENT)
        finally:
            self.budget = usual

    async def _open(self) -> KeyValue:
        try:
            return await self.js.key_value(self.bucket)
        except (JsNotFound, BadRequestError):
            if not self.create_missing:
                raise
        try:
            await self.js.add_stream(
                bucket_config(self.bucket, self.replicas, placement=self.placement)
            )
        except BadRequestError as exc:  # another host created it meanwhile
            if exc.err_code == NO_PEERS:  # (or no servers fit the streams' placement)
                raise LogUnavailable(
                    f"durability: no {self.replicas} server(s) fit the key bucket "
                    f"{self.bucket}'s placement {self.placement} ({exc.description})"
                ) from exc
        return await self.js.key_value(self.bucket)

    async def _latest(self, name: str) -> tuple[Any, bool]:
        """The entry of the value ``name`` holds (None: none), and whether its latest
        message is a deletion marker.

        The bucket's direct gets may be answered by any replica, one behind the leader
        among them: what it does not hold yet is asked of the leader, which holds every
        acknowledged write (a KEK this host had just stored was "missing" under load)."""
        kv = await self.kv()
        try:
            entry = await self._retrying(lambda: kv.get(name))
        except KeyNotFoundError as exc:  # (KeyDeletedError is one: a marker)
            if getattr(exc, "entry", None) is not None:
                return None, True
            return await self._from_leader(name)
        if entry.operation in ("DEL", "PURGE"):
            return None, True
        return entry, False

    async def _from_leader(self, name: str) -> tuple[Any, bool]:
        """``_latest``, read by the stream's leader (not a direct get)."""
        subject = f"$KV.{self.bucket}.{name}"
        try:
            msg = await self._retrying(
                lambda: self.js.get_msg(self.stream, subject=subject, direct=False)
            )
        except JsNotFound:
            return None, False
        if (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
            return None, True
        entry = KeyValue.Entry(
            bucket=self.bucket, key=name, value=msg.data, revision=msg.seq,
            delta=None, created=None, operation=None,
        )  # fmt: skip
        return entry, False

    async def get(self, name: str) -> Found:
        entry, marked = await self._latest(name)
        if marked:
            return DESTROYED
        return None if entry is None else entry.value

    async def create(self, name: str, value: bytes) -> Found:
        kv = await self.kv()
        try:  # only on a name that never held anything (a marker is something)
            await self._retrying(lambda: kv.update(name, value, last=0))
            return value
        except KeyWrongLastSequenceError:
            return await self.get(name)

    async def replace(self, name: str, old: bytes, value: bytes) -> bool:
        entry, _ = await self._latest(name)
        if entry is not None and entry.value != old:  # (a replica behind may answer a
            entry, _ = await self._from_leader(name)  # direct get: the leader decides)
        if entry is None or entry.value != old or entry.revision is None:
            return False
        kv, last = await self.kv(), entry.revision
        try:
            await self._retrying(lambda: kv.update(name, value, last=last))
        except KeyWrongLastSequenceError:
            return False
        return True

    async def destroy(self, name: str) -> None:
        entry, marked = await self._latest(name)
        if marked:  # destroyed before; a crash may have come before the erasure: finish it
            await self.erase_values(name)
            return
        # the marker first, so the name never holds nothing (a create would take it),
        # then the value it replaced (kept as the one older revision) is erased
        kv = await self.kv()
        await self._retrying(lambda: kv.delete(name))
        if entry is not None and entry.revision is not None:
            await self._erase(entry.revision)

    async def put_fresh(self, values: dict[str, bytes]) -> None:
        """Group commit: what concurrent calls ask for while one is being stored goes
        together next, as one atomic batch (one disk sync), not one publish each."""
        await self.kv()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append((values, done))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.ensure_future(self._flush())
        await done

    async def _flush(self) -> None:
        while self._queued:
            taken, self._queued = self._queued, []
            merged: dict[str, bytes] = {}
            for values, _ in taken:
                merged.update(values)
            try:
                await self._store_fresh(merged)
            except Exception as exc:
                for _, done in taken:
                    if not done.done():
                        done.set_exception(exc)
            except BaseException:  # (cancelled: the instance closing)
                for _, done in taken:
                    done.cancel()
                raise
            else:
                for _, done in taken:
                    if not done.done():
                        done.set_result(None)

    async def _store_fresh(self, values: dict[str, bytes]) -> None:
        items = list(values.items())
        if len(items) == 1:  # one publish, refused if the name holds anything
            name, value = items[0]
            subject = f"$KV.{self.bucket}.{name}"
            try:
                await self._retrying(
                    lambda: self.js.publish(subject, value, headers={_EXPECT_NOTHING: "0"})
                )
            except APIError as exc:
                if exc.err_code not in (10071, 10164):
                    raise
                if await self.get(name) != value:
                    raise PulseError(f"{name}: a data key exists already for a new entity") from exc
            return
        for start in range(0, len(items), BATCH_MAX):  # one atomic batch (one disk sync)
            chunk = items[start : start + BATCH_MAX]
            answer = await publish_atomic(
                self.js._nc, [(f"$KV.{self.bucket}.{n}", v, {}) for n, v in chunk],
                self.budget,
            )  # fmt: skip
            if answer is None or answer.get("error") or int(answer.get("count", 0)) != len(chunk):
                await super().put_fresh(dict(chunk))  # one by one, each checked

    async def watch(self, arrived: Arrived) -> Stop:
        await self.kv()
        prefix = f"$KV.{self.bucket}."

        async def delivered(msg: Msg) -> None:
            name = msg.subject[len(prefix) :]
            operation = (msg.headers or {}).get("KV-Operation")
            arrived(name, None if operation in ("DEL", "PURGE") else msg.data)

        subscription = await self._retrying(
            lambda: self.js.subscribe(
                f"{prefix}>", cb=delivered, ordered_consumer=True, stream=self.stream,
                deliver_policy=api.DeliverPolicy.NEW,
            )
        )  # fmt: skip

        async def stop() -> None:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

        return stop

    async def erase_values(self, name: str) -> None:
        """Erase every value ``name`` holds here, writing no marker: a copy (an edge
        host's, the hub's) of a key destroyed where its marker was written.

        The name's messages are walked one get at a time (the next on its subject), each
        asked again within the budget. Not ``KeyValue.history``: it ends at a message
        the server says nothing is pending after, and another erasure of the same name
        at once (an edge host's delete and the echo of its own marker: ``eventlog.leaf``)
        can leave the server counting an erased message as still to come: the history
        then waited forever (a delete hung in 1% of such pairs)."""
        await self.kv()
        subject = f"$KV.{self.bucket}.{name}"
        seq = 1
        while True:
            try:
                msg = await self._retrying(
                    functools.partial(self.js.get_msg, self.stream, seq, subject=subject, next=True)
                )
            except JsNotFound:  # nothing (more) under the name
                return
            if not msg.seq:
                return
            if (msg.headers or {}).get("KV-Operation") not in ("DEL", "PURGE"):
                await self._erase(msg.seq)
            seq = msg.seq + 1

    async def _erase(self, seq: int) -> None:
        """Overwrite one message of the bucket's stream on disk (``no_erase`` false)."""
        subject = f"{self.js._prefix}.STREAM.MSG.DELETE.{self.stream}"
        body = json.dumps({"seq": seq}).encode()
        reply = await self._retrying(lambda: self.js._nc.request(subject, body, timeout=10.0))
        answer = json.loads(reply.data or b"{}")
        error = answer.get("error")
        # 10057 is any failed delete; one that found no message (erased before) is done, as
        # is 10043, "sequence N not found": another erasure of it came first (the service's
        # own, say, of a key that a collective's delete erases again)
        what = str((error or {}).get("description", error))
        if error and (error.get("err_code") not in (10057, 10043) or "not permitted" in what):
            raise PulseError(f"erasing a data key failed: {what}")

    async def names(self, prefix: str = "") -> list[str]:
        return sorted(await self._scan(prefix, values=False))

    async def items(self, prefix: str = "") -> dict[str, bytes]:
        return await self._scan(prefix, values=True)

    async def _scan(self, prefix: str, *, values: bool) -> dict[str, bytes]:
        """The last value of every name under ``prefix`` that holds one (one consumer
        on the bucket, filtered by the server; ``values=False``: names only).

        A pull consumer of every message on the names, in stream order (a later one
        replaces an earlier: the last of each name is what stays). Not one that delivers
        the last per subject: the server makes that one by finding each name's last
        message, 4-10 s for a million names in a server just started, longer than a
        request waits (the scan then asked again and again, and never began). It is asked
        for pages with ``no_wait`` until the server says it has nothing more (status 404
        or 408): its end is the server's answer, never a count.
        (nats-py's ``KeyValue.watch`` decides from the consumer's count that it has
        nothing to deliver, and under load ends at once with nothing: a rotation then
        kept the old KEK, or erased it with keys still wrapped by it. A scan that read
        until the delivered messages' pending count reached 0 waited forever at a
        million names, where that count never did.)"""
        await self.kv()
        names = f"$KV.{self.bucket}."  # (each message's subject: this, then its name)
        nc = self.js._nc
        next_page = f"{self.js._prefix}.CONSUMER.MSG.NEXT.{self.stream}."
        ask = json.dumps({"batch": SCAN_PAGE, "no_wait": True}).encode()

        async def scan() -> dict[str, bytes]:
            config = api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.ALL,
                ack_policy=api.AckPolicy.NONE,
                headers_only=not values,
                mem_storage=True,
                num_replicas=1,
                inactive_threshold=60.0,
                filter_subject=f"{names}{prefix}>",
            )  # fmt: skip
            arrived: deque[Msg] = deque()
            woken = asyncio.Event()

            def put(msg: Msg) -> None:
                arrived.append(msg)
                woken.set()

            sub = await subscribe_direct(nc, nc.new_inbox(), put)
            found: dict[str, bytes] = {}
            consumer = None
            try:
                consumer = (await self.js.add_consumer(self.stream, config=config)).name
                delivered = 0
                while True:
                    await nc.publish(next_page + consumer, ask, reply=sub.subject)
                    got = 0
                    while got < SCAN_PAGE:
                        if not arrived:
                            woken.clear()
                            async with asyncio.timeout(min(self.budget, SCAN_WAIT)):
                                await woken.wait()  # (a stall: scanned again)
                        while arrived:
                            msg = arrived.popleft()
                            if msg.headers and not msg.reply:  # a status: 404/408 is the end
                                status = msg.headers.get("Status")
                                if status in ("404", "408"):
                                    return found
                                raise ServiceUnavailableError(description=f"status {status}")
                            got, delivered = got + 1, delivered + 1
                            if ack_position(msg.reply)[1] != delivered:  # (see there)
                                raise ServiceUnavailableError(description="a delivery lost")
                            name = msg.subject[len(names) :]
                            if msg.headers and msg.headers.get("KV-Operation") in ("DEL", "PURGE"):
                                found.pop(name, None)
                            else:
                                found[name] = msg.data or b""
            finally:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
                if consumer is not None:  # (else it goes once idle: inactive_threshold)
                    with contextlib.suppress(Exception):
                        await self.js.delete_consumer(self.stream, consumer)

        return await self._retrying(scan)


class Keyring:
    """The data keys of one host: made, found, unwrapped, cached in memory (never on
    disk), destroyed, and the KEK rotated."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        # name -> data key (unwrapped), in this process only; the oldest go past ``cached``
        # (a miss asks the store again). An OrderedDict: taking a plain dict's oldest
        # (``next(iter(d))``) walks past every slot deleted before it until the dict is
        # resized, which made a rebuild of a million events spend 80% of its loop there
        self._keys: OrderedDict[str, bytes] = OrderedDict()
        self.cached = KEYS_CACHED
        self._usual_cap: int | None = None  # ``cached`` before a preload raised it
        self._keks: dict[bytes, AESGCM] = {}
        self._current: tuple[bytes, float] | None = None  # (kid, when it was read)
        self._kek_lock = asyncio.Lock()
        self._stop_following: Stop | None = None
        self._waiting: dict[str, asyncio.Event] = {}  # names a reader waits for
        # keys made ahead and stored (``take``), by scope, and the task making more
        self._pools: dict[Scope, deque[Made]] = {}
        self._making: dict[Scope, asyncio.Future[None]] = {}

    # -- the key-encryption key -------------------------------------------------------------

    async def _current_kek(self) -> tuple[bytes, AESGCM]:
        now = time.monotonic()
        if self._current is not None and now - self._current[1] < CURRENT_TTL:
            kid = self._current[0]
            kek = self._keks.get(kid)
            if kek is not None:
                return kid, kek
        async with self._kek_lock:
            found = await self.store.get(CURRENT)
            if not isinstance(found, bytes):
                found = await self._new_kek(first=True)
            kek = await self._kek(found)
            if kek is None:
                raise PulseError(f"the current key-encryption key {found.hex()} is missing")
            self._current = (found, time.monotonic())
            return found, kek

    async def _new_kek(self, *, first: bool) -> bytes:
        kid, secret = os.urandom(KID_BYTES), AESGCM.generate_key(bit_length=256)
        await self.store.create(f"{CURRENT}.{kid.hex()}", secret)
        if not first:
            old = await self.store.get(CURRENT)
            if not isinstance(old, bytes) or not await self.store.replace(CURRENT, old, kid):
                raise PulseError("another rotation of the key-encryption key is under way")
            return kid
        held = await self.store.create(CURRENT, kid)  # another host may have been first
        if isinstance(held, bytes) and held != kid:
            with contextlib.suppress(PulseError):  # (an unused key: left, if need be)
                await self.store.destroy(f"{CURRENT}.{kid.hex()}")
            return held
        return kid

    async def _kek(self, kid: bytes) -> AESGCM | None:
        kek = self._keks.get(kid)
        if kek is None:
            secret = await self.store.get(f"{CURRENT}.{kid.hex()}")
            if not isinstance(secret, bytes):
                return None
            kek = self._keks[kid] = AESGCM(secret)
        return kek

    async def _wrap(self, name: str, key: bytes) -> bytes:
        kid, kek = await self._current_kek()
        return _wrapped(kid, kek, name, key)

    async def _unwrap(self, name: str, value: bytes) -> bytes:
        kid = value[:KID_BYTES]
        kek = await self._kek(kid)
        if kek is None:  # rotated meanwhile: the value was wrapped again since it was read
            again = await self.store.get(name)
            if isinstance(again, bytes) and again[:KID_BYTES] != kid:
                return await self._unwrap(name, again)
            raise PulseError(f"{name}: wrapped with key-encryption key {kid.hex()}, which is gone")
        try:
            return _unwrapped(kek, name, value)
        except InvalidTag:
            raise PulseError(f"{name}: the stored data key does not unwrap (tampered?)") from None

    # -- data keys --------------------------------------------------------------------------

    async def make(self, name: str) -> bytes:
        """The data key of ``name``, made now if it has none; raises ``KeyDestroyed`` if
        its entity was deleted (its key destroyed)."""
        key = self._keys.get(name)
        if key is not None:
            return key
        fresh = AESGCM.generate_key(bit_length=256)
        wrapped = await self._wrap(name, fresh)
        held = await self.store.create(name, wrapped)
        if not isinstance(held, bytes):
            raise KeyDestroyed(name)
        key = fresh if held == wrapped else await self._unwrap(name, held)
        self._remember(name, key)
        return key

    async def fresh(self, names: Iterable[str]) -> dict[str, bytes]:
        """Data keys for entities made just now (fresh ids), made here without asking
        the store: kept in memory, and their wrapped values returned, for the caller to
        store (``KeyStore.put_fresh``) as it appends their events."""
        kid, kek = await self._current_kek()
        wrapped = {}
        for name in names:
            key = AESGCM.generate_key(bit_length=256)
            wrapped[name] = _wrapped(kid, kek, name, key)
            self._remember(name, key)
        return wrapped

    async def take(self, entity: str, collective_id: UUID | None) -> UUID | None:
        """The id of a new ``entity`` (of ``collective_id``; None: wisdom) whose data key
        is already in the store, made ahead (see the module docstring): its first event
        is sealed with it and appended alone. None: the pool was dropped as it was being
        filled (its collective deleted). Raises what the store raises when none is left
        and storing more fails."""
        scope = (entity, collective_id)
        pool = self._pools.get(scope)
        if not pool:
            await asyncio.shield(self._make_more(scope))
            pool = self._pools.get(scope)
            if not pool:
                return None
        entity_id, name, key = pool.popleft()
        if len(pool) < POOL_LOW:
            self._make_more(scope)
        self._remember(name, key)  # (again: it may have aged out of memory meanwhile)
        return entity_id

    def _make_more(self, scope: Scope) -> asyncio.Future[None]:
        """The task filling ``scope``'s pool (started if none runs)."""
        making = self._making.get(scope)
        if making is None or making.done():
            making = self._making[scope] = asyncio.ensure_future(self._make_ahead(scope))
            making.add_done_callback(_retrieved)
        return making

    async def _make_ahead(self, scope: Scope) -> None:
        pool = self._pools.setdefault(scope, deque())
        kid, kek = await self._current_kek()
        made: list[Made] = []
        wrapped: dict[str, bytes] = {}
        for _ in range(POOL - len(pool)):
            entity_id = uuid7()
            name = key_name(scope[0], entity_id, scope[1])
            key = AESGCM.generate_key(bit_length=256)
            wrapped[name] = _wrapped(kid, kek, name, key)
            made.append((entity_id, name, key))
            self._remember(name, key)  # (so this host's echo of them is not unwrapped)
        try:
            await self.store.put_fresh(wrapped)
        except BaseException:
            for _, name, _ in made:
                self.forget(name)
            raise
        if self._pools.get(scope) is pool:
            pool.extend(made)
            return
        # its collective was deleted meanwhile (``forget``): these go too
        for _, name, _ in made:
            self.forget(name)
        with contextlib.suppress(Exception):
            await gather_limited(self.store.destroy(name) for _, name, _ in made)

    async def stop_making(self) -> None:
        """Stop making keys ahead (a host closing): what was being stored may be left in
        the store unused, like the rest of its pools."""
        making = [m for m in self._making.values() if not m.done()]
        for task in making:
            task.cancel()
        await asyncio.gather(*making, return_exceptions=True)
        self._making.clear()
        self._pools.clear()

    async def follow(self) -> None:
        """Learn of the keys other hosts make as they are stored (``KeyStore.watch``):
        a host reading their events then finds them in memory."""
        if self._stop_following is None:
            self._stop_following = await self.store.watch(self._arrived)

    async def unfollow(self) -> None:
        stop, self._stop_following = self._stop_following, None
        if stop is not None:
            await stop()

    def _arrived(self, name: str, value: bytes | None) -> None:
        if name.startswith(CURRENT):
            self._current = None  # (a rotation: read the pointer again)
            return
        if value is None:
            self.forget(name)
        elif name not in self._keys:
            kek = self._keks.get(value[:KID_BYTES])
            if kek is not None:  # (a KEK not known yet: the reader asks the store)
                with contextlib.suppress(InvalidTag):
                    self._remember(name, _unwrapped(kek, name, value))
        waiter = self._waiting.pop(name, None)
        if waiter is not None:
            waiter.set()

    async def arrival(self, names: Iterable[str], timeout: float) -> None:
        """Wait up to ``timeout`` seconds for any of ``names`` to be written (as
        ``follow`` hears it); returns at once if nothing follows the store."""
        if self._stop_following is None:
            await asyncio.sleep(timeout)
            return
        wanted = list(names)
        events = [self._waiting.setdefault(n, asyncio.Event()) for n in wanted]
        if any(n in self._keys for n in wanted):  # heard of between the miss and now
            return
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            for name, event in zip(wanted, events, strict=True):
                if not event.is_set() and self._waiting.get(name) is event:
                    del self._waiting[name]  # (asked again after the pause: none kept)

    async def find(self, name: str) -> bytes | Destroyed | None:
        """The data key of ``name``; ``DESTROYED`` when its entity was deleted; None
        when the store has nothing under it (yet)."""
        key = self._keys.get(name)
        if key is not None:
            return key
        held = await self.store.get(name)
        if not isinstance(held, bytes):
            return held
        key = await self._unwrap(name, held)
        self._remember(name, key)
        return key

    async def find_many(self, names: Iterable[str]) -> dict[str, bytes | Destroyed | None]:
        found: dict[str, bytes | Destroyed | None] = {}
        missing = []
        for name in set(names):  # (a catch-up's keys are all in memory: no task each)
            key = self._keys.get(name)
            if key is None:
                missing.append(name)
            else:
                found[name] = key
        if missing:
            fetched = await gather_limited(self.find(n) for n in missing)
            found.update(zip(missing, fetched, strict=True))  # type: ignore[arg-type]
        return found

    async def preload(self) -> int:
        """Unwrap every key in the store into memory (before a long catch-up: one read of
        the bucket rather than a request per entity); returns how many. Every one is
        kept until ``trim`` (past ``cached`` keys, the catch-up would otherwise ask the
        store again for each of the oldest, the first it needs: a request per entity)."""
        held = await self.store.items("c.")
        held.update(await self.store.items("w."))
        fresh = {n: v for n, v in held.items() if n not in self._keys}
        # each key-encryption key looked up once, then every data key unwrapped here, a
        # pause for the event loop every PRELOAD_STRETCH: a task per key (a million at a
        # million entities) cost the event loop more than the unwrapping itself
        keks = {kid: await self._kek(kid) for kid in {v[:KID_BYTES] for v in fresh.values()}}
        keys: list[bytes] = []
        for at, (name, value) in enumerate(fresh.items(), 1):
            kek = keks[value[:KID_BYTES]]
            key = None
            if kek is not None:
                with contextlib.suppress(InvalidTag):
                    key = _unwrapped(kek, name, value)
            if key is None:  # (a KEK rotated since, or a bad value: as one find does)
                key = await self._unwrap(name, value)
            keys.append(key)
            if at % PRELOAD_STRETCH == 0:
                await asyncio.sleep(0)
        if self._usual_cap is None:
            self._usual_cap = self.cached
        self.cached = max(self.cached, len(self._keys) + len(fresh))
        for name, key in zip(fresh, keys, strict=True):
            self._remember(name, key)
        return len(fresh)

    def trim(self) -> None:
        """Back to holding at most ``cached`` keys as before a ``preload`` (after the
        catch-up it was for), the oldest going first."""
        if self._usual_cap is not None:
            self.cached, self._usual_cap = self._usual_cap, None
        keys = self._keys
        while len(keys) > self.cached:
            keys.popitem(last=False)

    def holds(self, name: str) -> bool:
        """Whether the data key of ``name`` is in memory here."""
        return name in self._keys

    def _remember(self, name: str, key: bytes) -> None:
        keys = self._keys
        keys[name] = key
        while len(keys) > self.cached:
            keys.popitem(last=False)  # the oldest

    def forget(self, name: str | None = None, *, prefix: str | None = None) -> None:
        """Drop cached keys (an entity or collective deleted): memory only."""
        if name is not None:
            self._keys.pop(name, None)
        if prefix is not None:
            for n in [n for n in self._keys if n.startswith(prefix)]:
                del self._keys[n]
            for scope in [s for s in self._pools if _scope_prefix(s).startswith(prefix)]:
                del self._pools[scope]  # (the keys in the store: destroyed with the prefix)

    async def destroy(self, name: str) -> None:
        """Destroy a data key on every host (the store's copy), and forget it here."""
        self.forget(name)
        await self.store.destroy(name)

    async def destroy_under(self, prefix: str) -> int:
        """Destroy every data key under ``prefix`` (a collective's); returns how many."""
        self.forget(prefix=prefix)
        names = await self.store.names(prefix)
        await gather_limited(self.store.destroy(n) for n in names)
        return len(names)

    async def destroy_copies(self, name: str | None = None, *, prefix: str | None = None) -> None:
        """Erase this host's own copies of keys another host destroyed (``name``, or
        every one under ``prefix``), where it keeps copies (``KeyStore.destroy_copy``)."""
        if name is None and prefix is None:
            return
        names = [name] if name is not None else await self.store.names(prefix or "")
        for each in names:
            self.forget(each)
            await self.store.destroy_copy(each)

    async def rotate(self, grace: float = ROTATION_GRACE) -> int:
        """Make a new KEK, wrap every data key again with it, then erase every older KEK.
        Hosts read the current KEK again within ``CURRENT_TTL``; after ``grace`` seconds
        the keys still wrapped with an older one (made meanwhile) are wrapped again, and
        only then is it erased. Returns how many data keys were wrapped again."""
        async with self._kek_lock:
            old = await self.store.get(CURRENT)
            kid = await self._new_kek(first=not isinstance(old, bytes))
            self._current = None
            self._keks.clear()
        total = await self._rewrap(kid)
        if grace > 0:
            await asyncio.sleep(grace)  # hosts that read the old KEK before now: see above
        total += await self._rewrap(kid)
        for name in await self.store.names(f"{CURRENT}."):
            if name != f"{CURRENT}.{kid.hex()}":
                await self.store.destroy(name)
        self._keks = {k: v for k, v in self._keks.items() if k == kid}
        return total

    async def _rewrap(self, kid: bytes) -> int:
        held = await self.store.items("c.")
        held.update(await self.store.items("w."))
        stale = {n: v for n, v in held.items() if v[:KID_BYTES] != kid}

        async def again(name: str, value: bytes) -> bool:
            fresh = await self._wrap(name, await self._unwrap(name, value))
            return await self.store.replace(name, value, fresh)  # not if destroyed meanwhile

        done = await gather_limited(again(n, v) for n, v in stale.items())
        return sum(1 for d in done if d)

    async def current_kek_id(self) -> str:
        """The id of the KEK new data keys are wrapped with."""
        kid, _ = await self._current_kek()
        return kid.hex()

    async def kek_ids(self) -> list[str]:
        """The ids of the KEKs the store holds (one, except during a rotation)."""
        return [n.split(".", 1)[1] for n in await self.store.names(f"{CURRENT}.")]


def _scope_prefix(scope: Scope) -> str:
    entity, collective_id = scope
    return "w." if collective_id is None else f"{collective_prefix(collective_id)}{entity}."


def _retrieved(task: asyncio.Future[None]) -> None:
    """Keys made ahead in the background that could not be stored: logged; the next
    ``take`` that finds none left makes them again and raises if that fails."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("making data keys ahead failed: %r", exc)


def _wrapped(kid: bytes, kek: AESGCM, name: str, key: bytes) -> bytes:
    """A data key as the store keeps it: the KEK's id, a nonce, the key sealed with the
    KEK (bound to its name, so a value moved to another name does not unwrap)."""
    nonce = os.urandom(NONCE_BYTES)
    return kid + nonce + kek.encrypt(nonce, key, name.encode())


def _unwrapped(kek: AESGCM, name: str, value: bytes) -> bytes:
    start = KID_BYTES + NONCE_BYTES
    return kek.decrypt(value[KID_BYTES:start], value[start:], name.encode())


class KeyDestroyed(PulseError):
    """The entity's data key was destroyed: it was deleted."""

    def __init__(self, name: str) -> None:
        super().__init__(f"the data key {name} was destroyed: its entity was deleted")
        self.name = name

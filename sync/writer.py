"""The write path: an event checked by a domain service is sealed, appended to the log
(acknowledged by JetStream, or raise), and the call returns once this host applied it
(read-your-writes); a write that landed after a concurrent delete is forgotten again.
A single event reaches the engine through the tail, which gives it back as written (not
decoded or opened again: ``Replication.writing``); a batch is also offered to the engine
as soon as it is acknowledged (one hand-over for all of it).

Also here: the common fields of every event (its id, the instance, the clock, the
author), ids drawn from an idempotency key (``sync.idempotency``) and the results of the
last idempotent calls, and deletes (a tombstone that wins, then a purge: forgetting).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from uuid import UUID

from eventlog import codec, subjects
from eventlog import events as ev
from eventlog.codec import encode_body
from eventlog.errors import ConflictError, LogUnavailable, NotFoundError, PulseError
from eventlog.ids import uuid7
from eventlog.limits import CLOCK_AHEAD_MS
from eventlog.log import EventLog, LogEntry, key_conflict
from eventlog.sealing import Sealer, tombstone_name
from projections import queries
from projections.engine import Engine
from projections.projection import entity_of
from sync import idempotency
from sync.access import Principal
from sync.gate import uuid_of
from sync.hlc import HybridClock
from sync.owed import OwedPurges
from sync.reading import Reader
from sync.replication import Replication

T = TypeVar("T")

DELETES_OF: dict[str, Any] = {
    "experience": ev.ExperienceDeleted,
    "relation": ev.RelationDeleted,
    "insight": ev.InsightDeleted,
    "wisdom": ev.WisdomDeleted,
    "session": ev.SessionDeleted,
}


class Writer:
    """The write path of an instance (see the module docstring)."""

    def __init__(
        self,
        log_: EventLog,
        engine: Engine,
        sealer: Sealer,
        clock: HybridClock,
        instance_id: UUID,
        replication: Replication,
        reader: Reader,
        owed: OwedPurges,
        me: Callable[[], Principal],
    ) -> None:
        self.log, self.engine, self.sealer, self.clock = log_, engine, sealer, clock
        self.instance_id = instance_id
        self.replication, self.reader, self.owed = replication, reader, owed
        self.me = me
        # the last idempotent calls served here: key -> (fingerprint, result)
        self._idempotent: OrderedDict[str, tuple[str, Any]] = OrderedDict()

    # -- what every event carries ---------------------------------------------------------

    def common(self) -> dict[str, Any]:
        """The fields of a new event: its id, this instance, the clock, its author."""
        me = self.me()
        return {"event_id": self.new_id(), "instance_id": self.instance_id,
                "hlc": self.clock.now(), "author_owner": me.owner,
                "author_agent": me.agent}  # fmt: skip

    def new_id(self) -> UUID:
        """A new id for an event or entity: random, or derived from the idempotency key
        of the call in progress (``sync.idempotency``)."""
        call = idempotency.CURRENT.get()
        return uuid7() if call is None else call.next_id()

    async def entity_id(self, entity: str, collective_id: UUID | None) -> UUID:
        """The id of a new entity: one whose data key is stored already (made ahead:
        ``Keyring.take``), so its record is one synced write, or derived from the
        idempotency key of the call in progress (its key made as it is sealed)."""
        call = idempotency.CURRENT.get()
        if call is not None:
            return call.next_id()
        taken = await self.sealer.keyring.take(entity, collective_id)
        return uuid7() if taken is None else taken

    # -- idempotent calls (sync.idempotency.idempotent) -----------------------------------

    def remembered(self, key: str) -> tuple[str, Any] | None:
        """The fingerprint and result of the idempotent call of ``key`` served here."""
        return self._idempotent.get(key)

    def remember(self, key: str, fingerprint: str, result: Any) -> None:
        self._idempotent[key] = (fingerprint, result)
        self._idempotent.move_to_end(key)
        while len(self._idempotent) > idempotency.REMEMBERED:
            self._idempotent.popitem(last=False)

    @staticmethod
    def key_conflict() -> ConflictError:
        return key_conflict("")

    # -- appending ------------------------------------------------------------------------

    async def write(self, event: ev.Event) -> int:
        """Append ``event``; its sequence once this host applied it."""
        replication = self.replication
        replication.check_open()
        call = idempotency.CURRENT.get()
        if call is None:  # what the log holds: its text encrypted (a new entity's key is
            # stored already, or made here and stored as the event is appended)
            (wire,), fresh = await self.sealer.seal_fresh((event,))
            replication.writing((event,))  # (the tail hands it over as written)
            seq = await self._with_keys(fresh, self.log.append(wire))
        else:  # a retry within the duplicate window finds the first copy: nothing new
            wire = await self.sealer.seal(event)
            seq, _ = await self.log.append_keyed(wire, call.fingerprint)
        # not offered to the engine: the tail brings it back as the ack comes, and one
        # hand-over costs less than two (the offer, then the tail's copy of it)
        await replication.wait_applied(seq)
        self._check_not_kept_aside(seq)
        await self._forget_if_deleted(event, seq)
        return seq

    async def write_many(self, events: Sequence[ev.Event], *, atomic: bool = False) -> list[int]:
        """Append events as one batch (``atomic``: committed together, see
        ``EventLog.append_batch``); return their sequences once applied here."""
        replication = self.replication
        replication.check_open()
        call = idempotency.CURRENT.get()
        if call is not None:  # one by one, each deduplicated (see sync.idempotency)
            wires = await self.sealer.seal_many(events)
            stored = await asyncio.gather(
                *(self.log.append_keyed(e, call.fingerprint) for e in wires)
            )
            seqs, fresh = [s for s, _ in stored], all(first is None for _, first in stored)
        else:
            wires, keys = await self.sealer.seal_fresh(events)
            replication.writing(events)
            seqs = await self._with_keys(keys, self.log.append_batch(wires, atomic=atomic))
            fresh = True
        if (
            fresh
            and not self.log.numbered_here  # (there, the tail numbered them already)
            and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            and self._within_clock_bound(events)
        ):  # contiguous, and certain to be read alike: offer them
            self.engine.offer(
                [LogEntry(s, subjects.subject_for(e), e) for s, e in zip(seqs, events, strict=True)]
            )
        await replication.wait_applied(max(seqs))
        self._check_not_kept_aside(*seqs)
        refusals = [await self._forget(event, seq) for event, seq in zip(events, seqs, strict=True)]
        refused = [r for r in refusals if r is not None]
        if refused:  # every one of them forgotten first, then the caller hears of it
            more = f" (and {len(refused) - 1} more of the batch)" if len(refused) > 1 else ""
            raise NotFoundError(refused[0] + more)
        return seqs

    async def append_unfolded(self, event: ev.Event) -> None:
        """Append an event no projection folds (an activity): nothing to wait for."""
        self.replication.check_open()
        call = idempotency.CURRENT.get()
        if call is None:
            await self.log.append(event)
        else:
            await self.log.append_keyed(event, call.fingerprint)

    async def _with_keys(self, keys: dict[str, bytes], appending: Awaitable[T]) -> T:
        """Await an append while the data keys its events were sealed with are stored
        (at once: a reader that gets an event first waits for its key). Once appended,
        the keys must be stored too: asked again within the key store's budget, then
        the write fails (and its events stay unreadable: a dead letter on every host,
        this one too, as nothing was offered)."""
        if not keys:
            return await appending
        store = self.sealer.keyring.store
        storing = asyncio.ensure_future(store.put_fresh(keys))
        await asyncio.sleep(0)  # its publish goes out first: the key usually reaches a
        try:  # reader before the event does
            done = await appending
        except BaseException:
            await asyncio.gather(storing, return_exceptions=True)  # (harmless: unused)
            raise
        try:
            await storing
        except Exception:
            try:
                await store.put_fresh(keys)
            except Exception as exc:
                for name in keys:
                    self.sealer.keyring.forget(name)
                raise LogUnavailable(
                    f"the event was stored but the key store did not take its data key "
                    f"({exc!r}); it cannot be read"
                ) from exc
        return done

    def _within_clock_bound(self, events: Sequence[ev.Event]) -> bool:
        """Whether every host will read these events as this one would: their clocks are
        within the bound of a time the stream already reached, so of the time it stored
        them. Only then may a writer hand its engine its own events (the fast path of
        read-your-writes); otherwise they come back through the tail, stamped with the
        stream's time, and are judged as every host judges them (a host whose clock runs
        too fast sees its write kept aside and raise). Half the bound is kept in reserve:
        the stream's time is its leader's clock, and after a leader change it may stand
        behind what this host saw (cluster nodes' clocks differ by far less)."""
        bound = self.replication.log_ms + CLOCK_AHEAD_MS // 2
        return all(ev.hlc_millis(e.hlc) <= bound for e in events)

    def _check_not_kept_aside(self, *seqs: int) -> None:
        """A write stored but set aside by the fold (as every host will) is not a success."""
        for seq in seqs:
            reason = self.replication.kept_aside.get(seq)
            if reason is not None:
                raise PulseError(
                    f"the event stored at sequence {seq} was kept aside as a dead letter "
                    f"by every host: {reason}"
                )

    # -- a write after a delete, and deletes ----------------------------------------------

    async def _forget_if_deleted(self, event: ev.Event, seq: int) -> None:
        """A write checked against a state that did not have a concurrent delete yet lands
        after the tombstone: it must not keep deleted content in the log. Forget it (and
        say so); every host's fold already ignores it."""
        refusal = await self._forget(event, seq)
        if refusal is not None:
            raise NotFoundError(refusal)

    async def _forget(self, event: ev.Event, seq: int) -> str | None:
        """Forget ``event`` if it landed after a tombstone of its collective or entity;
        returns why (for the caller's error), or None when it stands."""
        landed = self.replication.landed_dead.pop(seq, None)
        if landed is None:
            return None
        collective_id = getattr(event, "collective_id", None)
        entity, entity_id = entity_of(event)
        if landed == "collective":
            subject = subjects.subject_for(event)
            before = self.log.kept_before(subject, seq + 1)  # (what a restart still knows)
            token = self.owed.owe({"purge": subject, "before_seq": before})
            await self.log.purge(subject, before_seq=before)
            self.owed.paid(token)
            return f"collective_id: collective {collective_id} was deleted"
        await self.delete(entity, entity_id)  # a new tombstone, purging the write
        return f"{entity}_id: {entity} {entity_id} was deleted"

    async def tombstone(self, event: ev.Event, forget: str, token: str | None = None) -> None:
        """Append a tombstone, wait until it is applied here, then purge everything before
        it on ``forget`` (a subject, wildcards allowed) from the stream: forgetting. The
        purge is recorded as owed before the tombstone is appended (``sync.owed``);
        ``token``: the record of an owed purge this finishes."""
        if token is None:
            token = self.owed.owe(
                {"tombstone": encode_body(event).hex(), "schema": codec.SCHEMA_VERSION,
                 "forget": forget}
            )  # fmt: skip
        seq = await self.write(event)
        name = tombstone_name(event)
        try:
            if name is not None:  # every copy of its sealed events is noise from here on
                await self.sealer.keyring.destroy(name)
        finally:  # (an edge host's offline delete: its own copies go even so; owed: the hub's)
            await self.log.purge(forget, before_seq=seq)
        self.owed.paid(token)

    async def delete(self, entity: str, entity_id: Any) -> None:
        """Tombstone an entity that exists or was deleted here, and forget it."""
        key = uuid_of(f"{entity}_id", entity_id)
        anchor = await self.reader.read(queries.anchor_of, entity, key)
        if anchor is None:
            raise NotFoundError(f"{entity}_id: no {entity} {entity_id}")
        anchor_field = "owner_id" if entity == "wisdom" else "collective_id"
        event = DELETES_OF[entity](**self.common(), **{f"{entity}_id": key, anchor_field: anchor})
        await self.tombstone(event, subjects.subject_for(event))

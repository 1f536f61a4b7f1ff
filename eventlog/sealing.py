"""Sealing events: the text and vectors of an entity travel encrypted with its data key.

A writer seals (``Sealer.seal``) every event that carries an entity's text or vector
(``limits.SEALED_KINDS``: an experience's record, update and invalidation, an insight, a
relation, a session's start and updates, wisdom) into an ``events.Sealed``: the common
fields and the entity's ids in the clear, the whole event inside a box, AES-256-GCM with
the entity's data key (``eventlog.keys``), bound to the event id and the key's name. The
log, every store it is copied to and every backup see only the box.

A reader opens them (``Sealer.open``) before they are folded, which makes them input like
any other: the event inside must be well-typed and in range, of the kind and entity the
envelope names (so its subject is the one it was stored on), with the envelope's id.
What fails is a dead letter, with the reason. A box whose key was destroyed (its entity
deleted) stays sealed: the fold turns it into nothing, exactly as if the purge that
follows every delete had already removed it. A key that is not in the store yet (another
host's fresh entity whose key has not reached it) is waited for, up to
``KEY_WAIT`` seconds; after that the event is a dead letter saying so, read again each
time the host opens (``Projection.readmit_due``): a key that came late then applies.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from uuid import UUID

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from eventlog import events as ev
from eventlog.errors import DecodeError, NotFoundError
from eventlog.keys import KeyDestroyed, Keyring, collective_prefix, gather_limited, key_name
from eventlog.limits import SEALED_KINDS, check_ranges
from eventlog.log import LogEntry

KEY_WAIT = 30.0  # seconds a reader waits for a key that has not reached the store
# the reason of a dead letter whose key was not there: read again whenever a host opens
KEY_MISSING = "its data key is not in the key store:"
AAD = b"pulse.sealed.1:"

SEALED_ENTITY: dict[str, str] = {
    kind: entity for entity, kinds in SEALED_KINDS.items() for kind in kinds
}
# the events that make an entity: the first of its sealed kinds
MAKING = frozenset(kinds[0] for kinds in SEALED_KINDS.values())
DELETED_ENTITY: dict[type[ev.EventBase], str] = {
    ev.ExperienceDeleted: "experience",
    ev.InsightDeleted: "insight",
    ev.RelationDeleted: "relation",
    ev.SessionDeleted: "session",
    ev.ThreadDeleted: "thread",
    ev.WisdomDeleted: "wisdom",
}

_encoder = msgspec.msgpack.Encoder(uuid_format="bytes")
_decoder = msgspec.msgpack.Decoder(ev.Event)


def _aad(event_id: UUID, name: str) -> bytes:
    return AAD + event_id.bytes + name.encode()


def _name_of(entity: str | None, event: ev.Event) -> str | None:
    if entity is None:
        return None
    return key_name(entity, getattr(event, f"{entity}_id"), getattr(event, "collective_id", None))


def sealed_name(event: ev.Event) -> str | None:
    """The data key an event is sealed with (None: it is not sealed)."""
    return _name_of(SEALED_ENTITY.get(ev.event_type_name(event)), event)


def tombstone_name(event: ev.Event) -> str | None:
    """The data key an entity's tombstone destroys (None: not an entity's tombstone)."""
    return _name_of(DELETED_ENTITY.get(type(event)), event)


def tombstone_scope(event: ev.Event) -> tuple[str | None, str | None] | None:
    """The data keys a tombstone destroys, as (name, prefix) for ``Keyring.forget`` and
    ``destroy_copies``: an entity's name, or a collective's prefix; None: none."""
    if isinstance(event, ev.CollectiveDeleted):
        return None, collective_prefix(event.collective_id)
    name = tombstone_name(event)
    return None if name is None else (name, None)


def seal_with(event: ev.Event, key: bytes, name: str) -> ev.Sealed:
    entity = SEALED_ENTITY[ev.event_type_name(event)]
    nonce = os.urandom(12)
    box = nonce + AESGCM(key).encrypt(nonce, _encoder.encode(event), _aad(event.event_id, name))
    return ev.Sealed(
        event_id=event.event_id, instance_id=event.instance_id, hlc=event.hlc,
        author_owner=event.author_owner, author_agent=event.author_agent,
        kind=ev.event_type_name(event), entity=entity,
        entity_id=getattr(event, f"{entity}_id"),
        collective_id=getattr(event, "collective_id", None), box=box,
    )  # fmt: skip


def open_with(sealed: ev.Sealed, key: bytes, name: str | None = None) -> ev.Event:
    """The event inside ``sealed`` (``name``: its key's, when known); raises
    ``ValueError`` naming what is wrong."""
    if name is None:
        name = key_name(sealed.entity, sealed.entity_id, sealed.collective_id)
    try:
        body = AESGCM(key).decrypt(sealed.box[:12], sealed.box[12:], _aad(sealed.event_id, name))
    except InvalidTag:
        raise ValueError(f"box: does not open with the data key of {name}") from None
    try:
        inner = _decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ValueError(f"box: the sealed body is not an event: {exc}") from None
    if isinstance(inner, ev.Sealed) or ev.event_type_name(inner) != sealed.kind:
        raise ValueError(f"box: holds a {ev.event_type_name(inner)}, not a {sealed.kind}")
    if (
        inner.event_id != sealed.event_id
        or getattr(inner, f"{sealed.entity}_id") != sealed.entity_id
        or getattr(inner, "collective_id", None) != sealed.collective_id
    ):  # (the envelope's ids make its subject: the event's own, then)
        raise ValueError("box: the sealed event is not the one its envelope names")
    check_ranges(inner)
    return inner


class Sealer:
    """Seals what a host writes and opens what it reads, with its keyring."""

    def __init__(self, keyring: Keyring, *, key_wait: float = KEY_WAIT) -> None:
        self.keyring = keyring
        self.key_wait = key_wait

    async def seal(self, event: ev.Event) -> ev.Event:
        """``event`` sealed with its entity's key (made if it has none), or as it is when
        it carries nothing to seal. Raises ``keys.KeyDestroyed`` for a deleted entity."""
        name = sealed_name(event)
        if name is None:
            return event
        return seal_with(event, await self._make(name, event), name)

    async def _make(self, name: str, event: ev.Event) -> bytes:
        try:
            return await self.keyring.make(name)
        except KeyDestroyed:
            entity = SEALED_ENTITY[ev.event_type_name(event)]
            entity_id = getattr(event, f"{entity}_id")
            raise NotFoundError(f"{entity}_id: {entity} {entity_id} was deleted") from None

    async def seal_fresh(
        self, events: Sequence[ev.Event]
    ) -> tuple[list[ev.Event], dict[str, bytes]]:
        """``events`` sealed, those that make an entity (``MAKING``) with a key made here
        without asking the store, for entities whose ids were made just now (never an
        idempotent call's, which a retry may repeat); and the wrapped keys the caller
        stores as it appends (``KeyStore.put_fresh``): a reader that meets an event
        before its key waits for the key. An entity whose key this host holds already
        (its id taken with its key, made ahead: ``Keyring.take``) needs none."""
        keyring = self.keyring
        named = [(event, sealed_name(event)) for event in events]
        making = {
            name: None
            for event, name in named
            if name is not None and ev.event_type_name(event) in MAKING and not keyring.holds(name)
        }
        wrapped = await keyring.fresh(making) if making else {}
        return await self._seal_named(named), wrapped

    async def seal_many(self, events: Sequence[ev.Event]) -> list[ev.Event]:
        return await self._seal_named([(event, sealed_name(event)) for event in events])

    async def _seal_named(self, named: Sequence[tuple[ev.Event, str | None]]) -> list[ev.Event]:
        """Events sealed, each with its data key's name (None: not sealed) worked out."""
        firsts: dict[str, ev.Event] = {}
        for event, name in named:
            if name is not None and not self.keyring.holds(name):
                firsts.setdefault(name, event)
        if len(firsts) > 1:  # their keys made in parallel first (each seal then finds its own)
            await gather_limited(self._make(n, e) for n, e in firsts.items())
        return [
            event if name is None else seal_with(event, await self._make(name, event), name)
            for event, name in named
        ]

    async def open(
        self, entries: Sequence[LogEntry], *, key_wait: float | None = None
    ) -> list[LogEntry]:
        """``entries`` with every sealed event opened (see the module docstring); a
        missing key is waited for ``key_wait`` seconds (default: the sealer's)."""
        wait = self.key_wait if key_wait is None else key_wait
        names: dict[int, str] = {}
        for i, entry in enumerate(entries):
            event = entry.event
            if isinstance(event, ev.Sealed):
                try:
                    names[i] = key_name(event.entity, event.entity_id, event.collective_id)
                except ValueError:
                    pass  # (check_ranges refused it already when read)
        if not names:
            return list(entries)
        keys = await self._keys(set(names.values()), wait)
        opened = list(entries)
        for i, name in names.items():
            entry, key = entries[i], keys.get(name)
            assert isinstance(entry.event, ev.Sealed)
            if isinstance(key, bytes):
                try:
                    opened[i] = replace(entry, event=open_with(entry.event, key, name))
                except ValueError as exc:
                    opened[i] = self._refused(entry, str(exc))
            elif key is None:
                opened[i] = self._refused(entry, f"{KEY_MISSING} {name} (waited {wait:g} s)")
            # DESTROYED: it stays sealed, and folds to nothing
        return opened

    async def _keys(self, names: set[str], wait: float) -> dict[str, Any]:
        found = await self.keyring.find_many(names)
        deadline = time.monotonic() + wait
        pause = 0.05
        while (waiting := [n for n, k in found.items() if k is None]) and (
            time.monotonic() < deadline
        ):  # another host's key on its way to this store: heard of (Keyring.follow), or
            # asked for again after a pause
            await self.keyring.arrival(waiting, min(pause, deadline - time.monotonic()))
            pause = min(pause * 2, 0.5)
            found.update(await self.keyring.find_many(waiting))
        return found

    @staticmethod
    def _refused(entry: LogEntry, reason: str) -> LogEntry:
        event = entry.event
        error = DecodeError(
            reason, subject=entry.subject, seq=entry.seq,
            instance_id=event.instance_id if event is not None else None,
        )  # fmt: skip
        return replace(entry, event=None, error=error)

    def forget(self, event: ev.Event) -> None:
        """A tombstone applied: its keys leave this host's memory."""
        scope = tombstone_scope(event)
        if scope is not None:
            self.keyring.forget(scope[0], prefix=scope[1])

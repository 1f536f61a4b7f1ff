"""Forgetting: every delete is a tombstone that wins, then a purge of what came before it
on the entity's subject, so the content leaves the stream as well as every host's state
and indexes. Repeating a delete is harmless and finishes forgetting if an earlier call
was interrupted, and a delete interrupted by a crash is finished when the instance opens
again (``sync.owed``). (A write that lands after a concurrent delete is forgotten by the
write path itself: ``sync.writer.Writer``.)"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from uuid import UUID

import msgspec

from eventlog import events as ev
from eventlog import subjects
from eventlog.codec import HDR_SCHEMA, decode_event
from eventlog.errors import NotFoundError
from eventlog.keys import collective_prefix, key_name
from eventlog.log import EventLog
from projections import queries
from projections.engine import Engine
from projections.projection import Projection
from sync.core import DELETES_OF, uuid_of
from sync.gate import Gate
from sync.idempotency import idempotent
from sync.models import BATCH_MAX
from sync.reading import Reader
from sync.writer import Writer

log = logging.getLogger(__name__)


class Compacted(msgspec.Struct, frozen=True, kw_only=True):
    """What ``PulseDB.compact`` did: the sequence the rewritten files reflect, and the
    seconds each rewrite took."""

    applied_seq: int
    duckdb_seconds: float
    text_seconds: float
    vectors_seconds: float


class KeysRotated(msgspec.Struct, frozen=True, kw_only=True):
    """What ``PulseDB.rotate_keys`` did: the new key-encryption key's id and how many
    data keys were wrapped again with it."""

    kek_id: str
    rewrapped: int


class Forgetting:
    """Deletes that forget, and what forgetting owes (see the module docstring).
    ``sync``: waits until this host applied what the log holds (``compact``)."""

    def __init__(
        self,
        reads: Reader,
        gate: Gate,
        writer: Writer,
        log_: EventLog,
        engine: Engine,
        sync: Callable[[], Awaitable[int]],
    ) -> None:
        self.reads, self.gate, self.writer = reads, gate, writer
        self.log, self.engine, self.sync = log_, engine, sync
        self.sealer, self.owed = writer.sealer, writer.owed
        self._owed_lock = asyncio.Lock()  # one pass over the owed purges at a time

    @idempotent
    async def delete_collective(
        self, collective_id: UUID, *, idempotency_key: str | None = None
    ) -> None:
        """Delete a collective and forget everything in it: a tombstone for the collective
        and one for every experience, relation, insight, session and thread in it, then
        everything before the collective's tombstone is purged from the stream (and its
        agents' activities).
        Every host wipes those rows and drops them from its indexes; the stream keeps the
        tombstones only. Repeating it is harmless (and finishes forgetting if an earlier
        call was interrupted). Admins only (and the local operator): it forgets memories
        of every member, private ones its caller may not see among them."""
        cid = uuid_of("collective_id", collective_id)
        if await self.reads.read(queries.anchor_of, "collective", cid) is None:
            raise NotFoundError(f"collective_id: no collective {collective_id}")
        if not self.gate.me().admin:  # it forgets what its members may not see: an admin's
            await self.gate.writable(cid)
            self.gate.me().need_admin("deleting a collective (it forgets every member's memories)")
        token = self.owed.owe({"collective": str(cid)})
        await self._delete_collective(cid)
        self.owed.paid(token)

    async def _delete_collective(self, cid: UUID) -> None:
        seq = await self.writer.write(
            ev.CollectiveDeleted(**self.writer.common(), collective_id=cid)
        )
        tombstones: list[ev.Event] = [
            DELETES_OF[entity](**self.writer.common(), collective_id=cid, **{f"{entity}_id": key})
            for entity in ("experience", "relation", "insight")
            for key in await self.reads.read(queries.ids_in_collective, entity, cid)
        ]  # after the collective's tombstone, so the purge below keeps them
        tombstones += [
            ev.SessionDeleted(**self.writer.common(), collective_id=cid, session_id=key)
            for key in await self.reads.read(queries.session_ids_in_collective, cid)
        ]  # (and one for every session of its agents)
        tombstones += [
            ev.ThreadDeleted(**self.writer.common(), collective_id=cid, thread_id=key)
            for key in await self.reads.read(queries.thread_ids_in_collective, cid)
        ]  # (and one for every thread of its agents' frameworks)
        for start in range(0, len(tombstones), BATCH_MAX):
            await self.writer.write_many(tombstones[start : start + BATCH_MAX], atomic=True)
        await self.sealer.keyring.destroy_under(collective_prefix(cid))  # its data keys
        await self.log.purge(f"{subjects.PREFIX}.c.{cid}.>", before_seq=seq)
        await self.log.purge(f"{subjects.PREFIX}.a.{cid}.>", before_seq=None)  # its presence

    async def finish_owed_purges(self) -> int:
        """Finish what deletes interrupted by a crash still owe (``sync.owed``): append
        the tombstone if it is not in the stream yet and purge before it, or delete the
        collective again. Runs when an instance opens; returns how many it finished.
        One that fails stays owed (logged) for the next open."""
        async with self._owed_lock:  # (on open, and on an edge host's link returning)
            return await self._finish_owed()

    async def _finish_owed(self) -> int:
        finished = 0
        for token, owed in self.owed.pending():
            try:
                if "tombstone" in owed:
                    body = bytes.fromhex(owed["tombstone"])
                    # as the version that wrote it (1 in records from before it was said)
                    event = decode_event(body, {HDR_SCHEMA: str(owed.get("schema", 1))})
                    await self.writer.tombstone(event, owed["forget"], token)
                elif "collective" in owed:
                    await self._delete_collective(UUID(owed["collective"]))
                    self.owed.paid(token)
                else:
                    await self.log.purge(owed["purge"], before_seq=int(owed["before_seq"]))
                    self.owed.paid(token)
                finished += 1
            except Exception:
                log.exception("an owed purge (%s) failed; it stays owed", owed)
        return finished

    @idempotent
    async def delete_experience(
        self, experience_id: UUID, *, idempotency_key: str | None = None
    ) -> None:
        """Delete and forget: the content and embedding leave every host's state and
        indexes and the stream itself (only the tombstone stays). Repeating it is
        harmless and finishes forgetting if an earlier call was interrupted."""
        await self._may_delete("experience", experience_id)
        await self.writer.delete("experience", experience_id)

    @idempotent
    async def delete_relation(
        self, relation_id: UUID, *, idempotency_key: str | None = None
    ) -> None:
        """Delete a relation and forget it (idempotent, as every delete)."""
        await self._may_delete("relation", relation_id)
        await self.writer.delete("relation", relation_id)

    @idempotent
    async def delete_insight(self, insight_id: UUID, *, idempotency_key: str | None = None) -> None:
        """Delete an insight and forget it (idempotent, as every delete)."""
        await self._may_delete("insight", insight_id)
        await self.writer.delete("insight", insight_id)

    @idempotent
    async def delete_wisdom(self, wisdom_id: UUID, *, idempotency_key: str | None = None) -> None:
        """Delete wisdom and forget it (idempotent, as every delete)."""
        await self._may_delete("wisdom", wisdom_id)
        await self.writer.delete("wisdom", wisdom_id)

    async def compact(self) -> Compacted:
        """Forget on this host's disk now: once every delete in the log is applied here,
        rewrite the DuckDB file, the text index and the vector files so that nothing a
        delete forgot is left in them (``Projection.scrub``; without this call it happens
        within ``ProjectionSettings.scrub_after`` seconds of a delete). The log itself
        holds deleted text and vectors only as ciphertext whose key is destroyed. Admins
        only (and the local operator)."""
        self.gate.me().need_admin("compacting")
        seq = await self.sync()
        took = await self.engine.scrub()
        return Compacted(
            applied_seq=seq, duckdb_seconds=took["duckdb"], text_seconds=took["tantivy"],
            vectors_seconds=took["vectors"],
        )  # fmt: skip

    async def rotate_keys(self) -> KeysRotated:
        """Rotate the key-encryption key: a new one, every data key wrapped again with
        it, the old one erased (``eventlog.keys.Keyring.rotate``). Any copy of a
        destroyed data key that outlived its erasure can no longer be unwrapped. Takes a
        few seconds (hosts learn of the new key first). Admins only."""
        self.gate.me().need_admin("rotating the key-encryption key")
        keyring = self.sealer.keyring
        rewrapped = await keyring.rotate()
        return KeysRotated(kek_id=await keyring.current_kek_id(), rewrapped=rewrapped)

    async def _may_delete(self, entity: str, entity_id: UUID) -> None:
        """A restricted caller deletes what it may change; repeating the delete of a
        deleted entity (to finish forgetting it) takes a write scope and membership of its
        live collective (for wisdom, its owner)."""
        me = self.gate.me()
        if me.admin:
            return
        key = uuid_of(f"{entity}_id", entity_id)
        if await self.reads.read(queries.access_of, entity, key) is not None:
            await self.gate.entity(entity, key, write=True)
            return
        anchor = await self.reads.read(queries.anchor_of, entity, key)
        if entity == "wisdom":
            ours = anchor == me.owner
        else:
            collective = await self.reads.read(queries.get_collective, anchor) if anchor else None
            ours = collective is not None and me.member(collective.owner_id, anchor)
        if not ours:
            raise NotFoundError(f"{entity}_id: no {entity} {entity_id}")
        me.need_write()

    async def forget_copies(self, state: Path) -> None:
        """An edge host that opens forgets, in its own streams, what the deletes it applied
        since it last opened forgot: those that came while it was away were applied by
        the catch-up, before the tail's listener (``sync.replication``) runs."""
        mark = state / "copies-forgotten.json"
        since = 0
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            since = int(json.loads(mark.read_text())["through"])
        through = self.engine.seq
        keyring = self.sealer.keyring
        for seq, entity, cid, key in await self.engine.run(Projection.deletes_since, since):
            if entity == "collective":
                subject = f"{subjects.PREFIX}.c.{cid}.>"
                keys = functools.partial(keyring.destroy_copies, prefix=collective_prefix(key))
            elif entity == "wisdom":
                subject = subjects.wisdom_subject(key)
                keys = functools.partial(keyring.destroy_copies, key_name(entity, key, None))
            else:
                assert cid is not None
                subject = subjects.collective_subject(cid, entity, key)
                keys = functools.partial(keyring.destroy_copies, key_name(entity, key, cid))
            try:
                await self.log.purge_copy(subject, before_seq=seq)
                await keys()
            except Exception:  # a failure leaves the mark where it was: done again next time
                log.warning("forgetting this host's copy of %s failed", subject, exc_info=True)
                return
        await asyncio.to_thread(mark.write_text, json.dumps({"through": through}))

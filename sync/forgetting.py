"""Forgetting: every delete is a tombstone that wins, then a purge of what came before it
on the entity's subject, so the content leaves the stream as well as every host's state
and indexes. Repeating a delete is harmless and finishes forgetting if an earlier call
was interrupted. (A write that lands after a concurrent delete is forgotten by the
write path itself: ``InstanceCore._forget_if_deleted``.)"""

from __future__ import annotations

from uuid import UUID

from eventlog import events as ev
from eventlog import subjects
from eventlog.errors import NotFoundError
from projections import queries
from sync.core import DELETES_OF, InstanceCore, uuid_of
from sync.models import BATCH_MAX


class Forgetting(InstanceCore):
    async def delete_collective(self, collective_id: UUID) -> None:
        """Delete a collective and forget everything in it: a tombstone for the collective
        and one for every experience, relation and insight in it, then everything before
        the collective's tombstone is purged from the stream (and its agents' activities).
        Every host wipes those rows and drops them from its indexes; the stream keeps the
        tombstones only. Repeating it is harmless (and finishes forgetting if an earlier
        call was interrupted)."""
        cid = uuid_of("collective_id", collective_id)
        if await self._read(queries.anchor_of, "collective", cid) is None:
            raise NotFoundError(f"collective_id: no collective {collective_id}")
        seq = await self._write(ev.CollectiveDeleted(**self._common(), collective_id=cid))
        tombstones: list[ev.Event] = [
            DELETES_OF[entity](**self._common(), collective_id=cid, **{f"{entity}_id": key})
            for entity in ("experience", "relation", "insight")
            for key in await self._read(queries.ids_in_collective, entity, cid)
        ]  # after the collective's tombstone, so the purge below keeps them
        for start in range(0, len(tombstones), BATCH_MAX):
            await self._write_many(tombstones[start : start + BATCH_MAX], atomic=True)
        await self.log.purge(f"{subjects.PREFIX}.c.{cid}.>", before_seq=seq)
        await self.log.purge(f"{subjects.PREFIX}.a.{cid}.>", before_seq=None)  # its presence

    async def delete_experience(self, experience_id: UUID) -> None:
        """Delete and forget: the content and embedding leave every host's state and
        indexes and the stream itself (only the tombstone stays). Repeating it is
        harmless and finishes forgetting if an earlier call was interrupted."""
        await self._delete("experience", experience_id)

    async def delete_relation(self, relation_id: UUID) -> None:
        """Delete a relation and forget it (idempotent, as every delete)."""
        await self._delete("relation", relation_id)

    async def delete_insight(self, insight_id: UUID) -> None:
        """Delete an insight and forget it (idempotent, as every delete)."""
        await self._delete("insight", insight_id)

    async def delete_wisdom(self, wisdom_id: UUID) -> None:
        """Delete wisdom and forget it (idempotent, as every delete)."""
        await self._delete("wisdom", wisdom_id)

"""Wisdom: patterns an owner learned across collectives (few per owner: exact scan)."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

import numpy as np
import numpy.typing as npt

from eventlog import events as ev
from eventlog.errors import Forbidden, NotFoundError, ValidationError
from eventlog.ids import uuid7
from projections import queries
from sync import models
from sync.core import as_of_read, check_limit, check_text
from sync.gate import Gate
from sync.idempotency import idempotent
from sync.models import validated
from sync.reading import Reader
from sync.writer import Writer


class Wisdom:
    """An owner's wisdom (see the module docstring)."""

    def __init__(self, reads: Reader, gate: Gate, writer: Writer) -> None:
        self.reads, self.gate, self.writer = reads, gate, writer

    # -- wisdom: per owner, across collectives ---------------------------------------------

    @idempotent
    async def store_wisdom(
        self,
        owner_id: str,
        category: str,
        pattern: str,
        embedding: Sequence[float] | npt.NDArray[np.float32],
        *,
        confidence: float = 0.5,
        source_collectives: Sequence[UUID] = (),
        source_experience_count: int = 0,
        applicable_domains: Sequence[str] = (),
        visibility: ev.Visibility = "team",
        idempotency_key: str | None = None,
    ) -> UUID:
        """A pattern learned across an owner's collectives. The wisdom of one owner that a
        caller sees shares one embedding dimension (the first stored sets it). ``visibility``:
        "private" (its author), "team" (every principal of the owner) or "org" (all)."""
        spec = validated(
            models.WisdomIn, owner_id=owner_id, category=category, pattern=pattern,
            embedding=embedding, confidence=confidence,
            source_collectives=list(source_collectives),
            source_experience_count=source_experience_count,
            applicable_domains=list(applicable_domains), visibility=visibility,
        )  # fmt: skip
        me = self.gate.me()
        me.need_write()
        if not me.admin and spec.owner_id != me.owner:
            raise Forbidden(
                f"owner_id: {me.describe()} may store wisdom of owner {me.owner!r} only"
            )
        for source in spec.source_collectives:
            try:
                found: queries.Collective | None = (await self.gate.readable(source))[0]
            except NotFoundError:
                found = None
            if found is None or found.owner_id != spec.owner_id:
                raise NotFoundError(
                    f"source_collectives: no collective {source} owned by {spec.owner_id!r}"
                )
        # (checked against what the caller sees of it: another agent's private wisdom must
        # not tell its dimension; a search skips wisdom of another dimension anyway)
        existing = await self.reads.read(queries.wisdom_of, spec.owner_id, None if me.admin else me)
        if existing and len(ev.unpack_vector(existing[0].embedding)) != len(spec.embedding):
            raise ValidationError(
                f"embedding: {len(spec.embedding)} values, the wisdom of {spec.owner_id!r} "
                f"has dimension {len(ev.unpack_vector(existing[0].embedding))}"
            )
        wisdom_id = self.writer.new_id()
        await self.writer.write(
            ev.WisdomStored(
                **self.writer.common(), wisdom_id=wisdom_id, owner_id=spec.owner_id,
                category=spec.category, pattern=spec.pattern, confidence=spec.confidence,
                embedding=ev.pack_vector(spec.embedding),
                source_collectives=tuple(spec.source_collectives),
                source_experience_count=spec.source_experience_count,
                applicable_domains=tuple(spec.applicable_domains),
                visibility=spec.visibility,
            )
        )  # fmt: skip
        return wisdom_id

    @as_of_read
    async def get_wisdom(
        self,
        owner_id: str,
        query: Sequence[float] | npt.NDArray[np.float32] | None = None,
        k: int = 10,
        *,
        as_of: models.AsOf = None,
    ) -> list[queries.ScoredWisdom]:
        """An owner's wisdom (what the caller may see of it): nearest to ``query`` first,
        or all (oldest first, score 1)."""
        check_text("owner_id", owner_id, models.NAME_MAX)
        check_limit("k", k)
        me = self.gate.me()
        viewer = None if me.admin else me
        if query is None:
            found = await self.reads.read(queries.wisdom_of, owner_id, viewer)
            return [queries.ScoredWisdom(w, 1.0) for w in found][:k]
        vector = validated(models.SearchIn, collective_id=uuid7(), embedding=query).embedding
        assert vector is not None
        return await self.reads.read(queries.similar_wisdom, owner_id, vector, k, viewer)

"""Relations between experiences and insights distilled from them."""

from __future__ import annotations

import math
import typing
from collections.abc import Sequence
from typing import Literal
from uuid import UUID

import numpy as np
import numpy.typing as npt

from eventlog import events as ev
from eventlog.errors import ConflictError, NotFoundError, ValidationError
from projections import queries
from sync import models
from sync.core import as_of_read, text_languages, uuid_of, vector_for
from sync.gate import Gate
from sync.idempotency import idempotent
from sync.models import validated
from sync.reading import Reader
from sync.writer import Writer

# relation types that may close their target, and what the target is said to be
INVALIDATING = {"Supersedes": "superseded", "Contradicts": "contradicted"}


class Links:
    """Relations and insights (see the module docstring)."""

    def __init__(self, reads: Reader, gate: Gate, writer: Writer) -> None:
        self.reads, self.gate, self.writer = reads, gate, writer

    # -- relations -------------------------------------------------------------------------

    @idempotent
    async def store_relation(
        self,
        source_id: UUID,
        target_id: UUID,
        relation_type: str,
        *,
        strength: float = 0.5,
        metadata: str | None = None,
        visibility: ev.Visibility = "team",
        invalidate: bool = False,
        idempotency_key: str | None = None,
    ) -> UUID:
        """Link two experiences of one collective. A (source, target, type) triple is
        unique among the relations shared alike (of one visibility; private ones: of one
        author): storing it again raises ``ConflictError`` naming the existing relation,
        which the caller can always see (one it may not see never stands in its way).
        (Two hosts racing on one triple both succeed; the fold keeps the smaller id and
        lists the other under dead_letters.) ``invalidate`` (Supersedes and Contradicts
        only): the target stops being true now, in the same append as the relation."""
        spec = validated(
            models.RelationIn, source_id=source_id, target_id=target_id,
            relation_type=relation_type, strength=strength, metadata=metadata,
            visibility=visibility, invalidate=invalidate,
        )  # fmt: skip
        source_collective = await self.gate.entity(
            "experience", spec.source_id, write=False, field="source_id"
        )
        target_collective = await self.gate.entity(
            "experience", spec.target_id, write=False, field="target_id"
        )
        if source_collective != target_collective:
            raise ValidationError(
                f"target_id: is in collective {target_collective}, source_id in "
                f"{source_collective}; relations stay within one collective"
            )
        assert source_collective is not None
        await self.gate.writable(source_collective)
        me = self.gate.me()
        taken = await self.reads.read(
            queries.relation_taken, spec.source_id, spec.target_id, spec.relation_type,
            spec.visibility, me.owner, me.agent,
        )  # fmt: skip
        if taken is not None:  # (shared as the new one would be: the caller sees it)
            raise ConflictError(
                f"relation: ({spec.source_id}, {spec.target_id}, {spec.relation_type}) "
                f"already exists as relation {taken}; a triple is unique among the "
                f"{spec.visibility} relations"
                + (" of one author" if spec.visibility == "private" else "")
            )
        if spec.invalidate and spec.relation_type not in INVALIDATING:
            raise ValidationError(
                f"invalidate: only a {' or '.join(INVALIDATING)} relation invalidates its "
                f"target, got {spec.relation_type}"
            )
        relation_id = self.writer.new_id()
        stored = ev.RelationStored(
            **self.writer.common(), relation_id=relation_id,
            collective_id=source_collective, source_id=spec.source_id,
            target_id=spec.target_id, relation_type=spec.relation_type,
            strength=spec.strength, metadata=spec.metadata, visibility=spec.visibility,
        )  # fmt: skip
        if not spec.invalidate:
            await self.writer.write(stored)
            return relation_id
        common = self.writer.common()
        closed = ev.ExperienceInvalidated(
            **common, experience_id=spec.target_id, collective_id=source_collective,
            reason=f"{INVALIDATING[spec.relation_type]} by another experience (a "
            f"{spec.relation_type} relation)",  # (no id: the reader may not see it)
            valid_to_ms=ev.hlc_millis(common["hlc"]),
        )  # fmt: skip
        await self.writer.write_many([stored, closed], atomic=True)
        return relation_id

    @as_of_read
    async def get_related_experiences(
        self,
        experience_id: UUID,
        direction: Literal["outgoing", "incoming", "both"] = "both",
        relation_types: Sequence[str] | None = None,
        *,
        min_strength: float | None = None,
        limit: int = models.PAGE_DEFAULT,
        after: str | None = None,
        as_of: models.AsOf = None,
    ) -> models.Page[queries.RelatedExperience]:
        """Experiences linked to this one (outgoing, incoming or both), optionally only
        some relation types and at least some strength: one page of at most ``limit``
        (1..1000, default 100), outgoing before incoming, each by relation id; the page's
        ``next`` is the cursor of the rest (``after=``), None on the last page."""
        if direction not in ("outgoing", "incoming", "both"):
            raise ValidationError(
                f"direction: must be 'outgoing', 'incoming' or 'both', got {direction!r}"
            )
        if relation_types is not None:
            known = set(typing.get_args(ev.RelationType))
            unknown = [t for t in relation_types if t not in known]
            if unknown:
                raise ValidationError(
                    f"relation_types: unknown {unknown}; known: {', '.join(sorted(known))}"
                )
        if min_strength is not None and not (
            math.isfinite(min_strength) and 0 <= min_strength <= 1
        ):
            raise ValidationError(f"min_strength: must be in [0, 1], got {min_strength}")
        models.check_page_limit(limit)
        key = models.from_cursor("related_experiences", after, (int, UUID))
        experience_id = uuid_of("experience_id", experience_id)
        collective_id = await self.gate.entity("experience", experience_id, write=False)
        viewer = None
        if not self.gate.me().admin:
            _, viewer = await self.gate.readable(collective_id)
        related, last = await self.reads.read(
            queries.related_page, experience_id, direction, relation_types,
            min_strength=min_strength, limit=limit, after=key, viewer=viewer,
        )  # fmt: skip
        return models.Page(
            related, None if last is None else models.cursor("related_experiences", last)
        )

    # -- insights --------------------------------------------------------------------------

    @idempotent
    async def store_insight(
        self,
        collective_id: UUID,
        content: str,
        embedding: Sequence[float] | npt.NDArray[np.float32] | None = None,
        *,
        source_experiences: Sequence[UUID],
        confidence: float = 0.5,
        domain: Sequence[str] = (),
        embedder: str | None = None,
        visibility: ev.Visibility = "team",
        idempotency_key: str | None = None,
    ) -> UUID:
        """A distilled insight, derived from 1..100 live experiences of the collective
        (each one the caller may see)."""
        spec = validated(
            models.InsightIn, collective_id=collective_id, content=content,
            embedding=embedding, embedder=embedder,
            source_experiences=list(source_experiences), confidence=confidence,
            domain=list(domain), visibility=visibility,
        )  # fmt: skip
        collective = await self.gate.writable(spec.collective_id)
        for source in spec.source_experiences:
            try:
                found = await self.gate.entity(
                    "experience", source, write=False, field="source_experiences"
                )
            except NotFoundError:
                found = None
            if found != spec.collective_id:
                raise NotFoundError(
                    f"source_experiences: no experience {source} in collective {collective.name!r}"
                )
        vector = await vector_for(collective, spec.content, spec.embedding, spec.embedder)
        (language,) = await text_languages(collective, [spec.content])
        insight_id = self.writer.new_id()
        await self.writer.write(
            ev.InsightStored(
                **self.writer.common(), insight_id=insight_id,
                collective_id=spec.collective_id, content=spec.content,
                embedding=ev.pack_vector(vector),
                source_experiences=tuple(spec.source_experiences),
                confidence=spec.confidence, domain=tuple(spec.domain),
                visibility=spec.visibility, language=language,
            )
        )  # fmt: skip
        return insight_id

    @as_of_read
    async def get_insight(
        self, insight_id: UUID, *, as_of: models.AsOf = None
    ) -> queries.Insight | None:
        """The insight, or None (also when the caller may not see it); its sources the
        caller may not see are left out."""
        key = uuid_of("insight_id", insight_id)
        if self.gate.me().admin:
            return await self.reads.read(queries.get_insight, key)
        try:
            collective_id = await self.gate.entity("insight", key, write=False)
            _, viewer = await self.gate.readable(collective_id)
        except NotFoundError:
            return None
        return await self.reads.read(queries.get_insight, key, viewer)

    @as_of_read
    async def get_insights(
        self,
        collective_id: UUID,
        query: str | Sequence[float] | npt.NDArray[np.float32],
        k: int = 10,
        *,
        embedder: str | None = None,
        as_of: models.AsOf = None,
    ) -> list[queries.ScoredInsight]:
        """The k insights nearest to ``query`` (a vector, or text with an embedder)."""
        text, vector = (query, None) if isinstance(query, str) else (None, query)
        spec = validated(
            models.SearchIn, collective_id=collective_id, text=text, embedding=vector, k=k
        )
        collective, viewer = await self.gate.readable(spec.collective_id)
        q = await vector_for(
            collective, spec.text, spec.embedding, embedder, field="query", query=True
        )
        return await self.reads.read(
            queries.similar_insights, collective.collective_id, q, spec.k, viewer
        )

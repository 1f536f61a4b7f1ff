"""Recall: search by meaning, by words and both fused, weighted by energy; cold
experiences; everything an agent needs before a task in one call.

The engine thread does the searching (``projections.queries``: FAISS, tantivy and the
engine's memory); this part validates, embeds the query off the loop, and re-ranks
the candidates by energy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import msgspec
import numpy as np
import numpy.typing as npt

from eventlog.errors import ValidationError
from projections import queries
from sync import models
from sync.core import InstanceSettings, as_of_read, check_limit, vector_for
from sync.gate import Gate
from sync.models import validated
from sync.presence import Activity, Presence
from sync.reading import Reader

RRF_K = 60  # the usual Reciprocal Rank Fusion constant


class Context(msgspec.Struct, frozen=True, kw_only=True):
    """What ``get_context_candidates`` returns; a switched-off part is empty."""

    collective_id: UUID
    similar: list[queries.ScoredExperience]
    recent: list[queries.Experience]
    insights: list[queries.ScoredInsight]
    relations: list[queries.Relation]
    active_agents: list[Activity]


class Recall:
    """Search and context (see the module docstring); ``presence`` says who is active."""

    def __init__(
        self, reads: Reader, gate: Gate, settings: InstanceSettings, presence: Presence
    ) -> None:
        self.reads, self.gate, self.settings, self.presence = (
            reads,
            gate,
            settings,
            presence,
        )

    @as_of_read
    async def search_similar(
        self,
        collective_id: UUID,
        query: str | Sequence[float] | npt.NDArray[np.float32],
        k: int = 10,
        flt: Any = None,
        *,
        embedder: str | None = None,
        energy_weight: float | None = None,
        as_of: models.AsOf = None,
    ) -> list[queries.ScoredExperience]:
        """The k experiences nearest in meaning to ``query`` (a vector, or a text when the
        collective has an embedder), filtered, weighted by energy."""
        text, vector = (query, None) if isinstance(query, str) else (None, query)
        spec = validated(
            models.SearchIn, collective_id=collective_id, text=text, embedding=vector, k=k,
            energy_weight=energy_weight,
        )  # fmt: skip
        collective, viewer = await self.gate.readable(spec.collective_id)
        q = await vector_for(
            collective, spec.text, spec.embedding, embedder, field="query", query=True
        )
        hits = await self.reads.read(
            queries.similar_experiences, collective.collective_id, q,
            self._pool(spec.k, spec.energy_weight), self.reads.filter(flt, viewer),
        )  # fmt: skip
        return self._weighted(hits, spec.energy_weight, spec.k)

    def _pool(self, k: int, energy_weight: float | None) -> int:
        """How many candidates to fetch so that re-weighting by energy can reorder them."""
        w = self.settings.energy_weight if energy_weight is None else energy_weight
        return k if w == 0 else min(max(4 * k, 50), models.K_MAX * 4)

    def _weighted(
        self, hits: list[queries.ScoredExperience], weight: float | None, k: int
    ) -> list[queries.ScoredExperience]:
        """Order by relevance weighted by energy: relevance x (1 - w + w x energy), and
        by ``unstable_weight`` for an experience invalidated often."""
        w = self.settings.energy_weight if weight is None else weight
        shaky = self.settings.unstable_weight
        now = int(time.time() * 1000)
        out = []
        for hit in hits:
            e = queries.energy_of(hit.experience, now, **self.settings.energy)
            score = hit.score * (1 - w + w * e) * (shaky if hit.experience.unstable else 1.0)
            out.append(queries.ScoredExperience(hit.experience, score, hit.score, e))
        out.sort(key=lambda h: -h.score)
        return out[:k]

    @as_of_read
    async def search_text(
        self,
        collective_id: UUID,
        text: str,
        k: int = 10,
        flt: Any = None,
        *,
        energy_weight: float | None = None,
        as_of: models.AsOf = None,
    ) -> list[queries.ScoredExperience]:
        """BM25 full-text matches of ``text``, filtered, weighted by energy."""
        spec = validated(
            models.SearchIn, collective_id=collective_id, text=text, k=k,
            energy_weight=energy_weight,
        )  # fmt: skip
        if not (spec.text or "").strip():
            raise ValidationError("text: must contain at least one word")
        collective, viewer = await self.gate.readable(spec.collective_id)
        hits = await self.reads.read(
            queries.search_text, collective.collective_id, spec.text or "",
            self._pool(spec.k, spec.energy_weight), self.reads.filter(flt, viewer),
        )  # fmt: skip
        return self._weighted(hits, spec.energy_weight, spec.k)

    @as_of_read
    async def search_hybrid(
        self,
        collective_id: UUID,
        text: str,
        embedding: Sequence[float] | npt.NDArray[np.float32] | None = None,
        k: int = 10,
        flt: Any = None,
        *,
        embedder: str | None = None,
        vector_weight: float = 1.0,
        text_weight: float = 1.0,
        energy_weight: float | None = None,
        as_of: models.AsOf = None,
    ) -> list[queries.ScoredExperience]:
        """Meaning and words together: the vector and BM25 rankings fused by Reciprocal
        Rank Fusion (score = sum of weight / (60 + rank)), then weighted by energy.
        ``embedding`` may be left out when the collective has an embedder."""
        spec = validated(
            models.SearchIn, collective_id=collective_id, text=text, embedding=embedding, k=k,
            vector_weight=vector_weight, text_weight=text_weight, energy_weight=energy_weight,
        )  # fmt: skip
        if not (spec.text or "").strip():
            raise ValidationError("text: must contain at least one word")
        collective, viewer = await self.gate.readable(spec.collective_id)
        q = await vector_for(
            collective, spec.text, spec.embedding, embedder, field="embedding", query=True
        )
        return await self._hybrid(collective.collective_id, spec, q, self.reads.filter(flt, viewer))

    async def _hybrid(
        self,
        collective_id: UUID,
        spec: models.SearchIn,
        q: npt.NDArray[np.float32],
        flt: queries.ExperienceFilter,
    ) -> list[queries.ScoredExperience]:
        return await self.reads.read(
            queries.hybrid_experiences, collective_id, spec.text or "", q,
            max(4 * spec.k, 50), flt, vector_weight=spec.vector_weight,
            text_weight=spec.text_weight, rrf_k=RRF_K,
            weighing=self._weighing(spec.energy_weight, spec.k),
        )  # fmt: skip

    def _weighing(self, weight: float | None, k: int) -> queries.Weighing:
        """``_weighted`` on the engine thread: only the hits kept are made answers."""
        return queries.Weighing(
            k=k, weight=self.settings.energy_weight if weight is None else weight,
            shaky=self.settings.unstable_weight, now_ms=int(time.time() * 1000),
            **self.settings.energy,
        )  # fmt: skip

    @as_of_read
    async def list_cold_experiences(
        self,
        collective_id: UUID,
        threshold: float = 0.1,
        limit: int = 100,
        flt: Any = None,
        *,
        as_of: models.AsOf = None,
    ) -> list[queries.ScoredExperience]:
        """Experiences whose energy (see ``projections.queries.energy``) is below
        ``threshold``, coldest first: candidates to archive or forget."""
        if not (math.isfinite(threshold) and 0.0 <= threshold <= 1.0):
            raise ValidationError(f"threshold: must be a finite number in [0, 1], got {threshold}")
        check_limit("limit", limit)
        collective, viewer = await self.gate.readable(collective_id)
        return await self.reads.read(
            queries.cold_experiences, collective.collective_id, threshold, limit,
            int(time.time() * 1000), self.reads.filter(flt, viewer), **self.settings.energy,
        )  # fmt: skip

    async def get_context_candidates(
        self, /, request: models.ContextIn | dict[str, Any] | None = None, **fields: Any
    ) -> Context:
        """Everything an agent needs before a task, in one call: experiences similar to the
        task (hybrid when there is text, by vector otherwise), the most recent ones,
        similar insights, the relations among all of these, and who is active. Each part
        can be switched off; the filter applies throughout."""
        if isinstance(request, models.ContextIn):
            spec = request
        else:
            spec = validated(models.ContextIn, **{**(request or {}), **fields})
        async with self.reads.at(spec.as_of):
            collective, viewer = await self.gate.readable(spec.collective_id)
            cid = collective.collective_id
            flt = self.reads.filter(spec.filter, viewer)
            q: npt.NDArray[np.float32] | None = None
            if spec.embedding is not None or spec.text:
                q = await vector_for(
                    collective, spec.text, spec.embedding, spec.embedder, query=True
                )
            hybrid = bool(spec.similar and q is not None and spec.text and spec.text.strip())
            pool = max(4 * spec.k, 50) if hybrid else self._pool(spec.k, spec.energy_weight)
            found = await self.reads.read(
                _context, cid, spec.text or "", q, flt, pool, hybrid, spec.similar, spec.recent,
                spec.insights, spec.vector_weight, spec.text_weight, viewer,
            )  # fmt: skip
            similar = self._weighted(found[0], spec.energy_weight, spec.k)
            recent, insights = found[1], found[2]
            relations: list[queries.Relation] = []
            if spec.relations:
                ids = {h.experience.experience_id for h in similar} | {
                    e.experience_id for e in recent
                }
                relations = await self.reads.read(
                    queries.relations_among, sorted(ids), queries.CONTEXT_RELATIONS_MAX, viewer
                )
            agents = await self.presence.get_active_agents(cid) if spec.active_agents else []
        return Context(
            collective_id=cid, similar=similar, recent=recent, insights=insights,
            relations=relations, active_agents=agents,
        )  # fmt: skip


# -- what runs on the engine thread ---------------------------------------------------------


def _context(
    p: Any,
    cid: UUID,
    text: str,
    q: Any,
    flt: Any,
    pool: int,
    hybrid: bool,
    similar: bool,
    recent: int,
    insights: int,
    vw: float,
    tw: float,
    viewer: Any = None,
) -> tuple[list[queries.ScoredExperience], list[queries.Experience], list[queries.ScoredInsight]]:
    """The parts of a context that read the projection, in one visit to the engine."""
    hits: list[queries.ScoredExperience] = []
    if similar and q is not None:
        if hybrid:
            hits = queries.hybrid_experiences(
                p, cid, text, q, pool, flt, vector_weight=vw, text_weight=tw, rrf_k=RRF_K
            )
        else:
            hits = queries.similar_experiences(p, cid, q, pool, flt)
    newest = queries.recent_experiences(p, cid, recent, flt) if recent else []
    near = (
        queries.similar_insights(p, cid, q, insights, viewer) if insights and q is not None else []
    )
    return hits, newest, near

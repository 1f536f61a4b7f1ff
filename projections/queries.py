"""Read queries over a projection: what the public API calls. Results are typed msgspec
Structs; everything here reads the live views, so deleted, invalid and (unless asked
for) archived rows never come back."""

from __future__ import annotations

from typing import Any, Literal, Sequence
from uuid import UUID

import msgspec
import numpy as np
import numpy.typing as npt

from eventlog import events as ev
from projections.projection import Projection


class ExperienceFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which experiences a query may return (all fields optional)."""

    domains: tuple[str, ...] | None = None  # at least one of these tags
    experience_types: tuple[str, ...] | None = None  # variant names, e.g. ("Fact",)
    min_importance: float | None = None
    min_confidence: float | None = None
    since_ms: int | None = None  # recorded at or after (Unix ms)
    include_archived: bool = False

    @property
    def narrows(self) -> bool:
        """True when it selects more than "live, and not archived unless asked"."""
        return any(
            v is not None
            for v in (
                self.domains,
                self.experience_types,
                self.min_importance,
                self.min_confidence,
                self.since_ms,
            )
        )


ANY_LIVE = ExperienceFilter()  # the default: every live experience that is not archived


class Experience(msgspec.Struct, frozen=True, kw_only=True):
    experience_id: UUID
    collective_id: UUID
    content: str
    embedding: bytes
    experience_type: ev.ExperienceType
    importance: float
    confidence: float
    domain: tuple[str, ...]
    related_files: tuple[str, ...]
    source_agent: str
    source_task: str | None
    timestamp_ms: int
    archived: bool
    applications: int
    last_reinforced_ms: int | None

    @property
    def vector(self) -> npt.NDArray[np.float32]:
        return ev.unpack_vector(self.embedding)


class ScoredExperience(msgspec.Struct, frozen=True):
    experience: Experience
    score: float


class Relation(msgspec.Struct, frozen=True, kw_only=True):
    relation_id: UUID
    collective_id: UUID
    source_id: UUID
    target_id: UUID
    relation_type: str
    strength: float
    metadata: str | None


class RelatedExperience(msgspec.Struct, frozen=True):
    relation: Relation
    experience: Experience  # the experience at the other end


class Insight(msgspec.Struct, frozen=True, kw_only=True):
    insight_id: UUID
    collective_id: UUID
    content: str
    embedding: bytes
    source_experiences: tuple[UUID, ...]
    confidence: float
    domain: tuple[str, ...]


class ScoredInsight(msgspec.Struct, frozen=True):
    insight: Insight
    score: float


class CollectiveStats(msgspec.Struct, frozen=True, kw_only=True):
    collective_id: UUID
    experiences: int
    archived: int
    relations: int
    insights: int
    applications: int
    dead_letters: int


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    entity: str
    id: UUID | None
    collective_id: UUID | None
    reason: str
    seq: int | None
    subject: str | None


_EXPERIENCE_FIELDS = (
    "experience_id", "collective_id", "content", "embedding", "type_data", "importance",
    "confidence", "domain", "related_files", "source_agent", "source_task", "created_ms",
    "archived", "applications", "last_reinforced",
)  # fmt: skip


def _experience_columns(alias: str = "") -> str:
    cols = [f"{alias}{name}" for name in _EXPERIENCE_FIELDS]
    cols[-1] = f"epoch_ms({cols[-1]})"
    return ", ".join(cols)


_EXPERIENCE_COLUMNS = _experience_columns()
_kind_decoder = msgspec.json.Decoder(ev.ExperienceType)


def _experience(row: Sequence[Any]) -> Experience:
    return Experience(
        experience_id=row[0],
        collective_id=row[1],
        content=row[2],
        embedding=row[3],
        experience_type=_kind_decoder.decode(row[4]),
        importance=row[5],
        confidence=row[6],
        domain=tuple(row[7] or ()),
        related_files=tuple(row[8] or ()),
        source_agent=row[9],
        source_task=row[10],
        timestamp_ms=row[11],
        archived=row[12],
        applications=int(row[13]),
        last_reinforced_ms=row[14],
    )


def _where(collective_id: UUID, flt: ExperienceFilter) -> tuple[str, list[Any]]:
    clauses: list[str] = ["collective_id = ?"]
    params: list[Any] = [collective_id]
    if not flt.include_archived:
        clauses.append("NOT archived")
    if flt.domains is not None:
        clauses.append("list_has_any(domain, ?::VARCHAR[])")
        params.append(list(flt.domains))
    if flt.experience_types is not None:
        clauses.append("list_contains(?::VARCHAR[], experience_type)")
        params.append(list(flt.experience_types))
    if flt.min_importance is not None:
        clauses.append("importance >= ?")
        params.append(flt.min_importance)
    if flt.min_confidence is not None:
        clauses.append("confidence >= ?")
        params.append(flt.min_confidence)
    if flt.since_ms is not None:
        clauses.append("created_ms >= ?")
        params.append(flt.since_ms)
    return " AND ".join(clauses), params


def get_experience(p: Projection, experience_id: UUID) -> Experience | None:
    """One live experience (archived ones included), or None."""
    row = p.store.con.execute(
        f"SELECT {_EXPERIENCE_COLUMNS} FROM experiences WHERE experience_id = ?", [experience_id]
    ).fetchone()
    return _experience(row) if row else None


def recent_experiences(
    p: Projection,
    collective_id: UUID,
    limit: int = 20,
    flt: ExperienceFilter = ANY_LIVE,
    *,
    offset: int = 0,
) -> list[Experience]:
    """Newest first (by recording time, then id)."""
    where, params = _where(collective_id, flt)
    rows = p.store.con.execute(
        f"SELECT {_EXPERIENCE_COLUMNS} FROM experiences WHERE {where} "
        "ORDER BY created_ms DESC, experience_id DESC LIMIT ? OFFSET ?",
        [*params, limit, offset],
    ).fetchall()
    return [_experience(r) for r in rows]


def _by_vec_ids(p: Projection, view: str, columns: str, ids: list[int]) -> dict[int, Any]:
    if not ids:
        return {}
    rows = p.store.con.execute(
        f"SELECT vec_id, {columns} FROM {view} WHERE vec_id IN (SELECT unnest(?::BIGINT[]))",
        [ids],
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


def similar_experiences(
    p: Projection,
    collective_id: UUID,
    query: Sequence[float] | npt.NDArray[np.float32],
    k: int = 10,
    flt: ExperienceFilter = ANY_LIVE,
) -> list[ScoredExperience]:
    """The k live experiences nearest to ``query`` by cosine similarity, best first."""
    index = p.vectors.get(("experience", collective_id))
    if index is None or k <= 0:
        return []
    vector = np.asarray(query, dtype=np.float32).reshape(1, -1)
    if vector.shape[1] != index.dim:
        raise ValueError(f"query: {vector.shape[1]} dimensions, the collective has {index.dim}")
    allowed = None
    if flt.narrows:
        where, params = _where(collective_id, flt)
        rows = p.store.con.execute(f"SELECT vec_id FROM experiences WHERE {where}", params)
        allowed = {r[0] for r in rows.fetchall()}
    hits = index.search(vector, k, include_archived=flt.include_archived, allowed=allowed)
    found = _by_vec_ids(p, "experiences", _EXPERIENCE_COLUMNS, [i for i, _ in hits])
    return [ScoredExperience(_experience(found[i]), s) for i, s in hits if i in found]


def search_text(
    p: Projection,
    collective_id: UUID,
    text: str,
    k: int = 10,
    flt: ExperienceFilter = ANY_LIVE,
) -> list[ScoredExperience]:
    """BM25 matches of ``text`` in experience content, best first, filtered."""
    if k <= 0 or not text.strip():
        return []
    where, params = _where(collective_id, flt)
    fetch = k
    while True:  # ask tantivy for more until enough pass the filter, or it has no more
        hits = p.text.search("experience", collective_id, text, fetch)
        ids = [i for i, _ in hits]
        rows = p.store.con.execute(
            f"SELECT {_EXPERIENCE_COLUMNS} FROM experiences WHERE {where} "
            "AND experience_id IN (SELECT unnest(?::UUID[]))",
            [*params, ids],
        ).fetchall()
        found = {r[0]: _experience(r) for r in rows}
        result = [ScoredExperience(found[i], s) for i, s in hits if i in found]
        if len(result) >= k or len(hits) < fetch:
            return result[:k]
        fetch *= 4


def related_experiences(
    p: Projection,
    experience_id: UUID,
    direction: Literal["outgoing", "incoming", "both"] = "both",
    relation_types: Sequence[str] | None = None,
) -> list[RelatedExperience]:
    """Experiences linked to ``experience_id`` by live relations."""
    ends = {
        "outgoing": [("source_id", "target_id")],
        "incoming": [("target_id", "source_id")],
        "both": [("source_id", "target_id"), ("target_id", "source_id")],
    }[direction]
    result = []
    for here, there in ends:
        sql = (
            "SELECT r.relation_id, r.collective_id, r.source_id, r.target_id, r.relation_type, "
            f"r.strength, r.metadata, {_experience_columns('e.')} "
            f"FROM relations r JOIN experiences e ON e.experience_id = r.{there} "
            f"WHERE r.{here} = ?"
        )
        params: list[Any] = [experience_id]
        if relation_types is not None:
            sql += " AND list_contains(?::VARCHAR[], r.relation_type)"
            params.append(list(relation_types))
        for row in p.store.con.execute(sql + " ORDER BY r.relation_id", params).fetchall():
            relation = Relation(
                relation_id=row[0], collective_id=row[1], source_id=row[2], target_id=row[3],
                relation_type=row[4], strength=row[5], metadata=row[6],
            )  # fmt: skip
            result.append(RelatedExperience(relation, _experience(row[7:])))
    return result


_INSIGHT_COLUMNS = (
    "insight_id, collective_id, content, embedding, source_experiences, confidence, domain"
)


def _insight(row: Sequence[Any]) -> Insight:
    return Insight(
        insight_id=row[0], collective_id=row[1], content=row[2], embedding=row[3],
        source_experiences=tuple(row[4]), confidence=row[5], domain=tuple(row[6] or ()),
    )  # fmt: skip


def similar_insights(
    p: Projection,
    collective_id: UUID,
    query: Sequence[float] | npt.NDArray[np.float32],
    k: int = 10,
) -> list[ScoredInsight]:
    index = p.vectors.get(("insight", collective_id))
    if index is None or k <= 0:
        return []
    hits = index.search(np.asarray(query, dtype=np.float32).reshape(1, -1), k)
    found = _by_vec_ids(p, "insights", _INSIGHT_COLUMNS, [i for i, _ in hits])
    return [ScoredInsight(_insight(found[i]), s) for i, s in hits if i in found]


def collective_stats(p: Projection, collective_id: UUID) -> CollectiveStats | None:
    row = p.store.con.execute(
        """SELECT
             (SELECT count(*) FROM experiences WHERE collective_id = $c),
             (SELECT count(*) FROM experiences WHERE collective_id = $c AND archived),
             (SELECT count(*) FROM relations WHERE collective_id = $c),
             (SELECT count(*) FROM insights WHERE collective_id = $c),
             (SELECT coalesce(sum(applications), 0) FROM experiences WHERE collective_id = $c),
             (SELECT count(*) FROM dead_letters WHERE collective_id = $c),
             (SELECT count(*) FROM collectives WHERE collective_id = $c)""",
        {"c": collective_id},
    ).fetchone()
    if row is None or row[6] == 0:
        return None
    return CollectiveStats(
        collective_id=collective_id, experiences=row[0], archived=row[1], relations=row[2],
        insights=row[3], applications=int(row[4]), dead_letters=row[5],
    )  # fmt: skip


def dead_letters(p: Projection) -> list[DeadLetter]:
    rows = p.store.con.execute(
        "SELECT entity, id, collective_id, reason, seq, subject FROM dead_letters "
        "ORDER BY entity, coalesce(seq, 0), id"
    ).fetchall()
    return [
        DeadLetter(entity=r[0], id=r[1], collective_id=r[2], reason=r[3], seq=r[4], subject=r[5])
        for r in rows
    ]

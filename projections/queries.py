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
from projections.store import uuid_literals


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
    """A search hit. ``score`` orders the results: ``relevance`` (cosine similarity, BM25
    or the fused rank score) weighted by ``energy`` (see ``energy``)."""

    experience: Experience
    score: float
    relevance: float = 0.0
    energy: float = 1.0


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


class Collective(msgspec.Struct, frozen=True, kw_only=True):
    collective_id: UUID
    owner_id: str
    name: str
    embedding_dimension: int
    embedder: str | None  # the text embedder it uses; None: callers bring vectors
    created_ms: int


class Wisdom(msgspec.Struct, frozen=True, kw_only=True):
    wisdom_id: UUID
    owner_id: str
    category: str
    pattern: str
    confidence: float
    embedding: bytes
    source_collectives: tuple[UUID, ...]
    source_experience_count: int
    applicable_domains: tuple[str, ...]
    created_ms: int


class ScoredWisdom(msgspec.Struct, frozen=True):
    wisdom: Wisdom
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
    """The Experience columns as read from the ``experiences`` view."""
    cols = [f"{alias}{name}" for name in _EXPERIENCE_FIELDS]
    cols[-1] = f"epoch_ms({cols[-1]})"
    return ", ".join(cols)


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


def _fetch(p: Projection, ids: Sequence[UUID]) -> dict[UUID, Experience]:
    """Live experiences by id, read from the base rows (much faster than the view)."""
    if not ids:
        return {}
    keys = uuid_literals(ids)
    rows = p.store.con.execute(
        f"""SELECT e.experience_id, e.collective_id, e.content, e.embedding, e.type_data,
                   e.importance, e.confidence, e.domain, e.related_files, e.source_agent,
                   e.source_task, (e.created_hlc >> 16)::BIGINT, e.archived,
                   coalesce(a.applications, 0), (a.last_hlc >> 16)::BIGINT,
                   e.create_event IS NOT NULL AND NOT e.deleted, octet_length(e.embedding)
            FROM experience_rows e
            LEFT JOIN (SELECT experience_id, sum(applications) AS applications,
                              max(last_hlc) AS last_hlc
                       FROM application_rows WHERE experience_id IN ({keys})
                       GROUP BY experience_id) a USING (experience_id)
            WHERE e.experience_id IN ({keys})"""
    ).fetchall()
    found = {}
    for row in rows:
        dim = p.live_dimension(row[1]) if row[1] is not None else None
        if row[15] and dim is not None and row[16] == 4 * dim:
            found[row[0]] = _experience(row)
    return found


def _passes(e: Experience, flt: ExperienceFilter) -> bool:
    return (
        (flt.include_archived or not e.archived)
        and (flt.domains is None or bool(set(flt.domains) & set(e.domain)))
        and (
            flt.experience_types is None
            or type(e.experience_type).__struct_config__.tag in flt.experience_types
        )
        and (flt.min_importance is None or e.importance >= flt.min_importance)
        and (flt.min_confidence is None or e.confidence >= flt.min_confidence)
        and (flt.since_ms is None or e.timestamp_ms >= flt.since_ms)
    )


def _where(p: Projection, collective_id: UUID, flt: ExperienceFilter) -> tuple[str, list[Any]]:
    """Conditions on ``experience_rows`` for the live experiences of a collective that
    pass the filter (the collective itself must be live: see ``live_dimension``)."""
    dim = p.live_dimension(collective_id) or 0
    clauses = [
        "collective_id = ?",
        "create_event IS NOT NULL",
        "NOT deleted",
        "octet_length(embedding) = ?",
    ]
    params: list[Any] = [collective_id, 4 * dim]
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
        clauses.append("(created_hlc >> 16) >= ?")
        params.append(flt.since_ms)
    return " AND ".join(clauses), params


def live_collective_of(p: Projection, experience_id: UUID) -> UUID | None:
    """The collective of a live experience, or None: a one-row key lookup, much cheaper
    than reading the whole experience (what writers need to check a reference)."""
    row = p.store.con.execute(
        "SELECT collective_id, octet_length(embedding) FROM experience_rows "
        "WHERE experience_id = ? AND create_event IS NOT NULL AND NOT deleted",
        [experience_id],
    ).fetchone()
    if row is None:
        return None
    dimension = p.live_dimension(row[0])
    return row[0] if dimension is not None and row[1] == 4 * dimension else None


def get_experience(p: Projection, experience_id: UUID) -> Experience | None:
    """One live experience (archived ones included), or None."""
    return _fetch(p, [experience_id]).get(experience_id)


def recent_experiences(
    p: Projection,
    collective_id: UUID,
    limit: int = 20,
    flt: ExperienceFilter = ANY_LIVE,
    *,
    offset: int = 0,
    newest_first: bool = True,
) -> list[Experience]:
    """Newest first (by recording time, then id); oldest first for stable paging."""
    if p.live_dimension(collective_id) is None:
        return []
    where, params = _where(p, collective_id, flt)
    order = "DESC" if newest_first else "ASC"
    ids = [
        r[0]
        for r in p.store.con.execute(
            f"SELECT experience_id FROM experience_rows WHERE {where} "
            f"ORDER BY created_hlc {order}, experience_id {order} LIMIT ? OFFSET ?",
            [*params, limit, offset],
        ).fetchall()
    ]
    found = _fetch(p, ids)
    return [found[i] for i in ids if i in found]


def similar_ids(
    p: Projection,
    collective_id: UUID,
    query: Sequence[float] | npt.NDArray[np.float32],
    k: int = 10,
    flt: ExperienceFilter = ANY_LIVE,
) -> list[tuple[UUID, float]]:
    """(id, cosine similarity) of the k nearest experiences, best first, unread."""
    index = p.vectors.get(("experience", collective_id))
    if index is None or k <= 0 or p.live_dimension(collective_id) is None:
        return []
    vector = np.asarray(query, dtype=np.float32).reshape(1, -1)
    if vector.shape[1] != index.dim:
        raise ValueError(f"query: {vector.shape[1]} dimensions, the collective has {index.dim}")
    allowed = None
    if flt.narrows:
        where, params = _where(p, collective_id, flt)
        rows = p.store.con.execute(f"SELECT vec_id FROM experience_rows WHERE {where}", params)
        allowed = {r[0] for r in rows.fetchall()}
    hits = index.search(vector, k, include_archived=flt.include_archived, allowed=allowed)
    return [(index.keys[v], s) for v, s in hits if v in index.keys]


def similar_experiences(
    p: Projection,
    collective_id: UUID,
    query: Sequence[float] | npt.NDArray[np.float32],
    k: int = 10,
    flt: ExperienceFilter = ANY_LIVE,
) -> list[ScoredExperience]:
    """The k live experiences nearest to ``query`` by cosine similarity, best first."""
    keyed = similar_ids(p, collective_id, query, k, flt)
    found = _fetch(p, [i for i, _ in keyed])
    return [ScoredExperience(found[i], s) for i, s in keyed if i in found]


def hybrid_experiences(
    p: Projection,
    collective_id: UUID,
    text: str,
    query: Sequence[float] | npt.NDArray[np.float32],
    pool: int,
    flt: ExperienceFilter = ANY_LIVE,
    *,
    vector_weight: float = 1.0,
    text_weight: float = 1.0,
    rrf_k: int = 60,
) -> list[ScoredExperience]:
    """The vector and the BM25 rankings (``pool`` candidates each) fused by Reciprocal
    Rank Fusion: score = sum over the rankings of weight / (rrf_k + rank). The two
    candidate lists are read from DuckDB in one query."""
    by_vector = similar_ids(p, collective_id, query, pool, flt)
    by_text = p.text.search("experience", collective_id, text, pool) if text.strip() else []
    found = _fetch(p, list(dict.fromkeys([i for i, _ in by_vector] + [i for i, _ in by_text])))
    fused: dict[UUID, float] = {}
    for weight, ranking in ((vector_weight, by_vector), (text_weight, by_text)):
        rank = 0
        for experience_id, _ in ranking:
            if experience_id in found and _passes(found[experience_id], flt):
                rank += 1
                fused[experience_id] = fused.get(experience_id, 0.0) + weight / (rrf_k + rank)
    return [ScoredExperience(found[i], score) for i, score in fused.items()]


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
    fetch = k
    while True:  # ask tantivy for more until enough pass the filter, or it has no more
        hits = p.text.search("experience", collective_id, text, fetch)
        found = _fetch(p, [i for i, _ in hits])
        result = [
            ScoredExperience(found[i], s) for i, s in hits if i in found and _passes(found[i], flt)
        ]
        if len(result) >= k or len(hits) < fetch:
            return result[:k]
        fetch *= 4


_RELATION_FIELDS = (
    "relation_id", "collective_id", "source_id", "target_id", "relation_type", "strength",
    "metadata",
)  # fmt: skip


def _relation_columns(alias: str = "") -> str:
    return ", ".join(f"{alias}{name}" for name in _RELATION_FIELDS)


def _relation(row: Sequence[Any]) -> Relation:
    return Relation(
        relation_id=row[0], collective_id=row[1], source_id=row[2], target_id=row[3],
        relation_type=row[4], strength=row[5], metadata=row[6],
    )  # fmt: skip


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
            f"SELECT {_relation_columns('r.')}, "
            f"{_experience_columns('e.')} "
            f"FROM relations r JOIN experiences e ON e.experience_id = r.{there} "
            f"WHERE r.{here} = ?"
        )
        params: list[Any] = [experience_id]
        if relation_types is not None:
            sql += " AND list_contains(?::VARCHAR[], r.relation_type)"
            params.append(list(relation_types))
        for row in p.store.con.execute(sql + " ORDER BY r.relation_id", params).fetchall():
            result.append(RelatedExperience(_relation(row), _experience(row[7:])))
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
    keyed = [(index.keys[v], s) for v, s in hits if v in index.keys]
    if not keyed:
        return []
    rows = p.store.con.execute(
        f"SELECT {_INSIGHT_COLUMNS} FROM insights "
        f"WHERE insight_id IN ({uuid_literals([i for i, _ in keyed])})"
    ).fetchall()
    found = {r[0]: _insight(r) for r in rows}
    return [ScoredInsight(found[i], s) for i, s in keyed if i in found]


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


# -- collectives ----------------------------------------------------------------------------

_COLLECTIVE_COLUMNS = (
    "collective_id, owner_id, name, embedding_dimension, nullif(embedder, ''), "
    "(created_hlc >> 16)::BIGINT"
)


def _collective(row: Sequence[Any]) -> Collective:
    return Collective(
        collective_id=row[0], owner_id=row[1], name=row[2], embedding_dimension=int(row[3]),
        embedder=row[4], created_ms=int(row[5]),
    )  # fmt: skip


def get_collective(p: Projection, collective_id: UUID) -> Collective | None:
    row = p.store.con.execute(
        f"SELECT {_COLLECTIVE_COLUMNS} FROM collective_rows "
        "WHERE collective_id = ? AND create_event IS NOT NULL AND NOT deleted",
        [collective_id],
    ).fetchone()
    return _collective(row) if row else None


def list_collectives(p: Projection, owner_id: str | None = None) -> list[Collective]:
    """Live collectives (of one owner, or all), oldest first."""
    sql = (
        f"SELECT {_COLLECTIVE_COLUMNS} FROM collective_rows "
        "WHERE create_event IS NOT NULL AND NOT deleted"
    )
    params: list[Any] = []
    if owner_id is not None:
        sql += " AND owner_id = ?"
        params.append(owner_id)
    rows = p.store.con.execute(sql + " ORDER BY created_hlc, collective_id", params).fetchall()
    return [_collective(r) for r in rows]


def anchor_of(p: Projection, entity: str, entity_id: UUID) -> Any:
    """The collective (owner, for wisdom) of an entity that exists or was deleted, or None
    when it never existed here: what a delete needs to write its tombstone again."""
    table, key, anchor = {
        "collective": ("collective_rows", "collective_id", "collective_id"),
        "experience": ("experience_rows", "experience_id", "collective_id"),
        "relation": ("relation_rows", "relation_id", "collective_id"),
        "insight": ("insight_rows", "insight_id", "collective_id"),
        "wisdom": ("wisdom_rows", "wisdom_id", "owner_id"),
    }[entity]
    row = p.store.con.execute(
        f"SELECT {anchor} FROM {table} WHERE {key} = ? AND (create_event IS NOT NULL OR deleted)",
        [entity_id],
    ).fetchone()
    return row[0] if row else None


# -- energy: importance raised by use, decayed by time; computed when read ------------------

DAY_MS = 86_400_000


def energy(
    importance: Any,
    applications: Any,
    last_active_ms: Any,
    now_ms: int,
    *,
    half_life_days: float = 30.0,
    boost_every: float = 5.0,
) -> Any:
    """How alive an experience is, in [0, 1] (scalars or numpy arrays).

    Importance is raised by applications (every ``boost_every`` applications halve the
    distance to 1) and halves every ``half_life_days`` since the experience was last
    reinforced (or recorded, if never). Never stored: it depends on when it is read.
    """
    importance = np.asarray(importance, dtype=np.float64)
    applications = np.asarray(applications, dtype=np.float64)
    raised = 1.0 - (1.0 - importance) * np.power(0.5, applications / boost_every)
    age_days = np.maximum(0.0, now_ms - np.asarray(last_active_ms, dtype=np.float64)) / DAY_MS
    return raised * np.power(0.5, age_days / half_life_days)


def energy_of(e: Experience, now_ms: int, **settings: float) -> float:
    last = e.last_reinforced_ms if e.last_reinforced_ms is not None else e.timestamp_ms
    return float(energy(e.importance, e.applications, last, now_ms, **settings))


def cold_experiences(
    p: Projection,
    collective_id: UUID,
    threshold: float,
    limit: int,
    now_ms: int,
    flt: ExperienceFilter = ANY_LIVE,
    **settings: float,
) -> list[ScoredExperience]:
    """Experiences whose energy is below ``threshold``, coldest first (score = energy)."""
    if p.live_dimension(collective_id) is None or limit <= 0:
        return []
    where, params = _where(p, collective_id, flt)
    rows = p.store.con.execute(
        f"""SELECT e.experience_id, e.importance, coalesce(a.applications, 0),
                   coalesce((a.last_hlc >> 16)::BIGINT, (e.created_hlc >> 16)::BIGINT)
            FROM (SELECT * FROM experience_rows WHERE {where}) e
            LEFT JOIN (SELECT experience_id, sum(applications) AS applications,
                              max(last_hlc) AS last_hlc
                       FROM application_rows GROUP BY experience_id) a USING (experience_id)""",
        params,
    ).fetchall()
    if not rows:
        return []
    ids = [r[0] for r in rows]
    values = energy(
        [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], now_ms, **settings
    )
    order = [i for i in np.argsort(values, kind="stable") if values[i] < threshold][:limit]
    found = _fetch(p, [ids[i] for i in order])
    return [
        ScoredExperience(found[ids[i]], float(values[i]), float(values[i]), float(values[i]))
        for i in order
        if ids[i] in found
    ]


# -- relations and insights by key ----------------------------------------------------------


def relation_taken(p: Projection, source_id: UUID, target_id: UUID, relation_type: str) -> Any:
    """The id of a live relation with this (source, target, type), or None."""
    row = p.store.con.execute(
        "SELECT min(relation_id) FROM relation_rows WHERE source_id = ? AND target_id = ? "
        "AND relation_type = ? AND create_event IS NOT NULL AND NOT deleted",
        [source_id, target_id, relation_type],
    ).fetchone()
    return row[0] if row else None


def relations_among(p: Projection, ids: Sequence[UUID]) -> list[Relation]:
    """Live relations whose both ends are among ``ids``."""
    if not ids:
        return []
    keys = uuid_literals(ids)
    rows = p.store.con.execute(
        f"SELECT {_relation_columns()} FROM relations "
        f"WHERE source_id IN ({keys}) AND target_id IN ({keys}) ORDER BY relation_id"
    ).fetchall()
    return [_relation(r) for r in rows]


def get_insight(p: Projection, insight_id: UUID) -> Insight | None:
    row = p.store.con.execute(
        f"SELECT {_INSIGHT_COLUMNS} FROM insights WHERE insight_id = ?", [insight_id]
    ).fetchone()
    return _insight(row) if row else None


# -- wisdom (per owner, across collectives; few per owner: an exact scan) -------------------

_WISDOM_COLUMNS = (
    "wisdom_id, owner_id, category, pattern, confidence, embedding, source_collectives, "
    "source_experience_count, applicable_domains, (created_hlc >> 16)::BIGINT"
)


def wisdom_of(p: Projection, owner_id: str) -> list[Wisdom]:
    """The live wisdom of one owner, oldest first."""
    rows = p.store.con.execute(
        f"SELECT {_WISDOM_COLUMNS} FROM wisdom_rows WHERE owner_id = ? "
        "AND create_event IS NOT NULL AND NOT deleted ORDER BY created_hlc, wisdom_id",
        [owner_id],
    ).fetchall()
    return [
        Wisdom(
            wisdom_id=r[0],
            owner_id=r[1],
            category=r[2],
            pattern=r[3],
            confidence=r[4],
            embedding=r[5],
            source_collectives=tuple(r[6] or ()),
            source_experience_count=int(r[7] or 0),
            applicable_domains=tuple(r[8] or ()),
            created_ms=int(r[9]),
        )  # fmt: skip
        for r in rows
    ]


def similar_wisdom(
    p: Projection, owner_id: str, query: Sequence[float] | npt.NDArray[np.float32], k: int
) -> list[ScoredWisdom]:
    """The owner's wisdom nearest to ``query`` (cosine), best first; other dimensions skipped."""
    q = np.asarray(query, dtype=np.float32)
    q = q / (np.linalg.norm(q) or 1.0)
    scored = []
    for w in wisdom_of(p, owner_id):
        vector = ev.unpack_vector(w.embedding)
        if len(vector) == len(q):
            scored.append(ScoredWisdom(w, float(vector @ q / (np.linalg.norm(vector) or 1.0))))
    scored.sort(key=lambda s: -s.score)
    return scored[:k]

"""Read queries over a projection: what the public API calls, run on the engine thread
(``projections.engine``), or for those marked ``inline`` on the caller's thread while the
engine thread is between rounds (``Engine.now``: the state is the same either way).
Results are typed msgspec Structs. Everything here reads the
engine's memory (``projections.state``) and its indexes, never DuckDB, and only what
``MemoryState`` calls live, so deleted, invalid and (unless asked for) archived rows
never come back."""

from __future__ import annotations

import binascii
import itertools
import math
import time
from types import EllipsisType
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Literal,
    Sequence,
    TypeVar,
)
from uuid import UUID

import msgspec

from eventlog import events as ev
from eventlog.access import DEFAULT_VISIBILITY, Principal, TokenInfo, Viewer, visibility_code
from eventlog.languages import AUTO, ENGLISH
from eventlog.recorded import DUPLICATE_SIMILARITY, ON_DUPLICATE
from projections.fold import CollectiveRow, ExperienceRow, InsightRow, RelationRow, SessionRow
from projections.language import of_query

if TYPE_CHECKING:  # (the result types come without numpy or the engines: see ops.remote)
    import numpy as np
    import numpy.typing as npt

    from projections.past import Past
    from projections.projection import Projection


class ExperienceFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which experiences a query may return (all fields optional)."""

    domains: tuple[str, ...] | None = None  # at least one of these tags
    source_task: str | None = None  # recorded for this task (source_task equal)
    experience_types: tuple[str, ...] | None = None  # variant names, e.g. ("Fact",)
    min_importance: float | None = None
    min_confidence: float | None = None
    since_ms: int | None = None  # recorded at or after (Unix ms)
    include_archived: bool = False
    viewer: Viewer | None = None  # what the caller may see (eventlog.access); None: all
    # validity: by default only what is still true now (not invalidated, or invalidated
    # with a time still ahead); ``include_invalid`` takes everything; ``valid_at_ms`` what
    # was true at that moment (valid_from <= valid_at < valid_to)
    include_invalid: bool = False
    valid_at_ms: int | None = None
    at_ms: int | None = None  # the "now" of "true now" (a read as of a moment: that moment)

    @property
    def narrows(self) -> bool:
        """True when it selects more than "live, valid now, and not archived unless
        asked" (whether "valid now" leaves anything out is the columns' to say)."""
        return any(
            v is not None
            for v in (
                self.domains,
                self.source_task,
                self.experience_types,
                self.min_importance,
                self.min_confidence,
                self.since_ms,
                self.valid_at_ms,
            )
        )

    def validity(self) -> tuple[int, bool] | None:
        """(the moment an experience must be true at, whether its start counts too), or
        None when validity does not matter. "Now" checks the end only: an experience
        seen is one already recorded, whatever the clocks of the hosts say."""
        if self.valid_at_ms is not None:
            return self.valid_at_ms, True
        if self.include_invalid:
            return None
        return (int(time.time() * 1000) if self.at_ms is None else self.at_ms), False


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
    visibility: str = "team"  # private, team or org (eventlog.access)
    author_owner: str | None = None  # the principal that created it
    author_agent: str | None = None
    valid_from_ms: int = 0  # when it became true (its recording time unless told)
    valid_to_ms: int | None = None  # when it stopped being true; None: it still is
    invalid_reason: str | None = None  # why it stopped (with valid_to_ms)
    invalidations: int = 0  # how often it was invalidated
    unstable: bool = False  # invalidated UNSTABLE_COUNT times within UNSTABLE_WINDOW_MS
    # the language its content is analyzed in for search: its collective's, or in one of
    # "auto" the language its writer detected (None: recorded before languages per
    # document; analyzed in the one each host detects)
    language: str | None = None

    @property
    def vector(self) -> npt.NDArray[np.float32]:
        return ev.unpack_vector(self.embedding)


UNSTABLE_COUNT = 3  # invalidations ...
UNSTABLE_WINDOW_MS = 30 * 86_400_000  # ... within this long mark an experience unstable


def unstable(invalidations: Sequence[int] | None) -> bool:
    """Whether UNSTABLE_COUNT of these invalidation HLCs fall within UNSTABLE_WINDOW_MS
    (uniko's drift flag: a fact that keeps flipping is not one to lean on)."""
    if not invalidations or len(invalidations) < UNSTABLE_COUNT:
        return False
    ms = sorted(ev.hlc_millis(h) for h in invalidations)
    return any(
        ms[i + UNSTABLE_COUNT - 1] - ms[i] <= UNSTABLE_WINDOW_MS
        for i in range(len(ms) - UNSTABLE_COUNT + 1)
    )


def valid_from(row: ExperienceRow) -> int:
    """When an experience became true (Unix ms): as told, else when it was recorded."""
    if row.valid_from_ms is not None:
        return row.valid_from_ms
    return ev.hlc_millis(row.created_hlc or 0)


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
    visibility: str = "team"  # private, team or org (eventlog.access)
    author_owner: str | None = None  # the principal that created it
    author_agent: str | None = None


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
    visibility: str = "team"  # private, team or org (eventlog.access)
    author_owner: str | None = None  # the principal that created it
    author_agent: str | None = None


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
    language: str = "english"  # how its text is analyzed for search (projections.language)
    # what recording an experience close to a live one of the same type and visibility,
    # by the same owner, does: "keep" (both stay), "reinforce" (the one there counts one
    # more application instead) or "link" (both stay, related); close: a cosine
    # similarity of at least ``duplicate_similarity``
    on_duplicate: str = "keep"
    duplicate_similarity: float = DUPLICATE_SIMILARITY


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
    visibility: str = "team"  # private, team or org (eventlog.access)
    author_owner: str | None = None  # the principal that created it
    author_agent: str | None = None


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
    invalid: int = 0  # experiences no longer true (now)
    invalidations: int = 0  # invalidations of its experiences (each counts up to 64)
    unstable: int = 0  # experiences invalidated often (see ``unstable``)


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    entity: str
    id: UUID | None
    collective_id: UUID | None
    reason: str
    seq: int | None
    subject: str | None
    instance_id: UUID | None = None  # the writer of a message kept aside, when readable


_kind_decoder = msgspec.json.Decoder(ev.ExperienceType)


_kinds: dict[str, ev.ExperienceType] = {}  # decoded types by their JSON (immutable: shared)


def _kind(type_data: str | None) -> ev.ExperienceType:
    text = type_data or '{"kind": "Generic"}'
    found = _kinds.get(text)
    if found is None:
        if len(_kinds) >= 4096:
            _kinds.clear()
        found = _kinds[text] = _kind_decoder.decode(text)
    return found


def _experience(p: Projection, row: ExperienceRow) -> Experience:
    """The public form of a live experience row."""
    applications, last_hlc = p.memory.applications_of(row.experience_id)
    return Experience(
        experience_id=row.experience_id,
        collective_id=row.collective_id,  # type: ignore[arg-type]
        content=row.content or "",
        embedding=p.embedding(row),
        experience_type=_kind(row.type_data),
        importance=row.importance if row.importance is not None else 0.0,
        confidence=row.confidence if row.confidence is not None else 0.0,
        domain=tuple(row.domain or ()),
        related_files=tuple(row.related_files or ()),
        source_agent=row.source_agent or "",
        source_task=row.source_task,
        timestamp_ms=ev.hlc_millis(row.created_hlc or 0),
        archived=row.archived,
        applications=applications,
        last_reinforced_ms=None if last_hlc is None else ev.hlc_millis(last_hlc),
        visibility=row.visibility or DEFAULT_VISIBILITY,
        author_owner=row.author_owner,
        author_agent=row.author_agent,
        valid_from_ms=valid_from(row),
        valid_to_ms=row.valid_to,
        invalid_reason=row.invalid_reason if row.valid_to is not None else None,
        invalidations=len(row.invalidations or ()),
        unstable=unstable(row.invalidations),
        language=_language(p, row),
    )


def _language(p: Projection, row: ExperienceRow | InsightRow) -> str | None:
    """What ``Experience.language`` says (as the ``experiences`` view)."""
    language = p.memory.collective_language(row.collective_id)
    return row.language if language == AUTO else language


def _valid(row: ExperienceRow, validity: tuple[int, bool] | None) -> bool:
    if validity is None:
        return True
    at, from_too = validity
    if row.valid_to is not None and row.valid_to <= at:
        return False
    return not from_too or valid_from(row) <= at


def _passes(
    row: ExperienceRow,
    flt: ExperienceFilter,
    validity: tuple[int, bool] | None | EllipsisType = ...,
) -> bool:
    """Whether a live experience row passes a filter (``validity``: the filter's
    ``ExperienceFilter.validity``, which a query over many rows takes once)."""
    if validity is ...:
        validity = flt.validity()
    return (
        _valid(row, validity)
        and (flt.include_archived or not row.archived)
        and (flt.domains is None or not set(flt.domains).isdisjoint(row.domain or ()))
        and (flt.source_task is None or row.source_task == flt.source_task)
        and (flt.experience_types is None or row.experience_type in flt.experience_types)
        and (flt.min_importance is None or (row.importance or 0.0) >= flt.min_importance)
        and (flt.min_confidence is None or (row.confidence or 0.0) >= flt.min_confidence)
        and (flt.since_ms is None or ev.hlc_millis(row.created_hlc or 0) >= flt.since_ms)
        and (
            flt.viewer is None
            or flt.viewer.sees(row.visibility, row.author_owner, row.author_agent)
        )
    )


def live_collective_of(p: Projection, experience_id: UUID) -> UUID | None:
    """The collective of a live experience, or None (what writers check a reference by)."""
    row = p.memory.live_experience(experience_id)
    return row.collective_id if row is not None else None


def get_experience(p: Projection, experience_id: UUID) -> Experience | None:
    """One live experience (archived ones included), or None."""
    row = p.memory.live_experience(experience_id)
    return _experience(p, row) if row is not None else None


def total_applications(p: Projection, experience_id: UUID) -> int:
    """The G-counter total of an experience (0 when it has none)."""
    return p.memory.applications_of(experience_id)[0]


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
    picked: list[Experience] = []
    skipped, validity = 0, flt.validity()
    if flt.source_task is not None:  # a task's rows, found in one pass of the columns
        found = _columns(p, collective_id).of_task(flt.source_task)
        rows = [p.memory.live_experience(i) for i in found]
        kept = [r for r in rows if r is not None and _passes(r, flt, validity)]
        kept.sort(key=lambda r: (r.created_hlc or 0, r.experience_id), reverse=newest_first)
        return [_experience(p, r) for r in kept[offset : offset + limit]]
    for row in p.memory.experiences_in_order(collective_id, newest_first=newest_first):
        if not _passes(row, flt, validity):
            continue
        if skipped < offset:
            skipped += 1
            continue
        picked.append(_experience(p, row))
        if len(picked) >= limit:
            break
    return picked


class _Columns:
    """A collective's live experiences as numpy columns, for filters: every filter is a
    few vectorised comparisons instead of a pass over the rows. Kept up to date from the
    experiences that changed since (``MemoryState.take_changes``); built again when the
    collective itself changed or too much did.

    Each column is a view of the first ``size`` slots of a larger array that doubles when
    full, so the rows of a write are appended in place (a copy of every column each
    write was O(n): at a million rows, 100 MB copied by the first search after a
    write). Slots past ``size`` may be shared with a ``copy`` (a past's): an append to
    a copy starts new arrays."""

    COLUMNS = (
        "vec_ids", "alive", "importance", "confidence", "created_ms", "archived", "types",
        "visibility", "author", "valid_from", "valid_to", "tasks", "task_hashes", "ids",
        "invalidations", "unstable",
    )  # fmt: skip

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        import numpy as np

        self.version = -1
        self.index_of: dict[UUID, int] = {}
        self.size = 0
        self._room = 0  # slots of the arrays under the columns (0: none of its own yet)
        self.vec_ids = np.zeros(0, dtype=np.int64)
        self.alive = np.zeros(0, dtype=bool)
        self.importance = np.zeros(0, dtype=np.float64)
        self.confidence = np.zeros(0, dtype=np.float64)
        self.created_ms = np.zeros(0, dtype=np.int64)
        self.archived = np.zeros(0, dtype=bool)
        self.types = np.zeros(0, dtype=object)
        self.visibility = np.zeros(0, dtype=np.int8)  # eventlog.access.visibility_code
        # the author of each row as a small number (``authors``): compared as ints, a
        # 100,000-row filter by author is a vector operation, not 100,000 string compares
        self.author = np.zeros(0, dtype=np.int32)
        self.authors: dict[tuple[str | None, str | None], int] = {}
        self.valid_from = np.zeros(0, dtype=np.int64)
        self.valid_to = np.zeros(0, dtype=np.int64)  # NO_END: still true
        # each row's source_task, its hash (this process's: compared as ints, then the
        # few equal ones as text) and its id: the rows a task's filter selects
        self.tasks = np.zeros(0, dtype=object)
        self.task_hashes = np.zeros(0, dtype=np.int64)
        self.ids = np.zeros(0, dtype=object)
        # what a collective's stats count (``collective_stats``): each row's invalidations,
        # and whether they make it unstable
        self.invalidations = np.zeros(0, dtype=np.int32)
        self.unstable = np.zeros(0, dtype=bool)
        self.earliest_end: int | None = None  # of the live rows (NO_END: none); None: unknown
        self._full: dict[str, Any] = {}  # the arrays under the columns, by name
        self._domains: list[tuple[str, ...]] = []
        self._by_domain: dict[str, npt.NDArray[np.bool_]] = {}

    def refresh(self, p: Projection, collective_id: UUID) -> None:
        import numpy as np

        version = p.memory.versions.get(collective_id, 0)
        if version == self.version:
            return
        changed = p.memory.take_changes(collective_id)
        dead = self.size - int(np.count_nonzero(self.alive))
        if (
            self.version == -1  # (new: the changes listed since were another's to patch)
            or changed is None
            or len(changed) > self.size // 4 + 1000
            or dead > self.size // 2 + 1000  # superseded slots: start afresh
        ):
            self._reset()
            rows = list(p.memory.live_experiences_of(collective_id))
        else:
            rows = []
            for experience_id in changed:
                self._drop(self.index_of.get(experience_id))  # appended anew if live
                row = p.memory.live_experience(experience_id)
                if row is not None and row.collective_id == collective_id:
                    rows.append(row)
        self.append(p, rows)
        self.version = version

    def _drop(self, at: int | None) -> None:
        """The row at slot ``at`` is no longer (the earliest end is looked for again if
        it was this row's)."""
        if at is None or not self.alive[at]:
            return
        self.alive[at] = False
        if self.earliest_end is not None and self.valid_to[at] <= self.earliest_end:
            self.earliest_end = None

    def copy(self) -> _Columns:
        """A copy that changes apart from this one (``projections.past``)."""
        twin = _Columns.__new__(_Columns)
        twin.__dict__.update(self.__dict__)
        twin.alive = self.alive.copy()  # (the only column changed in place)
        twin._room = 0  # its first append makes arrays of its own (these are shared)
        twin._full = {}
        twin.index_of, twin.authors = dict(self.index_of), dict(self.authors)
        twin._domains, twin._by_domain = list(self._domains), {}
        return twin

    def append(self, p: Projection | Past, rows: list[ExperienceRow]) -> None:
        import numpy as np

        vec_ids = p.memory.vec_ids
        rows = [r for r in rows if r.experience_id in vec_ids]
        if not rows:
            return
        start, end = self.size, self.size + len(rows)
        for i, r in enumerate(rows):
            self.index_of[r.experience_id] = start + i
        codes = self.authors
        ends = [NO_END if r.valid_to is None else r.valid_to for r in rows]
        values: dict[str, list[Any]] = {
            "vec_ids": [vec_ids[r.experience_id] for r in rows],
            "alive": [True] * len(rows),
            "importance": [r.importance or 0.0 for r in rows],
            "confidence": [r.confidence or 0.0 for r in rows],
            "created_ms": [ev.hlc_millis(r.created_hlc or 0) for r in rows],
            "archived": [r.archived for r in rows],
            "types": [r.experience_type or "" for r in rows],
            "visibility": [visibility_code(r.visibility) for r in rows],
            "author": [
                codes.setdefault((r.author_owner, r.author_agent), len(codes)) for r in rows
            ],
            "valid_from": [valid_from(r) for r in rows],
            "valid_to": ends,
            "tasks": [r.source_task for r in rows],
            "task_hashes": [hash(r.source_task) for r in rows],
            "ids": [r.experience_id for r in rows],
            "invalidations": [len(r.invalidations or ()) for r in rows],
            "unstable": [unstable(r.invalidations) for r in rows],
        }
        if end > self._room:  # new arrays, twice as large (or this copy's own)
            room = max(end, 2 * self._room, 64)
            for name in self.COLUMNS:
                column = getattr(self, name)
                full = np.zeros(room, dtype=column.dtype)
                full[:start] = column[:start]
                self._full[name] = full
            self._room = room
        for name in self.COLUMNS:
            full = self._full[name]
            full[start:end] = values[name]
            setattr(self, name, full[:end])
        self.size = end
        if self.earliest_end is not None:
            self.earliest_end = min(self.earliest_end, min(ends))
        self._domains.extend(r.domain or () for r in rows)
        for name, found in list(self._by_domain.items()):  # (the new rows' part only)
            more = np.fromiter((name in (r.domain or ()) for r in rows), bool, len(rows))
            self._by_domain[name] = np.concatenate([found, more])

    def domain(self, name: str) -> npt.NDArray[np.bool_]:
        import numpy as np

        found = self._by_domain.get(name)
        if found is None:
            found = self._by_domain[name] = np.fromiter(
                (name in d for d in self._domains), bool, len(self._domains)
            )
        return found

    def restricts(self, viewer: Viewer | None) -> bool:
        """Whether ``viewer`` is kept from any live row (a member with no private row of
        another author around sees them all)."""
        import numpy as np

        if viewer is None:
            return False
        if not viewer.member:
            return True
        return bool(np.any(self.alive & ~self.visible(viewer)))

    def visible(self, viewer: Viewer) -> npt.NDArray[np.bool_]:
        """Which rows ``viewer`` may see (``Viewer.mask``, the numpy form of the rule)."""
        return viewer.mask(self.visibility, self.author, self.authors)

    def shows(self, viewer: Viewer) -> bool:
        """Whether ``viewer`` may see a live row."""
        import numpy as np

        return bool(np.any(self.alive & self.visible(viewer)))

    def _valid(self, validity: tuple[int, bool] | None) -> npt.NDArray[np.bool_] | None:
        if validity is None:
            return None
        at, from_too = validity
        keep = self.valid_to > at
        if from_too:
            keep &= self.valid_from <= at
        return keep

    def invalid_any(self, flt: ExperienceFilter) -> bool:
        """Whether the filter's validity leaves out a live row."""
        import numpy as np

        validity = flt.validity()
        if validity is None:
            return False
        if not validity[1]:  # "true now": the earliest end of a live row says (kept)
            if self.earliest_end is None:
                ends = self.valid_to[self.alive]
                self.earliest_end = int(ends.min()) if len(ends) else int(NO_END)
            return self.earliest_end <= validity[0]
        valid = self._valid(validity)
        return valid is not None and bool(np.any(self.alive & ~valid))

    def select(self, flt: ExperienceFilter) -> npt.NDArray[np.int64]:
        """The vec_ids of the rows that pass ``flt``."""
        selected: npt.NDArray[np.int64] = self.vec_ids[self._keep(flt)]
        return selected

    def duplicates(
        self, experience_type: str, visibility: str, owner: str | None, agent: str | None
    ) -> npt.NDArray[np.int64]:
        """The vec_ids of the rows a new experience of this type and visibility by this
        author may duplicate: live, not archived, true now, of the same type and
        visibility, by the same owner (any of its agents; a private one: by the same
        author, the only one who sees it)."""
        import numpy as np

        keep = self.alive & ~self.archived & (self.types == experience_type)
        keep &= self.visibility == visibility_code(visibility)
        valid = self._valid(ANY_LIVE.validity())
        if valid is not None:
            keep &= valid
        private = visibility == "private"
        codes = [
            code
            for (who, whose), code in self.authors.items()
            if who == owner and (whose == agent or not private)
        ]
        keep &= np.isin(self.author, codes)
        selected: npt.NDArray[np.int64] = self.vec_ids[keep]
        return selected

    def of_task(self, source_task: str) -> list[UUID]:
        """The ids of the live rows recorded for ``source_task``."""
        return list(self.ids[self._task(source_task) & self.alive])

    def _task(self, source_task: str) -> npt.NDArray[np.bool_]:
        """Which rows were recorded for ``source_task``: their hashes compared, then the
        text of the few whose hash is equal."""
        import numpy as np

        keep: npt.NDArray[np.bool_] = self.task_hashes == hash(source_task)
        at = np.flatnonzero(keep)
        keep[at] = self.tasks[at] == source_task
        return keep

    def _keep(self, flt: ExperienceFilter) -> npt.NDArray[np.bool_]:
        import numpy as np

        keep = self.alive.copy() if flt.include_archived else self.alive & ~self.archived
        if flt.viewer is not None:
            keep &= self.visible(flt.viewer)
        valid = self._valid(flt.validity())
        if valid is not None:
            keep &= valid
        if flt.min_importance is not None:
            keep &= self.importance >= flt.min_importance
        if flt.min_confidence is not None:
            keep &= self.confidence >= flt.min_confidence
        if flt.since_ms is not None:
            keep &= self.created_ms >= flt.since_ms
        if flt.experience_types is not None:
            keep &= np.isin(self.types, list(flt.experience_types))
        if flt.source_task is not None:
            keep &= self._task(flt.source_task)
        if flt.domains is not None:
            any_of = np.zeros(len(self.vec_ids), dtype=bool)
            for name in flt.domains:
                any_of |= self.domain(name)
            keep &= any_of
        return keep


NO_END = 2**63 - 1  # the valid_to of what is still true (the largest int64)


def _columns(p: Projection | Past, collective_id: UUID) -> _Columns:
    from projections.past import Past

    if isinstance(p, Past):
        return _past_columns(p, collective_id)
    key = ("filter columns", collective_id)
    columns: _Columns | None = p.caches.get(key)
    if columns is None:
        columns = p.caches[key] = _Columns()
    p.sync_indexes()  # (a live row has its vector id once indexed: the columns want it)
    columns.refresh(p, collective_id)
    return columns


def _past_columns(p: Past, collective_id: UUID) -> _Columns:
    """A collective's filter columns as of a past moment: the present ones, with the rows
    of the experiences changed since set to what they were (kept with the past)."""
    key = ("filter columns", collective_id)
    found: _Columns | None = p.caches.get(key)
    if found is None:
        found = p.caches[key] = _columns(p.base, collective_id).copy()
        rows = []
        for experience_id in p.changed_experiences:
            at = found.index_of.get(experience_id)
            if at is not None:
                found.alive[at] = False
            row = p.memory.live_experience(experience_id)
            if row is not None and row.collective_id == collective_id:
                rows.append(row)
        found.append(p, rows)
        found.earliest_end = None
    return found


def _allowed(p: Projection, collective_id: UUID, flt: ExperienceFilter) -> npt.NDArray[np.int64]:
    """The vector ids of the live experiences of a collective that pass a filter."""
    return _columns(p, collective_id).select(flt)


def _narrows(p: Projection, collective_id: UUID, flt: ExperienceFilter) -> bool:
    """Whether a search must be restricted to the rows ``flt`` selects."""
    if flt.narrows:
        return True
    columns = _columns(p, collective_id)
    return columns.restricts(flt.viewer) or columns.invalid_any(flt)


def shows_anything(p: Projection, collective_id: UUID, viewer: Viewer) -> bool:
    """Whether a collective holds anything a non-member may see (org-visible rows)."""
    if viewer.member:
        return True
    if p.memory.live_collective(collective_id) is None:
        return False
    if p.live_dimension(collective_id) is not None and _columns(p, collective_id).shows(viewer):
        return True
    # (a relation shows with both of its ends only, so visible experiences decide for it)
    return any(
        viewer.sees(r.visibility, r.author_owner, r.author_agent)
        for r in p.memory.live_insights_of(collective_id)
    )


def similar_ids(
    p: Projection,
    collective_id: UUID,
    query: Sequence[float] | npt.NDArray[np.float32],
    k: int = 10,
    flt: ExperienceFilter = ANY_LIVE,
) -> list[tuple[UUID, float]]:
    """(id, cosine similarity) of the k nearest live experiences, best first."""
    import numpy as np

    from projections.past import Past

    p.sync_indexes()
    index = p.vectors.get(("experience", collective_id))
    if index is None or k <= 0 or p.live_dimension(collective_id) is None:
        return []
    vector = np.asarray(query, dtype=np.float32).reshape(1, -1)
    if vector.shape[1] != index.dim:
        raise ValueError(f"query: {vector.shape[1]} dimensions, the collective has {index.dim}")
    past = isinstance(p, Past)  # (the index's archived flags are the present ones)
    # a caller that may not see everything: an exact scan of the rows it may see, so that
    # neither a graph (built over every row, in the order they came) nor the cut of a tie
    # depends on what it may not see
    restricted = flt.viewer is not None
    narrow = past or restricted or _narrows(p, collective_id, flt)
    allowed = _allowed(p, collective_id, flt) if narrow else None
    hits = index.search(
        vector, k, include_archived=flt.include_archived or past, allowed=allowed,
        exact=restricted,
    )  # fmt: skip
    keyed = [(index.keys[v], s) for v, s in hits if v in index.keys]
    keyed.sort(key=lambda hit: (-hit[1], hit[0]))  # equal scores in one order on every host
    return keyed


def duplicates_of(
    p: Projection,
    collective_id: UUID,
    asked: Sequence[tuple[npt.NDArray[np.float32], str, str] | None],
    author: tuple[str | None, str | None],
    similarity: float,
    exclude: Collection[UUID] = (),
) -> list[tuple[UUID, float] | None]:
    """For each new experience of ``asked`` (its vector, type and visibility; None: not
    looked for), by ``author`` (owner, agent), the live experience it would duplicate,
    with their cosine similarity: of the same type and visibility, written by the same
    owner (a private one: by the same author), not archived, true now, at least
    ``similarity`` close (less a rounding's worth: a vector's similarity to itself may
    be 0.99999994), and not one of ``exclude``; the closest, and of equal ones the least
    id. None when there is none. The rows each may duplicate are found once for each
    (type, visibility) asked."""
    import numpy as np

    p.sync_indexes()
    index = p.vectors.get(("experience", collective_id))
    if index is None or p.live_dimension(collective_id) is None:
        return [None] * len(asked)
    columns = _columns(p, collective_id)
    allowed_of: dict[tuple[str, str], npt.NDArray[np.int64]] = {}
    live = len(index.members) - len(index.gone)
    found: list[tuple[UUID, float] | None] = []
    for item in asked:
        if item is None:
            found.append(None)
            continue
        vector, experience_type, visibility = item
        allowed = allowed_of.get((experience_type, visibility))
        if allowed is None:
            allowed = allowed_of[(experience_type, visibility)] = columns.duplicates(
                experience_type, visibility, *author
            )
        if not len(allowed):
            found.append(None)
            continue
        query = np.asarray(vector, dtype=np.float32).reshape(1, -1)
        hits: list[tuple[int, float]] = []
        if len(allowed) * 10 >= 9 * live:
            # (most rows may be duplicated, as in a collective of one owner and one type:
            # the nearest of all, then those allowed; the first allowed is the nearest
            # allowed. A filtered graph search costs several times as much)
            nearest = index.search(query, DUPLICATE_SCAN)
            passed = np.isin([v for v, _ in nearest], allowed)
            hits = [hit for hit, ok in zip(nearest, passed, strict=True) if ok]
        if not hits:
            hits = index.search(query, DUPLICATE_TIES, allowed=allowed)
        least = similarity - SIMILARITY_ROUNDING
        keyed = [
            (index.keys[v], s)
            for v, s in hits
            if v in index.keys and s >= least and index.keys[v] not in exclude
        ]
        found.append(min(keyed, key=lambda hit: (-hit[1], hit[0])) if keyed else None)
    return found


SIMILARITY_ROUNDING = 1e-5  # what float32 products (and a quantized graph) may lose
DUPLICATE_TIES = 8  # nearest rows a duplicate is chosen among (equal ones: the least id)
DUPLICATE_SCAN = 32  # nearest rows of all looked at first, for those a duplicate may be


F = TypeVar("F", bound=Callable[..., Any])


def inline(fn: F) -> F:
    """Mark a read that may run on its caller's thread when the engine thread is between
    rounds (``projections.engine.Engine.now``): one that changes nothing but caches, is
    short, and waits for nothing slow (a FAISS search releases the GIL)."""
    setattr(fn, "inline", True)  # noqa: B010 (an attribute a function type has not)
    return fn


@inline
def similar_experiences(
    p: Projection,
    collective_id: UUID,
    query: Sequence[float] | npt.NDArray[np.float32],
    k: int = 10,
    flt: ExperienceFilter = ANY_LIVE,
) -> list[ScoredExperience]:
    """The k live experiences nearest to ``query`` by cosine similarity, best first."""
    found = []
    for experience_id, score in similar_ids(p, collective_id, query, k, flt):
        row = p.memory.live_experience(experience_id)
        if row is not None:
            found.append(ScoredExperience(_experience(p, row), score))
    return found


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
    weighing: Weighing | None = None,
) -> list[ScoredExperience]:
    """The vector and the BM25 rankings (``pool`` candidates each) fused by Reciprocal
    Rank Fusion: score = sum over the rankings of weight / (rrf_k + rank); with a
    ``weighing``, those it keeps, weighed (``weighed``)."""
    by_vector = similar_ids(p, collective_id, query, pool, flt)
    by_text = []
    if text.strip():  # (a viewer's: every visible candidate, ranked before the filter)
        from projections.text import CANDIDATES_MAX

        limit = pool if flt.viewer is None else max(pool, CANDIDATES_MAX)
        by_text = _text_hits(p, collective_id, text, limit, flt.viewer)
    fused: dict[UUID, float] = {}
    rows: dict[UUID, ExperienceRow] = {}
    validity = flt.validity()
    for weight, ranking in ((vector_weight, by_vector), (text_weight, by_text)):
        rank = 0
        for experience_id, _ in ranking:
            row = rows.get(experience_id) or p.memory.live_experience(experience_id)
            if row is None or row.collective_id != collective_id or not _passes(row, flt, validity):
                continue
            rows[experience_id] = row
            rank += 1
            fused[experience_id] = fused.get(experience_id, 0.0) + weight / (rrf_k + rank)
    if weighing is not None:
        return weighed(p, [(rows[i], score) for i, score in fused.items()], weighing)
    return [ScoredExperience(_experience(p, rows[i]), score) for i, score in fused.items()]


def _text_hits(
    p: Projection, collective_id: UUID, text: str, limit: int, viewer: Viewer | None = None
) -> list[tuple[UUID, float]]:
    """BM25 hits among the experiences of one collective (unfiltered otherwise); with a
    ``viewer``, scored from the statistics of what it may see (``projections.text``)."""
    language: str | tuple[str, ...] = p.memory.collective_language(collective_id)
    if language == AUTO:  # each document in its own: the query in each it could be
        language = of_query(text)
    if viewer is not None:
        return p.text.search(
            "experience", collective_id, text, limit, language=language, viewer=viewer,
            content=lambda i: _content(p, i),
        )  # fmt: skip
    alone = p.memory.experiences_of.keys() <= {collective_id}  # every document is its own
    return p.text.search("experience", collective_id, text, limit, language=language, alone=alone)


def _content(p: Projection, experience_id: UUID) -> tuple[str, str] | None:
    """The text of a live experience and the language it is analyzed in (None: gone)."""
    row = p.memory.live_experience(experience_id)
    return None if row is None else (row.content or "", p.memory.text_language(row))


def search_text(
    p: Projection,
    collective_id: UUID,
    text: str,
    k: int = 10,
    flt: ExperienceFilter = ANY_LIVE,
) -> list[ScoredExperience]:
    """BM25 matches of ``text`` in experience content, best first, filtered. For a
    caller that may not see every row (``flt.viewer``), BM25 from the statistics of the
    rows of this collective it may see (``projections.text``): the whole index's would
    tell, by scores and by order, how often a word occurs in what it may not read."""
    p.sync_indexes()
    if k <= 0 or not text.strip():
        return []
    fetch, validity = k, flt.validity()
    if flt.viewer is not None:  # every visible candidate is scored: one pass
        from projections.text import CANDIDATES_MAX

        fetch = max(k, CANDIDATES_MAX)
    while True:  # ask tantivy for more until enough pass the filter, or it has no more
        hits = _text_hits(p, collective_id, text, fetch, flt.viewer)
        result: list[ScoredExperience] = []
        for experience_id, score in hits:
            row = p.memory.live_experience(experience_id)
            if (
                row is not None
                and row.collective_id == collective_id
                and _passes(row, flt, validity)
            ):
                result.append(ScoredExperience(_experience(p, row), score))
        if len(result) >= k or len(hits) < fetch or flt.viewer is not None:
            return result[:k]
        fetch *= 4


def _relation(row: RelationRow) -> Relation:
    return Relation(
        relation_id=row.relation_id, collective_id=row.collective_id,  # type: ignore[arg-type]
        source_id=row.source_id, target_id=row.target_id,  # type: ignore[arg-type]
        relation_type=row.relation_type or "", strength=row.strength or 0.0,
        metadata=row.metadata, visibility=row.visibility or DEFAULT_VISIBILITY,
        author_owner=row.author_owner, author_agent=row.author_agent,
    )  # fmt: skip


def related_experiences(
    p: Projection,
    experience_id: UUID,
    direction: Literal["outgoing", "incoming", "both"] = "both",
    relation_types: Sequence[str] | None = None,
) -> list[RelatedExperience]:
    """Experiences linked to ``experience_id`` by live relations."""
    return related_page(p, experience_id, direction, relation_types)[0]


def related_page(
    p: Projection,
    experience_id: UUID,
    direction: Literal["outgoing", "incoming", "both"] = "both",
    relation_types: Sequence[str] | None = None,
    *,
    min_strength: float | None = None,
    limit: int | None = None,
    after: tuple[int, UUID] | None = None,
    viewer: Viewer | None = None,
) -> tuple[list[RelatedExperience], tuple[int, UUID] | None]:
    """Up to ``limit`` of the experiences linked to ``experience_id`` by live relations,
    outgoing before incoming, each by relation id, after the key ``after``; and the key of
    the last one when more follow."""
    memory = p.memory
    ends = {
        "outgoing": [(0, memory.by_source, "target_id")],
        "incoming": [(1, memory.by_target, "source_id")],
        "both": [(0, memory.by_source, "target_id"), (1, memory.by_target, "source_id")],
    }[direction]
    result: list[RelatedExperience] = []
    last: tuple[int, UUID] | None = None
    for phase, by_end, there in ends:
        for relation_id in sorted(by_end.get(experience_id, ())):
            if after is not None and (phase, relation_id) <= after:
                continue
            row = memory.live_relation(relation_id)
            if row is None or (
                relation_types is not None and row.relation_type not in relation_types
            ):
                continue
            if min_strength is not None and (row.strength or 0.0) < min_strength:
                continue
            if viewer is not None and not viewer.sees(
                row.visibility, row.author_owner, row.author_agent
            ):
                continue
            other = memory.live_experience(getattr(row, there))
            if other is not None and (
                viewer is None
                or viewer.sees(other.visibility, other.author_owner, other.author_agent)
            ):
                if limit is not None and len(result) == limit:
                    return result, last
                result.append(RelatedExperience(_relation(row), _experience(p, other)))
                last = (phase, relation_id)
    return result, None


def _insight(p: Projection, row: InsightRow, viewer: Viewer | None = None) -> Insight:
    sources = tuple(row.source_experiences or ())
    if viewer is not None:  # the sources the caller may not see are left out
        sources = tuple(s for s in sources if _visible_experience(p, s, viewer))
    return Insight(
        insight_id=row.insight_id, collective_id=row.collective_id,  # type: ignore[arg-type]
        content=row.content or "", embedding=p.embedding(row),
        source_experiences=sources,
        confidence=row.confidence or 0.0, domain=tuple(row.domain or ()),
        visibility=row.visibility or DEFAULT_VISIBILITY, author_owner=row.author_owner,
        author_agent=row.author_agent,
    )  # fmt: skip


def _visible_experience(p: Projection, experience_id: UUID, viewer: Viewer) -> bool:
    row = p.memory.live_experience(experience_id)
    return row is not None and viewer.sees(row.visibility, row.author_owner, row.author_agent)


def similar_insights(
    p: Projection,
    collective_id: UUID,
    query: Sequence[float] | npt.NDArray[np.float32],
    k: int = 10,
    viewer: Viewer | None = None,
) -> list[ScoredInsight]:
    import numpy as np

    from projections.past import Past

    p.sync_indexes()
    index = p.vectors.get(("insight", collective_id))
    if index is None or k <= 0:
        return []
    vector = np.asarray(query, dtype=np.float32).reshape(1, -1)
    if viewer is not None:  # an exact scan of what it may see (as ``similar_ids``)
        vec_ids = p.memory.vec_ids
        allowed = np.array(
            sorted(
                vec_ids[r.insight_id]
                for r in p.memory.live_insights_of(collective_id)
                if vec_ids.get(r.insight_id) in index.members
                and viewer.sees(r.visibility, r.author_owner, r.author_agent)
            ),
            dtype=np.int64,
        )
        visible = []
        for vec_id, score in index.search(vector, k, allowed=allowed, exact=True):
            row = p.memory.live_insight(index.keys[vec_id]) if vec_id in index.keys else None
            if row is not None:
                visible.append(ScoredInsight(_insight(p, row, viewer), score))
        return visible
    fetch = k
    while True:  # with a viewer, ask for more until k are visible or there are no more
        hits = index.search(vector, fetch)
        found = []
        for vec_id, score in hits:
            row = p.memory.live_insight(index.keys[vec_id]) if vec_id in index.keys else None
            if row is not None and (
                viewer is None or viewer.sees(row.visibility, row.author_owner, row.author_agent)
            ):
                found.append(ScoredInsight(_insight(p, row, viewer), score))
        if (viewer is None and not isinstance(p, Past)) or len(found) >= k or len(hits) < fetch:
            return found[:k]
        fetch *= 4


def collective_stats(
    p: Projection, collective_id: UUID, viewer: Viewer | None = None, at_ms: int | None = None
) -> CollectiveStats | None:
    """Counts of a collective; with a ``viewer``, of what it may see only (and no dead
    letters: they are for admins)."""
    import numpy as np

    memory = p.memory
    if memory.live_collective(collective_id) is None:
        return None

    def seen(rows: Iterable[Any]) -> list[Any]:
        if viewer is None:
            return list(rows)
        return [r for r in rows if viewer.sees(r.visibility, r.author_owner, r.author_agent)]

    # the experiences, counted on the collective's filter columns (a pass over 100,000
    # rows in Python took 0.7 s of the engine's thread; these are a few vector sums)
    columns = _columns(p, collective_id)
    keep = columns.alive.copy()
    if viewer is not None:
        keep &= columns.visible(viewer)
    valid = columns._valid(ExperienceFilter(at_ms=at_ms).validity())  # ("invalid": then)
    applications = 0
    for experience_id, named in memory.counters:  # (the reinforced ones only)
        at = columns.index_of.get(experience_id) if named == collective_id else None
        if at is not None and keep[at]:
            applications += memory.applications_of(experience_id)[0]
    relations = seen(memory.live_relations_of(collective_id))
    if viewer is not None:  # a relation shows with both of its ends only
        relations = [
            r for r in relations
            if _visible_experience(p, r.source_id, viewer)
            and _visible_experience(p, r.target_id, viewer)
        ]  # fmt: skip
    return CollectiveStats(
        collective_id=collective_id,
        experiences=int(np.count_nonzero(keep)),
        archived=int(np.count_nonzero(keep & columns.archived)),
        relations=len(relations),
        insights=len(seen(memory.live_insights_of(collective_id))),
        applications=applications,
        dead_letters=len(dead_letters(p, collective_id)) if viewer is None else 0,
        invalid=0 if valid is None else int(np.count_nonzero(keep & ~valid)),
        invalidations=int(columns.invalidations[keep].sum()),
        unstable=int(np.count_nonzero(keep & columns.unstable)),
    )


def _unsettled(p: Projection, collective_id: UUID, members: Collection[UUID]) -> Collection[UUID]:
    """The experiences of a collective (``members``) that may be dead letters: those its
    filter columns do not hold live (a live one has no problem), so none at all when they
    count every one (a check of every row took 0.2 s at 100,000; as of a past moment the
    members are the present's, and those recorded since are not looked at either)."""
    import numpy as np

    if p.memory.live_collective(collective_id) is None:
        return members
    columns = _columns(p, collective_id)
    if len(members) == int(np.count_nonzero(columns.alive)):
        return ()
    live = set(columns.ids[columns.alive].tolist())
    return [i for i in members if i not in live]


def dead_letters(p: Projection, collective_id: UUID | None = None) -> list[DeadLetter]:
    """What breaks an invariant of the folded state, and the messages kept aside; with
    ``collective_id``, only the rows of that collective (messages name none)."""
    memory = p.memory
    found = []
    checks: tuple[tuple[str, dict[tuple[Any, ...], Any], dict[UUID, set[UUID]], Any], ...] = (
        ("experience", memory.experiences, memory.experiences_of, memory.experience_problem),
        ("relation", memory.relations, memory.relations_of, memory.relation_problem),
        ("insight", memory.insights, memory.insights_of, memory.insight_problem),
    )
    for entity, table, members, problem in checks:
        rows: Iterable[Any] = table.values()
        if entity == "experience":  # (a row of no collective has no create event)
            # each once: a row may be listed under two collectives, its own and the one a
            # misplaced event of it named (a strayed part), until a reopen reads it back
            ids = dict.fromkeys(
                i for cid in ([collective_id] if collective_id else list(members))
                for i in _unsettled(p, cid, members.get(cid, ()))
            )  # fmt: skip
            rows = (table[(i,)] for i in ids if (i,) in table)
        elif collective_id is not None:
            rows = (table[(i,)] for i in members.get(collective_id, ()) if (i,) in table)
        for row in rows:
            if row.create_event is None or row.deleted:
                continue
            if collective_id is not None and row.collective_id != collective_id:
                continue
            reason = problem(row)
            if reason is not None:
                found.append(
                    DeadLetter(
                        entity=entity, id=row.key()[0], reason=reason,
                        collective_id=row.collective_id, seq=None, subject=None,
                    )
                )  # fmt: skip
    if collective_id is None:
        for r in memory.rejected.values():
            found.append(
                DeadLetter(
                    entity="message", id=None, collective_id=None, reason=r.reason, seq=r.seq,
                    subject=r.subject, instance_id=r.instance_id,
                )
            )  # fmt: skip
    found.sort(key=dead_letter_key)
    return found


def dead_letter_key(d: DeadLetter) -> tuple[str, int, str]:
    return (d.entity, d.seq or 0, str(d.id))


def dead_letters_page(
    p: Projection, limit: int, after: tuple[str, int, str] | None = None
) -> tuple[list[DeadLetter], tuple[str, int, str] | None]:
    """Up to ``limit`` dead letters after the key ``after``, and the key of the last one
    when more follow."""
    return _take(((dead_letter_key(d), d) for d in dead_letters(p)), limit, after)


# -- collectives ----------------------------------------------------------------------------


def _collective(row: CollectiveRow) -> Collective:
    return Collective(
        collective_id=row.collective_id, owner_id=row.owner_id or "", name=row.name or "",
        embedding_dimension=int(row.embedding_dimension or 0), embedder=row.embedder or None,
        created_ms=ev.hlc_millis(row.created_hlc or 0), language=row.language or ENGLISH,
        on_duplicate=_choice(row.on_duplicate),
        duplicate_similarity=row.duplicate_similarity or DUPLICATE_SIMILARITY,
    )  # fmt: skip


def _choice(on_duplicate: str | None) -> str:
    """A collective's ``on_duplicate``: "keep" for none, or one this release lacks."""
    return on_duplicate if on_duplicate is not None and on_duplicate in ON_DUPLICATE else "keep"


def get_collective(p: Projection, collective_id: UUID) -> Collective | None:
    row = p.memory.live_collective(collective_id)
    return _collective(row) if row is not None else None


def list_collectives(p: Projection, owner_id: str | None = None) -> list[Collective]:
    """Live collectives (of one owner, or all), oldest first."""
    rows = [
        r
        for r in p.memory.collectives.values()
        if r.create_event is not None and not r.deleted and owner_id in (None, r.owner_id)
    ]
    rows.sort(key=lambda r: (r.created_hlc or 0, r.collective_id))
    return [_collective(r) for r in rows]


def collectives_page(
    p: Projection,
    owner_id: str | None = None,
    limit: int | None = None,
    after: tuple[int, UUID] | None = None,
    principal: Principal | None = None,
) -> tuple[list[Collective], tuple[int, UUID] | None]:
    """Up to ``limit`` live collectives (of one owner, or all), oldest first, after the
    key ``after`` (created HLC, id); and the key of the last one when more follow. With a
    ``principal``, those it is a member of or may see something in."""

    def shown(r: CollectiveRow) -> bool:
        if principal is None or principal.member(r.owner_id, r.collective_id):
            return True
        return shows_anything(p, r.collective_id, Viewer(False, principal.owner, principal.agent))

    rows = sorted(
        ((r.created_hlc or 0, r.collective_id), r)
        for r in p.memory.collectives.values()
        if r.create_event is not None and not r.deleted and owner_id in (None, r.owner_id)
        and shown(r)
    )  # fmt: skip
    taken, last = _take(rows, limit, after)
    return [_collective(r) for r in taken], last


K = TypeVar("K")
X = TypeVar("X")


def _take(
    keyed: Iterable[tuple[K, X]], limit: int | None, after: K | None
) -> tuple[list[X], K | None]:
    """The items of ``keyed`` (in key order) past ``after``, at most ``limit``; and the
    key of the last item taken when more follow."""
    taken: list[X] = []
    last: K | None = None
    for key, item in keyed:
        if after is not None and key <= after:  # type: ignore[operator]
            continue
        if limit is not None and len(taken) == limit:
            return taken, last
        taken.append(item)
        last = key
    return taken, None


def anchor_of(p: Projection, entity: str, entity_id: UUID) -> Any:
    """The collective (owner, for wisdom) of an entity that exists or was deleted, or None
    when it never existed here: what a delete needs to write its tombstone again."""
    tables: dict[str, dict[tuple[Any, ...], Any]] = {
        "collective": p.memory.collectives,
        "experience": p.memory.experiences,
        "relation": p.memory.relations,
        "insight": p.memory.insights,
        "wisdom": p.memory.wisdom,
        "session": p.memory.sessions,
    }
    row = tables[entity].get((entity_id,))
    if row is None or (row.create_event is None and not row.deleted):
        return None
    return getattr(row, "owner_id" if entity == "wisdom" else "collective_id")


def ids_in_collective(p: Projection, entity: str, collective_id: UUID) -> list[UUID]:
    """Every experience, relation or insight row of a collective (deleted ones too)."""
    memory = p.memory
    found = {
        "experience": memory.experiences_of,
        "relation": memory.relations_of,
        "insight": memory.insights_of,
    }[entity].get(collective_id, set())
    return sorted(found)


def max_hlc(p: Projection) -> int:
    """The largest HLC of anything folded (a restarted clock starts past it)."""
    return p.memory.max_hlc()


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
    import numpy as np

    importance = np.asarray(importance, dtype=np.float64)
    applications = np.asarray(applications, dtype=np.float64)
    raised = 1.0 - (1.0 - importance) * np.power(0.5, applications / boost_every)
    age_days = np.maximum(0.0, now_ms - np.asarray(last_active_ms, dtype=np.float64)) / DAY_MS
    return raised * np.power(0.5, age_days / half_life_days)


def energy_of(
    e: Experience, now_ms: int, *, half_life_days: float = 30.0, boost_every: float = 5.0
) -> float:
    """``energy`` of one experience, in plain floats (numpy costs ~20x more per scalar,
    and this runs for every candidate of every search)."""
    last = e.last_reinforced_ms if e.last_reinforced_ms is not None else e.timestamp_ms
    return _energy(e.importance, e.applications, last, now_ms, half_life_days, boost_every)


def _energy(
    importance: float,
    applications: int,
    last_ms: int,
    now_ms: int,
    half_life_days: float,
    boost_every: float,
) -> float:
    raised = 1.0 - (1.0 - importance) * math.pow(0.5, applications / boost_every)
    age_days = max(0.0, now_ms - last_ms) / DAY_MS
    return raised * math.pow(0.5, age_days / half_life_days)


class Weighing(msgspec.Struct, frozen=True, kw_only=True):
    """How a search orders its candidates, and how many it keeps (``sync.recall``):
    score = relevance x (1 - weight + weight x energy), x ``shaky`` for an unstable
    experience; the best ``k``."""

    k: int
    weight: float
    shaky: float
    now_ms: int
    half_life_days: float = 30.0
    boost_every: float = 5.0


def weighed(
    p: Projection, scored: list[tuple[ExperienceRow, float]], weighing: Weighing
) -> list[ScoredExperience]:
    """The best ``weighing.k`` of rows scored by relevance, weighed by energy, in the
    order and with the scores ``sync.recall`` gives hits: only those kept are made into
    answers (an answer, its embedding with it, costs more than its weighing)."""
    w, out = weighing.weight, []
    for row, relevance in scored:
        applications, last_hlc = p.memory.applications_of(row.experience_id)
        last = ev.hlc_millis(last_hlc if last_hlc is not None else row.created_hlc or 0)
        importance = row.importance if row.importance is not None else 0.0
        e = _energy(importance, applications, last, weighing.now_ms, weighing.half_life_days,
                    weighing.boost_every)  # fmt: skip
        shaky = weighing.shaky if unstable(row.invalidations) else 1.0
        out.append((relevance * (1 - w + w * e) * shaky, relevance, e, row))
    out.sort(key=lambda hit: -hit[0])  # (stable: ties keep the candidates' order)
    return [
        ScoredExperience(_experience(p, row), score, relevance, e)
        for score, relevance, e, row in out[: weighing.k]
    ]


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
    import numpy as np

    if p.live_dimension(collective_id) is None or limit <= 0:
        return []
    validity = flt.validity()
    rows = [r for r in p.memory.live_experiences_of(collective_id) if _passes(r, flt, validity)]
    if not rows:
        return []
    rows.sort(key=lambda r: r.experience_id)
    counts = [p.memory.applications_of(r.experience_id) for r in rows]
    values = energy(
        [r.importance or 0.0 for r in rows],
        [n for n, _ in counts],
        [ev.hlc_millis(last if last is not None else (r.created_hlc or 0))
         for r, (_, last) in zip(rows, counts, strict=True)],
        now_ms,
        **settings,
    )  # fmt: skip
    order = [i for i in np.argsort(values, kind="stable") if values[i] < threshold][:limit]
    return [
        ScoredExperience(
            _experience(p, rows[i]), float(values[i]), float(values[i]), float(values[i])
        )
        for i in order
    ]


# -- relations and insights by key ----------------------------------------------------------


def relation_taken(
    p: Projection,
    source_id: UUID,
    target_id: UUID,
    relation_type: str,
    visibility: str = "team",
    author_owner: str | None = None,
    author_agent: str | None = None,
) -> Any:
    """The id of the relation holding this (source, target, type) among those shared as
    a relation of this visibility and author would be (``state.sharing``), or None."""
    from projections.state import sharing

    shared = sharing(visibility, author_owner, author_agent)
    return p.memory.triple_winner((source_id, target_id, relation_type, shared))


CONTEXT_RELATIONS_MAX = 1000  # relations in one context (get_context_candidates)


def relations_among(
    p: Projection,
    ids: Sequence[UUID],
    limit: int = CONTEXT_RELATIONS_MAX,
    viewer: Viewer | None = None,
) -> list[Relation]:
    """Live relations whose both ends are among ``ids``: the first ``limit`` by id."""
    wanted = set(ids)
    found = {
        rid
        for i in wanted
        for rid in p.memory.by_source.get(i, ())
        if (r := p.memory.relations.get((rid,))) is not None and r.target_id in wanted
    }
    live = (
        r
        for rid in sorted(found)
        if (r := p.memory.live_relation(rid)) is not None
        and (viewer is None or viewer.sees(r.visibility, r.author_owner, r.author_agent))
    )
    return [_relation(r) for r in itertools.islice(live, limit)]


def get_insight(p: Projection, insight_id: UUID, viewer: Viewer | None = None) -> Insight | None:
    row = p.memory.live_insight(insight_id)
    return _insight(p, row, viewer) if row is not None else None


# -- wisdom (per owner, across collectives; few per owner: an exact scan) -------------------


def wisdom_of(p: Projection, owner_id: str, principal: Principal | None = None) -> list[Wisdom]:
    """The live wisdom of one owner, oldest first (what ``principal`` may see of it)."""
    rows = [
        r
        for r in p.memory.wisdom.values()
        if r.owner_id == owner_id and r.create_event is not None and not r.deleted
        and (principal is None or principal.sees_wisdom(
            r.visibility, r.owner_id, r.author_owner, r.author_agent))
    ]  # fmt: skip
    rows.sort(key=lambda r: (r.created_hlc or 0, r.wisdom_id))
    return [
        Wisdom(
            wisdom_id=r.wisdom_id,
            owner_id=r.owner_id or "",
            category=r.category or "",
            pattern=r.pattern or "",
            confidence=r.confidence or 0.0,
            embedding=r.embedding or b"",
            source_collectives=tuple(r.source_collectives or ()),
            source_experience_count=int(r.source_experience_count or 0),
            applicable_domains=tuple(r.applicable_domains or ()),
            created_ms=ev.hlc_millis(r.created_hlc or 0),
            visibility=r.visibility or DEFAULT_VISIBILITY,
            author_owner=r.author_owner,
            author_agent=r.author_agent,
        )  # fmt: skip
        for r in rows
    ]


def similar_wisdom(
    p: Projection,
    owner_id: str,
    query: Sequence[float] | npt.NDArray[np.float32],
    k: int,
    principal: Principal | None = None,
) -> list[ScoredWisdom]:
    """The owner's wisdom nearest to ``query`` (cosine), best first; other dimensions skipped."""
    import numpy as np

    q = np.asarray(query, dtype=np.float32)
    q = q / (np.linalg.norm(q) or 1.0)
    scored = []
    for w in wisdom_of(p, owner_id, principal):
        vector = ev.unpack_vector(w.embedding)
        if len(vector) == len(q):
            scored.append(ScoredWisdom(w, float(vector @ q / (np.linalg.norm(vector) or 1.0))))
    scored.sort(key=lambda s: -s.score)
    return scored[:k]


# -- access ------------------------------------------------------------------------------------


def tokens(p: Projection) -> list[TokenInfo]:
    """Every access token this host applied, revoked ones included (by id)."""
    found = []
    for row in p.memory.tokens.values():
        if row.create_event is None:
            continue  # a revocation of a token whose create is not here (yet)
        found.append(
            TokenInfo(
                token_id=row.token_id,
                owner_id=row.owner_id or "",
                agent_id=row.agent_id,
                scope=row.scope or "read",  # type: ignore[arg-type]
                collectives=tuple(row.collectives or ()),
                expires_ms=row.expires_ms,
                secret_sha256=row.secret_sha256,
                revoked=row.deleted,
            )  # fmt: skip
        )
    found.sort(key=lambda t: t.token_id)
    return found


class Access(msgspec.Struct, frozen=True):
    """What deciding access to a live entity needs: its collective (and the collective's
    owner), its visibility and its author."""

    collective_id: UUID | None
    owner_id: str | None  # the collective's owner (the wisdom's owner for wisdom)
    visibility: str | None
    author_owner: str | None
    author_agent: str | None


def access_of(p: Projection, entity: str, entity_id: UUID) -> Access | None:
    """The access facts of a live experience, relation, insight or wisdom, or None."""
    memory = p.memory
    row: Any
    if entity == "experience":
        row = memory.live_experience(entity_id)
    elif entity == "relation":
        row = memory.live_relation(entity_id)
    elif entity == "insight":
        row = memory.live_insight(entity_id)
    else:
        row = memory.wisdom.get((entity_id,))
        if row is None or row.create_event is None or row.deleted:
            return None
        return Access(None, row.owner_id, row.visibility, row.author_owner, row.author_agent)
    if row is None:
        return None
    collective = memory.live_collective(row.collective_id)
    return Access(
        row.collective_id, collective.owner_id if collective is not None else None,
        row.visibility, row.author_owner, row.author_agent,
    )  # fmt: skip


def deleted_access(p: Projection, experience_id: UUID) -> Access | None:
    """The access facts an experience had before this host applied its delete (None: it
    was not live here then, or too long ago)."""
    found = p.memory.deleted_access.get(experience_id)
    if found is None:
        return None
    collective_id, visibility, author_owner, author_agent = found
    collective = p.memory.collectives.get((collective_id,))
    owner = collective.owner_id if collective is not None else None
    return Access(collective_id, owner, visibility, author_owner, author_agent)


# -- sessions (sync.sessions) -------------------------------------------------------------------


class Todo(msgspec.Struct, frozen=True, kw_only=True):
    """One item of a session's todo list."""

    task: str
    priority: ev.TodoPriority = "medium"
    note: str = ""
    done: bool = False


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's session in a collective: what it did, has to do, broke and decided.
    Each field is the last value written to it, on whichever host."""

    session_id: UUID
    collective_id: UUID
    agent_id: str
    summary: str
    todo: tuple[Todo, ...]
    changes: tuple[str, ...]
    bugs: tuple[str, ...]
    architecture: tuple[str, ...]
    started_ms: int
    updated_ms: int  # the latest write to it: its start, an update or its end
    ended: bool
    ended_ms: int | None  # when it ended (None: open)
    author_owner: str | None  # the principal that started it
    author_agent: str | None


_todo_list = msgspec.json.Decoder(tuple[Todo, ...])


def _session(row: SessionRow) -> Session:
    latest = row.created_hlc or 0
    for name in SessionRow.REGISTERS:
        stamp = getattr(row, f"{name}_stamp")
        if stamp:
            latest = max(latest, int.from_bytes(stamp[:8], "big"))
    return Session(
        session_id=row.session_id, collective_id=row.collective_id,  # type: ignore[arg-type]
        agent_id=row.agent_id or "", summary=row.summary or "",
        todo=_todo_list.decode(row.todo) if row.todo else (),
        changes=tuple(row.changes or ()), bugs=tuple(row.bugs or ()),
        architecture=tuple(row.architecture or ()),
        started_ms=ev.hlc_millis(row.created_hlc or 0), updated_ms=ev.hlc_millis(latest),
        ended=row.ended_hlc is not None,
        ended_ms=None if row.ended_hlc is None else ev.hlc_millis(row.ended_hlc),
        author_owner=row.author_owner, author_agent=row.author_agent,
    )  # fmt: skip


def get_session(p: Projection, session_id: UUID) -> Session | None:
    """A live session (ended or not), or None."""
    row = p.memory.live_session(session_id)
    return None if row is None else _session(row)


def sessions_page(
    p: Projection,
    collective_id: UUID,
    agent_id: str | None = None,
    open_only: bool = False,
    limit: int | None = None,
    after: tuple[int, UUID] | None = None,
) -> tuple[list[Session], tuple[int, UUID] | None]:
    """Up to ``limit`` live sessions of a collective (of one agent; only the open ones),
    oldest first by (start HLC, id), after the key ``after``; and the key of the last one
    when more follow."""
    rows = sorted(
        ((r.created_hlc or 0, r.session_id), r)
        for r in p.memory.live_sessions_of(collective_id)
        if agent_id in (None, r.agent_id) and not (open_only and r.ended_hlc is not None)
    )  # fmt: skip
    taken, last = _take(rows, limit, after)
    return [_session(r) for r in taken], last


def latest_open_session(p: Projection, collective_id: UUID, agent_id: str) -> Session | None:
    """The open session of an agent started last (by start HLC, then id), or None."""
    found = max(
        (
            ((r.created_hlc or 0, r.session_id), r)
            for r in p.memory.live_sessions_of(collective_id)
            if r.agent_id == agent_id and r.ended_hlc is None
        ),
        default=None,
        key=lambda keyed: keyed[0],
    )
    return None if found is None else _session(found[1])


def session_ids_in_collective(p: Projection, collective_id: UUID) -> list[UUID]:
    """Every session row of a collective, deleted ones too (what its delete tombstones)."""
    return sorted(p.memory.sessions_of.get(collective_id, set()))


# -- threads: an agent framework's checkpoints (sync.threads) ------------------------------


class PendingWrite(msgspec.Struct, frozen=True, kw_only=True):
    """A task's pending write after a checkpoint: ``value``, the bytes its serializer
    made (``value_type``) in base64, at place ``idx`` among the task's writes."""

    task_id: str
    task_path: str
    idx: int
    channel: str
    value_type: str
    value: str  # base64 (the answers' bytes are embeddings: ops.encoding)


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """One checkpoint of a thread: the framework's serialized state (``checkpoint``, the
    bytes its serializer made, ``checkpoint_type``, in base64), its metadata, and the
    pending writes made after it. ``thread`` is the framework's name of the thread,
    ``thread_id`` Pulse's."""

    thread: str
    thread_id: UUID
    collective_id: UUID
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint_type: str
    checkpoint: str  # base64
    metadata: dict[str, Any]
    run_id: str | None
    created_ms: int
    author_owner: str | None
    author_agent: str | None
    pending_writes: tuple[PendingWrite, ...] = ()


class ThreadKey(msgspec.Struct, frozen=True, kw_only=True):
    """Where a checkpoint was written: its thread (by name and Pulse's id), namespace and id."""

    thread: str
    thread_id: UUID
    collective_id: UUID
    checkpoint_ns: str
    checkpoint_id: str


_metadata = msgspec.json.Decoder(dict[str, Any])


def _base64(data: bytes | None) -> str:
    return binascii.b2a_base64(data or b"", newline=False).decode()


def _metadata_of(text: str | None) -> dict[str, Any]:
    """A checkpoint's metadata: a JSON object as written (anything else, from a log
    written by another program, reads as none)."""
    try:
        return _metadata.decode(text or "{}")
    except msgspec.DecodeError:
        return {}


def _visible_threads(
    p: Projection, collective_id: UUID, owner: str | None, agent: str | None
) -> Iterator[tuple[UUID, tuple[UUID, str, str | None, str | None]]]:
    """The live threads of a collective the principal (its owner and agent; None: any)
    may see: those it wrote (an owner's token, its owner's threads; an agent's, its
    agent's), with what their first checkpoint says of them."""
    memory = p.memory
    for thread_id in sorted(memory.threads_of.get(collective_id, ())):
        named = memory.thread_names.get((thread_id, collective_id))
        if named is None:
            continue
        if (owner is None or named[2] == owner) and (agent is None or named[3] == agent):
            yield thread_id, named


def thread_ids(
    p: Projection, collective_id: UUID, name: str, owner: str | None, agent: str | None
) -> list[UUID]:
    """Pulse's ids of the live threads called ``name`` in a collective that the principal
    may see, smallest first (one, unless two hosts began it at once)."""
    return [t for t, named in _visible_threads(p, collective_id, owner, agent) if named[1] == name]


def thread_names(
    p: Projection, collective_id: UUID, owner: str | None, agent: str | None
) -> list[str]:
    """The names of the threads of a collective the principal may see."""
    return sorted({named[1] for _, named in _visible_threads(p, collective_id, owner, agent)})


def _checkpoint_rows(p: Projection, thread_id: UUID, collective_id: UUID) -> list[Any]:
    memory = p.memory
    return [
        row
        for key in memory.parts_of.get((thread_id, collective_id), ())
        if len(key) == 4 and (row := memory.checkpoints.get(key)) is not None and not row.deleted
    ]


def _checkpoint(p: Projection, row: Any, name: str) -> Checkpoint:
    memory = p.memory
    writes = [
        memory.pending_writes[key]
        for key in memory.writes_of.get(row.key(), ())
        if key in memory.pending_writes
    ]
    writes.sort(key=lambda w: (w.task_path or "", w.task_id, w.idx))
    return Checkpoint(
        thread=name, thread_id=row.thread_id, collective_id=row.collective_id,
        checkpoint_ns=row.checkpoint_ns, checkpoint_id=row.checkpoint_id,
        parent_checkpoint_id=row.parent_checkpoint_id,
        checkpoint_type=row.checkpoint_type or "", checkpoint=_base64(row.checkpoint),
        metadata=_metadata_of(row.metadata), run_id=row.run_id,
        created_ms=ev.hlc_millis(row.created_hlc or 0), author_owner=row.author_owner,
        author_agent=row.author_agent,
        pending_writes=tuple(
            PendingWrite(task_id=w.task_id, task_path=w.task_path or "", idx=w.idx,
                         channel=w.channel or "", value_type=w.value_type or "",
                         value=_base64(w.value))
            for w in writes
        ),
    )  # fmt: skip


def thread_checkpoints(
    p: Projection,
    collective_id: UUID,
    owner: str | None,
    agent: str | None,
    *,
    name: str | None = None,
    checkpoint_ns: str | None = None,
    checkpoint_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    before: str | None = None,
    limit: int | None = None,
) -> list[Checkpoint]:
    """The live checkpoints of a collective's threads the principal may see (of the
    thread ``name``; of one namespace; one checkpoint), whose metadata holds each item
    of ``metadata``, with an id below ``before``: newest first (the largest id first),
    at most ``limit``."""
    found: list[tuple[str, UUID, str, Any, str]] = []
    for thread_id, named in _visible_threads(p, collective_id, owner, agent):
        if name is not None and named[1] != name:
            continue
        for row in _checkpoint_rows(p, thread_id, collective_id):
            if checkpoint_ns is not None and row.checkpoint_ns != checkpoint_ns:
                continue
            if checkpoint_id is not None and row.checkpoint_id != checkpoint_id:
                continue
            if before is not None and not row.checkpoint_id < before:
                continue
            if metadata:
                held = _metadata_of(row.metadata)
                if any(key not in held or held[key] != value for key, value in metadata.items()):
                    continue
            found.append((row.checkpoint_id, thread_id, row.checkpoint_ns, row, named[1]))
    found.sort(key=lambda f: (f[0], f[1], f[2]), reverse=True)
    if limit is not None:
        found = found[:limit]
    return [_checkpoint(p, row, name_) for _, _, _, row, name_ in found]


def thread_run_checkpoints(
    p: Projection, collective_id: UUID, owner: str | None, agent: str | None, run_ids: set[str]
) -> list[tuple[UUID, str, str]]:
    """(thread id, namespace, checkpoint id) of the live checkpoints the principal may see
    that the runs ``run_ids`` made."""
    return sorted(
        (thread_id, row.checkpoint_ns, row.checkpoint_id)
        for thread_id, _ in _visible_threads(p, collective_id, owner, agent)
        for row in _checkpoint_rows(p, thread_id, collective_id)
        if row.run_id in run_ids
    )


def thread_parts(p: Projection, thread_id: UUID, collective_id: UUID) -> list[Any]:
    """Every live checkpoint and pending write row of a thread, checkpoints first (what a
    copy of it writes again)."""
    memory = p.memory
    keys = sorted(memory.parts_of.get((thread_id, collective_id), ()), key=lambda k: (len(k), k))
    rows = []
    for key in keys:
        row = (memory.checkpoints if len(key) == 4 else memory.pending_writes).get(key)
        if row is not None and not getattr(row, "deleted", False):
            rows.append(row)
    return rows


def thread_ids_in_collective(p: Projection, collective_id: UUID) -> list[UUID]:
    """Every thread of a collective held here (what deleting the collective tombstones)."""
    return sorted(p.memory.threads_of.get(collective_id, ()))

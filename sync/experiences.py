"""Collectives and experiences: the write side of an instance's API (and their reads).

Every write is validated (pydantic models of ``sync.models``, then references checked
against the engine's state), appended, and returns once this host has applied it.
``record_experiences`` takes up to 1,000 experiences at once: validated all-or-nothing,
embedded in one embedder call, committed as one atomic batch, applied as one group.
"""

from __future__ import annotations

import asyncio
import contextlib
import typing
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

import msgspec
import numpy as np
import numpy.typing as npt
import pydantic

from eventlog import events as ev
from eventlog.errors import Forbidden, NotFollowed, NotFoundError, ValidationError
from eventlog.recorded import DUPLICATE_SIMILARITY
from projections import naming, queries
from projections.language import AUTO
from projections.projection import Projection
from sync import embedders, idempotency, models
from sync.core import (
    as_of_read,
    check_limit,
    check_vector,
    embed,
    holding,
    text_languages,
    uuid_of,
    vector_for,
)
from sync.following import Following
from sync.gate import Gate
from sync.idempotency import idempotent
from sync.models import validated
from sync.reading import Reader
from sync.writer import Writer

BATCH_MAX = models.BATCH_MAX
OWN_MAX = 4096  # acknowledged totals kept (of the experiences reinforced last)


class Experiences:
    """Collectives and their experiences (see the module docstring). ``following``
    admits a collective this host creates (a partial host follows it first) and says
    what the host follows."""

    def __init__(self, reads: Reader, gate: Gate, writer: Writer, following: Following) -> None:
        self.reads, self.gate, self.writer, self.following = (
            reads,
            gate,
            writer,
            following,
        )
        # this incarnation's acknowledged totals of the experiences it reinforced last,
        # least recently first (at most ``OWN_MAX``; a miss reads the projection)
        self._own: OrderedDict[UUID, int] = OrderedDict()
        # one announcement in flight per experience (two concurrent calls must not both
        # announce the same total); different experiences go in parallel. An entry is
        # (lock, calls holding or waiting for it) and goes when the last of them is done.
        self._reinforce_locks: dict[UUID, tuple[asyncio.Lock, int]] = {}
        # one call at a time per collective that looks for duplicates (``_deduplicated``)
        self._dedup_locks: dict[UUID, tuple[asyncio.Lock, int]] = {}

    @idempotent
    async def create_collective(
        self,
        owner_id: str,
        name: str,
        embedding_dimension: int | None = None,
        *,
        embedder: str | None = None,
        language: models.Language | None = None,
        on_duplicate: models.OnDuplicate | None = None,
        duplicate_similarity: float | None = None,
        idempotency_key: str | None = None,
    ) -> UUID:
        """A new collective. Its embedding dimension is fixed for good; with an
        ``embedder`` ("hash", or "e5-small" with the model extra) text alone can be
        recorded and searched, and the dimension defaults to the embedder's. Its
        ``language`` (fixed for good too) says how its text is analyzed for search:
        "english", "german", "ukrainian", "chinese", ... (``projections.language``), or
        "auto" (the default): each text in the language detected from it, recorded as it
        is written (``simple`` for text too short to tell), and each query in every
        language it could be. ``on_duplicate`` says what recording an experience whose
        vector is at least ``duplicate_similarity`` (cosine, default 0.95) close to a
        live one of the same type and visibility, written by the same owner, does:
        "keep" (the default: both stay), "reinforce" (the one there counts one more
        application instead) or "link" (both stay, related); a call may say otherwise
        for itself (``record_experience``). A
        principal creates collectives of its own owner only (admins: of any)."""
        me = self.gate.me()
        me.need_write()
        if not me.admin:
            if owner_id != me.owner:
                raise Forbidden(
                    f"owner_id: {me.describe()} may create collectives of owner "
                    f"{me.owner!r} only, got {owner_id!r:.60}"
                )
            if me.collectives is not None:
                raise Forbidden(
                    "owner_id: a token limited to some collectives cannot create others"
                )
        spec = validated(
            models.CollectiveIn, owner_id=owner_id, name=name,
            embedding_dimension=embedding_dimension, embedder=embedder, language=language,
            on_duplicate=on_duplicate, duplicate_similarity=duplicate_similarity,
        )  # fmt: skip
        chosen = spec.language or AUTO  # recorded as asked: "auto" is a choice of its own
        dimension = spec.embedding_dimension
        if spec.embedder is not None:
            dimension = dimension or embedders.default_dimension(spec.embedder)
            embedders.embedder(spec.embedder, dimension)  # refuses a dimension it cannot make
        assert dimension is not None
        collective_id = self.writer.new_id()
        await self.following.admit(collective_id, spec.owner_id, spec.name)
        await self.writer.write(
            ev.CollectiveCreated(
                **self.writer.common(), collective_id=collective_id, owner_id=spec.owner_id,
                name=spec.name, embedding_dimension=dimension, embedder=spec.embedder or "",
                language=chosen, on_duplicate=spec.on_duplicate or "keep",
                duplicate_similarity=spec.duplicate_similarity or DUPLICATE_SIMILARITY,
            )
        )  # fmt: skip
        return collective_id

    @as_of_read
    async def get_collective(
        self, collective_id: UUID, *, as_of: models.AsOf = None
    ) -> queries.Collective | None:
        """The collective, or None (also when the caller may see nothing of it)."""
        try:
            collective, _ = await self.gate.readable(uuid_of("collective_id", collective_id))
        except NotFollowed:
            raise  # (it exists: this host does not follow it, and says so)
        except NotFoundError:
            return None
        return collective

    @as_of_read
    async def list_collectives(
        self,
        owner_id: str | None = None,
        *,
        limit: int = models.PAGE_DEFAULT,
        after: str | None = None,
        as_of: models.AsOf = None,
    ) -> models.Page[queries.Collective]:
        """The live collectives, or those of one owner, oldest first: one page of at most
        ``limit`` (1..1000, default 100); the page's ``next`` is the cursor of the rest
        (``after=``), None on the last page."""
        models.check_page_limit(limit)
        key = models.from_cursor("collectives", after, (int, UUID))
        me = self.gate.me()
        found, last = await self.reads.read(
            queries.collectives_page, owner_id, limit, key, None if me.admin else me
        )
        return models.Page(found, None if last is None else models.cursor("collectives", last))

    @as_of_read
    async def find_collective(
        self, collective: str, *, as_of: models.AsOf = None
    ) -> queries.Collective:
        """The collective a caller names: by id, by a name of its own owner's collectives,
        or as ``owner/name`` (another owner's). A bare name never finds another owner's
        collective, so nobody can shadow or stand in for a caller's names; the local
        operator's bare names are every owner's, and must be unique (``projections.naming``
        has the rule). NotFoundError when there is none the caller may see; ValidationError
        when one owner has two of that name (then name it by id)."""
        ref = naming.reference(collective)
        if ref.collective_id is not None:
            found = await self.get_collective(ref.collective_id)
            if found is None:
                raise NotFoundError(f"collective: no collective {ref.collective_id}")
            return found
        me = self.gate.me()
        own = None if me.local else me.owner
        whose = ref.owner_id if ref.owner_id is not None else own
        listed, _ = await self.reads.read(
            queries.collectives_page, whose, None, None, None if me.admin else me
        )
        named = [
            c for c in listed if ref.matches(c.collective_id, c.owner_id, c.name, own)
        ]  # fmt: skip
        if not named:
            of = "" if whose is None else f" of owner {whose!r}"
            among = ""
            if me.admin and self.following.scope is not None:
                among = f" among those this host follows ({self.following.scope.describe()})"
            hint = " (another owner's: owner/name, or its id)" if ref.owner_id is None else ""
            raise NotFoundError(f"collective: no collective named {ref.name!r}{of}{among}{hint}")
        if len(named) > 1:
            each = ", ".join(f"{c.owner_id}/{c.name} ({c.collective_id})" for c in named[:10])
            each += f" and {len(named) - 10} more" if len(named) > 10 else ""
            raise ValidationError(
                f"collective: {len(named)} collectives are named {ref.text!r}; name one by "
                f"owner/name or id: {each}"
            )
        return named[0]

    @as_of_read
    async def get_collective_stats(
        self, collective_id: UUID, *, as_of: models.AsOf = None
    ) -> queries.CollectiveStats:
        """Counts of the collective's live rows (those the caller may see)."""
        collective, viewer = await self.gate.readable(uuid_of("collective_id", collective_id))
        stats = await self.reads.read(
            queries.collective_stats, collective.collective_id, viewer, self.reads.moment()
        )
        if stats is None:
            raise NotFoundError(f"collective_id: no collective {collective_id}")
        return stats

    @idempotent
    async def record_experience(
        self,
        collective_id: UUID,
        content: str,
        embedding: Sequence[float] | npt.NDArray[np.float32] | None = None,
        *,
        embedder: str | None = None,
        experience_type: ev.ExperienceType | dict[str, Any] | None = None,
        importance: float = 0.5,
        confidence: float = 0.5,
        domain: Sequence[str] = (),
        related_files: Sequence[str] = (),
        source_agent: str = "agent",
        source_task: str | None = None,
        visibility: ev.Visibility = "team",
        valid_from: int | str | None = None,
        on_duplicate: models.OnDuplicate | None = None,
        idempotency_key: str | None = None,
    ) -> UUID:
        """Record what an agent learned. ``embedding`` may be left out when the collective
        has an embedder (the content is embedded). ``visibility``: who may see it,
        "private" (its author), "team" (the collective's members) or "org" (everyone).
        ``valid_from``: when it became true (Unix ms or ISO 8601; default: now).
        ``on_duplicate``: what to do if it duplicates a live experience, for this call
        ("keep", "reinforce" or "link"; default: the collective's, ``create_collective``).
        Returns, once this host has applied it, the id of the experience that holds the
        lesson, a ``models.Recorded``: a UUID that says what was done (``outcome``
        "recorded", "reinforced": the id of the one reinforced, or "linked", and
        ``duplicate_of``). The decision is this host's, from the state it has applied,
        and what it wrote says it, so every host holds the same; two hosts writing the
        same lesson at the same moment may both record it (a later one then reinforces
        or links the closest of them, the least id of equals)."""
        fields: dict[str, Any] = {
            "collective_id": collective_id, "content": content, "embedding": embedding,
            "embedder": embedder, "importance": importance, "confidence": confidence,
            "domain": list(domain), "related_files": list(related_files),
            "source_agent": source_agent, "source_task": source_task,
            "visibility": visibility, "valid_from": valid_from, "on_duplicate": on_duplicate,
        }  # fmt: skip
        if experience_type is not None:
            fields["experience_type"] = experience_type
        spec = validated(models.ExperienceIn, **fields)
        collective = await self.gate.writable(spec.collective_id)
        vector = await vector_for(collective, spec.content, spec.embedding, spec.embedder)
        (language,) = await text_languages(collective, [spec.content])
        if (spec.on_duplicate or collective.on_duplicate) in DEDUPING:
            (found,) = await self._deduplicated(collective, [spec], [vector], [language])
            return found
        experience_id = await self.writer.entity_id("experience", spec.collective_id)
        event = _recorded(self.writer.common(), experience_id, spec, vector, language)
        await self.writer.write(event)
        return models.Recorded(event.experience_id)

    @idempotent
    async def record_experiences(
        self,
        collective_id: UUID,
        items: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
    ) -> list[UUID]:
        """Record up to 1,000 experiences in one call; each item holds the keyword
        arguments of ``record_experience`` (``content`` and, unless the collective has an
        embedder, ``embedding``). All or nothing: one bad item refuses the whole call
        with an error naming each problem as ``items.<index>.<field>``. Published as one
        batch; returns the new ids in the order of ``items`` once this host applied them."""
        if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
            raise ValidationError("items: must be a list of experiences")
        if not 1 <= len(items) <= BATCH_MAX:
            raise ValidationError(f"items: must hold 1..{BATCH_MAX} experiences, got {len(items)}")
        cid = uuid_of("collective_id", collective_id)
        specs: list[models.ExperienceIn] = []
        errors: list[Any] = []
        for index, item in enumerate(items):
            if not isinstance(item, Mapping):
                errors.append(_error(index, "must be an object of record_experience fields"))
                continue
            fields = {k: v for k, v in item.items() if k != "collective_id"}
            if "collective_id" in item and str(item["collective_id"]) != str(cid):
                errors.append(_error(index, "differs from the call's", "collective_id"))
                continue
            try:
                specs.append(models.ExperienceIn(collective_id=cid, **fields))
            except pydantic.ValidationError as exc:
                for error in exc.errors(include_url=False):
                    errors.append({**error, "loc": ("items", index, *error["loc"])})
            except TypeError as exc:
                errors.append(_error(index, str(exc)))
        if errors:
            raise models.from_errors(errors)
        collective = await self.gate.writable(cid)
        vectors: list[npt.NDArray[np.float32] | None] = []
        problems: list[str] = []
        for index, spec in enumerate(specs):
            vectors.append(spec.embedding)
            if spec.embedding is None:
                continue
            try:
                check_vector(collective, spec.embedding, spec.embedder, f"items.{index}.embedding")
            except ValidationError as exc:
                text = str(exc)
                problems.append(text if text.startswith("items.") else f"items.{index}.{text}")
        missing = [i for i, v in enumerate(vectors) if v is None]
        if missing and not collective.embedder:
            problems += [
                f"items.{i}.embedding: required, collective {collective.name!r} has no embedder"
                for i in missing
            ]
        if problems:
            shown = problems[:20]
            more = f"; and {len(problems) - 20} more" if len(problems) > 20 else ""
            refusal = ValidationError("; ".join(shown) + more)
            refusal.problems = problems  # type: ignore[attr-defined]
            raise refusal
        if missing:
            made = await embed(
                collective,
                [specs[i].content for i in missing],
                field=f"items.{missing[0]}.embedding",
            )
            for i, vector in zip(missing, made, strict=True):
                vectors[i] = vector
        languages = await text_languages(collective, [spec.content for spec in specs])
        if any((spec.on_duplicate or collective.on_duplicate) in DEDUPING for spec in specs):
            return await self._deduplicated(collective, specs, vectors, languages)  # type: ignore[arg-type]
        events = [
            _recorded(self.writer.common(), self.writer.new_id(), spec, vector, language)  # type: ignore[arg-type]
            for spec, vector, language in zip(specs, vectors, languages, strict=True)
        ]
        await self.writer.write_many(
            events, atomic=True
        )  # fresh ids: a stored copy changes nothing
        return [models.Recorded(e.experience_id) for e in events]

    async def _deduplicated(
        self,
        collective: queries.Collective,
        specs: Sequence[models.ExperienceIn],
        vectors: Sequence[npt.NDArray[np.float32]],
        languages: Sequence[str],
    ) -> list[UUID]:
        """Record experiences of which some may duplicate a live one (``on_duplicate``,
        theirs or the collective's), or one recorded before them in the same call: each
        is recorded, reinforces the one it duplicates, or is recorded and related to it,
        all in one atomic batch. One such call at a time per collective on this host, so
        that each decides on what the one before it wrote."""
        cid = collective.collective_id
        me = self.gate.me()
        author = (me.owner, me.agent)
        similarity = collective.duplicate_similarity
        modes = [spec.on_duplicate or collective.on_duplicate for spec in specs]
        async with holding(self._dedup_locks, cid):
            asked = [
                (vector, _event_type_tag(spec), spec.visibility)
                for spec, vector in zip(specs, vectors, strict=True)
            ]
            # a call with an idempotency key draws its experiences' ids first, whatever
            # it decides, and never takes one of them for a duplicate: retried, it finds
            # what its first attempt recorded and decides as it did, with the same ids
            keyed = idempotency.CURRENT.get() is not None
            drawn = [self.writer.new_id() for _ in specs] if keyed else []
            found = await self.reads.read(
                queries.duplicates_of, cid,
                [a if mode in DEDUPING else None for a, mode in zip(asked, modes, strict=True)],
                author, similarity, frozenset(drawn),
            )  # fmt: skip
            units = _units(asked)
            events: list[ev.Event] = []
            results: list[UUID] = []
            reinforced: dict[UUID, int] = {}  # the experiences reinforced: how often
            for index, (spec, vector, language, mode) in enumerate(
                zip(specs, vectors, languages, modes, strict=True)
            ):
                duplicate = found[index]  # (None for one that keeps)
                if duplicate is not None and mode == "reinforce":
                    target = duplicate[0]
                    reinforced[target] = reinforced.get(target, 0) + 1
                    results.append(models.Recorded(target, "reinforced", target))
                    continue
                new_id = drawn[index] if keyed else await self._new_experience_id(cid, len(specs))
                events.append(_recorded(self.writer.common(), new_id, spec, vector, language))
                if duplicate is None:
                    results.append(models.Recorded(new_id))
                else:  # (linked)
                    target, score = duplicate
                    events.append(
                        ev.RelationStored(
                            **self.writer.common(), relation_id=self.writer.new_id(),
                            collective_id=cid, source_id=new_id, target_id=target,
                            relation_type="RelatedTo", strength=min(max(score, 0.0), 1.0),
                            metadata=DUPLICATE_METADATA, visibility=spec.visibility,
                        )
                    )  # fmt: skip
                    results.append(models.Recorded(new_id, "linked", target))
                # (those after it in the call may duplicate it)
                found = _with_new(found, index, asked, units, new_id, similarity, modes)
            async with contextlib.AsyncExitStack() as stack:
                for target in sorted(reinforced):  # (in one order: no two calls deadlock)
                    await stack.enter_async_context(self._reinforcing(target))
                totals = {t: await self._own_total(t) + n for t, n in reinforced.items()}
                common = self.writer.common
                events += [
                    ev.ExperienceReinforced(
                        **common(), experience_id=t, collective_id=cid, applications=total
                    )
                    for t, total in totals.items()
                ]
                if len(events) == 1:
                    await self.writer.write(events[0])
                else:
                    await self.writer.write_many(events, atomic=True)
                self._acknowledged(totals)
        return results

    async def _new_experience_id(self, collective_id: UUID, calls: int) -> UUID:
        """A new experience's id: one whose key is made ahead for a single record."""
        if calls == 1:
            return await self.writer.entity_id("experience", collective_id)
        return self.writer.new_id()

    @as_of_read
    async def get_experience(
        self, experience_id: UUID, *, as_of: models.AsOf = None
    ) -> queries.Experience | None:
        """The experience (archived ones too), or None (also when the caller may not see it)."""
        key = uuid_of("experience_id", experience_id)
        if not self.gate.me().admin:
            try:
                await self.gate.entity("experience", key, write=False)
            except NotFoundError:
                return None
        return await self.reads.read(queries.get_experience, key)

    @as_of_read
    async def get_recent_experiences(
        self,
        collective_id: UUID,
        limit: int = 20,
        flt: Any = None,
        *,
        offset: int = 0,
        as_of: models.AsOf = None,
    ) -> list[queries.Experience]:
        """The newest experiences of a collective (filtered), newest first."""
        return await self._page(collective_id, limit, offset, flt, newest_first=True)

    @as_of_read
    async def list_experiences(
        self,
        collective_id: UUID,
        *,
        limit: int = 100,
        offset: int = 0,
        flt: Any = None,
        as_of: models.AsOf = None,
    ) -> list[queries.Experience]:
        """One page of a collective's experiences, oldest first (stable paging by offset)."""
        return await self._page(collective_id, limit, offset, flt, newest_first=False)

    async def _page(
        self, collective_id: UUID, limit: int, offset: int, flt: Any, *, newest_first: bool
    ) -> list[queries.Experience]:
        check_limit("limit", limit)
        if offset < 0:
            raise ValidationError(f"offset: must be >= 0, got {offset}")
        collective, viewer = await self.gate.readable(collective_id)
        return await self.reads.read(
            queries.recent_experiences, collective.collective_id, limit,
            self.reads.filter(flt, viewer), offset=offset, newest_first=newest_first,
        )  # fmt: skip

    @idempotent
    async def update_experience(
        self, /, experience_id: UUID, *, idempotency_key: str | None = None, **changes: Any
    ) -> None:
        """Change importance, confidence, domain and/or related_files (last writer wins,
        per field). Content, embedding and timestamp are immutable."""
        spec = validated(models.ExperienceUpdateIn, **changes)
        experience_id = uuid_of("experience_id", experience_id)
        collective_id = await self.gate.entity("experience", experience_id, write=True)
        assert collective_id is not None
        await self.writer.write(
            ev.ExperienceUpdated(
                **self.writer.common(), experience_id=experience_id,
                collective_id=collective_id, importance=spec.importance,
                confidence=spec.confidence,
                domain=None if spec.domain is None else tuple(spec.domain),
                related_files=None if spec.related_files is None else tuple(spec.related_files),
            )
        )  # fmt: skip

    @idempotent
    async def invalidate_experience(
        self,
        experience_id: UUID,
        reason: str,
        at: int | str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> queries.Experience:
        """Say that an experience stopped being true ``at`` (Unix ms or ISO 8601; default:
        now), and why: closes its validity interval. Searches and context leave it out
        from then on unless asked (``include_invalid``, or ``valid_at`` a moment before).
        Last writer wins on the end and its reason; every invalidation is remembered, and
        one invalidated often is marked ``unstable``. Returns the experience as it is now."""
        spec = validated(models.InvalidationIn, experience_id=experience_id, reason=reason, at=at)
        return await self._invalidation(spec, closes=True)

    @idempotent
    async def revalidate_experience(
        self, experience_id: UUID, reason: str, *, idempotency_key: str | None = None
    ) -> queries.Experience:
        """Say that an invalidated experience is true again, and why (its interval is
        open-ended again; the invalidations stay counted)."""
        spec = validated(models.InvalidationIn, experience_id=experience_id, reason=reason)
        return await self._invalidation(spec, closes=False)

    async def _invalidation(
        self, spec: models.InvalidationIn, *, closes: bool
    ) -> queries.Experience:
        """Write an experience's new end (``closes``: at ``spec.at``, default now; else
        none) and its reason; returns the experience as it is then."""
        collective_id = await self.gate.entity("experience", spec.experience_id, write=True)
        assert collective_id is not None
        common = self.writer.common()
        end = (spec.at if spec.at is not None else ev.hlc_millis(common["hlc"])) if closes else None
        await self.writer.write(
            ev.ExperienceInvalidated(
                **common, experience_id=spec.experience_id, collective_id=collective_id,
                reason=spec.reason, valid_to_ms=end,
            )
        )  # fmt: skip
        found = await self.reads.read(queries.get_experience, spec.experience_id)
        assert found is not None
        return found

    @idempotent
    async def archive_experience(
        self, experience_id: UUID, *, idempotency_key: str | None = None
    ) -> None:
        """Hide from searches (unless asked for); reversible."""
        await self._lifecycle(ev.ExperienceArchived, experience_id)

    @idempotent
    async def unarchive_experience(
        self, experience_id: UUID, *, idempotency_key: str | None = None
    ) -> None:
        await self._lifecycle(ev.ExperienceUnarchived, experience_id)

    async def _lifecycle(
        self, kind: type[ev.ExperienceArchived | ev.ExperienceUnarchived], experience_id: UUID
    ) -> None:
        experience_id = uuid_of("experience_id", experience_id)
        collective_id = await self.gate.entity("experience", experience_id, write=True)
        assert collective_id is not None
        await self.writer.write(
            kind(**self.writer.common(), experience_id=experience_id, collective_id=collective_id)
        )

    @idempotent
    async def reinforce_experience(
        self, experience_id: UUID, *, idempotency_key: str | None = None
    ) -> int:
        """Count one more application by this instance; returns the total across instances.

        Publishes this incarnation's new total (never "+1"). If the append fails, the
        total is not advanced, and the next call announces the same total again: an
        announcement that was stored after all is subsumed, never counted twice.

        The acknowledged totals of the ``OWN_MAX`` experiences reinforced last are kept
        here. For any other, this instance's entry in the projection's G-counter is read
        back: every acknowledged announcement was applied here before its call returned,
        so the entry is at least the last acknowledged total and the new total counts. (If
        the last call failed and its announcement has reached this host since, the entry
        holds it and the new total is one above it: that stored announcement counts, once.)
        """
        experience_id = uuid_of("experience_id", experience_id)
        collective_id = await self.gate.entity("experience", experience_id, write=True)
        assert collective_id is not None
        async with self._reinforcing(experience_id):
            total = await self._own_total(experience_id) + 1
            await self.writer.write(
                ev.ExperienceReinforced(
                    **self.writer.common(), experience_id=experience_id,
                    collective_id=collective_id, applications=total,
                )
            )  # fmt: skip
            self._acknowledged({experience_id: total})
        return await self.reads.read(queries.total_applications, experience_id)

    async def _own_total(self, experience_id: UUID) -> int:
        """This incarnation's last acknowledged total of an experience (its reinforcement
        lock held): kept, or read back from the projection."""
        own = self._own.get(experience_id)
        if own is None:
            own = await self.reads.read(_own_total, experience_id, self.writer.instance_id)
        return own

    def _acknowledged(self, totals: Mapping[UUID, int]) -> None:
        """Keep the totals an append just acknowledged (their locks still held)."""
        for experience_id, total in totals.items():
            if idempotency.CURRENT.get() is not None:  # a retry may have stored nothing:
                self._own.pop(experience_id, None)  # the projection has the total
            else:
                self._own[experience_id] = total
                self._own.move_to_end(experience_id)
                while len(self._own) > OWN_MAX:
                    self._own.popitem(last=False)

    def _reinforcing(self, experience_id: UUID) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the reinforcement lock of an experience (``sync.core.holding``)."""
        return holding(self._reinforce_locks, experience_id)


def _own_total(p: Projection, experience_id: UUID, instance_id: UUID) -> int:
    """The total ``instance_id`` holds in an experience's G-counter (0 when none)."""
    counter = p.memory.counter_of(experience_id)
    return 0 if counter is None else counter.get(instance_id)


def _event_type(value: pydantic.BaseModel) -> ev.ExperienceType:
    """``models.to_event_type``, converted to the variant's own class: msgspec keeps what
    it learns of a class, but works a union out again on every call (~50 us a record)."""
    if type(value) is models.GenericIn and value.category is None:
        return _GENERIC  # (the default: one frozen struct for all)
    data = value.model_dump(mode="python")
    variant = _VARIANTS.get(data.get("kind"))
    if variant is None:
        return models.to_event_type(value)
    converted: ev.ExperienceType = msgspec.convert(data, variant)
    return converted


_GENERIC = ev.Generic()
_VARIANTS: dict[Any, type[ev.ExperienceType]] = {
    v.__struct_config__.tag: v for v in typing.get_args(ev.ExperienceType)
}


def _recorded(
    common: dict[str, Any],
    experience_id: UUID,
    spec: models.ExperienceIn,
    vector: npt.NDArray[np.float32],
    language: str = "",
) -> ev.ExperienceRecorded:
    return ev.ExperienceRecorded(
        **common, experience_id=experience_id, collective_id=spec.collective_id,
        content=spec.content, embedding=ev.pack_vector(vector),
        experience_type=_event_type(spec.experience_type),
        importance=spec.importance, confidence=spec.confidence,
        source_agent=spec.source_agent, domain=tuple(spec.domain),
        related_files=tuple(spec.related_files), source_task=spec.source_task,
        visibility=spec.visibility, valid_from_ms=spec.valid_from, language=language,
    )  # fmt: skip


DEDUPING = ("reinforce", "link")  # the choices of on_duplicate that look for duplicates
DUPLICATE_METADATA = '{"duplicate": true}'  # of the relation a linked duplicate gets

# what a new experience may duplicate: (vector, type tag, visibility) of each
Asked = Sequence[tuple[npt.NDArray[np.float32], str, str]]
Duplicate = tuple[UUID, float] | None


def _event_type_tag(spec: models.ExperienceIn) -> str:
    """The variant name of an experience's type, e.g. "Fact" (as the fold stores it)."""
    tag: str = type(_event_type(spec.experience_type)).__struct_config__.tag  # type: ignore[assignment]
    return tag


def _with_new(
    found: list[Duplicate], index: int, asked: Asked, units: npt.NDArray[np.float32],
    new_id: UUID, similarity: float, modes: Sequence[str],
) -> list[Duplicate]:  # fmt: skip
    """``found`` with the experience ``asked[index]`` (recorded as ``new_id`` by this
    call) as what each one after it that looks for duplicates (``modes``) duplicates,
    where it is closer than what was found (of equal ones, the least id). ``units``: the
    vectors of ``asked``, of length 1."""
    _, tag, visibility = asked[index]
    updated = list(found)
    scores = units[index + 1 :] @ units[index]
    for at in np.flatnonzero(scores >= similarity - queries.SIMILARITY_ROUNDING):
        later, score = index + 1 + int(at), float(scores[at])
        if modes[later] not in DEDUPING or asked[later][1:] != (tag, visibility):
            continue
        there = updated[later]
        if there is None or (-score, new_id) < (-there[1], there[0]):
            updated[later] = (new_id, score)
    return updated


def _units(asked: Asked) -> npt.NDArray[np.float32]:
    """The vectors of ``asked`` as rows of length 1 (cosine similarities: products)."""
    matrix = np.asarray([vector for vector, _, _ in asked], dtype=np.float32)
    lengths = np.linalg.norm(matrix, axis=1, keepdims=True)
    unit = matrix / np.where(lengths > 0, lengths, np.float32(1.0))
    return unit.astype(np.float32, copy=False)


def _error(index: int, message: str, field: str | None = None) -> dict[str, Any]:
    """A pydantic-shaped error for ``models.from_errors`` at ``items.<index>[.field]``."""
    loc: tuple[Any, ...] = ("items", index) if field is None else ("items", index, field)
    return {"loc": loc, "msg": message, "type": "value_error", "input": None}

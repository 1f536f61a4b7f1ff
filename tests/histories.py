"""Hypothesis strategies for event histories over a small id space written by several
instances: enough collisions to exercise every fold rule (conflicting creates, updates
before creates, deletes, repeated reinforcements, relation triples taken twice, wrong
dimensions, relations across collectives), plus a plain model of the fold written from
the specification alone (the rules in ``projections.fold``'s docstring and docs/architecture.md's
table): it shares no code with the fold, whose row classes it uses only as the format
to compare in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import msgspec
from hypothesis import strategies as st

from eventlog import events as ev
from projections import fold

COLLECTIVES = [UUID(int=0xC0 + i) for i in range(2)]
EXPERIENCES = [UUID(int=0xE0 + i) for i in range(4)]
RELATIONS = [UUID(int=0xF0 + i) for i in range(3)]
INSIGHTS = [UUID(int=0xD0 + i) for i in range(2)]
WISDOM = [UUID(int=0xB0)]
TOKENS = [UUID(int=0x70 + i) for i in range(2)]
INSTANCES = [UUID(int=0xA0 + i) for i in range(3)]
AUTHORS = [(None, None), ("o", None), ("o", "a1"), ("p", "a2")]  # (owner, agent)
visibility = st.sampled_from(["private", "team", "org"])

small_floats = st.sampled_from([0.0, 0.25, 0.5, 1.0])
tags = st.lists(st.sampled_from(["a", "b", "c"]), max_size=2).map(tuple)


@st.composite
def common(draw: st.DrawFn) -> dict[str, Any]:
    owner, agent = draw(st.sampled_from(AUTHORS))
    return {
        "event_id": draw(st.uuids()),
        "instance_id": draw(st.sampled_from(INSTANCES)),
        "hlc": ev.pack_hlc(
            draw(st.integers(1_700_000_000_000, 1_700_000_000_020)), draw(st.integers(0, 3))
        ),
        "author_owner": owner,
        "author_agent": agent,
    }


def vector(dim: int) -> bytes:
    return ev.pack_vector([float(i + 1) for i in range(dim)])


cid = st.sampled_from(COLLECTIVES)
eid = st.sampled_from(EXPERIENCES)
dims = st.sampled_from([2, 3])

EVENTS = st.one_of(
    st.builds(
        lambda c, i, d, name: ev.CollectiveCreated(**c, collective_id=i, owner_id="o", name=name, embedding_dimension=d),
        common(), cid, dims, st.sampled_from(["x", "y"]),
    ),
    st.builds(lambda c, i: ev.CollectiveDeleted(**c, collective_id=i), common(), cid),
    st.builds(
        lambda c, e, col, d, imp, conf, dom, text, kind, vis, since: ev.ExperienceRecorded(
            **c, experience_id=e, collective_id=col, content=text, embedding=vector(d),
            experience_type=kind, importance=imp, confidence=conf, source_agent="agent", domain=dom,
            visibility=vis, valid_from_ms=since,
        ),
        common(), eid, cid, dims, small_floats, small_floats, tags, st.sampled_from(["alpha", "beta"]),
        st.sampled_from([ev.Generic(), ev.Fact(statement="s", source="t")]), visibility,
        st.none() | st.integers(0, 5),
    ),
    st.builds(
        lambda c, e, col, imp, conf, dom: ev.ExperienceUpdated(
            **c, experience_id=e, collective_id=col, importance=imp, confidence=conf, domain=dom
        ),
        common(), eid, cid, st.none() | small_floats, st.none() | small_floats, st.none() | tags,
    ),
    st.builds(lambda c, e, col: ev.ExperienceArchived(**c, experience_id=e, collective_id=col), common(), eid, cid),
    st.builds(lambda c, e, col: ev.ExperienceUnarchived(**c, experience_id=e, collective_id=col), common(), eid, cid),
    st.builds(lambda c, e, col: ev.ExperienceDeleted(**c, experience_id=e, collective_id=col), common(), eid, cid),
    st.builds(  # closes the validity interval, or (None) opens it again
        lambda c, e, col, reason, at: ev.ExperienceInvalidated(
            **c, experience_id=e, collective_id=col, reason=reason, valid_to_ms=at
        ),
        common(), eid, cid, st.sampled_from(["stale", "wrong"]), st.none() | st.integers(0, 3),
    ),
    st.builds(
        lambda c, e, col, n: ev.ExperienceReinforced(**c, experience_id=e, collective_id=col, applications=n),
        common(), eid, cid, st.integers(1, 4),
    ),
    st.builds(
        lambda c, r, col, s, t, kind, strength, vis: ev.RelationStored(
            **c, relation_id=r, collective_id=col, source_id=s, target_id=t, relation_type=kind, strength=strength,
            visibility=vis,
        ),
        common(), st.sampled_from(RELATIONS), cid, eid, eid, st.sampled_from(["Supports", "Contradicts"]), small_floats,
        visibility,
    ),
    st.builds(lambda c, r, col: ev.RelationDeleted(**c, relation_id=r, collective_id=col), common(), st.sampled_from(RELATIONS), cid),
    st.builds(
        lambda c, i, col, d, sources, vis: ev.InsightStored(
            **c, insight_id=i, collective_id=col, content="insight", embedding=vector(d),
            source_experiences=tuple(sources), confidence=0.5, visibility=vis,
        ),
        common(), st.sampled_from(INSIGHTS), cid, dims, st.lists(eid, min_size=1, max_size=2), visibility,
    ),
    st.builds(lambda c, i, col: ev.InsightDeleted(**c, insight_id=i, collective_id=col), common(), st.sampled_from(INSIGHTS), cid),
    st.builds(
        lambda c, w, pattern, vis: ev.WisdomStored(
            **c, wisdom_id=w, owner_id="o", category="CodingStyle", pattern=pattern, confidence=0.5, embedding=vector(2),
            visibility=vis,
        ),
        common(), st.sampled_from(WISDOM), st.sampled_from(["p", "q"]), visibility,
    ),
    st.builds(lambda c, w: ev.WisdomDeleted(**c, wisdom_id=w, owner_id="o"), common(), st.sampled_from(WISDOM)),
    st.builds(
        lambda c, t, owner, agent, scope, limited, expires: ev.TokenCreated(
            **c, token_id=t, owner_id=owner, secret_sha256=f"{t.int:064x}", scope=scope, agent_id=agent,
            collectives=tuple(limited), expires_ms=expires,
        ),
        common(), st.sampled_from(TOKENS), st.sampled_from(["o", "p"]), st.sampled_from([None, "a1"]),
        st.sampled_from(["read", "write", "admin"]), st.lists(cid, max_size=2, unique=True),
        st.none() | st.integers(0, 10),
    ),
    st.builds(lambda c, t: ev.TokenRevoked(**c, token_id=t), common(), st.sampled_from(TOKENS)),
)  # fmt: skip

histories = st.lists(EVENTS, min_size=1, max_size=40)


@st.composite
def redeliveries(draw: st.DrawFn, events: list[ev.Event]) -> list[ev.Event]:
    """The same events in any order, some delivered more than once."""
    shuffled = draw(st.permutations(events))
    extra = draw(st.lists(st.sampled_from(events), max_size=len(events))) if events else []
    merged = list(shuffled)
    for event in extra:
        merged.insert(draw(st.integers(0, len(merged))), event)
    return merged


# -- the plain model: every rule applied "by definition" to the whole set of events --------

Rows = dict[type[fold.Row], dict[tuple[Any, ...], fold.Row]]


def later(e: ev.Event) -> tuple[int, UUID, UUID]:
    """The last-writer-wins order: HLC, then instance id, then event id."""
    return (e.hlc, e.instance_id, e.event_id)


def stamp_column(e: ev.Event) -> bytes:
    """How a row stores the stamp of the write it holds: the three of ``later`` as bytes,
    the HLC as 8 bytes big-endian."""
    return e.hlc.to_bytes(8, "big") + e.instance_id.bytes + e.event_id.bytes


def last_write(writes: Sequence[tuple[ev.Event, Any]], default: Any = None) -> tuple[Any, bytes]:
    """A register: the value of the latest write and its stamp; unwritten, the default."""
    if not writes:
        return default, b""
    event, value = max(writes, key=lambda write: later(write[0]))
    return value, stamp_column(event)


@dataclass(frozen=True)
class Entity:
    """One kind of entity: its events, its row and what its create sets."""

    row: type[fold.Row]
    key: str
    create: type[ev.Event]
    delete: type[ev.Event]
    updates: tuple[type[ev.Event], ...]  # field updates, archive / unarchive
    anchor: str | None  # the smallest one named by any of its events is kept
    created: Callable[[Any], dict[str, Any]]  # the create's fields, by row column


def experience_type(kind: Any) -> dict[str, Any]:
    """The variant's name (its tag) and the variant as JSON."""
    return {"experience_type": type(kind).__name__, "type_data": msgspec.json.encode(kind).decode()}


def author(e: ev.Event) -> dict[str, Any]:
    """Who wrote a create: kept with what it created."""
    return {"author_owner": e.author_owner, "author_agent": e.author_agent}


def shown(e: Any) -> dict[str, Any]:
    """Who may see what a create made, and who made it."""
    return {"visibility": e.visibility, **author(e)}


ENTITIES = [
    Entity(
        fold.CollectiveRow, "collective_id", ev.CollectiveCreated, ev.CollectiveDeleted, (), None,
        lambda e: {"owner_id": e.owner_id, "name": e.name, "embedding_dimension": e.embedding_dimension, "embedder": e.embedder,
                   **author(e)},
    ),
    Entity(
        fold.ExperienceRow, "experience_id", ev.ExperienceRecorded,
        ev.ExperienceDeleted,
        (ev.ExperienceUpdated, ev.ExperienceArchived, ev.ExperienceUnarchived, ev.ExperienceInvalidated),
        "collective_id",
        lambda e: {
            "content": e.content, "embedding": e.embedding, **experience_type(e.experience_type),
            "source_agent": e.source_agent, "source_task": e.source_task, **shown(e),
            "valid_from_ms": e.valid_from_ms,
        },
    ),
    Entity(
        fold.RelationRow, "relation_id", ev.RelationStored, ev.RelationDeleted, (), "collective_id",
        lambda e: {
            "source_id": e.source_id, "target_id": e.target_id, "relation_type": e.relation_type,
            "strength": e.strength, "metadata": e.metadata, **shown(e),
        },
    ),
    Entity(
        fold.InsightRow, "insight_id", ev.InsightStored, ev.InsightDeleted, (), "collective_id",
        lambda e: {
            "content": e.content, "embedding": e.embedding, "source_experiences": e.source_experiences,
            "confidence": e.confidence, "domain": e.domain, **shown(e),
        },
    ),
    Entity(
        fold.WisdomRow, "wisdom_id", ev.WisdomStored, ev.WisdomDeleted, (), "owner_id",
        lambda e: {
            "category": e.category, "pattern": e.pattern, "confidence": e.confidence, "embedding": e.embedding,
            "source_collectives": e.source_collectives, "source_experience_count": e.source_experience_count,
            "applicable_domains": e.applicable_domains, **shown(e),
        },
    ),
    Entity(  # a token: its create as any create, its revocation a tombstone
        fold.TokenRow, "token_id", ev.TokenCreated, ev.TokenRevoked, (), None,
        lambda e: {
            "owner_id": e.owner_id, "secret_sha256": e.secret_sha256, "scope": e.scope, "agent_id": e.agent_id,
            "collectives": e.collectives, "expires_ms": e.expires_ms, **author(e),
        },
    ),
]  # fmt: skip


def experience_registers(group: list[ev.Event]) -> dict[str, Any]:
    """Last-writer-wins per field: every create writes all four fields, an update those it
    does not leave None; archive and unarchive write ``archived``."""
    columns: dict[str, Any] = {}
    for name in ("importance", "confidence", "domain", "related_files"):
        writes = [
            (e, getattr(e, name))
            for e in group
            if isinstance(e, ev.ExperienceRecorded)
            or (isinstance(e, ev.ExperienceUpdated) and getattr(e, name) is not None)
        ]
        columns[name], columns[f"{name}_stamp"] = last_write(writes)
    toggles = [
        (e, isinstance(e, ev.ExperienceArchived))
        for e in group
        if isinstance(e, (ev.ExperienceArchived, ev.ExperienceUnarchived))
    ]
    columns["archived"], columns["archived_stamp"] = last_write(toggles, default=False)
    # an invalidation writes the end of the validity interval and its reason together;
    # every one that closes it is remembered by its HLC (the 64 latest)
    closing = [e for e in group if isinstance(e, ev.ExperienceInvalidated)]
    columns["valid_to"], columns["valid_to_stamp"] = last_write(
        [(e, e.valid_to_ms) for e in closing]
    )
    columns["invalid_reason"], columns["invalid_reason_stamp"] = last_write(
        [(e, e.reason) for e in closing]
    )
    times = sorted({e.hlc for e in closing if e.valid_to_ms is not None})[-64:]
    columns["invalidations"] = tuple(times) or None
    return columns


def entity_row(entity: Entity, key: UUID, group: list[ev.Event]) -> fold.Row:
    """The row of one entity's events (all naming one collective, for an entity in one)."""
    columns: dict[str, Any] = {}
    if entity.anchor is not None:
        columns[entity.anchor] = min(getattr(e, entity.anchor) for e in group)
    revoked_token = entity.row is fold.TokenRow and any(isinstance(e, entity.delete) for e in group)
    if any(isinstance(e, entity.delete) for e in group) and not revoked_token:
        columns["deleted"] = True  # a tombstone: the key, the anchor and the flag
    else:
        creates = [e for e in group if isinstance(e, entity.create)]
        if creates:  # the create with the smallest event id sets the create fields
            first = min(creates, key=lambda e: (e.event_id, e.hlc))
            columns.update(
                entity.created(first), create_event=first.event_id, created_hlc=first.hlc
            )
        if entity.row is fold.ExperienceRow:
            columns.update(experience_registers(group))
        if revoked_token:  # a revoked token keeps what it was, all but its secret's hash
            columns.update(deleted=True, secret_sha256=None)
    return entity.row(key, **columns)  # type: ignore[call-arg]


def model(events: list[ev.Event]) -> Rows:
    unique = list({e.event_id: e for e in events}.values())  # a redelivery is the same write
    rows: Rows = {t: {} for t in fold.ROW_TYPES}
    for entity in ENTITIES:
        groups: dict[UUID, list[ev.Event]] = {}
        for e in unique:
            if isinstance(e, (entity.create, entity.delete, *entity.updates)):
                groups.setdefault(getattr(e, entity.key), []).append(e)
        for key, group in groups.items():
            if entity.anchor != "collective_id":
                rows[entity.row][(key,)] = entity_row(entity, key, group)
                continue
            # an entity in a collective: the events naming each collective are a row of
            # their own; the entity is the one of its create (the smallest create event
            # id), else of a tombstone, else of the smallest collective; the rest are
            # strays, which nothing reads
            named: dict[UUID, fold.Row] = {}
            for collective in {e.collective_id for e in group}:
                named[collective] = entity_row(
                    entity, key, [e for e in group if e.collective_id == collective]
                )
            created = [r for r in named.values() if getattr(r, "create_event", None) is not None]
            deleted = [r for r in named.values() if getattr(r, "deleted", False)]
            if created:
                main = min(  # (bare events carry no stream sequence: the event id decides)
                    created,
                    key=lambda r: (r.create_event, r.created_hlc, r.collective_id),  # type: ignore[attr-defined]
                )
            elif deleted:
                main = min(deleted, key=lambda r: r.collective_id)  # type: ignore[attr-defined]
            else:
                main = named[min(named)]
            main.strays = {c: r for c, r in named.items() if r is not main} or None  # type: ignore[attr-defined]
            rows[entity.row][(key,)] = main

    reports: dict[tuple[UUID, UUID, UUID], list[ev.ExperienceReinforced]] = {}
    for e in unique:  # a G-counter: one entry per (experience, instance), per collective named
        if isinstance(e, ev.ExperienceReinforced):
            reports.setdefault((e.experience_id, e.instance_id, e.collective_id), []).append(e)
    for (experience, instance, collective), totals in reports.items():
        rows[fold.ApplicationRow][(experience, instance, collective)] = fold.ApplicationRow(
            experience_id=experience,
            instance_id=instance,
            applications=max(0, *(e.applications for e in totals)),  # the largest total reported
            last_hlc=max(e.hlc for e in totals),
            collective_id=collective,
        )
    return rows


def creates_in_two_collectives(events: list[ev.Event]) -> bool:
    """Whether some entity has creates naming different collectives (a forged or buggy
    writer): on a stream, the first create decides (``projections.fold.Placed``), so
    which one depends on the order the stream holds them in."""
    named: dict[UUID, set[UUID]] = {}
    for e in events:
        if isinstance(e, (ev.ExperienceRecorded, ev.RelationStored, ev.InsightStored)):
            entity = getattr(e, {ev.ExperienceRecorded: "experience_id",
                                 ev.RelationStored: "relation_id",
                                 ev.InsightStored: "insight_id"}[type(e)])  # fmt: skip
            named.setdefault(entity, set()).add(e.collective_id)
    return any(len(c) > 1 for c in named.values())


def stored_model(events: list[ev.Event]) -> Rows:
    """``model`` after what the store forgets: the application counts of an experience
    that reports naming a collective made, where the experience is deleted in that
    collective (a delete naming another collective than the record's does not take the
    record's counts), and the strays of an entity (writes naming another collective)."""
    rows = model(events)
    deleted = {  # (experience, collective) with a tombstone, the entity's or a stray's
        (k[0], g.collective_id)
        for k, r in rows[fold.ExperienceRow].items()
        for g in [r, *(getattr(r, "strays", None) or {}).values()]
        if g.deleted
    }
    for table in rows.values():
        for row in table.values():
            if getattr(row, "strays", None) is not None:
                row.strays = None  # type: ignore[attr-defined]
    rows[fold.ApplicationRow] = {
        k: r for k, r in rows[fold.ApplicationRow].items() if (k[0], k[2]) not in deleted
    }
    return rows

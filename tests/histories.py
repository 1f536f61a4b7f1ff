"""Hypothesis strategies for event histories over a small id space written by several
instances: enough collisions to exercise every fold rule (conflicting creates, updates
before creates, deletes, repeated reinforcements, relation triples taken twice, wrong
dimensions, relations across collectives), plus a plain model of the fold."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from hypothesis import strategies as st

from eventlog import events as ev
from projections import fold

COLLECTIVES = [UUID(int=0xC0 + i) for i in range(2)]
EXPERIENCES = [UUID(int=0xE0 + i) for i in range(4)]
RELATIONS = [UUID(int=0xF0 + i) for i in range(3)]
INSIGHTS = [UUID(int=0xD0 + i) for i in range(2)]
WISDOM = [UUID(int=0xB0)]
INSTANCES = [UUID(int=0xA0 + i) for i in range(3)]

small_floats = st.sampled_from([0.0, 0.25, 0.5, 1.0])
tags = st.lists(st.sampled_from(["a", "b", "c"]), max_size=2).map(tuple)


@st.composite
def common(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "event_id": draw(st.uuids()),
        "instance_id": draw(st.sampled_from(INSTANCES)),
        "hlc": ev.pack_hlc(
            draw(st.integers(1_700_000_000_000, 1_700_000_000_020)), draw(st.integers(0, 3))
        ),
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
        lambda c, e, col, d, imp, conf, dom, text, kind: ev.ExperienceRecorded(
            **c, experience_id=e, collective_id=col, content=text, embedding=vector(d),
            experience_type=kind, importance=imp, confidence=conf, source_agent="agent", domain=dom,
        ),
        common(), eid, cid, dims, small_floats, small_floats, tags, st.sampled_from(["alpha", "beta"]),
        st.sampled_from([ev.Generic(), ev.Fact(statement="s", source="t")]),
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
    st.builds(
        lambda c, e, col, n: ev.ExperienceReinforced(**c, experience_id=e, collective_id=col, applications=n),
        common(), eid, cid, st.integers(1, 4),
    ),
    st.builds(
        lambda c, r, col, s, t, kind, strength: ev.RelationStored(
            **c, relation_id=r, collective_id=col, source_id=s, target_id=t, relation_type=kind, strength=strength
        ),
        common(), st.sampled_from(RELATIONS), cid, eid, eid, st.sampled_from(["Supports", "Contradicts"]), small_floats,
    ),
    st.builds(lambda c, r, col: ev.RelationDeleted(**c, relation_id=r, collective_id=col), common(), st.sampled_from(RELATIONS), cid),
    st.builds(
        lambda c, i, col, d, sources: ev.InsightStored(
            **c, insight_id=i, collective_id=col, content="insight", embedding=vector(d),
            source_experiences=tuple(sources), confidence=0.5,
        ),
        common(), st.sampled_from(INSIGHTS), cid, dims, st.lists(eid, min_size=1, max_size=2),
    ),
    st.builds(lambda c, i, col: ev.InsightDeleted(**c, insight_id=i, collective_id=col), common(), st.sampled_from(INSIGHTS), cid),
    st.builds(
        lambda c, w, pattern: ev.WisdomStored(
            **c, wisdom_id=w, owner_id="o", category="CodingStyle", pattern=pattern, confidence=0.5, embedding=vector(2)
        ),
        common(), st.sampled_from(WISDOM), st.sampled_from(["p", "q"]),
    ),
    st.builds(lambda c, w: ev.WisdomDeleted(**c, wisdom_id=w, owner_id="o"), common(), st.sampled_from(WISDOM)),
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


def model(events: list[ev.Event]) -> dict[type[fold.Row], dict[tuple[Any, ...], fold.Row]]:
    unique = {e.event_id: e for e in events}.values()
    rows: dict[type[fold.Row], dict[tuple[Any, ...], fold.Row]] = {t: {} for t in fold.ROW_TYPES}

    def by_entity(kinds: tuple[type, ...], key: str) -> dict[UUID, list[ev.Event]]:
        grouped: dict[UUID, list[ev.Event]] = {}
        for e in unique:
            if isinstance(e, kinds):
                grouped.setdefault(getattr(e, key), []).append(e)
        return grouped

    def first_create(group: list[ev.Event], kind: type) -> ev.Event | None:
        creates = [e for e in group if isinstance(e, kind)]
        return min(creates, key=lambda e: e.event_id) if creates else None

    def latest(group: list[ev.Event], value_of: Any) -> tuple[Any, bytes]:
        best: tuple[Any, bytes] = (None, fold.NO_STAMP)
        for e in group:
            value = value_of(e)
            if value is not None and fold.stamp_of(e) > best[1]:
                best = (value, fold.stamp_of(e))
        return best

    plain_creates = [
        (ev.CollectiveCreated, ev.CollectiveDeleted, "collective_id", fold.CollectiveRow),
        (ev.RelationStored, ev.RelationDeleted, "relation_id", fold.RelationRow),
        (ev.InsightStored, ev.InsightDeleted, "insight_id", fold.InsightRow),
        (ev.WisdomStored, ev.WisdomDeleted, "wisdom_id", fold.WisdomRow),
    ]
    for create, delete, key, row_type in plain_creates:
        for entity, group in by_entity((create, delete), key).items():
            winner = first_create(group, create)
            row = fold.row_of(winner) if winner else row_type(entity)  # type: ignore[arg-type, call-arg]
            assert row is not None
            if any(isinstance(e, delete) for e in group):  # a tombstone: key and flag only
                row = row_type(entity, deleted=True)  # type: ignore[call-arg]
            for name in row_type.ANCHOR:  # the smallest any create or delete names
                setattr(row, name, min(getattr(e, name) for e in group))
            rows[row_type][(entity,)] = row

    experience_kinds = (
        ev.ExperienceRecorded, ev.ExperienceUpdated, ev.ExperienceArchived,
        ev.ExperienceUnarchived, ev.ExperienceDeleted,
    )  # fmt: skip
    for entity, group in by_entity(experience_kinds, "experience_id").items():
        winner = first_create(group, ev.ExperienceRecorded)
        row = fold.row_of(winner) if winner else fold.ExperienceRow(entity)  # type: ignore[arg-type]
        assert isinstance(row, fold.ExperienceRow)
        for name in ("importance", "confidence", "domain", "related_files"):
            setters = [
                e for e in group if isinstance(e, (ev.ExperienceRecorded, ev.ExperienceUpdated))
            ]
            value, stamp = latest(setters, lambda e, n=name: getattr(e, n))
            setattr(row, name, value)
            setattr(row, f"{name}_stamp", stamp)
        toggles = [
            e for e in group if isinstance(e, (ev.ExperienceArchived, ev.ExperienceUnarchived))
        ]
        archived, stamp = latest(toggles, lambda e: isinstance(e, ev.ExperienceArchived))
        row.archived, row.archived_stamp = bool(archived), stamp
        if any(isinstance(e, ev.ExperienceDeleted) for e in group):
            row = fold.ExperienceRow(entity, deleted=True)
        row.collective_id = min(e.collective_id for e in group)  # every one names it
        rows[fold.ExperienceRow][(entity,)] = row

    for e in unique:
        if isinstance(e, ev.ExperienceReinforced):
            key = (e.experience_id, e.instance_id)
            current = rows[fold.ApplicationRow].get(key)
            count = max(e.applications, current.applications if current else 0)  # type: ignore[attr-defined]
            last = max(e.hlc, current.last_hlc if current else 0)  # type: ignore[attr-defined]
            collective = e.collective_id
            if current is not None and current.collective_id is not None:  # type: ignore[attr-defined]
                collective = min(collective, current.collective_id)  # type: ignore[attr-defined]
            rows[fold.ApplicationRow][key] = fold.ApplicationRow(
                e.experience_id, e.instance_id, count, last, collective
            )
    return rows


def stored_model(events: list[ev.Event]) -> dict[type[fold.Row], dict[tuple[Any, ...], fold.Row]]:
    """``model`` after what the store forgets: the application counts of a deleted
    experience."""
    rows = model(events)
    deleted = {k[0] for k, r in rows[fold.ExperienceRow].items() if r.deleted}  # type: ignore[attr-defined]
    rows[fold.ApplicationRow] = {
        k: r for k, r in rows[fold.ApplicationRow].items() if k[0] not in deleted
    }
    return rows

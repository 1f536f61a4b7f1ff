"""Queries over a projection: what they return, what they hide, and what dead letters say."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections import queries as q
from projections.projection import Projection, ProjectionSettings
from tests import factories as f
from tests.harness import by_profile


def stamp(hlc_ms: int) -> dict[str, object]:
    return {"event_id": uuid7(), "instance_id": f.INSTANCE, "hlc": ev.pack_hlc(hlc_ms)}


def record(
    cid: UUID,
    content: str,
    vector: list[float],
    *,
    at: int,
    domain: tuple[str, ...] = (),
    kind: ev.ExperienceType | None = None,
    importance: float = 0.5,
) -> ev.ExperienceRecorded:
    return ev.ExperienceRecorded(
        **stamp(at),  # type: ignore[arg-type]
        experience_id=uuid7(), collective_id=cid, content=content, embedding=ev.pack_vector(vector),
        experience_type=kind or ev.Generic(), importance=importance, confidence=0.5, source_agent="agent-1",
        domain=domain,
    )  # fmt: skip


class World:
    """A small collective with every kind of row, applied to a projection in two batches."""

    def __init__(self, directory: Path, settings: ProjectionSettings | None = None) -> None:
        self.cid = uuid7()
        self.other = uuid7()
        c, o = self.cid, self.other
        self.created = ev.CollectiveCreated(
            **stamp(1000),
            collective_id=c,
            owner_id="o",
            name="main",
            embedding_dimension=4,  # type: ignore[arg-type]
        )
        self.nats = record(
            c,
            "JetStream dedups retried publishes by message id",
            [1, 0, 0, 0],
            at=1001,
            domain=("nats",),
            kind=ev.Fact(statement="dedup", source="docs"),
            importance=0.9,
        )
        self.duck = record(
            c,
            "DuckDB commits the checkpoint with the rows",
            [0, 1, 0, 0],
            at=1002,
            domain=("duckdb",),
            importance=0.4,
        )
        self.faiss = record(
            c, "FAISS HNSW trades recall for speed", [0, 0, 1, 0], at=1003, domain=("faiss", "nats")
        )
        self.old = record(
            c, "Archived lesson about retries", [0.9, 0.1, 0, 0], at=1004, domain=("nats",)
        )
        self.gone = record(c, "Deleted secret lesson", [0.95, 0, 0.05, 0], at=1005)
        self.wrong_dim = record(c, "wrong dimension", [1, 0, 0], at=1006)
        self.elsewhere = record(o, "in another collective", [1, 0], at=1007)
        self.supports = ev.RelationStored(
            **stamp(1010),
            relation_id=uuid7(),
            collective_id=c,
            source_id=self.nats.experience_id,  # type: ignore[arg-type]
            target_id=self.duck.experience_id,
            relation_type="Supports",
            strength=0.8,
        )
        self.twin = ev.RelationStored(
            **stamp(1011),
            relation_id=uuid7(),
            collective_id=c,
            source_id=self.nats.experience_id,  # type: ignore[arg-type]
            target_id=self.duck.experience_id,
            relation_type="Supports",
            strength=0.1,
        )
        self.across = ev.RelationStored(
            **stamp(1012),
            relation_id=uuid7(),
            collective_id=c,
            source_id=self.nats.experience_id,  # type: ignore[arg-type]
            target_id=self.elsewhere.experience_id,
            relation_type="RelatedTo",
            strength=0.5,
        )
        self.insight = ev.InsightStored(
            **stamp(1013),
            insight_id=uuid7(),
            collective_id=c,
            content="Idempotency first",  # type: ignore[arg-type]
            embedding=ev.pack_vector([1, 1, 0, 0]),
            source_experiences=(self.nats.experience_id,),
            confidence=0.7,
        )
        self.orphan = ev.InsightStored(
            **stamp(1014),
            insight_id=uuid7(),
            collective_id=c,
            content="From nothing",  # type: ignore[arg-type]
            embedding=ev.pack_vector([0, 0, 0, 1]),
            source_experiences=(uuid7(),),
            confidence=0.7,
        )
        first = [
            self.created, self.nats, self.duck, self.faiss, self.old, self.gone, self.wrong_dim,
            ev.CollectiveCreated(**stamp(1000), collective_id=o, owner_id="o", name="other", embedding_dimension=2),  # type: ignore[arg-type]
            self.elsewhere,
        ]  # fmt: skip
        second = [
            self.supports, self.twin, self.across, self.insight, self.orphan,
            ev.ExperienceArchived(**stamp(1020), experience_id=self.old.experience_id, collective_id=c),  # type: ignore[arg-type]
            ev.ExperienceDeleted(**stamp(1021), experience_id=self.gone.experience_id, collective_id=c),  # type: ignore[arg-type]
            ev.ExperienceReinforced(**stamp(1022), experience_id=self.nats.experience_id, collective_id=c, applications=2),  # type: ignore[arg-type]
            ev.ExperienceReinforced(**{**stamp(1023), "instance_id": uuid7()}, experience_id=self.nats.experience_id, collective_id=c, applications=3),  # type: ignore[arg-type]
        ]  # fmt: skip
        self.projection = Projection(directory, settings)
        self.projection.apply([LogEntry(i, "s", e) for i, e in enumerate(first, 1)])
        n = len(first)
        self.projection.apply([LogEntry(n + i, "s", e) for i, e in enumerate(second, 1)])
        from eventlog.errors import DecodeError

        bad = DecodeError("garbage", subject="pulse.c.x.experience.y", seq=n + len(second) + 1)
        self.projection.apply([LogEntry(bad.seq, bad.subject, None, bad)])  # type: ignore[arg-type]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path / "state")


def ids(results: list[q.ScoredExperience] | list[q.Experience]) -> list[UUID]:
    return [
        r.experience.experience_id if isinstance(r, q.ScoredExperience) else r.experience_id
        for r in results
    ]


def test_get_experience_returns_typed_fields(world: World) -> None:
    got = q.get_experience(world.projection, world.nats.experience_id)
    assert got is not None
    assert got.content == world.nats.content and got.experience_type == world.nats.experience_type
    assert got.vector.tolist() == [1, 0, 0, 0] and got.domain == ("nats",)
    assert got.applications == 5 and got.last_reinforced_ms == 1023
    assert got.timestamp_ms == 1001 and not got.archived
    assert q.get_experience(world.projection, world.gone.experience_id) is None
    assert q.get_experience(world.projection, world.wrong_dim.experience_id) is None
    archived = q.get_experience(world.projection, world.old.experience_id)
    assert archived is not None and archived.archived


def test_recent_is_newest_first_without_archived(world: World) -> None:
    p, c = world.projection, world.cid
    assert ids(q.recent_experiences(p, c)) == [
        world.faiss.experience_id,
        world.duck.experience_id,
        world.nats.experience_id,
    ]
    with_archived = q.recent_experiences(p, c, flt=q.ExperienceFilter(include_archived=True))
    assert ids(with_archived)[0] == world.old.experience_id
    assert ids(q.recent_experiences(p, c, limit=1, offset=1)) == [world.duck.experience_id]


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (q.ExperienceFilter(domains=("nats",)), ["faiss", "nats"]),
        (q.ExperienceFilter(experience_types=("Fact",)), ["nats"]),
        (q.ExperienceFilter(min_importance=0.5), ["faiss", "nats"]),
        (q.ExperienceFilter(since_ms=1002), ["faiss", "duck"]),
        (q.ExperienceFilter(domains=("nats",), include_archived=True), ["old", "faiss", "nats"]),
    ],
)
def test_filters(world: World, flt: q.ExperienceFilter, expected: list[str]) -> None:
    names = {getattr(world, n).experience_id: n for n in ("nats", "duck", "faiss", "old")}
    got = q.recent_experiences(world.projection, world.cid, flt=flt)
    assert [names[i] for i in ids(got)] == expected


def test_similar_search_hides_archived_and_deleted(world: World) -> None:
    p, c = world.projection, world.cid
    hits = q.similar_experiences(p, c, [1, 0, 0, 0], k=10)
    assert ids(hits)[0] == world.nats.experience_id
    assert set(ids(hits)) == {
        world.nats.experience_id,
        world.faiss.experience_id,
        world.duck.experience_id,
    }
    assert hits[0].score == pytest.approx(1.0)
    with_archived = q.similar_experiences(
        p, c, [1, 0, 0, 0], k=2, flt=q.ExperienceFilter(include_archived=True)
    )
    assert ids(with_archived) == [world.nats.experience_id, world.old.experience_id]
    filtered = q.similar_experiences(
        p, c, [1, 0, 0, 0], k=5, flt=q.ExperienceFilter(domains=("duckdb",))
    )
    assert ids(filtered) == [world.duck.experience_id]
    with pytest.raises(ValueError, match="3 dimensions, the collective has 4"):
        q.similar_experiences(p, c, [1, 0, 0], k=1)


def test_text_search(world: World) -> None:
    p, c = world.projection, world.cid
    assert ids(q.search_text(p, c, "retrying publish")) == [world.nats.experience_id]
    assert ids(
        q.search_text(p, c, "archived lesson", flt=q.ExperienceFilter(include_archived=True))
    ) == [world.old.experience_id]
    assert q.search_text(p, c, "archived lesson") == []  # archived: hidden by default
    assert q.search_text(p, c, "secret") == []  # deleted
    assert q.search_text(p, c, 'checkpoint" AND (') != []  # broken syntax is forgiven


def test_related_experiences(world: World) -> None:
    p = world.projection
    out = q.related_experiences(p, world.nats.experience_id, "outgoing")
    assert [(r.relation.relation_id, r.experience.experience_id) for r in out] == [
        (world.supports.relation_id, world.duck.experience_id)
    ]
    assert q.related_experiences(p, world.nats.experience_id, "incoming") == []
    inc = q.related_experiences(p, world.duck.experience_id, "incoming", ["Supports"])
    assert [r.experience.experience_id for r in inc] == [world.nats.experience_id]
    assert q.related_experiences(p, world.duck.experience_id, "both", ["Contradicts"]) == []


def test_insights_by_similarity(world: World) -> None:
    hits = q.similar_insights(world.projection, world.cid, [1, 1, 0, 0], k=5)
    assert [h.insight.insight_id for h in hits] == [world.insight.insight_id]
    assert hits[0].insight.source_experiences == (world.nats.experience_id,)


def test_stats(world: World) -> None:
    stats = q.collective_stats(world.projection, world.cid)
    assert stats == q.CollectiveStats(
        collective_id=world.cid, experiences=4, archived=1, relations=1, insights=1,
        applications=5, dead_letters=4,
    )  # fmt: skip
    assert q.collective_stats(world.projection, uuid7()) is None


def test_dead_letters_say_why(world: World) -> None:
    letters = {(d.entity, d.id): d.reason for d in q.dead_letters(world.projection)}
    assert letters[("experience", world.wrong_dim.experience_id)] == (
        "embedding has 3 dimensions, the collective has 4"
    )
    assert letters[("relation", world.across.relation_id)] == "relation across collectives"
    assert letters[("relation", world.twin.relation_id)] == (
        f"(source, target, type) is already taken by relation {world.supports.relation_id}"
    )
    assert letters[("insight", world.orphan.insight_id)] == "a source experience does not exist"
    (message,) = [d for d in q.dead_letters(world.projection) if d.entity == "message"]
    assert message.reason == "garbage" and message.subject == "pulse.c.x.experience.y"


def test_deleted_content_is_gone_from_the_rows(world: World) -> None:
    assert world.projection.memory.experiences[(world.gone.experience_id,)].content is None
    world.projection.flush()
    content, embedding, deleted = world.projection.store.con.execute(
        "SELECT content, embedding, deleted FROM experience_rows WHERE experience_id = ?",
        [world.gone.experience_id],
    ).fetchone()  # type: ignore[misc]
    assert (content, embedding, deleted) == (None, None, True)


def test_indexes_survive_reopening_and_catch_up_from_duckdb(tmp_path: Path) -> None:
    world = World(tmp_path / "state")
    expected = ids(q.similar_experiences(world.projection, world.cid, [1, 0, 0, 0], k=3))
    world.projection.close()

    reopened = Projection(tmp_path / "state")  # loads the saved indexes
    assert ids(q.similar_experiences(reopened, world.cid, [1, 0, 0, 0], k=3)) == expected
    late = record(world.cid, "Applied but never saved to the index files", [0, 0, 0, 1], at=2000)
    reopened.apply([LogEntry(100, "s", late)])
    reopened.flush()
    reopened.text.close()  # a crash: DuckDB and tantivy committed, the FAISS files not saved
    reopened.store.close()

    caught_up = Projection(tmp_path / "state")
    assert ids(q.similar_experiences(caught_up, world.cid, [0, 0, 0, 1], k=1)) == [
        late.experience_id
    ]
    assert ids(q.search_text(caught_up, world.cid, "never saved")) == [late.experience_id]
    (tmp_path / "state" / "vectors" / "manifest.json").unlink()  # indexes lost entirely
    caught_up.text.close()
    caught_up.store.close()
    rebuilt = Projection(tmp_path / "state")
    assert ids(q.similar_experiences(rebuilt, world.cid, [1, 0, 0, 0], k=3)) == expected
    rebuilt.close()


def test_large_collectives_switch_to_hnsw_and_still_hide_deleted(tmp_path: Path) -> None:
    settings = ProjectionSettings(hnsw_threshold=50)
    projection = Projection(tmp_path / "state", settings)
    cid = uuid7()
    rng = np.random.default_rng(7)
    created = ev.CollectiveCreated(
        **stamp(1), collective_id=cid, owner_id="o", name="big", embedding_dimension=8
    )  # type: ignore[arg-type]
    records = [
        record(cid, f"lesson {i}", rng.normal(size=8).tolist(), at=10 + i) for i in range(200)
    ]
    projection.apply([LogEntry(i, "s", e) for i, e in enumerate([created, *records], 1)])
    projection.sync_indexes()  # the engine does this after every batch
    index = projection.vectors[("experience", cid)]
    assert index.is_hnsw
    target = records[17]
    assert ids(q.similar_experiences(projection, cid, target.vector, k=1)) == [target.experience_id]
    deleted = ev.ExperienceDeleted(
        **stamp(999), experience_id=target.experience_id, collective_id=cid
    )  # type: ignore[arg-type]
    projection.apply([LogEntry(500, "s", deleted)])
    assert target.experience_id not in ids(
        q.similar_experiences(projection, cid, target.vector, k=5)
    )
    projection.close()
    reopened = Projection(tmp_path / "state", settings)
    assert reopened.vectors[("experience", cid)].is_hnsw
    assert target.experience_id not in ids(q.similar_experiences(reopened, cid, target.vector, k=5))
    reopened.close()


def test_an_experience_before_its_collective_becomes_live_when_it_arrives(tmp_path: Path) -> None:
    projection = Projection(tmp_path / "state")
    cid = uuid7()
    early = record(cid, "arrived first", [0, 1, 0, 0], at=5)
    projection.apply([LogEntry(1, "s", early)])
    assert q.similar_experiences(projection, cid, [0, 1, 0, 0]) == []
    created = ev.CollectiveCreated(
        **stamp(1), collective_id=cid, owner_id="o", name="late", embedding_dimension=4
    )  # type: ignore[arg-type]
    projection.apply([LogEntry(2, "s", created)])
    assert ids(q.similar_experiences(projection, cid, [0, 1, 0, 0])) == [early.experience_id]
    assert ids(q.search_text(projection, cid, "arrived")) == [early.experience_id]
    projection.close()


def test_unknown_header_schema_is_a_dead_letter_not_a_crash(tmp_path: Path) -> None:
    projection = Projection(tmp_path / "state")
    from eventlog.errors import DecodeError

    error = DecodeError("written with schema 9", subject="pulse.c.a.b.c", seq=1)
    projection.apply([LogEntry(1, "pulse.c.a.b.c", None, error)])
    assert [d.reason for d in q.dead_letters(projection)] == ["written with schema 9"]
    assert projection.checkpoint() == (1, 1)
    projection.close()


def test_an_experience_before_its_collective_is_found_after_reopening(tmp_path: Path) -> None:
    """Its vector id is given when the collective arrives, after the row was written to
    DuckDB: it must be written again, or a reopened host loses it from vector search."""
    from tests import factories as f

    cid = uuid7()
    early = f.experience(cid)
    projection = Projection(tmp_path / "state")
    projection.apply([LogEntry(1, "s", early)])
    projection.flush()
    projection.apply([LogEntry(2, "s", f.collective(cid))])
    projection.close()
    reopened = Projection(tmp_path / "state")
    hits = q.similar_experiences(reopened, cid, early.vector, k=1)
    assert ids(hits) == [early.experience_id]
    reopened.close()


@pytest.mark.parametrize("changes_max", [10_000, 1])  # columns patched, or built again
@pytest.mark.parametrize("threshold", [10_000, 50])  # a flat index, and an HNSW graph
def test_filtered_search_follows_every_change(
    tmp_path: Path, threshold: int, changes_max: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Filters read columns cached per collective; any change to a row (an update, an
    archive, a delete, a new record) is seen by the next filtered search."""
    monkeypatch.setattr("projections.state.CHANGES_MAX", changes_max)
    p = Projection(tmp_path / "state", ProjectionSettings(hnsw_threshold=threshold))
    cid = uuid7()
    rng = np.random.default_rng(3)
    created = ev.CollectiveCreated(
        **stamp(1), collective_id=cid, owner_id="o", name="c", embedding_dimension=8
    )  # type: ignore[arg-type]
    records = [record(cid, f"r{i}", rng.normal(size=8).tolist(), at=10 + i) for i in range(300)]
    p.apply([LogEntry(i, "s", e) for i, e in enumerate([created, *records], 1)])
    seq = len(records) + 1
    target = records[7]
    important = q.ExperienceFilter(min_importance=0.8)

    def found(flt: q.ExperienceFilter) -> list[UUID]:
        return ids(q.similar_experiences(p, cid, target.vector, k=5, flt=flt))

    def then(event: ev.Event) -> None:
        nonlocal seq
        seq += 1
        p.apply([LogEntry(seq, "s", event)])

    assert found(important) == []  # every record has importance 0.5
    then(ev.ExperienceUpdated(**stamp(900), experience_id=target.experience_id,  # type: ignore[arg-type]
                              collective_id=cid, importance=0.9))  # fmt: skip
    assert found(important) == [target.experience_id]
    broad = q.ExperienceFilter(min_confidence=0.1)  # every row: the bitmap path under HNSW
    assert found(broad)[0] == target.experience_id
    then(ev.ExperienceArchived(**stamp(901), experience_id=target.experience_id,  # type: ignore[arg-type]
                               collective_id=cid))  # fmt: skip
    assert found(important) == []
    assert found(q.ExperienceFilter(min_importance=0.8, include_archived=True)) == [
        target.experience_id
    ]
    assert target.experience_id not in found(broad)
    assert found(q.ExperienceFilter(min_confidence=0.1, include_archived=True))[0] == (
        target.experience_id
    )
    late = record(cid, "late", target.vector.tolist(), at=902)
    then(late)
    then(ev.ExperienceUpdated(**stamp(903), experience_id=late.experience_id,  # type: ignore[arg-type]
                              collective_id=cid, importance=1.0, domain=("ops",)))  # fmt: skip
    assert found(important) == [late.experience_id]
    assert found(q.ExperienceFilter(domains=("ops",))) == [late.experience_id]
    then(ev.ExperienceDeleted(**stamp(904), experience_id=late.experience_id, collective_id=cid))  # type: ignore[arg-type]
    assert found(important) == []
    assert found(q.ExperienceFilter(domains=("ops",))) == []
    p.close()


def test_reopening_a_saved_state_with_dead_letters_writes_nothing(world: World) -> None:
    """A dead letter (here an embedding of the wrong dimension) is in no index and keeps
    its bytes; opening a state that holds one must not take it for a row the indexes
    missed, re-index and save everything again."""
    world.projection.close()
    manifest = world.projection.dir / "vectors" / "manifest.json"
    written = manifest.stat().st_mtime_ns
    reopened = Projection(world.projection.dir)
    assert manifest.stat().st_mtime_ns == written, "opening saved the indexes again"
    row = reopened.memory.experiences[(world.wrong_dim.experience_id,)]
    assert isinstance(row.embedding, bytes) and len(row.embedding) == 12  # still a dead letter
    assert q.get_experience(reopened, world.wrong_dim.experience_id) is None
    reopened.close()


@settings(max_examples=by_profile(ci=15, dev=80), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1),  # importance
            st.integers(0, 12),  # applications
            st.integers(0, 4),  # invalidations (3 within a month: unstable)
            st.integers(0, 90),  # days since it was recorded
            st.integers(0, 90),  # days after that it was last reinforced (within those)
        ),
        min_size=1,
        max_size=25,
    ),
    st.floats(0, 1),
    st.integers(1, 30),
)
def test_a_weighed_hybrid_search_keeps_what_weighing_every_answer_keeps(
    tmp_path_factory: pytest.TempPathFactory,
    made: list[tuple[float, int, int, int, int]],
    weight: float,
    k: int,
) -> None:
    """``hybrid_experiences`` with a ``Weighing`` (answers made for the k kept only) keeps
    the hits, the order and the scores of every candidate made an answer and then
    weighed by energy: relevance x (1 - w + w x energy), x shaky when unstable."""
    now = 10**12 + 100 * 86_400_000
    cid = uuid7()
    events: list[ev.Event] = [
        ev.CollectiveCreated(**stamp(now - 200 * 86_400_000), collective_id=cid, owner_id="o",
                             name="main", embedding_dimension=4)  # type: ignore[arg-type]
    ]  # fmt: skip
    rng = np.random.default_rng(len(made))
    for i, (importance, applications, invalidations, days, later) in enumerate(made):
        at = now - days * 86_400_000 - i
        recorded = record(cid, f"lesson {i} about retries", list(rng.random(4)), at=at,
                          importance=importance)  # fmt: skip
        events.append(recorded)
        ids = {"experience_id": recorded.experience_id, "collective_id": cid}
        if applications:  # (last reinforced ``later`` days after it was recorded)
            when = at + min(later, days) * 86_400_000 + 1
            reinforced = ev.ExperienceReinforced(**stamp(when), **ids, applications=applications)  # type: ignore[arg-type]
            events.append(reinforced)
        for j in range(invalidations):
            events.append(
                ev.ExperienceInvalidated(
                    **stamp(at + 2 + j), **ids, reason="r", valid_to_ms=at + 2 + j
                )
            )  # type: ignore[arg-type]
    p = Projection(tmp_path_factory.mktemp("weighed") / "state")
    try:
        p.apply([LogEntry(i, "s", e) for i, e in enumerate(events, 1)])
        flt = q.ExperienceFilter(include_invalid=True)
        query = [0.5, 0.5, 0.5, 0.5]
        weighing = q.Weighing(k=k, weight=weight, shaky=0.5, now_ms=now,
                              half_life_days=30.0, boost_every=5.0)  # fmt: skip
        every = q.hybrid_experiences(p, cid, "retries", query, 50, flt)
        kept = q.hybrid_experiences(p, cid, "retries", query, 50, flt, weighing=weighing)

        def energy(e: q.Experience) -> float:  # (the rule, as the docs state it)
            last = e.last_reinforced_ms or e.timestamp_ms
            raised = 1 - (1 - e.importance) * 0.5 ** (e.applications / 5.0)
            return raised * 0.5 ** (max(0, now - last) / 86_400_000 / 30.0)

        expected = sorted(
            (
                (h.score * (1 - weight + weight * energy(h.experience))
                 * (0.5 if h.experience.unstable else 1.0), n, h)
                for n, h in enumerate(every)
            ),
            key=lambda t: (-t[0], t[1]),
        )[:k]  # fmt: skip
        assert [h.experience for h in kept] == [h.experience for _, _, h in expected]
        assert [h.score for h in kept] == pytest.approx([s for s, _, _ in expected])
        assert [h.relevance for h in kept] == [h.score for _, _, h in expected]
    finally:
        p.close()


@settings(max_examples=by_profile(40, 120), deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["record", "archive", "unarchive", "invalidate", "invalidate", "revalidate",
                             "reinforce", "delete"]),
            st.integers(0, 2),  # which (few: some are changed often enough to be unstable)
            st.sampled_from(["team", "private", "org"]),
        ),
        min_size=1, max_size=30,
    ),
    batch=st.integers(1, 6),
)  # fmt: skip
def test_the_stats_count_what_a_pass_over_the_rows_counts(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int, str]], batch: int
) -> None:
    """``collective_stats`` counts on the collective's filter columns, kept up to date
    change by change; after any history, in batches of any size, it says what a plain
    pass over the live rows says, for an admin and for a member and a stranger."""
    from eventlog.access import Viewer

    p = Projection(tmp_path_factory.mktemp("stats") / "state")
    cid = uuid7()
    events: list[ev.Event] = [ev.CollectiveCreated(
        **stamp(1), collective_id=cid, owner_id="o", name="c", embedding_dimension=4,  # type: ignore[arg-type]
    )]  # fmt: skip
    made: list[UUID] = []
    for at, (step, which, visibility) in enumerate(steps, start=10):
        if step == "record" or not made:
            e = record(cid, f"r{at}", [1.0, float(at), 0.0, 0.5], at=at)
            events.append(msgspec.structs.replace(e, visibility=visibility))
            made.append(e.experience_id)
        else:
            events.append(change(step, made[which % len(made)], cid, at))
    viewers = [None, Viewer(True, "o", "agent-9"), Viewer(False, "x", None)]
    for start in range(0, len(events), batch):
        chunk = events[start : start + batch]
        p.apply([LogEntry(start + i + 1, "s", e) for i, e in enumerate(chunk)])
        for viewer in viewers:
            found = q.collective_stats(p, cid, viewer)
            assert found is not None
            rows = [r for r in p.memory.live_experiences_of(cid)
                    if viewer is None or viewer.sees(r.visibility, r.author_owner, r.author_agent)]  # fmt: skip
            now = q.ExperienceFilter().validity()
            assert (found.experiences, found.archived) == (len(rows), sum(r.archived for r in rows))
            assert found.applications == sum(
                p.memory.applications_of(r.experience_id)[0] for r in rows
            )
            assert found.invalid == sum(not q._valid(r, now) for r in rows)
            assert found.invalidations == sum(len(r.invalidations or ()) for r in rows)
            assert found.unstable == sum(q.unstable(r.invalidations) for r in rows)
            if viewer is None:
                assert found.dead_letters == len(
                    [d for d in q.dead_letters(p) if d.collective_id == cid]
                )
    p.close()


def change(step: str, eid: UUID, cid: UUID, at: int) -> ev.Event:
    """One change of an experience, at ``at`` ms."""
    common: dict[str, Any] = {**stamp(at), "experience_id": eid, "collective_id": cid}
    if step == "archive":
        return ev.ExperienceArchived(**common)
    if step == "unarchive":
        return ev.ExperienceUnarchived(**common)
    if step in ("invalidate", "revalidate"):
        end = at if step == "invalidate" else None
        return ev.ExperienceInvalidated(**common, reason=step, valid_to_ms=end)
    if step == "reinforce":
        return ev.ExperienceReinforced(**common, applications=at)
    return ev.ExperienceDeleted(**common)


def test_filter_columns_made_anew_hold_every_row(tmp_path: Path) -> None:
    """Columns made after the memory began listing changes (a cache dropped, as
    ``ops.bench.as_of`` drops them) are built from every row, not from the changes."""
    p = Projection(tmp_path / "state")
    cid = uuid7()
    created = ev.CollectiveCreated(
        **stamp(1), collective_id=cid, owner_id="o", name="c", embedding_dimension=4
    )  # type: ignore[arg-type]
    records = [record(cid, f"r{i}", [1.0, float(i), 0.0, 0.5], at=10 + i) for i in range(50)]
    p.apply([LogEntry(i, "s", e) for i, e in enumerate([created, *records], 1)])
    assert q.collective_stats(p, cid).experiences == 50  # type: ignore[union-attr]
    p.caches.pop(("filter columns", cid))
    p.apply([LogEntry(52, "s", change("archive", records[0].experience_id, cid, 100))])
    stats = q.collective_stats(p, cid)
    assert stats is not None and (stats.experiences, stats.archived) == (50, 1)
    p.close()


def test_a_dead_letter_is_listed_once_when_a_stray_event_named_another_collective(
    tmp_path: Path,
) -> None:
    """An experience of a deleted collective, archived first by an event that named
    another collective and flushed before the record came: the memory lists it under
    both until it is read back from DuckDB; its dead letter is one, before and after
    (hypothesis found two in ``test_engine``)."""
    lost, other = uuid7(), uuid7()
    recorded = f.experience(lost, "an orphan")
    stray = ev.ExperienceArchived(**f.common(), experience_id=recorded.experience_id,  # type: ignore[arg-type]
                                  collective_id=other)  # fmt: skip
    p = Projection(tmp_path)
    gone = ev.CollectiveDeleted(**f.common(), collective_id=lost)  # type: ignore[arg-type]
    p.apply([LogEntry(1, "pulse.test", f.collective(lost)), LogEntry(2, "pulse.test", gone),
             LogEntry(3, "pulse.test", stray)])  # fmt: skip
    p.flush()  # (the stray part in DuckDB before the record comes)
    p.apply([LogEntry(4, "pulse.test", recorded)])
    found = [(d.entity, d.id) for d in q.dead_letters(p) if d.entity != "message"]
    p.close()
    reopened = Projection(tmp_path)
    again = [(d.entity, d.id) for d in q.dead_letters(reopened) if d.entity != "message"]
    reopened.close()
    assert found == again == [("experience", recorded.experience_id)]


def test_counts_made_before_the_record_outlast_a_stray_delete_and_a_reopen(
    tmp_path: Path,
) -> None:
    """A delete naming another collective, then reinforcements, then the record: the
    tombstone alone was the row's until the record came, and the counts went with it
    for good (``test_store_flusher``'s hypothesis test found it). The counts wait for the
    record, across a reopen, and no view shows them while the row is a tombstone."""
    home, other = uuid7(), uuid7()
    recorded = f.experience(home, "a lesson")
    eid = recorded.experience_id
    stray = ev.ExperienceDeleted(**f.common(), experience_id=eid, collective_id=other)  # type: ignore[arg-type]

    def reinforced(instance: UUID, n: int) -> ev.ExperienceReinforced:
        return ev.ExperienceReinforced(**{**f.common(), "instance_id": instance},  # type: ignore[arg-type]
                                       experience_id=eid, collective_id=home, applications=n)  # fmt: skip

    one, two = uuid7(), uuid7()
    p = Projection(tmp_path)
    p.apply([LogEntry(1, "pulse.test", f.collective(home)), LogEntry(2, "pulse.test", stray),
             LogEntry(3, "pulse.test", reinforced(one, 2))])  # fmt: skip
    p.flush()
    shown = _sql(p, "SELECT count(*) FROM applications WHERE experience_id = ?", [eid])
    assert shown == [(0,)]  # (a tombstone's counts are nobody's yet)
    p.close()
    p = Projection(tmp_path)  # (the tombstone and the counts read back from DuckDB)
    p.apply([LogEntry(4, "pulse.test", reinforced(two, 3)), LogEntry(5, "pulse.test", recorded)])
    assert p.memory.applications_of(eid)[0] == 5
    p.flush()
    p.close()
    p = Projection(tmp_path)
    assert p.memory.applications_of(eid)[0] == 5
    assert _sql(
        p, "SELECT sum(applications)::INTEGER FROM applications WHERE experience_id = ?", [eid]
    ) == [(5,)]
    p.apply([LogEntry(6, "pulse.test", ev.ExperienceDeleted(**f.common(), experience_id=eid,  # type: ignore[arg-type]
                                                            collective_id=home))])  # fmt: skip
    assert p.memory.applications_of(eid)[0] == 0  # (deleted once created: gone for good)
    p.flush()
    assert _sql(p, "SELECT count(*) FROM application_rows WHERE experience_id = ?", [eid]) == [(0,)]
    p.close()


def _sql(p: Projection, query: str, params: list[Any]) -> list[tuple[Any, ...]]:
    p.flush()
    return p.store.con.execute(query, params).fetchall()


def test_a_stray_delete_takes_its_collective_s_counts_after_a_restart_too(
    tmp_path: Path,
) -> None:
    """An experience recorded in its collective, a delete of it naming another, then a
    report naming that other: the report's count goes, whether or not the host restarted
    between the delete and the report (the stray's tombstone is kept in DuckDB), so two
    hosts agree on the digest."""
    home, other = uuid7(), uuid7()
    recorded = f.experience(home, "a lesson")
    eid = recorded.experience_id
    stray = ev.ExperienceDeleted(**f.common(), experience_id=eid, collective_id=other)  # type: ignore[arg-type]
    report = ev.ExperienceReinforced(**f.common(), experience_id=eid, collective_id=other,  # type: ignore[arg-type]
                                     applications=2)  # fmt: skip
    before = [LogEntry(1, "pulse.test", f.collective(home)), LogEntry(2, "pulse.test", recorded),
              LogEntry(3, "pulse.test", stray)]  # fmt: skip
    after = [LogEntry(4, "pulse.test", report)]
    digests = []
    for restarted in (False, True):
        p = Projection(tmp_path / str(restarted))
        p.apply(before)
        if restarted:
            p.flush()
            p.close()
            p = Projection(tmp_path / str(restarted))
        p.apply(after)
        assert _sql(p, "SELECT count(*) FROM application_rows", []) == [(0,)]
        assert p.memory.applications_of(eid)[0] == 0
        digests.append(p.digest())
        p.close()
    assert digests[0] == digests[1]

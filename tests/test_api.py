"""The public API beyond the basics: collectives, paging, relations, insights, activities,
wisdom, text / hybrid search with energy, cold experiences, context candidates, the
embedders, and the blocking facade, each on a real embedded NATS."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog import EmbeddedNats, NotFoundError
from eventlog import events as ev
from eventlog.ids import uuid7
from projections import queries
from sync import InstanceSettings, PulseDB, PulseDBSync
from sync.embedders import HashEmbedder
from tests.harness import eventually


@pytest.fixture
async def db(tmp_path: Path, nats_server: EmbeddedNats) -> AsyncIterator[PulseDB]:
    instance = await PulseDB.open(tmp_path / "db", nats_server.url)
    yield instance
    await instance.close()


async def test_collectives_by_owner_with_stats_and_delete(db: PulseDB) -> None:
    mine = await db.create_collective("ana", "mine", 3)
    theirs = await db.create_collective("bo", "theirs", embedder="hash")
    assert [c.name for c in await db.list_collectives()] == ["mine", "theirs"]
    assert [c.collective_id for c in await db.list_collectives("ana")] == [mine]
    found = await db.get_collective(theirs)
    assert found is not None
    assert (found.owner_id, found.embedder, found.embedding_dimension) == ("bo", "hash", 384)
    e = await db.record_experience(mine, "x", [1, 0, 0])
    await db.archive_experience(e)
    await db.reinforce_experience(e)
    stats = await db.get_collective_stats(mine)
    assert (stats.experiences, stats.archived, stats.applications) == (1, 1, 1)
    await db.delete_collective(mine)
    assert await db.get_collective(mine) is None
    with pytest.raises(NotFoundError):
        await db.get_collective_stats(mine)


async def test_paging_visits_every_experience_once_in_order(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", 2)
    ids = [await db.record_experience(cid, f"n{i}", [1, i]) for i in range(7)]
    pages = [await db.list_experiences(cid, limit=3, offset=o) for o in (0, 3, 6, 9)]
    assert [len(p) for p in pages] == [3, 3, 1, 0]
    assert [e.experience_id for p in pages for e in p] == ids
    recent = await db.get_recent_experiences(cid, limit=2)
    assert [e.experience_id for e in recent] == ids[:-3:-1]


async def test_relations_by_direction_type_and_strength(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", 2)
    a, b, c = [await db.record_experience(cid, n, [1, i]) for i, n in enumerate("abc")]
    ab = await db.store_relation(a, b, "Supports", strength=0.9)
    ca = await db.store_relation(c, a, "Contradicts", strength=0.2, metadata='{"why": "x"}')

    def ids(related: list[queries.RelatedExperience]) -> list[object]:
        return [(r.relation.relation_id, r.experience.experience_id) for r in related]

    assert ids(await db.get_related_experiences(a, "outgoing")) == [(ab, b)]
    assert ids(await db.get_related_experiences(a, "incoming")) == [(ca, c)]
    assert set(ids(await db.get_related_experiences(a))) == {(ab, b), (ca, c)}
    assert ids(await db.get_related_experiences(a, relation_types=["Contradicts"])) == [(ca, c)]
    assert ids(await db.get_related_experiences(a, min_strength=0.5)) == [(ab, b)]
    await db.delete_relation(ab)
    assert ids(await db.get_related_experiences(a)) == [(ca, c)]
    await db.store_relation(a, b, "Supports")  # a deleted triple can be stored again


async def test_insights_by_similarity_and_delete(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", 2)
    e = await db.record_experience(cid, "x", [1, 0])
    near = await db.store_insight(cid, "near", [1, 0.1], source_experiences=[e], confidence=0.8)
    far = await db.store_insight(cid, "far", [0, 1], source_experiences=[e])
    found = await db.get_insights(cid, [1, 0], k=2)
    assert [s.insight.insight_id for s in found] == [near, far]
    assert found[0].insight.source_experiences == (e,) and found[0].insight.confidence == 0.8
    await db.delete_insight(near)
    assert [s.insight.insight_id for s in await db.get_insights(cid, [1, 0])] == [far]


async def test_activities_register_heartbeat_end_and_go_stale(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", 2)
    first = await db.register_activity(cid, "builder", "compiling", ["Makefile"])
    await db.register_activity(cid, "tester", "testing")
    beat = await db.update_heartbeat(cid, "builder", working_on=["Makefile", "setup.py"])
    assert beat.started_ms == first.started_ms and beat.task_description == "compiling"
    assert beat.last_heartbeat_ms >= first.last_heartbeat_ms
    active = {a.agent_id: a for a in await db.get_active_agents(cid)}
    assert set(active) == {"builder", "tester"}
    assert active["builder"].working_on == ("Makefile", "setup.py")
    await db.end_activity(cid, "tester")
    assert [a.agent_id for a in await db.get_active_agents(cid)] == ["builder"]
    # no heartbeat for longer than the threshold: no longer active (default: 5 minutes)
    await eventually(lambda: _no_agents(db, cid, 0.05), timeout=5, what="the builder going stale")
    assert [a.agent_id for a in await db.get_active_agents(cid)] == ["builder"]


async def _no_agents(db: PulseDB, cid: object, stale_after: float) -> bool:
    return await db.get_active_agents(cid, stale_after=stale_after) == []  # type: ignore[arg-type]


async def test_wisdom_per_owner_by_similarity(db: PulseDB) -> None:
    cid = await db.create_collective("ana", "c", 2)
    w1 = await db.store_wisdom(
        "ana", "CodingStyle", "small functions", [1, 0], source_collectives=[cid],
        applicable_domains=["python"], source_experience_count=3,
    )  # fmt: skip
    w2 = await db.store_wisdom("ana", "QualityStandard", "tests first", [0, 1])
    await db.store_wisdom("bo", "CodingStyle", "other owner", [1, 0])
    assert [s.wisdom.wisdom_id for s in await db.get_wisdom("ana", [0.1, 1])] == [w2, w1]
    everything = await db.get_wisdom("ana")
    assert [s.wisdom.wisdom_id for s in everything] == [w1, w2]
    assert everything[0].wisdom.source_collectives == (cid,)
    await db.delete_wisdom(w1)
    assert [s.wisdom.wisdom_id for s in await db.get_wisdom("ana")] == [w2]


async def test_text_hybrid_and_their_weights(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", 2)
    by_words = await db.record_experience(cid, "tantivy ranks words with bm25", [0, 1])
    by_meaning = await db.record_experience(cid, "nothing in common here", [1, 0])
    text = await db.search_text(cid, "bm25 words", energy_weight=0)
    assert [h.experience.experience_id for h in text] == [by_words]
    both = await db.search_hybrid(cid, "bm25 words", [1, 0], energy_weight=0)
    assert {h.experience.experience_id for h in both} == {by_words, by_meaning}
    vector_only = await db.search_hybrid(cid, "bm25 words", [1, 0], text_weight=0, k=1)
    assert [h.experience.experience_id for h in vector_only] == [by_meaning]
    text_only = await db.search_hybrid(cid, "bm25 words", [1, 0], vector_weight=0, k=1)
    assert [h.experience.experience_id for h in text_only] == [by_words]
    archived_filter = {"include_archived": False, "domains": ["none"]}
    assert await db.search_hybrid(cid, "bm25", [1, 0], flt=archived_filter) == []


async def test_energy_raises_reinforced_experiences_and_lists_cold_ones(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", 2)
    plain = await db.record_experience(cid, "plain", [1, 0], importance=0.3)
    used = await db.record_experience(cid, "used", [1, 0], importance=0.3)
    for _ in range(5):
        await db.reinforce_experience(used)
    ranked = await db.search_similar(cid, [1, 0], energy_weight=1.0)
    assert [h.experience.experience_id for h in ranked] == [used, plain]
    assert ranked[0].energy == pytest.approx(0.65, abs=0.01)  # 1 - 0.7 / 2
    assert ranked[0].relevance == pytest.approx(1.0)
    unweighted = await db.search_similar(cid, [1, 0], energy_weight=0.0)
    assert [h.score for h in unweighted] == [pytest.approx(1.0)] * 2
    cold = await db.list_cold_experiences(cid, threshold=0.5)
    assert [h.experience.experience_id for h in cold] == [plain]


def test_energy_decays_by_half_life() -> None:
    day = queries.DAY_MS
    fresh = queries.energy(0.8, 0, 0, 0)
    assert fresh == pytest.approx(0.8)
    assert queries.energy(0.8, 0, 0, 30 * day) == pytest.approx(0.4)
    assert queries.energy(0.8, 0, 0, 30 * day, half_life_days=60) == pytest.approx(0.8 / 2**0.5)
    assert queries.energy(0.8, 5, 0, 0) == pytest.approx(0.9)  # five uses halve the gap


@given(
    st.floats(0, 1), st.integers(0, 50), st.integers(0, 10**12), st.integers(0, 10**12),
    st.floats(0.1, 100), st.floats(0.1, 20),
)  # fmt: skip
def test_one_experience_energy_equals_the_vector_formula(
    importance: float, uses: int, last: int, now: int, half_life: float, boost: float
) -> None:
    """The plain-float energy searches use agrees with the numpy formula the cold list uses."""
    e = queries.Experience(
        experience_id=uuid7(), collective_id=uuid7(), content="c", embedding=b"",
        experience_type=ev.Generic(), importance=importance, confidence=0.5, domain=(),
        related_files=(), source_agent="a", source_task=None, timestamp_ms=last,
        archived=False, applications=uses, last_reinforced_ms=None,
    )  # fmt: skip
    expected = queries.energy(importance, uses, last, now, half_life_days=half_life,
                              boost_every=boost)  # fmt: skip
    assert queries.energy_of(e, now, half_life_days=half_life, boost_every=boost) == (
        pytest.approx(float(expected), rel=1e-9, abs=1e-12)
    )


async def test_context_candidates_in_one_call(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", embedder="hash")
    a = await db.record_experience(cid, "retry the nats publish on timeout", domain=["nats"])
    b = await db.record_experience(cid, "nats timeouts come from slow fsync", domain=["nats"])
    await db.record_experience(cid, "duckdb has one writer", domain=["duckdb"])
    await db.store_relation(a, b, "Elaborates")
    await db.store_insight(cid, "nats timeouts: retry and check disks", source_experiences=[a, b])
    await db.register_activity(cid, "agent-7", "debugging nats")
    context = await db.get_context_candidates(
        collective_id=cid, text="nats publish timeout", k=2, filter={"domains": ["nats"]}
    )
    assert {h.experience.experience_id for h in context.similar} == {a, b}
    assert {e.experience_id for e in context.recent} == {a, b}  # the filter applies here too
    assert len(context.insights) == 1
    assert [(r.source_id, r.target_id) for r in context.relations] == [(a, b)]
    assert [x.agent_id for x in context.active_agents] == ["agent-7"]
    bare = await db.get_context_candidates(
        collective_id=cid, text="nats", similar=False, recent=0, insights=0, relations=False,
        active_agents=False,
    )  # fmt: skip
    assert (bare.similar, bare.recent, bare.insights, bare.relations, bare.active_agents) == (
        [], [], [], [], []
    )  # fmt: skip


async def test_the_hash_embedder_is_deterministic_across_processes() -> None:
    here = HashEmbedder(64).embed_query("Pulse remembers what agents learn")
    code = (
        "from sync.embedders import HashEmbedder;"
        "print(list(HashEmbedder(64).embed_query('Pulse remembers what agents learn')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    there = np.array(eval(out.stdout), dtype=np.float32)  # a list of floats we printed
    assert np.array_equal(here, there) and np.linalg.norm(here) == pytest.approx(1.0)


async def test_the_e5_small_model_recalls_by_meaning_offline(db: PulseDB) -> None:
    cid = await db.create_collective("o", "semantic", embedder="e5-small")
    cat = await db.record_experience(cid, "the cat sat on the mat")
    await db.record_experience(cid, "stock prices fell sharply today")
    hits = await db.search_similar(cid, "a kitten resting on a rug", k=2, energy_weight=0)
    assert hits[0].experience.experience_id == cat
    stored = await db.get_experience(cat)
    assert stored is not None and len(stored.vector) == 384


async def test_the_blocking_facade_offers_every_method(tmp_path: Path) -> None:
    import inspect

    coroutines = [
        n for n, f in inspect.getmembers(PulseDB) if inspect.iscoroutinefunction(f)
        and not n.startswith("_")
    ]  # fmt: skip
    assert len(coroutines) > 30

    def work() -> tuple[int, int, list[str]]:
        with PulseDBSync.open(tmp_path / "sync", settings=InstanceSettings(stale_after=60)) as s:
            for name in coroutines:
                assert callable(getattr(s, name)), name
            cid = s.create_collective("o", "c", embedder="hash")
            e = s.record_experience(cid, "blocking calls work", domain=["x"])
            s.register_activity(cid, "me")
            hits = s.search_hybrid(cid, "blocking")
            total = s.reinforce_experience(e)
            agents = [a.agent_id for a in s.get_active_agents(cid)]
            health = s.health()
            assert health.replicating and health.applied_seq >= s.last_seq() > 0
            return len(hits), total, agents

    assert await asyncio.to_thread(work) == (1, 1, ["me"])


def test_experience_types_round_trip_through_the_api_models() -> None:
    from sync.models import ExperienceIn, to_event_type, validated

    for variant in (
        ev.Solution(approach="a", worked=True), ev.Fact(statement="s", source="docs"),
        ev.UserPreference(category="c", preference="p", strength=0.4), ev.Generic(),
    ):  # fmt: skip
        spec = validated(ExperienceIn, collective_id=ev.UUID(int=1), content="x",
                         experience_type=variant)  # fmt: skip
        assert to_event_type(spec.experience_type) == variant


async def test_context_accepts_a_vector_from_the_collectives_embedder(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", embedder="hash")
    e = await db.record_experience(cid, "vectors made elsewhere with the same embedder")
    vector = HashEmbedder(384).embed_query("vectors made elsewhere")
    context = await db.get_context_candidates(
        collective_id=cid, embedding=vector.tolist(), embedder="hash", recent=0
    )
    assert [h.experience.experience_id for h in context.similar] == [e]


async def test_a_write_that_lands_after_a_delete_is_forgotten_too(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    """Host b checked its write against a state without a's delete (a race); the write
    lands after the tombstone, and must not keep anything in the log."""
    from eventlog.ids import uuid7

    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        cid = await a.create_collective("o", "c", 2)
        eid = await a.record_experience(cid, "soon deleted", [1, 0])
        await b.sync()
        await a.delete_experience(eid)
        await b.sync()
        late = ev.ExperienceUpdated(
            event_id=uuid7(), instance_id=b.instance_id, hlc=b.clock.now(), experience_id=eid,
            collective_id=cid, domain=("written after the delete",),
        )  # fmt: skip
        with pytest.raises(NotFoundError, match=f"experience_id: experience {eid} was deleted"):
            await b.writer.write(late)  # what update_experience does once its check has passed
        gone = await a.create_collective("o", "gone", 2)
        await a.delete_collective(gone)
        await b.sync()
        stale = ev.ExperienceRecorded(
            event_id=uuid7(), instance_id=b.instance_id, hlc=b.clock.now(),
            experience_id=uuid7(), collective_id=gone, content="into a deleted collective",
            embedding=ev.pack_vector([1, 0]), experience_type=ev.Generic(), importance=0.5,
            confidence=0.5, source_agent="b",
        )  # fmt: skip
        with pytest.raises(NotFoundError, match=f"collective_id: collective {gone} was deleted"):
            await b.writer.write(stale)
        left = []
        async for batch in a.log.read(1):
            left.extend(repr(entry.event) for entry in batch)
        assert not any("after the delete" in e or "deleted collective" in e for e in left)
        assert await a.digest() == await b.digest()
    finally:
        await a.close()
        await b.close()


def test_a_watch_that_falls_behind_is_dropped_not_buffered_forever() -> None:
    from eventlog.errors import PulseError
    from eventlog.ids import uuid7
    from sync.instance import ExperienceChange, ExperienceWatch

    async def run() -> None:
        watchers: set[ExperienceWatch] = set()
        watch = ExperienceWatch(watchers, limit=2)
        change = ExperienceChange(kind="created", experience_id=uuid7(), collective_id=uuid7(),
                                  seq=1, instance_id=uuid7())  # fmt: skip
        for _ in range(3):
            watch.offer(change)
        assert watchers == set()  # no longer fed
        assert [await anext(watch), await anext(watch)] == [change, change]
        with pytest.raises(PulseError, match="fell more than 2 changes behind"):
            await anext(watch)

    asyncio.run(run())


def test_a_watch_counts_toward_its_bound_only_what_its_reader_may_see() -> None:
    """A stalled reader is dropped after the same number of changes it may see, however
    many it may not see were written meanwhile (else the drop would tell how many)."""
    from uuid import UUID

    from eventlog.errors import PulseError
    from eventlog.ids import uuid7
    from sync.instance import ExperienceChange, ExperienceWatch

    mine, hidden = uuid7(), uuid7()

    def change(collective_id: UUID) -> ExperienceChange:
        return ExperienceChange(
            kind="created", experience_id=uuid7(), collective_id=collective_id, seq=1,
            instance_id=uuid7(),
        )  # fmt: skip

    async def admit(c: ExperienceChange) -> bool:
        await asyncio.sleep(0)  # (admission reads the engine: it awaits)
        return c.collective_id == mine

    async def watched(hidden_writes: int) -> list[object]:
        watchers: set[ExperienceWatch] = set()
        watch = ExperienceWatch(watchers, limit=2, admit=admit, sequences=False)
        seen: list[object] = []
        for _ in range(3):  # three it may see, each after some it may not
            for _ in range(hidden_writes):
                watch.offer(change(hidden))
            watch.offer(change(mine))
            for _ in range(2 * hidden_writes + 4):  # the admitting task's turns: one each
                await asyncio.sleep(0)
            seen.append(bool(watchers))  # still fed?
        try:
            while True:
                seen.append((await asyncio.wait_for(anext(watch), 1)).seq)
        except PulseError as exc:
            seen.append(str(exc))
        return seen

    async def run() -> None:
        quiet, busy = await watched(0), await watched(15)  # (15: past the bound, 2)
        assert quiet == busy == [True, True, False, 0, 0, quiet[-1]]
        assert "fell more than 2 changes behind" in quiet[-1]

    asyncio.run(run())


async def test_sql_sees_every_write_acknowledged_before_it(db: PulseDB) -> None:
    """SQL reads DuckDB, which the engine writes in bulk: a query flushes first, and says
    which stream sequence its answer reflects."""
    cid = await db.create_collective("o", "c", 3)
    ids = [await db.record_experience(cid, f"note {i}", [1.0, float(i), 0.0]) for i in range(5)]
    await db.reinforce_experience(ids[0])
    result = await db.sql("SELECT count(*), sum(applications) FROM experiences")
    assert result.rows == [[5, 1]]
    assert result.seq == await db.log.last_seq() == db.applied_seq

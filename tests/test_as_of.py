"""Time and truth: validity intervals, and reads ``as_of`` a moment.

The exactness test writes a random history through the public API on a real NATS
server (records, updates, archives, invalidations, reinforcements, relations that
supersede, insights, wisdom, deletes that forget, a collective deleted), then for
random sequences S compares what the host answers ``as_of=S`` with what a fresh host
that replayed only the events 1..S answers now, read for read."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import numpy as np
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from eventlog import EmbeddedNats, NotFoundError, ValidationError
from eventlog import events as ev
from eventlog.ids import uuid7
from projections import analytics, queries
from projections.engine import Engine
from projections.projection import Projection, ProjectionSettings
from sync import PulseDB
from tests.harness import by_profile, call, eventually, sql_retried, start, stop

DIM = 4
WORDS = ["cache", "queue", "index", "schema", "token", "retry"]
SQL = [  # the analysts' views, as of a moment
    "SELECT experience_id, importance, archived, applications, valid_from, valid_to, "
    "invalid_reason, invalidations, content FROM experiences ORDER BY experience_id",
    "SELECT relation_id, source_id, target_id, relation_type FROM relations ORDER BY 1",
    "SELECT insight_id, source_experiences FROM insights ORDER BY 1",
    "SELECT collective_id, name FROM collectives ORDER BY 1",
    "SELECT experience_id, instance_id, applications FROM applications ORDER BY 1, 2",
    "SELECT wisdom_id, pattern FROM wisdom ORDER BY 1",
    "SELECT seq, event_type, entity_id, change FROM history ORDER BY seq, event_type",
    "SELECT count(*) FROM experience_rows",
]


@pytest.fixture
async def db(tmp_path: Path, nats_server: EmbeddedNats) -> AsyncIterator[PulseDB]:
    instance = await PulseDB.open(tmp_path / "db", nats_server.url)
    yield instance
    await instance.close()


def unit(rng: random.Random) -> list[float]:
    v = np.array([rng.gauss(0, 1) for _ in range(DIM)], dtype=np.float32)
    return list(v / np.linalg.norm(v))


async def random_history(db: PulseDB, rng: random.Random, steps: int) -> dict[str, Any]:
    """Writes through the public API; returns what was made (ids, collectives)."""
    collectives = [await db.create_collective("ana", f"c{i}", DIM) for i in range(2)]
    made: dict[str, Any] = {"collectives": collectives, "experiences": [], "insights": []}
    live: list[tuple[UUID, UUID]] = []  # (experience, collective)
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.3 or len(live) < 3:
            cid = rng.choice(collectives)
            words = " ".join(rng.sample(WORDS, 2))
            since = None if rng.random() < 0.7 else 1_700_000_000_000 + rng.randrange(10**9)
            e = await db.record_experience(
                cid, f"note about {words}", unit(rng), importance=rng.choice([0.2, 0.5, 0.9]),
                domain=rng.sample(["a", "b"], rng.randrange(3)), valid_from=since,
            )  # fmt: skip
            live.append((e, cid))
            made["experiences"].append(e)
            continue
        e, cid = rng.choice(live)
        if roll < 0.4:
            await db.update_experience(e, importance=rng.choice([0.1, 0.6, 1.0]))
        elif roll < 0.47:
            await db.archive_experience(e)
        elif roll < 0.52:
            await db.unarchive_experience(e)
        elif roll < 0.62:
            await db.reinforce_experience(e)
        elif roll < 0.7:
            at = None if rng.random() < 0.5 else 1_700_000_000_000 + rng.randrange(10**9)
            await db.invalidate_experience(e, rng.choice(["stale", "wrong"]), at=at)
        elif roll < 0.73:
            await db.revalidate_experience(e, "true again")
        elif roll < 0.83:
            others = [x for x, c in live if c == cid and x != e]
            if others:
                kind = rng.choice(["Supersedes", "Supports", "Contradicts"])
                try:
                    await db.store_relation(
                        e,
                        rng.choice(others),
                        kind,
                        invalidate=kind != "Supports" and rng.random() < 0.5,
                    )
                except Exception as exc:  # a triple taken twice: refused, nothing written
                    assert "already exists" in str(exc)
        elif roll < 0.88:
            sources = [x for x, c in live if c == cid][:2]
            made["insights"].append(
                await db.store_insight(
                    cid, f"insight on {rng.choice(WORDS)}", unit(rng), source_experiences=sources
                )
            )
        elif roll < 0.92:
            await db.store_wisdom("ana", "CodingStyle", f"pattern {rng.randrange(9)}", unit(rng))
        else:
            await db.delete_experience(e)
            live.remove((e, cid))
    if rng.random() < 0.5:  # a collective deleted: everything in it is forgotten
        await db.delete_collective(collectives[1])
    return made


async def fresh_host(db: PulseDB, directory: Path, upto: int) -> tuple[Engine, int | None]:
    """A projection that replayed only the log's events 1..upto (as a new host would),
    and the time of that moment: the clock of the latest of those events (what "true
    now" means as of it)."""
    engine = await Engine.start(directory, ProjectionSettings())
    latest = None
    async for batch in db.log.read(1):
        taken = await db.sealer.open([e for e in batch if e.seq <= upto])  # (as a host would)
        await engine.apply(taken)
        latest = max([latest or 0, *(e.event.hlc for e in taken if e.event is not None)])
    return engine, None if not latest else ev.hlc_millis(latest)


def shape(items: Any) -> Any:
    """Results made comparable: search hits as (id, relevance), structs as they are."""
    if isinstance(items, list):
        return [shape(i) for i in items]
    if isinstance(items, queries.ScoredExperience):
        return (items.experience, round(items.relevance or items.score, 5))
    if isinstance(items, queries.ScoredInsight):
        return (items.insight, round(items.score, 5))
    return items


async def answers_as_of(db: PulseDB, made: dict[str, Any], s: int, probe: list[float]) -> Any:
    """Every read of the public API, as of ``s``."""
    everything = {"include_invalid": True, "include_archived": True}
    out: dict[str, Any] = {}
    out["collectives"] = list(await db.list_collectives(as_of=s))
    for cid in made["collectives"]:
        try:
            out[("list", cid)] = await db.list_experiences(cid, limit=1000, flt=everything, as_of=s)
            out[("recent", cid)] = await db.get_recent_experiences(cid, limit=5, as_of=s)
            out[("stats", cid)] = await db.get_collective_stats(cid, as_of=s)
            out[("similar", cid)] = shape(
                await db.search_similar(cid, probe, k=50, flt=everything, energy_weight=0, as_of=s)
            )
            out[("valid now", cid)] = shape(
                await db.search_similar(cid, probe, k=50, energy_weight=0, as_of=s)
            )
            for word in WORDS[:3]:
                hits = await db.search_text(cid, word, k=100, flt=everything, as_of=s)
                out[("text", cid, word)] = sorted(h.experience.experience_id for h in hits)
            out[("insights", cid)] = shape(await db.get_insights(cid, probe, k=50, as_of=s))
        except NotFoundError:
            out[("absent", cid)] = True
    for e in made["experiences"]:
        out[("get", e)] = await db.get_experience(e, as_of=s)
        try:
            out[("related", e)] = list(await db.get_related_experiences(e, as_of=s))
        except NotFoundError:
            out[("related", e)] = None
    out["wisdom"] = await db.get_wisdom("ana", as_of=s)
    for query in SQL:
        out[query] = await sql_retried(db, query, as_of=s)
    return out


async def answers_of(
    engine: Engine, made: dict[str, Any], probe: list[float], moment: int | None
) -> Any:
    """The same reads, of a projection as it is (the queries the API runs), "true now"
    meaning true at ``moment``."""
    everything = queries.ExperienceFilter(include_invalid=True, include_archived=True)
    now = queries.ExperienceFilter(at_ms=moment)
    out: dict[str, Any] = {}
    found, _ = await engine.run(queries.collectives_page, None, None, None, None)
    out["collectives"] = found
    for cid in made["collectives"]:
        if await engine.run(queries.get_collective, cid) is None:
            out[("absent", cid)] = True
            continue
        out[("list", cid)] = await engine.run(
            lambda p, c=cid: queries.recent_experiences(p, c, 1000, everything, newest_first=False)
        )
        out[("recent", cid)] = await engine.run(queries.recent_experiences, cid, 5, now)
        out[("stats", cid)] = await engine.run(queries.collective_stats, cid, None, moment)
        out[("similar", cid)] = shape(
            await engine.run(queries.similar_experiences, cid, probe, 50, everything)
        )
        out[("valid now", cid)] = shape(
            await engine.run(queries.similar_experiences, cid, probe, 50, now)
        )
        for word in WORDS[:3]:
            hits = await engine.run(queries.search_text, cid, word, 100, everything)
            out[("text", cid, word)] = sorted(h.experience.experience_id for h in hits)
        out[("insights", cid)] = shape(await engine.run(queries.similar_insights, cid, probe, 50))
    for e in made["experiences"]:
        out[("get", e)] = await engine.run(queries.get_experience, e)
        if await engine.run(queries.get_experience, e) is None:
            out[("related", e)] = None
        else:
            out[("related", e)] = await engine.run(queries.related_experiences, e)
    wisdom = await engine.run(queries.wisdom_of, "ana")
    out["wisdom"] = [queries.ScoredWisdom(w, 1.0) for w in wisdom][:10]
    cursor, _ = await engine.cursor()
    try:
        for query in SQL:
            out[query] = [
                [analytics.cell(v) for v in row] for row in cursor.execute(query).fetchall()
            ]
    finally:
        engine.returned(cursor)
    return out


# moments of each history checked besides the first two and the last: each costs a replay
# and every read twice (about 3 CPU-seconds)
SAMPLED_MOMENTS = by_profile(ci=4, dev=8)


@pytest.mark.parametrize("seed", [1, 2])
async def test_as_of_a_sequence_is_what_a_host_that_replayed_up_to_it_answers(
    db: PulseDB, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    made = await random_history(db, rng, steps=80)
    last = await db.sync()
    probe = unit(rng)
    moments = sorted({0, 1, last, *rng.sample(range(1, last), SAMPLED_MOMENTS)})
    for s in moments:
        engine, moment = await fresh_host(db, tmp_path / f"fresh-{s}", s)
        try:
            expected = await answers_of(engine, made, probe, moment if s < last else None)
        finally:
            await engine.close()
        got = await answers_as_of(db, made, s, probe)
        assert got.keys() == expected.keys(), s
        for key in expected:
            assert got[key] == expected[key], (s, key)
        # the present moves on (the past state kept for s is brought up to it, not made
        # again): what was true as of s stays what it was
        e = rng.choice(made["experiences"])
        if await db.get_experience(e) is not None:
            await db.reinforce_experience(e)
            await db.update_experience(e, importance=rng.choice([0.3, 0.7]))
        cid = await db.create_collective("ana", f"later-{s}", DIM)
        await db.record_experience(cid, "note about cache", unit(rng))
        again = await answers_as_of(db, made, s, probe)
        for key in expected:
            assert again[key] == expected[key], ("after writes", s, key)


async def test_a_fact_that_stopped_being_true(db: PulseDB) -> None:
    cid = await db.create_collective("ana", "api", DIM)
    old = await db.record_experience(cid, "the billing API is v1", [1, 0, 0, 0])
    before = await db.sync()
    new = await db.record_experience(cid, "the billing API is v2; v1 is retired", [1, 0.1, 0, 0])
    await db.store_relation(new, old, "Supersedes", invalidate=True)

    now = [h.experience.experience_id for h in await db.search_similar(cid, [1, 0, 0, 0])]
    assert now == [new]  # the superseded one is left out ...
    everything = await db.search_similar(cid, [1, 0, 0, 0], flt={"include_invalid": True})
    assert {h.experience.experience_id for h in everything} == {old, new}  # ... unless asked
    closed = await db.get_experience(old)
    assert closed is not None and closed.valid_to_ms is not None
    assert closed.invalid_reason == "superseded by another experience (a Supersedes relation)"
    then = await db.search_similar(cid, [1, 0, 0, 0], as_of=before)
    assert [h.experience.experience_id for h in then] == [old]  # what it believed then
    was = await db.get_experience(old, as_of=before)
    assert was is not None and was.valid_to_ms is None
    assert (await db.get_collective_stats(cid)).invalid == 1
    assert (await db.get_collective_stats(cid, as_of=before)).invalid == 0
    at_then = await db.search_similar(
        cid, [1, 0, 0, 0], flt={"valid_at": closed.valid_to_ms - 1, "include_invalid": False}
    )
    assert {h.experience.experience_id for h in at_then} == {old, new}


async def test_flipping_often_marks_an_experience_unstable_and_weighs_it_down(
    db: PulseDB,
) -> None:
    cid = await db.create_collective("ana", "prefs", DIM)
    shaky = await db.record_experience(cid, "tabs, not spaces", [1, 0, 0, 0])
    steady = await db.record_experience(cid, "spaces, not tabs", [1, 0, 0, 0])
    for _ in range(3):
        await db.invalidate_experience(shaky, "changed our mind")
        await db.revalidate_experience(shaky, "changed it back")
    found = await db.get_experience(shaky)
    assert found is not None and found.invalidations == 3 and found.unstable
    assert found.valid_to_ms is None  # true again
    hits = await db.search_similar(cid, [1, 0, 0, 0], energy_weight=0)
    assert [h.experience.experience_id for h in hits] == [steady, shaky]
    assert hits[1].score == pytest.approx(hits[1].relevance * db.settings.unstable_weight)
    stats = await db.get_collective_stats(cid)
    assert (stats.invalidations, stats.unstable, stats.invalid) == (3, 1, 0)


async def test_bad_validity_and_as_of_input_is_refused_by_name(db: PulseDB) -> None:
    cid = await db.create_collective("ana", "c", DIM)
    e = await db.record_experience(cid, "x", [1, 0, 0, 0])
    before = await db.get_experience(e)
    with pytest.raises(ValidationError, match="reason"):
        await db.invalidate_experience(e, "")
    with pytest.raises(ValidationError, match="at"):
        await db.invalidate_experience(e, "why", at="not a time")
    with pytest.raises(ValidationError, match="invalidate: only a Supersedes or Contradicts"):
        other = await db.record_experience(cid, "y", [0, 1, 0, 0])
        await db.store_relation(other, e, "Supports", invalidate=True)
    assert await db.get_experience(e) == before
    with pytest.raises(ValidationError, match="as_of: sequence 999999 is past the end"):
        await db.get_experience(e, as_of=999_999)
    with pytest.raises(ValidationError, match="as_of: must be a stream sequence"):
        await db.get_experience(e, as_of="yesterday-ish")
    with pytest.raises(ValidationError, match="as_of: must be >= 0"):
        await db.get_experience(e, as_of=-3)
    assert await db.get_experience(e, as_of="2020-01-01T00:00:00Z") is None  # before it was


async def moment_now() -> str:
    """Now as an ISO 8601 time, once the clock moved past it: what is written after the
    call is stamped later."""
    from datetime import UTC, datetime

    from sync.hlc import wall_ms

    moment = wall_ms()
    while wall_ms() <= moment:
        await asyncio.sleep(0.001)
    return datetime.fromtimestamp(moment / 1000, UTC).isoformat()


async def test_sql_as_of_for_a_member_sees_its_own_then_and_the_history(db: PulseDB) -> None:
    from eventlog.errors import Forbidden
    from sync.access import Principal

    cid = await db.create_collective("ana", "c", DIM)
    mine = await db.record_experience(cid, "mine", [1, 0, 0, 0], visibility="private")
    before = await db.sync()
    at = await moment_now()  # (a member reads as of a time: a sequence counts others' writes)
    await db.update_experience(mine, importance=0.9)
    await db.record_experience(cid, "later", [0, 1, 0, 0])
    member = Principal("ana", "a1", scope="read")
    with db.acting_as(member):
        then = await db.sql("SELECT content, importance FROM experiences", as_of=at)
        now = await db.sql("SELECT content, importance FROM experiences ORDER BY content")
        changes = await db.sql(
            "SELECT seq, event_type FROM history WHERE entity = 'experience' ORDER BY seq",
            as_of=at,
        )
        with pytest.raises(Forbidden, match="as_of: a stream sequence"):
            await db.sql("SELECT content FROM experiences", as_of=before)
    assert then.rows == [] and then.seq == 0  # private to its author (local), then too
    # (a token that may not see every row is told no stream sequence: it counts events
    # it may not see)
    assert [r[0] for r in now.rows] == ["later"]
    everything = await db.sql("SELECT content, importance FROM experiences", as_of=before)
    assert everything.rows == [["mine", 0.5]]
    history = await db.sql(
        "SELECT event_type, change->>'importance' FROM history "
        f"WHERE entity_id = '{mine}' ORDER BY seq"
    )
    assert history.rows == [["experience.recorded", "0.5"], ["experience.updated", "0.9"]]
    assert changes.rows == []  # what it may not see, it sees no history of


async def test_validity_and_as_of_over_http(tmp_path: Path) -> None:
    service = start(tmp_path / "served")
    try:
        async with service.client() as client:
            schema = (await client.get("/openapi.json")).json()["components"]["schemas"]
            assert "as_of" in schema["search_text_request"]["properties"]
            assert "reason" in schema["invalidate_experience_request"]["required"]
            cid = await call(client, "create_collective", owner_id="me", name="api",
                             embedder="hash")  # fmt: skip
            v1 = await call(client, "record_experience", collective_id=cid,
                            content="the billing API is v1")  # fmt: skip
            before = await call(client, "sync")
            closed = await call(client, "invalidate_experience", experience_id=v1,
                                reason="v2 shipped")  # fmt: skip
            assert closed["invalid_reason"] == "v2 shipped" and closed["valid_to_ms"]
            now = await call(client, "search_text", collective_id=cid, text="billing")
            then = await call(client, "search_text", collective_id=cid, text="billing",
                              as_of=before)  # fmt: skip
            assert now == [] and [h["experience"]["experience_id"] for h in then] == [v1]
            rows = await call(client, "sql", query="SELECT count(*) FROM experiences "
                              "WHERE valid", as_of=before)  # fmt: skip
            assert rows["rows"] == [[1]] and rows["seq"] == before
            bad = await client.post("/v1/get_experience", json={"experience_id": v1,
                                    "as_of": "soon-ish"})  # fmt: skip
            assert bad.status_code == 422 and "as_of: must be" in bad.json()["message"]
            flag = await client.post("/v1/get_experience", json={"experience_id": v1,
                                     "as_of": True})  # fmt: skip
            assert flag.status_code == 422 and "as_of" in flag.json()["message"]
        async with (
            service.mcp_client() as http,
            streamable_http_client(f"{service.url}/mcp", http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()

            async def recall(**more: Any) -> list[str]:
                found = await session.call_tool(
                    "recall", {"collective": "api", "query": "billing", "mode": "text", **more}
                )
                assert not found.isError, found.content
                hits = json.loads(found.content[0].text)["results"]  # type: ignore[union-attr]
                return [h["experience"]["experience_id"] for h in hits]

            assert await recall() == []
            assert await recall(as_of=before) == [v1]
            assert await recall(include_invalid=True) == [v1]
            back = await session.call_tool(
                "invalidate", {"experience_id": v1, "reason": "v1 is back", "true_again": True}
            )
            assert not back.isError, back.content
            assert await recall() == [v1]
    finally:
        stop(service)


async def test_a_restricted_query_as_of_a_moment_cannot_reach_the_past_tables(
    db: PulseDB,
) -> None:
    """The temporary views of a query as of a moment are made after the query is checked:
    a CTE named like one of them (out of its scope, the name would reach the unfiltered
    view) is refused, as one named like a table is."""
    from eventlog.errors import Forbidden
    from sync.access import Principal

    bobs = await db.create_collective("bob", "bob's", DIM)
    secret = await db.record_experience(bobs, "BOB SECRET", [1, 0, 0, 0], visibility="private")
    mine = await db.create_collective("alice", "alice's", DIM)
    seen = await db.record_experience(mine, "alice's", [1, 0, 0, 0])
    hidden = await db.record_experience(mine, "mine only", [0, 0, 1, 0], visibility="private")
    insight = await db.store_insight(
        mine, "distilled", [1, 0, 0, 0], source_experiences=[seen, hidden]
    )
    await db.sync()
    at = await moment_now()  # (a reader's as_of is a time: a sequence counts others' writes)
    await db.record_experience(mine, "later", [0, 1, 0, 0])  # (so the query reads the past)
    reader = Principal("alice", "a1", scope="read")
    tries = [
        f"SELECT x.* FROM (WITH {name} AS (SELECT 1) SELECT 1) y, {name} x"
        for name in ("pulse_asof_experience_rows", "pulse_over_token_rows", "pulse_asof_history")
    ]
    with db.acting_as(reader):
        for query in tries:
            with pytest.raises(Forbidden, match="a CTE may not be named"):
                await db.sql(query, as_of=at)
        found = await db.sql("SELECT content FROM experiences", as_of=at)
        changes = await db.sql("SELECT entity_id FROM history", as_of=at)
        sources = await db.sql(
            "SELECT change->>'source_experiences' FROM history WHERE event_type = 'insight.stored'"
        )
    assert found.rows == [["alice's"]]
    assert sources.rows == [[f'["{seen}"]']]  # the source it may not see is left out
    assert str(secret) not in {r[0] for r in changes.rows} and str(insight) in {
        r[0] for r in changes.rows
    }


async def test_as_of_a_moment_true_means_true_then(db: PulseDB) -> None:
    """A fact said to stop being true later (``at`` ahead) was true at every moment
    before that: as of such a moment it is found, though it is not true now."""
    import time

    cid = await db.create_collective("ana", "plans", DIM)
    e = await db.record_experience(cid, "the v1 endpoint serves", [1, 0, 0, 0])
    ends = int(time.time() * 1000) + 200
    await db.invalidate_experience(e, "v1 retires", at=ends)
    then = await db.sync()
    await eventually(lambda: time.time() * 1000 > ends + 5, what="the end to pass")
    await db.record_experience(cid, "unrelated", [0, 1, 0, 0])  # (then is in the past now)
    now = await db.search_similar(cid, [1, 0, 0, 0])
    assert e not in [h.experience.experience_id for h in now]
    found = await db.search_similar(cid, [1, 0, 0, 0], as_of=then)
    assert [h.experience.experience_id for h in found] == [e]
    assert (await db.get_collective_stats(cid, as_of=then)).invalid == 0
    assert (await db.get_collective_stats(cid)).invalid == 1
    valid = await db.sql("SELECT valid FROM experiences WHERE content LIKE 'the v1%'", as_of=then)
    assert valid.rows == [[True]]


# -- SQL as of a moment makes what the query reads, and what that reads ----------------------

LOCAL_COLUMNS = {"vec_id", "updated_seq", "create_seq"}  # differ between hosts


def views_reading_views() -> list[ev.Event]:
    """A history whose past differs from its present only through what views read: a
    relation and an insight written before the experience they name (dead letters until
    it arrives: ``relations`` reads ``relation_checks`` and ``experiences``,
    ``insight_sources`` reads ``insights``, which reads ``insight_checks``), then a
    reinforcement (``experiences`` reads ``application_rows``) and an update."""
    from tests import factories

    created = factories.collective()
    cid = created.collective_id
    first, later = factories.experience(cid, "first"), factories.experience(cid, "later")
    relation = ev.RelationStored(
        **factories.common(), relation_id=uuid7(), collective_id=cid,  # type: ignore[arg-type]
        source_id=first.experience_id, target_id=later.experience_id,
        relation_type="Supports", strength=0.5,
    )  # fmt: skip
    insight = ev.InsightStored(
        **factories.common(), insight_id=uuid7(), collective_id=cid,  # type: ignore[arg-type]
        content="distilled", embedding=ev.pack_vector([0.5] * DIM),
        source_experiences=(first.experience_id, later.experience_id), confidence=0.5,
    )  # fmt: skip
    reinforced = ev.ExperienceReinforced(
        **factories.common(), experience_id=first.experience_id,  # type: ignore[arg-type]
        collective_id=cid, applications=1,
    )  # fmt: skip
    updated = ev.ExperienceUpdated(
        **factories.common(), experience_id=later.experience_id,  # type: ignore[arg-type]
        collective_id=cid, importance=0.9,
    )  # fmt: skip
    return [created, first, relation, insight, later, reinforced, updated]


def projection_of(directory: Path, events: list[ev.Event]) -> Projection:
    from eventlog.log import LogEntry
    from eventlog.subjects import subject_for

    p = Projection(directory, ProjectionSettings())
    p.apply([LogEntry(seq=i, subject=subject_for(e), event=e) for i, e in enumerate(events, 1)])
    p.flush()
    return p


def sql_rows(p: Projection, query: str, as_of: int | None = None, viewer: Any = None) -> Any:
    """The rows of an admin's query (``viewer``: a principal's) over ``p`` as of a
    sequence (None: now), the hosts' local columns left out, in a fixed order."""
    from projections.past import sql_tables

    tables = None if as_of is None else sql_tables(p, as_of)
    assert (tables is None) == (as_of is None)  # (as of a moment before the present)
    cursor = p.store.con.cursor()
    cursor.begin()
    found = analytics.SqlQuery(
        cursor, query, [], 10_000, 0, analytics.SqlLimits(), viewer=viewer, past=tables
    ).run()
    keep = [i for i, c in enumerate(found.columns) if c not in LOCAL_COLUMNS]
    return sorted(json.dumps([row[i] for i in keep], default=str) for row in found.rows)


# queries that name what they read in other ways than a plain FROM
ODD_NAMES = [
    'SELECT count(*) FROM "RELATIONS"',
    "SELECT (SELECT count(*) FROM main.insight_sources) AS n",
    "WITH r AS (SELECT * FROM relations) SELECT count(*) FROM r",
    "SELECT count(*) FROM experiences WHERE experience_id IN (SELECT source_id FROM relations)",
    "SELECT * FROM dead_letters d JOIN insights i ON i.insight_id = d.id",
]


def test_sql_as_of_reads_the_past_through_every_view_a_view_reads(tmp_path: Path) -> None:
    """Each object of the state read alone as of a moment (the views that read views
    among them) answers what a host that applied the events up to it answers now, for
    an admin and for a member: what the query names is made as of the moment, and what
    that reads in turn (read now, ``relations`` would hold a relation that was a dead
    letter then, and ``insight_sources`` the sources of an insight that was)."""
    from sync.access import Principal

    events = views_reading_views()
    p = projection_of(tmp_path / "live", events)
    member = Principal("owner-1", "agent-1", scope="read")
    try:
        s = 4  # the relation and the insight are dead letters; not yet reinforced
        replayed = projection_of(tmp_path / "replay", events[:s])
        try:
            for query in [
                *(f"SELECT * FROM {n}" for n in sorted(analytics.PAST_NAMES)),
                *ODD_NAMES,
            ]:
                assert sql_rows(p, query, s) == sql_rows(replayed, query), query
            for name in ("experiences", "applications", "relations", "insights", "insight_sources"):
                query = f"SELECT * FROM {name}"
                assert sql_rows(p, query, s, member) == sql_rows(replayed, query, viewer=member), (
                    "member", query,
                )  # fmt: skip
        finally:
            replayed.close()
        # (the history differs from the present where it is read: else this proves nothing)
        assert sql_rows(p, "SELECT count(*) FROM relations", 4) == ["[0]"]
        assert sql_rows(p, "SELECT count(*) FROM relations") == ["[1]"]
        assert sql_rows(p, "SELECT count(*) FROM insight_sources", 4, member) == ["[0]"]
        assert sql_rows(p, "SELECT count(*) FROM insight_sources", None, member) == ["[2]"]
    finally:
        p.close()


def test_sql_as_of_makes_only_what_the_query_reads(tmp_path: Path) -> None:
    """A query as of a moment is given the objects it names and what they read, not
    every table and view of the state (each costs time, for every query)."""
    from projections.past import sql_tables

    events = views_reading_views()
    p = projection_of(tmp_path / "live", events)
    try:
        tables = sql_tables(p, 4)
        assert tables is not None

        def made(names: list[str], prefix: str = "") -> set[str]:
            cursor = p.store.con.cursor()
            cursor.begin()
            try:
                analytics.past_views(cursor, tables, names, prefix=prefix)
                return {
                    r[0] for r in cursor.execute(
                        "SELECT view_name FROM duckdb_views() WHERE temporary AND NOT internal"
                    ).fetchall()
                }  # fmt: skip
            finally:
                cursor.rollback()
                cursor.close()

        assert made(["collectives"]) == {"collectives", "collective_rows"}
        assert made(["insight_sources", "meta"]) == {
            "insight_sources", "insights", "insight_checks", "insight_rows", "collective_rows",
            "experience_rows",
        }  # fmt: skip
        assert made(["history"], "pulse_asof_") == {
            "pulse_asof_history", "pulse_asof_audit_rows", "pulse_asof_count_history"
        }  # fmt: skip
        assert made(list(analytics.PAST_NAMES)) == analytics.PAST_NAMES
    finally:
        p.close()


def test_what_an_admins_query_reads_is_known_or_everything_is_made(tmp_path: Path) -> None:
    """The names an admin's query may read, for ``past_views``: those of its parse tree
    and every word of its text that is one (a superset); every object when the query
    reads the catalog, which lists them all."""
    p = projection_of(tmp_path / "live", views_reading_views()[:2])
    cursor = p.store.con.cursor()
    try:

        def reads(query: str) -> frozenset[str]:
            return analytics.check_sandboxed(cursor, query)

        assert reads("SELECT count(*) FROM relations") == {"relations"}
        assert reads('SELECT * FROM "Experience_Rows", meta') == {"experience_rows"}
        assert reads("SELECT 1 AS n -- then experiences") == {"experiences"}  # (a superset)
        assert reads("SELECT applications FROM experiences") == {"experiences", "applications"}
        assert reads("SELECT count(*) FROM activities") == frozenset()
        for catalog in (
            "SHOW TABLES",
            "SELECT * FROM information_schema.tables",
            "SELECT pg_get_viewdef('relations')",
        ):
            assert reads(catalog) == analytics.PAST_NAMES, catalog
    finally:
        cursor.close()
        p.close()


def test_every_source_of_a_view_is_known_to_the_past() -> None:
    """The objects each view reads, as ``past_views`` finds them in its SQL, are those of
    DuckDB's own parse of it: a source missed would be read as it is now."""
    import duckdb

    from projections.schema import VIEWS
    from projections.store import TABLE_OF

    con = duckdb.connect()
    try:
        for name, select in re.findall(r"CREATE OR REPLACE VIEW (\w+) AS\n(.*?);\n", VIEWS, re.S):
            tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [select]).fetchone()[0])
            named: set[str] = set()
            stack: list[Any] = [tree]
            while stack:
                node = stack.pop()
                if isinstance(node, list):
                    stack.extend(node)
                elif isinstance(node, dict):
                    stack.extend(node.values())
                    if node.get("type") == "BASE_TABLE":
                        named.add(node["table_name"].lower())
            assert named == analytics._PAST_READS[name], name
    finally:
        con.close()
    assert (
        set(TABLE_OF.values())
        | {"audit_rows", "count_history", "undecodable"}
        | {n for n, _ in re.findall(r"CREATE OR REPLACE VIEW (\w+) AS\n(.*?);\n", VIEWS, re.S)}
        == analytics.PAST_NAMES
    )

"""Who sees what: the visibility rules on the engine's reads, against a plain model.

A projection holds experiences, relations, insights and wisdom of two owners with every
visibility and several authors. For any principal hypothesis draws, each read the API
makes (listing, vector search under a flat and an HNSW index, text search, stats,
related experiences, insights, wisdom, which collectives show) returns exactly what the
model says the principal may see. The model is written from the rules (``eventlog.access``'s
docstring), with no code of Pulse's: it would catch a rule the code gets wrong as well
as a read that forgets to filter.

Then the same rules end to end, through ``PulseDB`` on a real NATS server: principals
given to ``open`` and per call, tokens that expire or are revoked on another host, the
author every event records, and callers acting for different principals at once.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import EmbeddedNats
from eventlog import events as ev
from eventlog.errors import Forbidden, NotFoundError, Unauthorized
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections import queries as q
from projections.projection import Projection, ProjectionSettings
from sync.access import Principal, Viewer
from sync.instance import PulseDB

DIM = 8
BASE_MS = 1_700_000_000_000
AUTHORS = [("alice", "a1"), ("alice", "a2"), ("alice", None), ("bob", "b1"), ("bob", None)]
VISIBILITIES = ("private", "team", "org")


@dataclass
class Row:
    """What the model knows of one entity."""

    id: UUID
    collective: UUID | None  # None for wisdom
    owner: str  # the collective's (the wisdom's) owner
    visibility: str
    author: tuple[str, str | None]
    ends: tuple[UUID, ...] = ()  # a relation's ends, an insight's sources


@dataclass
class World:
    projection: Projection
    collectives: dict[UUID, str]  # id -> owner
    experiences: dict[UUID, Row] = field(default_factory=dict)
    relations: dict[UUID, Row] = field(default_factory=dict)
    insights: dict[UUID, Row] = field(default_factory=dict)
    wisdom: dict[UUID, Row] = field(default_factory=dict)
    query: np.ndarray = field(default_factory=lambda: np.ones(DIM, dtype=np.float32))


# -- the model: the rules as the docstring of eventlog.access states them -------------------


@dataclass(frozen=True)
class Who:
    owner: str
    agent: str | None
    limited_to: frozenset[UUID] | None


def member(who: Who, world: World, collective: UUID) -> bool:
    return world.collectives[collective] == who.owner and (
        who.limited_to is None or collective in who.limited_to
    )


def may_see(who: Who, world: World, row: Row) -> bool:
    if row.visibility == "org":
        return True
    if row.collective is None:  # wisdom: team is every principal of its owner
        inside = row.owner == who.owner
    else:
        inside = member(who, world, row.collective)
    if row.visibility == "team":
        return inside
    return inside and row.author == (who.owner, who.agent)


def shown_experiences(who: Who, world: World, collective: UUID) -> set[UUID]:
    return {
        r.id
        for r in world.experiences.values()
        if r.collective == collective and may_see(who, world, r)
    }


def shown_relations(who: Who, world: World, collective: UUID) -> set[UUID]:
    return {
        r.id
        for r in world.relations.values()
        if r.collective == collective
        and may_see(who, world, r)
        and all(may_see(who, world, world.experiences[e]) for e in r.ends)
    }


# -- the world: one projection, every visibility and author ---------------------------------


def build_world(directory: Path, seed: int = 13) -> World:
    rng = random.Random(seed)
    alice_1, alice_2, bob_1 = uuid7(), uuid7(), uuid7()
    owners = {alice_1: "alice", alice_2: "alice", bob_1: "bob"}
    # an HNSW index for the first collective (the filtered search goes through a bitmap
    # selector there); the others stay flat (exact)
    projection = Projection(directory, ProjectionSettings(hnsw_threshold=40))
    world = World(projection, owners)
    instance = uuid7()
    events: list[ev.Event] = []
    ms = 0

    def common(author: tuple[str, str | None]) -> dict[str, object]:
        nonlocal ms
        ms += 1
        return {"event_id": uuid7(), "instance_id": instance, "hlc": ev.pack_hlc(BASE_MS + ms),
                "author_owner": author[0], "author_agent": author[1]}  # fmt: skip

    for cid, owner in owners.items():
        events.append(ev.CollectiveCreated(
            **common((owner, None)), collective_id=cid, owner_id=owner, name=f"c-{cid}",
            embedding_dimension=DIM,
        ))  # type: ignore[arg-type]  # fmt: skip
    for i in range(150):
        cid = rng.choice([alice_1, alice_1, alice_2, bob_1])
        author = rng.choice([a for a in AUTHORS if a[0] == owners[cid]] + [AUTHORS[3]])
        visibility = rng.choice(VISIBILITIES)
        eid = uuid7()
        vector = np.array([rng.gauss(0, 1) for _ in range(DIM)], dtype=np.float32)
        events.append(ev.ExperienceRecorded(
            **common(author), experience_id=eid, collective_id=cid,
            content=f"lesson {i} about caching", embedding=ev.pack_vector(vector),
            experience_type=ev.Generic(), importance=0.5, confidence=0.5,
            source_agent="agent", visibility=visibility,
        ))  # type: ignore[arg-type]  # fmt: skip
        world.experiences[eid] = Row(eid, cid, owners[cid], visibility, author)
    by_collective: dict[UUID, list[UUID]] = {}
    for row in world.experiences.values():
        assert row.collective is not None
        by_collective.setdefault(row.collective, []).append(row.id)
    for cid, ids in by_collective.items():
        for _ in range(25):
            source, target = rng.sample(ids, 2)
            author, visibility = rng.choice(AUTHORS), rng.choice(VISIBILITIES)
            rid = uuid7()
            events.append(ev.RelationStored(
                **common(author), relation_id=rid, collective_id=cid, source_id=source,
                target_id=target, relation_type=rng.choice(["Supports", "Elaborates",
                "Implies", "RelatedTo", "Contradicts", "Supersedes"]), strength=0.5,
                visibility=visibility,
            ))  # type: ignore[arg-type]  # fmt: skip
            world.relations[rid] = Row(rid, cid, owners[cid], visibility, author, (source, target))
        for _ in range(8):
            sources = tuple(rng.sample(ids, 3))
            author, visibility = rng.choice(AUTHORS), rng.choice(VISIBILITIES)
            iid = uuid7()
            vector = np.array([rng.gauss(0, 1) for _ in range(DIM)], dtype=np.float32)
            events.append(ev.InsightStored(
                **common(author), insight_id=iid, collective_id=cid, content="an insight",
                embedding=ev.pack_vector(vector), source_experiences=sources, confidence=0.5,
                visibility=visibility,
            ))  # type: ignore[arg-type]  # fmt: skip
            world.insights[iid] = Row(iid, cid, owners[cid], visibility, author, sources)
    for owner in ("alice", "bob"):
        for _ in range(6):
            author = rng.choice([a for a in AUTHORS if a[0] == owner])
            visibility = rng.choice(VISIBILITIES)
            wid = uuid7()
            events.append(ev.WisdomStored(
                **common(author), wisdom_id=wid, owner_id=owner, category="CodingStyle",
                pattern="small functions", confidence=0.5,
                embedding=ev.pack_vector(np.ones(DIM, dtype=np.float32)), visibility=visibility,
            ))  # type: ignore[arg-type]  # fmt: skip
            world.wisdom[wid] = Row(wid, None, owner, visibility, author)
    projection.apply([LogEntry(i, "pulse.test", e) for i, e in enumerate(events, start=1)])
    projection.sync_indexes()
    assert ("experience", alice_1) in projection.vectors
    return world


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with tempfile.TemporaryDirectory() as directory:
        built = build_world(Path(directory))
        yield built
        built.projection.close()


whos = st.builds(
    Who,
    owner=st.sampled_from(["alice", "bob", "carol"]),
    agent=st.sampled_from([None, "a1", "a2", "b1"]),
    limited_to=st.none(),
)


@st.composite
def principals(draw: st.DrawFn, world: World) -> Who:
    who = draw(whos)
    if draw(st.booleans()):  # a token limited to some collectives
        chosen = draw(st.sets(st.sampled_from(sorted(world.collectives)), max_size=2))
        who = Who(who.owner, who.agent, frozenset(chosen))
    return who


def as_principal(who: Who) -> Principal:
    return Principal(owner=who.owner, agent=who.agent, scope="read", collectives=who.limited_to)


def viewer(who: Who, world: World, collective: UUID) -> Viewer:
    """What the API hands the engine for a read of ``collective`` (built here from the
    model's membership, so a wrong ``Principal.member`` fails the comparisons below)."""
    return Viewer(member(who, world, collective), who.owner, who.agent)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_read_shows_what_the_rules_allow(world: World, data: st.DataObject) -> None:
    who = data.draw(principals(world))
    p = world.projection
    for cid in world.collectives:
        expected = shown_experiences(who, world, cid)
        seeing = viewer(who, world, cid)
        flt = q.ExperienceFilter(viewer=seeing)
        listed = q.recent_experiences(p, cid, 1000, flt)
        assert {e.experience_id for e in listed} == expected
        assert len(listed) == len(expected)  # nothing twice
        similar = q.similar_experiences(p, cid, world.query, len(world.experiences), flt)
        assert {h.experience.experience_id for h in similar} == expected
        top = q.similar_experiences(p, cid, world.query, 5, flt)
        assert len(top) == min(5, len(expected))  # k visible ones, not k minus the hidden
        texts = q.search_text(p, cid, "caching", 1000, flt)
        assert {h.experience.experience_id for h in texts} == expected
        stats = q.collective_stats(p, cid, seeing)
        assert stats is not None
        assert stats.experiences == len(expected)
        assert stats.relations == len(shown_relations(who, world, cid))
        assert stats.insights == sum(
            1 for r in world.insights.values()
            if r.collective == cid and may_see(who, world, r)
        )  # fmt: skip
        assert stats.dead_letters == 0
        visible_rows = [r for r in world.experiences.values() if r.collective == cid]
        assert q.shows_anything(p, cid, seeing) == (
            member(who, world, cid)
            or any(r.visibility == "org" for r in visible_rows)
            or any(r.visibility == "org" and r.collective == cid for r in world.insights.values())
        )  # (an org relation shows only with both of its ends: org experiences decide)
        insights = q.similar_insights(p, cid, world.query, 5, seeing)
        shown_insights = {
            r.id for r in world.insights.values() if r.collective == cid and may_see(who, world, r)
        }
        assert {i.insight.insight_id for i in insights} <= shown_insights
        assert len(insights) == min(5, len(shown_insights))
        for hit in insights:
            sources = world.insights[hit.insight.insight_id].ends
            assert set(hit.insight.source_experiences) == {
                s for s in sources if may_see(who, world, world.experiences[s])
            }
    relations = shown_relations_all = set().union(
        *(shown_relations(who, world, c) for c in world.collectives)
    )
    for row in list(world.experiences.values())[:40]:
        assert row.collective is not None
        if not may_see(who, world, row):
            continue
        page, _ = q.related_page(p, row.id, viewer=viewer(who, world, row.collective))
        assert {r.relation.relation_id for r in page} == {
            r.id for r in world.relations.values() if row.id in r.ends and r.id in relations
        }
    assert shown_relations_all is relations
    principal = as_principal(who)
    for owner in ("alice", "bob"):
        wisdom = {w.wisdom_id for w in q.wisdom_of(p, owner, principal)}
        assert wisdom == {
            r.id for r in world.wisdom.values() if r.owner == owner and may_see(who, world, r)
        }
    listed_collectives, _ = q.collectives_page(p, None, 100, None, principal)
    assert {c.collective_id for c in listed_collectives} == {
        cid for cid in world.collectives if q.shows_anything(p, cid, viewer(who, world, cid))
    }


def test_an_unrestricted_read_sees_everything(world: World) -> None:
    p = world.projection
    for cid in world.collectives:
        everything = {r.id for r in world.experiences.values() if r.collective == cid}
        listed = q.recent_experiences(p, cid, 1000)
        assert {e.experience_id for e in listed} == everything
        stats = q.collective_stats(p, cid)
        assert stats is not None and stats.experiences == len(everything)


# -- end to end, through PulseDB ------------------------------------------------------------

V = [1.0, 0.0, 0.0, 0.0]


async def test_two_owners_share_only_what_is_org_visible(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """The README's scenario: bob's agent sees neither alice's private nor her team
    memories, and both see the one she made org-visible; alice's other agent sees her
    team and org memories but not a1's private one."""
    db = await PulseDB.open(tmp_path / "host", nats_server.url)
    try:
        alice_c = await db.create_collective("alice", "alice-team", 4)
        bob_c = await db.create_collective("bob", "bob-team", 4)
        a1 = (await db.create_token("alice", agent_id="a1", scope="write")).token
        a2 = (await db.create_token("alice", agent_id="a2", scope="read")).token
        b1 = (await db.create_token("bob", agent_id="b1", scope="write")).token
        with db.acting_as(a1):
            secret = await db.record_experience(alice_c, "a1's notes", V, visibility="private")
            team = await db.record_experience(alice_c, "the deploy needs a lock", V)
            shared = await db.record_experience(
                alice_c, "pin the NATS version", V, visibility="org"
            )
        with db.acting_as(a2):
            seen = {h.experience.experience_id for h in await db.search_similar(alice_c, V)}
            assert seen == {team, shared}
            assert await db.get_experience(secret) is None
        with db.acting_as(b1):
            seen = {h.experience.experience_id for h in await db.search_similar(alice_c, V)}
            assert seen == {shared}
            assert await db.get_experience(team) is None
            assert await db.get_experience(secret) is None
            assert (await db.get_collective_stats(alice_c)).experiences == 1
            with pytest.raises(Forbidden, match="not a member"):
                await db.record_experience(alice_c, "bob writes in", V)
            with pytest.raises(Forbidden, match="may not change"):
                await db.reinforce_experience(shared)
            with pytest.raises(NotFoundError, match="no experience"):
                await db.archive_experience(team)
            mine = await db.record_experience(bob_c, "bob's own", V)
            assert [h.experience.experience_id for h in await db.search_similar(bob_c, V)] == [mine]
        with db.acting_as(a2), pytest.raises(Forbidden, match="may only read"):
            await db.record_experience(alice_c, "a2 reads only", V)
        everything = {h.experience.experience_id for h in await db.search_similar(alice_c, V)}
        assert everything == {secret, team, shared}  # the operator sees all
    finally:
        await db.close()


async def test_a_principal_given_to_open_holds_for_every_call(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    operator = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        cid = await operator.create_collective("alice", "team", 4)
        hidden = await operator.record_experience(cid, "operator's private", V,
                                                  visibility="private")  # fmt: skip
        token = (await operator.create_token("alice", agent_id="a1", scope="write")).token
        with pytest.raises(Unauthorized, match="unknown token"):
            await PulseDB.open(tmp_path / "x", nats_server.url, principal=token[:-4] + "AAAA")
        library = await PulseDB.open(tmp_path / "b", nats_server.url, principal=token)
        try:
            assert library.principal.owner == "alice" and library.principal.agent == "a1"
            assert await library.get_experience(hidden) is None
            written = await library.record_experience(cid, "mine", V)
            assert (await library.get_experience(written)) is not None
            with pytest.raises(Forbidden, match="admin"):
                await library.list_tokens()
            with pytest.raises(Forbidden, match="admin"):
                await library.dead_letters()
            with pytest.raises(Forbidden, match="owner 'alice' only"):
                await library.create_collective("bob", "not mine", 4)
        finally:
            await library.close()
        audit = await operator.sql(
            "SELECT event_type, author_owner, author_agent FROM audit "
            f"WHERE entity_id = '{written}'"
        )
        assert audit.rows == [["experience.recorded", "alice", "a1"]]
    finally:
        await operator.close()


async def test_callers_acting_for_different_principals_at_once(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """``acting_as`` belongs to the task: concurrent calls never see each other's."""
    db = await PulseDB.open(tmp_path / "host", nats_server.url)
    try:
        cid = await db.create_collective("alice", "team", 4)
        tokens = {
            agent: (await db.create_token("alice", agent_id=agent, scope="write")).token
            for agent in ("a1", "a2", "a3")
        }
        private: dict[str, UUID] = {}
        for agent, token in tokens.items():
            with db.acting_as(token):
                private[agent] = await db.record_experience(
                    cid, f"{agent} only", V, visibility="private"
                )

        async def sees(agent: str) -> set[UUID]:
            found: set[UUID] = set()
            with db.acting_as(tokens[agent]):
                for _ in range(20):
                    hits = await db.search_similar(cid, V)
                    found |= {h.experience.experience_id for h in hits}
                    await asyncio.sleep(0)  # let the others interleave
            return found

        answers = await asyncio.gather(*(sees(agent) for agent in tokens))
        assert answers == [{private[agent]} for agent in tokens]
    finally:
        await db.close()


async def test_expired_and_revoked_tokens_are_refused_on_every_host(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        await a.create_collective("alice", "team", 4)
        short = await a.create_token("alice", scope="read", expires_in=1.0)
        kept = await a.create_token("alice", scope="read")
        await b.sync()
        assert b.principal_of(kept.token).owner == "alice"  # the token reached b
        await a.revoke_token(kept.token_id)
        with pytest.raises(Unauthorized, match="revoked"):
            a.principal_of(kept.token)
        await b.sync()
        deadline = time.monotonic() + 10
        while True:  # b reads its tokens again once it applied the revocation
            try:
                b.principal_of(kept.token)
            except Unauthorized as exc:
                assert "revoked" in str(exc)
                break
            assert time.monotonic() < deadline, "b still accepts a revoked token"
            await asyncio.sleep(0.02)
        deadline = time.monotonic() + 10
        while True:
            try:
                b.principal_of(short.token)
            except Unauthorized as exc:
                assert "expired" in str(exc)
                break
            assert time.monotonic() < deadline, "an expired token is still accepted"
            await asyncio.sleep(0.05)
        listed = await b.list_tokens(include_revoked=True)
        assert {(t.token_id, t.revoked) for t in listed} == {
            (short.token_id, False),
            (kept.token_id, True),
        }
        assert {t.owner_id for t in listed} == {"alice"}  # a revoked one keeps its owner
        assert [t.token_id for t in await b.list_tokens("alice")] == [short.token_id]
        for db in (a, b):  # the secret is nowhere: the log and the state hold its hash
            assert kept.token not in str(await db.sql("SELECT * FROM tokens"))
    finally:
        await b.close()
        await a.close()


async def test_watch_shows_a_principal_only_what_it_may_see(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    db = await PulseDB.open(tmp_path / "host", nats_server.url)
    try:
        cid = await db.create_collective("alice", "team", 4)
        bob = (await db.create_token("bob", scope="read")).token
        with db.acting_as(bob):
            watch = db.watch_experiences()
        await db.record_experience(cid, "team only", V)
        shared = await db.record_experience(cid, "for everyone", V, visibility="org")
        change = await asyncio.wait_for(anext(aiter(watch)), 10)
        assert change.experience_id == shared  # the team one went by unseen
        watch.close()
    finally:
        await db.close()


async def test_idempotency_keys_are_per_principal(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """bob reusing alice's key with alice's arguments makes a call of his own (refused
    here: he is not a member), never her answer; her retry still gets hers."""
    db = await PulseDB.open(tmp_path / "host", nats_server.url)
    try:
        cid = await db.create_collective("alice", "team", 4)
        alice = (await db.create_token("alice", agent_id="a1", scope="write")).token
        bob = (await db.create_token("bob", agent_id="b1", scope="write")).token
        with db.acting_as(alice):
            first = await db.record_experience(cid, "once", V, idempotency_key="k-1")
            assert await db.record_experience(cid, "once", V, idempotency_key="k-1") == first
        with db.acting_as(bob), pytest.raises(NotFoundError, match="no collective"):
            await db.record_experience(cid, "once", V, idempotency_key="k-1")
        with db.acting_as(bob):
            own = await db.create_collective("bob", "b", 4, idempotency_key="k-1")
        assert own != cid
        with db.acting_as(alice):
            assert await db.record_experience(cid, "once", V, idempotency_key="k-1") == first
    finally:
        await db.close()


async def test_the_audit_says_who_wrote_changed_and_deleted_what(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """Each event names its author; forgetting an entity keeps only its delete in the
    audit (the log keeps no more of it either), and a rebuilt host agrees."""
    db = await PulseDB.open(tmp_path / "host", nats_server.url)
    try:
        cid = await db.create_collective("alice", "team", 4)
        a1 = (await db.create_token("alice", agent_id="a1", scope="write")).token
        a2 = (await db.create_token("alice", agent_id="a2", scope="write")).token
        with db.acting_as(a1):
            kept = await db.record_experience(cid, "kept", V)
            gone = await db.record_experience(cid, "gone", V)
        with db.acting_as(a2):
            await db.update_experience(kept, importance=0.9)
            await db.reinforce_experience(kept)  # (not audited: a count, not content)
            await db.delete_experience(gone)
        query = (
            "SELECT entity_id, event_type, author_agent FROM audit "
            f"WHERE entity = 'experience' AND collective_id = '{cid}' ORDER BY seq"
        )
        expected = [
            [str(kept), "experience.recorded", "a1"],
            [str(kept), "experience.updated", "a2"],
            [str(gone), "experience.deleted", "a2"],
        ]
        assert (await db.sql(query)).rows == expected
    finally:
        await db.close()
    fresh = await PulseDB.open(tmp_path / "fresh", nats_server.url)
    try:
        assert (await fresh.sql(query)).rows == expected
    finally:
        await fresh.close()


async def test_what_review_found_stays_fixed(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """Text scores that counted hidden documents, a member deleting a collective with
    others' private memories, a conflict naming a hidden relation, a remembered answer
    given to a read token, a watch telling a member of another agent's private delete."""
    from eventlog.errors import ConflictError

    db = await PulseDB.open(tmp_path / "host", nats_server.url)
    try:
        alice = await db.create_collective("alice", "alice-team", embedder="hash")
        bobs = await db.create_collective("bob", "bob-team", embedder="hash")
        a1 = (await db.create_token("alice", agent_id="a1", scope="write")).token
        a2 = (await db.create_token("alice", agent_id="a2", scope="write")).token
        a2_read = (await db.create_token("alice", agent_id="a2", scope="read")).token
        b1 = (await db.create_token("bob", agent_id="b1", scope="write")).token
        with db.acting_as(b1):
            await db.record_experience(bobs, "probe zeuscorp hermescorp")
            before = [h.relevance for h in await db.search_text(bobs, "zeuscorp")]
        with db.acting_as(a1):
            for i in range(5):
                await db.record_experience(alice, f"zeuscorp plan {i}", visibility="private")
        with db.acting_as(b1):  # a rank's score: the hidden documents change nothing
            assert [h.relevance for h in await db.search_text(bobs, "zeuscorp")] == before
        with db.acting_as(a2), pytest.raises(Forbidden, match="admin"):
            await db.delete_collective(alice)
        with db.acting_as(a1):
            one = await db.record_experience(alice, "one", visibility="org")
            two = await db.record_experience(alice, "two", visibility="org")
            hidden = await db.store_relation(one, two, "Supports", visibility="private")
            private = await db.record_experience(alice, "a1 only", visibility="private")
            team = await db.record_experience(alice, "all of us")
        with db.acting_as(a2):  # a hidden relation neither refuses nor outranks a2's
            mine = await db.store_relation(one, two, "Supports")
            related = await db.get_related_experiences(one)
            assert [r.relation.relation_id for r in related] == [mine] and hidden != mine
            with pytest.raises(ConflictError, match=f"already exists as relation {mine}"):
                await db.store_relation(one, two, "Supports")
            await db.record_experience(alice, "keyed", idempotency_key="k-1")
            watch = db.watch_experiences()
        with db.acting_as(a2_read), pytest.raises(Forbidden, match="may only read"):
            await db.record_experience(alice, "keyed", idempotency_key="k-1")
        with db.acting_as(a1):
            await db.delete_experience(private)
            await db.delete_experience(team)
        change = await asyncio.wait_for(anext(aiter(watch)), 10)
        assert (change.kind, change.experience_id) == ("deleted", team)  # not the private one
        watch.close()
    finally:
        await db.close()

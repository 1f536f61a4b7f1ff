"""Noninterference (issue 26): what a caller sees depends only on what it may see.

Hypothesis draws a world (owners alice and bob, their collectives, experiences of every
visibility by several authors, relations, insights, wisdom, sessions, activities) and a
second world: the first plus data the caller may not see (other owners' entries, other
agents' private entries in the caller's collectives, team entries where it is not a
member, relations on visible triples that it may not see, updates and deletes of hidden
entries), interleaved anywhere in the log. Both are written as events (fixed ids and
clocks) to an in-memory log and read back through ``PulseDB`` acting for the caller;
every read path of the API must answer the caller identically in both: the same ids,
order, scores, counts, cursors, error types and messages.

Whether the caller may see an entity is this file's own model of ``eventlog.access``'s rules
(it decides only which drawn entities may go to the second world).

What is left out of the comparison is a function of the wall clock alone: a hit's
``energy`` (it decays with the time of the call), and so the scores of cold
experiences (their energy: their ids and order are compared). Answers are
compared after ``msgspec.to_builtins``; a page is its items and its ``next`` cursor.

Beside it, the two cases that show the leaks on plain worlds (a text search whose order
told whether a word occurs in another agent's private memories; a vector search over an
HNSW graph holding them), and the words-not-syntax check: ``search_text`` with query
syntax answers words, over HTTP. The property runs without shrinking: a failing pair of
worlds is printed whole (shrinking one, each example two instances, takes minutes).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
import numpy as np
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from eventlog import MemoryLog
from eventlog import events as ev
from eventlog.ids import uuid7
from projections.projection import ProjectionSettings
from sync.access import Principal
from sync.instance import PulseDB
from tests.harness import start, stop

DIM = 4
WORDS = ["cache", "retry", "timeout", "schema", "deploy", "zeuscorp", "hermes", "plan"]
PROBES = ["zeuscorp hermes", "retry", "cache schema plan", "deploy zeuscorp"]
SYNTAX = ["experience:*", "collective:*", '"unbalanced', "(paren", "*", "AND", "id:x OR"]
AGENTS = {"alice": ["a1", "a2", None], "bob": ["b1", None]}
CALLERS = {
    "alice/a1": Principal("alice", "a1", "write"),
    "alice": Principal("alice", None, "write"),
    "carol": Principal("carol", "c1", "write"),  # a member of nothing
    "alice/a1@A2": None,  # limited to A2 (made per world: the ids are drawn)
}
WRITER = UUID(int=7)  # the instance id the events name


# -- the model: who may see what (eventlog.access's docstring) -----------------------------


@dataclass(frozen=True)
class Caller:
    owner: str
    agent: str | None
    limited_to: str | None  # a collective's name, or None


def member(caller: Caller, owner: str, name: str) -> bool:
    return owner == caller.owner and caller.limited_to in (None, name)


def sees(caller: Caller, owner: str, name: str, vis: str, author: tuple[str, str | None]) -> bool:
    if vis == "org":
        return True
    if not member(caller, owner, name):
        return False
    return vis == "team" or author == (caller.owner, caller.agent)


# -- the worlds ------------------------------------------------------------------------------


@dataclass
class World:
    """What both worlds hold (``base``) and what only the second does (``extra``)."""

    collectives: dict[str, tuple[UUID, str, str]]  # name -> (id, owner, language)
    base: list[ev.Event] = field(default_factory=list)
    extra: list[ev.Event] = field(default_factory=list)
    experiences: list[UUID] = field(default_factory=list)  # every drawn id, hidden too
    insights: list[UUID] = field(default_factory=list)
    sessions: list[UUID] = field(default_factory=list)
    relations: list[tuple[UUID, UUID, str]] = field(default_factory=list)  # triples
    by_collective: dict[str, list[UUID]] = field(default_factory=dict)  # base experiences
    late_base: list[ev.Event] = field(default_factory=list)  # after a watch starts
    late_extra: list[ev.Event] = field(default_factory=list)
    marker: ev.ExperienceRecorded | None = None  # the last late event (the watch reads up to it)


class Clock:
    def __init__(self, start_ms: int) -> None:
        self.ms = start_ms

    def stamp(self, author: tuple[str, str | None]) -> dict[str, Any]:
        self.ms += 1
        return {
            "event_id": uuid7(), "instance_id": WRITER, "hlc": ev.pack_hlc(self.ms),
            "author_owner": author[0], "author_agent": author[1],
        }  # fmt: skip


def vector(values: list[int]) -> bytes:
    found = np.asarray(values, dtype=np.float32)
    if not found.any():
        found[0] = 1.0
    return found.tobytes()


authors = st.sampled_from([(o, a) for o, agents in AGENTS.items() for a in agents])
visibilities = st.sampled_from(["private", "team", "org"])
contents = st.lists(st.sampled_from(WORDS), min_size=1, max_size=5).map(" ".join)
vectors = st.lists(st.integers(-2, 2), min_size=DIM, max_size=DIM)


@st.composite
def worlds(draw: st.DrawFn, caller: Caller) -> World:
    clock = Clock(int(time.time() * 1000) - 3_600_000)
    names = {"A1": ("alice", "english"), "A2": ("alice", "german"), "B1": ("bob", "english")}
    world = World({n: (uuid7(), o, lang) for n, (o, lang) in names.items()})
    world.collectives["B2"] = (uuid7(), "bob", "english")  # the second world's only
    for name, (cid, owner, language) in world.collectives.items():
        made = ev.CollectiveCreated(
            **clock.stamp((owner, None)), collective_id=cid, owner_id=owner, name=name,
            embedding_dimension=DIM, language=language,
        )  # fmt: skip
        (world.extra if name == "B2" else world.base).append(made)
        world.by_collective[name] = []

    def visible(name: str, vis: str, author: tuple[str, str | None]) -> bool:
        return sees(caller, world.collectives[name][1], name, vis, author)

    def author_in(name: str) -> tuple[str, str | None]:
        owner = world.collectives[name][1]
        return (owner, draw(st.sampled_from(AGENTS[owner])))

    where = st.sampled_from(["A1", "A2", "B1"])
    # experience -> (collective, visible, in the first world)
    facts: dict[UUID, tuple[str, bool, bool]] = {}
    for hidden_pass in (False, True):
        for _ in range(draw(st.integers(0, 6) if hidden_pass else st.integers(2, 8))):
            name = draw(
                st.sampled_from(["A1", "A2", "B1", "B2"] if hidden_pass else ["A1", "A2", "B1"])
            )
            vis, author = draw(visibilities), author_in(name)
            seen = visible(name, vis, author)
            if hidden_pass and seen:
                continue  # the second world adds only what the caller may not see
            eid = draw(st.uuids())
            event = ev.ExperienceRecorded(
                **clock.stamp(author), experience_id=eid,
                collective_id=world.collectives[name][0], content=draw(contents),
                embedding=vector(draw(vectors)), experience_type=ev.Generic(),
                importance=draw(st.sampled_from([0.2, 0.5, 0.9])), confidence=0.5,
                source_agent="agent", domain=tuple(draw(st.sets(st.sampled_from(["x", "y"])))),
                visibility=vis,
            )  # fmt: skip
            (world.extra if hidden_pass else world.base).append(event)
            world.experiences.append(eid)
            facts[eid] = (name, seen, not hidden_pass)
            if not hidden_pass:
                world.by_collective[name].append(eid)
            if draw(st.booleans()):  # a change to it: archived, reinforced, or (hidden) gone
                change = draw(st.sampled_from(["archive", "reinforce", "delete", "invalidate"]))
                if change == "delete" and not hidden_pass:
                    change = "reinforce"
                cid = world.collectives[name][0]
                common = clock.stamp(author)
                kinds: dict[str, Any] = {
                    "archive": (ev.ExperienceArchived, {}),
                    "reinforce": (ev.ExperienceReinforced, {"applications": 2}),
                    "delete": (ev.ExperienceDeleted, {}),
                    "invalidate": (
                        ev.ExperienceInvalidated,
                        {"reason": "stale", "valid_to_ms": clock.ms - 1000},
                    ),
                }
                made, more = kinds[change]
                later = made(**common, experience_id=eid, collective_id=cid, **more)
                (world.extra if hidden_pass else world.base).append(later)
    # relations: in the first world any; in the second, twins of the first's (the same
    # triple, shared otherwise: another agent's private one, a team one for a stranger)
    # with a smaller or a larger id, and others; the caller tries to store their triples
    relation_ids: dict[tuple[UUID, UUID, str], UUID] = {}
    for hidden_pass in (False, True):
        tries = [None] * draw(st.integers(1, 5)) + (list(relation_ids) if hidden_pass else [])
        for twin in tries:
            if twin is None:
                name = draw(where)
                ends = [e for e, (n, _, b) in facts.items() if n == name and (b or hidden_pass)]
                if len(ends) < 2:
                    continue
                source, target = draw(st.permutations(ends))[:2]
                kind = draw(st.sampled_from(["Supports", "RelatedTo"]))
            else:
                source, target, kind = twin
                name = facts[source][0]
            vis, author = draw(visibilities), author_in(name)
            seen = visible(name, vis, author) and facts[source][1] and facts[target][1]
            if hidden_pass and seen:
                continue
            rid = draw(st.uuids())
            if twin is not None and draw(st.booleans()):  # the twin's id is the smaller
                rid = UUID(int=max(relation_ids[twin].int - 1, 0))
            event = ev.RelationStored(
                **clock.stamp(author), relation_id=rid,
                collective_id=world.collectives[name][0], source_id=source, target_id=target,
                relation_type=kind, strength=0.5, visibility=vis,
            )  # fmt: skip
            (world.extra if hidden_pass else world.base).append(event)
            if not hidden_pass:
                relation_ids[(source, target, kind)] = rid
            if (source, target, kind) not in world.relations:
                world.relations.append((source, target, kind))
    # insights, wisdom, sessions, activities
    for hidden_pass in (False, True):
        for _ in range(draw(st.integers(0, 3))):
            name = draw(where)
            sources = [e for e, (n, _, b) in facts.items() if n == name and (b or hidden_pass)]
            if not sources:
                continue
            vis, author = draw(visibilities), author_in(name)
            if hidden_pass and visible(name, vis, author):
                continue
            iid = draw(st.uuids())
            world.insights.append(iid)
            (world.extra if hidden_pass else world.base).append(
                ev.InsightStored(
                    **clock.stamp(author),
                    insight_id=iid,
                    collective_id=world.collectives[name][0],
                    content=draw(contents),
                    embedding=vector(draw(vectors)),
                    source_experiences=tuple(draw(st.sets(st.sampled_from(sources), min_size=1))),
                    confidence=0.5,
                    visibility=vis,
                )  # fmt: skip
            )
        for _ in range(draw(st.integers(0, 2))):
            owner = draw(st.sampled_from(["alice", "bob"]))
            vis, author = draw(visibilities), (owner, draw(st.sampled_from(AGENTS[owner])))
            seen = vis == "org" or (
                owner == caller.owner and (vis == "team" or author == (caller.owner, caller.agent))
            )
            if hidden_pass and seen:
                continue
            (world.extra if hidden_pass else world.base).append(
                ev.WisdomStored(
                    **clock.stamp(author),
                    wisdom_id=draw(st.uuids()),
                    owner_id=owner,
                    category="CodingStyle",
                    pattern=draw(contents),
                    confidence=0.5,
                    embedding=vector(draw(vectors)),
                    visibility=vis,
                )  # fmt: skip
            )
        for _ in range(draw(st.integers(0, 2))):
            name = draw(
                st.sampled_from(["A1", "A2", "B1", "B2"] if hidden_pass else ["A1", "A2", "B1"])
            )
            owner = world.collectives[name][1]
            if hidden_pass and member(caller, owner, name):
                continue
            agent = draw(st.sampled_from([a for a in AGENTS[owner] if a is not None]))
            sid = draw(st.uuids())
            world.sessions.append(sid)
            (world.extra if hidden_pass else world.base).append(
                ev.SessionStarted(
                    **clock.stamp((owner, agent)),
                    session_id=sid,
                    collective_id=world.collectives[name][0],
                    agent_id=agent,
                    summary=draw(contents),
                )  # fmt: skip
            )
            (world.extra if hidden_pass else world.base).append(
                ev.ActivityRegistered(
                    **clock.stamp((owner, agent)),
                    collective_id=world.collectives[name][0],
                    agent_id=agent,
                    task_description=draw(contents),
                )  # fmt: skip
            )
    # the late events: a watch sees the visible ones, ends at the marker
    for eid, (name, seen, _) in facts.items():
        cid = world.collectives[name][0]
        late = ev.ExperienceUpdated(
            **clock.stamp(world_author(name, world)), experience_id=eid, collective_id=cid,
            importance=0.7,
        )  # fmt: skip
        if eid in world.by_collective[name]:
            world.late_base.append(late)
        elif not seen:
            world.late_extra.append(late)
    world.marker = ev.ExperienceRecorded(  # (org: every caller sees it)
        **clock.stamp(("alice", None)), experience_id=draw(st.uuids()),
        collective_id=world.collectives["A1"][0], content="marker",
        embedding=vector([1, 0, 0, 0]), experience_type=ev.Generic(), importance=0.5,
        confidence=0.5, source_agent="agent", visibility="org",
    )  # fmt: skip
    return world


def world_author(name: str, world: World) -> tuple[str, str | None]:
    return (world.collectives[name][1], None)


def interleaved(base: list[ev.Event], extra: list[ev.Event], at: list[int]) -> list[ev.Event]:
    """``base`` with ``extra`` inserted before the positions ``at`` (wrapped)."""
    out = list(base)
    for event, where in zip(extra, at + [len(out)] * len(extra), strict=False):
        out.insert(where % (len(out) + 1), event)
    return out


# -- every read path ---------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """An answer in comparable form (a page: items and cursor; energy left out)."""
    if isinstance(value, list) and hasattr(value, "next"):
        return {"items": plain(list(value)), "next": value.next}
    built = msgspec.to_builtins(value) if not isinstance(value, (list, dict)) else value
    if isinstance(built, dict):
        return {k: plain(v) for k, v in built.items() if k != "energy"}
    if isinstance(built, list):
        return [plain(v) for v in built]
    return built


async def answer(call: Awaitable[Any]) -> Any:
    try:
        return ("ok", plain(await call))
    except Exception as exc:  # the error is the answer: its type and message
        return ("error", type(exc).__name__, str(exc))


async def read_everything(db: PulseDB, world: World, unknown: UUID) -> dict[str, Any]:
    """Every read path of the API, for the caller ``db`` acts for."""
    q = np.asarray([1, 1, 0, -1], dtype=np.float32)
    found: dict[str, Any] = {}

    async def put(name: str, call: Awaitable[Any]) -> None:
        found[name] = await answer(call)

    async def cold(cid: UUID) -> list[UUID]:  # (scored by energy: the wall clock's)
        return [h.experience.experience_id for h in await db.list_cold_experiences(cid, 1.0)]

    ids = [c for c, _, _ in world.collectives.values()] + [unknown]
    await put("list_collectives", db.list_collectives())
    await put("list_collectives:bob", db.list_collectives("bob"))
    page = await db.list_collectives(limit=1)
    await put("list_collectives:2", db.list_collectives(limit=1, after=page.next))
    for n, cid in enumerate(ids):
        await put(f"get_collective {n}", db.get_collective(cid))
        await put(f"stats {n}", db.get_collective_stats(cid))
        await put(f"recent {n}", db.get_recent_experiences(cid, 5))
        await put(f"list {n}", db.list_experiences(cid, limit=2, offset=1))
        await put(f"archived {n}", db.list_experiences(cid, flt={"include_archived": True}))
        await put(f"cold {n}", cold(cid))
        await put(f"similar {n}", db.search_similar(cid, q, 5, energy_weight=0))
        await put(
            f"similar:y {n}",
            db.search_similar(cid, q, 3, {"domains": ["y"]}, energy_weight=0),
        )
        for text in PROBES + SYNTAX:
            await put(f"text {n} {text}", db.search_text(cid, text, 5, energy_weight=0))
        for text in PROBES[:2]:
            await put(
                f"hybrid {n} {text}",
                db.search_hybrid(cid, text, q, 5, energy_weight=0),
            )
        await put(
            f"context {n}",
            db.get_context_candidates(
                collective_id=cid, text=PROBES[0], embedding=q.tolist(), k=4, energy_weight=0
            ),
        )
        await put(f"insights {n}", db.get_insights(cid, q, 5))
        await put(f"sessions {n}", db.list_sessions(cid))
        await put(f"resume {n}", db.resume_session(cid, "a1"))
        await put(f"active {n}", db.get_active_agents(cid, stale_after=1e6))
        await put(f"digest {n}", db.digest(cid))
    for n, eid in enumerate(world.experiences + [unknown]):
        await put(f"experience {n}", db.get_experience(eid))
        await put(f"related {n}", db.get_related_experiences(eid))
        await put(f"related:1 {n}", db.get_related_experiences(eid, limit=1))
    for n, iid in enumerate(world.insights + [unknown]):
        await put(f"insight {n}", db.get_insight(iid))
    for n, sid in enumerate(world.sessions + [unknown]):
        await put(f"session {n}", db.get_session(sid))
    for owner in ("alice", "bob", "nobody"):
        await put(f"wisdom {owner}", db.get_wisdom(owner))
        await put(f"wisdom:q {owner}", db.get_wisdom(owner, q, 3))
    await put("digest", db.digest())
    await put("sync", db.sync())
    await put("as_of seq", db.list_collectives(as_of=1))
    return found


async def answers(
    directory: Path, world: World, events: list[ev.Event], late: list[ev.Event],
    caller: Principal, unknown: UUID,
) -> dict[str, Any]:  # fmt: skip
    log = MemoryLog()
    for event in events:
        await log.append(event)
    # (a tiny threshold: a collective's vectors go to an HNSW graph after a few)
    settings = ProjectionSettings(hnsw_threshold=3)
    db = await PulseDB.attach(directory, log, settings, owns_log=False)
    try:
        await db.sync()
        with db.acting_as(caller):
            found = await read_everything(db, world, unknown)
            watch = db.watch_experiences()
        changes = []
        assert world.marker is not None
        for event in [*late, world.marker]:
            await log.append(event)
        await db.sync()
        async with asyncio.timeout(20):
            async for change in watch:
                changes.append(plain(change))
                if change.experience_id == world.marker.experience_id:
                    break
        watch.close()
        found["watch"] = changes
        with db.acting_as(caller):  # a triple held (in the second world) by a hidden one
            for n, (source, target, kind) in enumerate(world.relations):
                found[f"store_relation {n}"] = await answer(  # (its id: from the key)
                    db.store_relation(source, target, kind, idempotency_key=f"r{n}")
                )
                found[f"related after {n}"] = await answer(db.get_related_experiences(source))
        return found
    finally:
        await db.close()
        await log.close()


def caller_of(name: str, world: World) -> tuple[Caller, Principal]:
    if name == "alice/a1@A2":
        limited = frozenset({world.collectives["A2"][0]})
        return Caller("alice", "a1", "A2"), Principal("alice", "a1", "write", limited)
    principal = CALLERS[name]
    assert principal is not None
    return Caller(principal.owner, principal.agent, None), principal


def differences(one: dict[str, Any], two: dict[str, Any]) -> list[str]:
    return [
        f"{key} at {where(one.get(key), two.get(key))}"
        for key in sorted(set(one) | set(two))
        if one.get(key) != two.get(key)
    ]


def where(one: Any, two: Any, path: str = "") -> str:
    """The first place two answers differ, and what each holds there."""
    if isinstance(one, dict) and isinstance(two, dict) and one.keys() == two.keys():
        for key in one:
            if one[key] != two[key]:
                return where(one[key], two[key], f"{path}.{key}")
    if isinstance(one, (list, tuple)) and isinstance(two, (list, tuple)) and len(one) == len(two):
        for i, (a, b) in enumerate(zip(one, two, strict=True)):
            if a != b:
                return where(a, b, f"{path}[{i}]")
    return f"{path or '.'}:\n  first:  {one!r:.400}\n  second: {two!r:.400}"


async def same_answers(world: World, at: list[int], principal: Principal) -> None:
    unknown = uuid7()
    with tempfile.TemporaryDirectory() as tmp:
        first = await answers(
            Path(tmp) / "first", world, world.base, world.late_base, principal, unknown
        )
        second = await answers(
            Path(tmp) / "second", world, interleaved(world.base, world.extra, at),
            interleaved(world.late_base, world.late_extra, at), principal, unknown,
        )  # fmt: skip
    found = differences(first, second)
    assert not found, f"{len(found)} answers differ:\n" + "\n".join(found[:8])


@settings(max_examples=20, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_what_a_caller_may_not_see_changes_no_answer(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(CALLERS)), label="caller")
    # the model's caller decides what the second world may add; drawn before the world
    placeholder = Caller("alice", "a1", "A2") if name == "alice/a1@A2" else None
    if placeholder is None:
        principal = CALLERS[name]
        assert principal is not None
        placeholder = Caller(principal.owner, principal.agent, None)
    world = data.draw(worlds(placeholder), label="world")
    _, principal = caller_of(name, world)
    at = data.draw(st.lists(st.integers(0, 10_000), max_size=len(world.extra) + 8), label="at")
    asyncio.run(same_answers(world, at, principal))


# -- the case that shows it on a plain world ------------------------------------------------


async def text_answers(directory: Path, events: list[ev.Event], cid: UUID) -> list[Any]:
    log = MemoryLog()
    for event in events:
        await log.append(event)
    db = await PulseDB.attach(directory, log, owns_log=False)
    try:
        await db.sync()
        with db.acting_as(Principal("alice", "a1", "read")):
            return [
                await answer(db.search_text(cid, "zeuscorp hermes", energy_weight=0)),
                await answer(
                    db.search_hybrid(cid, "zeuscorp hermes", [1.0, 0, 0, 0], energy_weight=0)
                ),
            ]
    finally:
        await db.close()
        await log.close()


async def test_hidden_words_do_not_reorder_a_text_search(tmp_path: Path) -> None:
    """Alice's agent a1 sees two memories of one length, each holding one of two words;
    BM25 ranks them by how rare each word is. Agent a2's private memories hold one of
    the words three times over: over one index's statistics that made it commoner, and
    the other memory first (rank scores or not, the order told a1 the word was there)."""
    clock = Clock(int(time.time() * 1000) - 60_000)
    cid = uuid7()
    base: list[ev.Event] = [
        ev.CollectiveCreated(
            **clock.stamp(("alice", None)), collective_id=cid, owner_id="alice", name="A1",
            embedding_dimension=DIM,
        )
    ]  # fmt: skip
    for n, content in enumerate(["zeuscorp plan", "hermes plan"]):
        base.append(
            ev.ExperienceRecorded(
                **clock.stamp(("alice", "a1")), experience_id=UUID(int=n + 1),
                collective_id=cid, content=content, embedding=vector([1, n, 0, 0]),
                experience_type=ev.Generic(), importance=0.5, confidence=0.5,
                source_agent="agent",
            )
        )  # fmt: skip
    hidden = [
        ev.ExperienceRecorded(
            **clock.stamp(("alice", "a2")),
            experience_id=uuid7(),
            collective_id=cid,
            content=f"zeuscorp secret {n}",
            embedding=vector([0, 0, 1, n]),
            experience_type=ev.Generic(),
            importance=0.5,
            confidence=0.5,
            source_agent="agent",
            visibility="private",
        )  # fmt: skip
        for n in range(3)
    ]
    first = await text_answers(tmp_path / "first", base, cid)
    second = await text_answers(tmp_path / "second", base + hidden, cid)
    assert first == second
    ranked = [h["experience"]["content"] for h in first[0][1]]
    assert ranked == ["zeuscorp plan", "hermes plan"]  # a tie, cut by id


async def test_another_agents_private_wisdom_tells_no_dimension(tmp_path: Path) -> None:
    """Storing wisdom checks its dimension against the owner's wisdom the caller sees: a
    refusal that named the dimension of another agent's private wisdom would tell it."""
    answers = []
    for world, hidden in (("first", False), ("second", True)):
        log = MemoryLog()
        db = await PulseDB.attach(tmp_path / world, log, owns_log=False)
        try:
            if hidden:
                with db.acting_as(Principal("alice", "a2", "write")):
                    await db.store_wisdom(
                        "alice", "CodingStyle", "secret", [1.0] * 8, visibility="private"
                    )
            with db.acting_as(Principal("alice", "a1", "write")):
                made = await answer(db.store_wisdom("alice", "CodingStyle", "mine", [1.0] * DIM))
                seen = await answer(db.get_wisdom("alice"))
            answers.append((made[0], [w["wisdom"]["pattern"] for w in seen[1]]))
        finally:
            await db.close()
            await log.close()
    assert answers[0] == answers[1] == ("ok", ["mine"]), answers


async def vector_answers(
    directory: Path, events: list[ev.Event], cid: UUID, probes: np.ndarray
) -> list[Any]:
    log = MemoryLog()
    for event in events:
        await log.append(event)
    # a graph from the 101st vector on, searched narrowly (so it misses some)
    settings = ProjectionSettings(hnsw_threshold=100, ef_search=1)
    db = await PulseDB.attach(directory, log, settings, owns_log=False)
    try:
        await db.sync()
        with db.acting_as(Principal("alice", "a1", "read")):
            return [
                await answer(db.search_similar(cid, probe, 10, energy_weight=0)) for probe in probes
            ]
    finally:
        await db.close()
        await log.close()


async def test_hidden_vectors_do_not_change_a_vector_search(tmp_path: Path) -> None:
    """Past its threshold a collective's vectors are an HNSW graph, approximate and built
    over every vector of the collective: as many private vectors of another agent as
    the caller sees changed which of its own the graph found. A caller that may not see
    everything is answered by an exact scan of what it may see."""
    rng = np.random.default_rng(26)
    clock = Clock(int(time.time() * 1000) - 600_000)
    cid = uuid7()
    created = ev.CollectiveCreated(
        **clock.stamp(("alice", None)), collective_id=cid, owner_id="alice", name="A1",
        embedding_dimension=16,
    )  # fmt: skip

    def recorded(author: tuple[str, str | None], visibility: ev.Visibility) -> ev.Event:
        return ev.ExperienceRecorded(
            **clock.stamp(author), experience_id=uuid7(), collective_id=cid, content="v",
            embedding=rng.normal(size=16).astype(np.float32).tobytes(),
            experience_type=ev.Generic(), importance=0.5, confidence=0.5,
            source_agent="agent", visibility=visibility,
        )  # fmt: skip

    base = [created] + [recorded(("alice", "a1"), "team") for _ in range(800)]
    hidden = [recorded(("alice", "a2"), "private") for _ in range(800)]
    probes = rng.normal(size=(30, 16)).astype(np.float32)
    first = await vector_answers(tmp_path / "first", base, cid, probes)
    mixed = [e for pair in zip(base[1:], hidden, strict=True) for e in pair]
    second = await vector_answers(tmp_path / "second", [created, *mixed], cid, probes)
    assert all(a[0] == "ok" and len(a[1]) == 10 for a in first)
    assert first == second


# -- search text is words, never query syntax -----------------------------------------------


async def test_query_syntax_is_searched_as_words(tmp_path: Path) -> None:
    """``experience:*`` or ``collective:*`` answered 500 (parsed as tantivy's query
    syntax, a field query on a field that is no fast field); quotes, parentheses, ``*``,
    ``AND`` and field names are words like any other now, over HTTP as in Python."""
    service = start(tmp_path / "served", "--token", "nonint-s3cret")
    service.token = "nonint-s3cret"
    try:
        async with service.client() as client:

            async def call(method: str, **body: Any) -> Any:
                response = await client.post(f"/v1/{method}", json=body)
                assert response.status_code == 200, (method, body, response.text)
                return response.json()

            cid = await call("create_collective", owner_id="alice", name="words", embedder="hash")
            kept = await call(
                "record_experience", collective_id=cid,
                content="the experience of a collective AND its id (star * stays)",
            )  # fmt: skip
            await call("record_experience", collective_id=cid, content="nothing in common")
            for text, found in [
                ("experience:*", [kept]),
                ("collective:*", [kept]),
                ('"unbalanced experience', [kept]),
                ("(collective", [kept]),
                ("*", []),
                ("AND", [kept]),
                ("id:x", [kept]),
                ("collective:" + cid, [kept]),
                ("experience_words:star", [kept]),
            ]:
                for method in ("search_text", "search_hybrid"):
                    hits = await call(method, collective_id=cid, text=text, k=5)
                    ids = [h["experience"]["experience_id"] for h in hits]
                    if method == "search_text":
                        assert ids == found, (text, hits)
                    else:  # (the vectors find everything; the words add nothing else)
                        assert set(found) <= set(ids), (text, hits)
    finally:
        stop(service)
    assert not [line for line in service.logged if "Traceback" in line]

"""Every constraint of the data model has its rejection: the error names the field, the
problem and the limit, and neither the state nor the log changes.

One instance on a real embedded NATS serves the whole module; each case calls the public
API with one bad input and checks the message, the digest and the stream's last sequence.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import pytest_asyncio

from eventlog import ConflictError, NotFoundError, ValidationError
from eventlog import events as ev
from sync import PulseDB

pytestmark = pytest.mark.asyncio(loop_scope="module")

MISSING = UUID("01900000-0000-7000-8000-000000000000")


@dataclass
class World:
    db: PulseDB
    a: UUID  # collective "alpha": dimension 3, callers bring vectors
    b: UUID  # collective "beta": dimension 3
    t: UUID  # collective "texts": hash embedder, 384-d
    e1: UUID
    e2: UUID  # both in alpha, related e1 -> e2 Supports
    eb: UUID  # in beta


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    db = await PulseDB.open(Path(tmp_path_factory.mktemp("validation")))
    try:
        a = await db.create_collective("owner", "alpha", 3)
        b = await db.create_collective("owner", "beta", 3)
        t = await db.create_collective("owner", "texts", embedder="hash")
        e1 = await db.record_experience(a, "one", [1, 0, 0])
        e2 = await db.record_experience(a, "two", [0, 1, 0])
        eb = await db.record_experience(b, "other", [0, 0, 1])
        await db.store_relation(e1, e2, "Supports")
        await db.register_activity(a, "present", "working")
        await db.store_wisdom("owner", "CodingStyle", "small functions", [1, 0])
        yield World(db, a, b, t, e1, e2, eb)
    finally:
        await db.close()


Call = Callable[[World], Awaitable[Any]]
KB = 1024

CASES: list[tuple[str, Call, type[Exception], str]] = [
    # -- collectives --
    ("owner_id empty", lambda w: w.db.create_collective("", "n", 3), ValidationError,
     "owner_id: String should have at least 1 character"),
    ("owner_id too long", lambda w: w.db.create_collective("o" * 257, "n", 3), ValidationError,
     "owner_id: String should have at most 256 characters"),
    ("name empty", lambda w: w.db.create_collective("o", "", 3), ValidationError,
     "name: String should have at least 1 character"),
    ("name too long", lambda w: w.db.create_collective("o", "n" * 257, 3), ValidationError,
     "name: String should have at most 256 characters"),
    ("dimension 0", lambda w: w.db.create_collective("o", "n", 0), ValidationError,
     "embedding_dimension: Input should be greater than or equal to 1"),
    ("dimension 4097", lambda w: w.db.create_collective("o", "n", 4097), ValidationError,
     "embedding_dimension: Input should be less than or equal to 4096"),
    ("no dimension, no embedder", lambda w: w.db.create_collective("o", "n"), ValidationError,
     r"embedding_dimension: required \(1..4096\) when the collective has no embedder"),
    ("unknown embedder", lambda w: w.db.create_collective("o", "n", embedder="gpt"),
     ValidationError, "embedder: unknown embedder 'gpt'; known: e5-small, hash"),
    ("e5-small is 384-d", lambda w: w.db.create_collective("o", "n", 100, embedder="e5-small"),
     ValidationError, "embedding_dimension: the e5-small embedder makes 384-d vectors, got 100"),
    ("stats of a missing collective", lambda w: w.db.get_collective_stats(MISSING),
     NotFoundError, f"collective_id: no collective {MISSING}"),
    ("delete a missing collective", lambda w: w.db.delete_collective(MISSING), NotFoundError,
     f"collective_id: no collective {MISSING}"),
    ("collective id not a UUID", lambda w: w.db.get_collective("nope"), ValidationError,
     "collective_id: not a UUID: 'nope'"),
    # -- experiences --
    ("content empty", lambda w: w.db.record_experience(w.a, "", [1, 0, 0]), ValidationError,
     r"content: must be 1 byte to 102,400 bytes of UTF-8 \(100 KB\), got 0"),
    ("content over 100 KB (bytes, not characters)",
     lambda w: w.db.record_experience(w.a, "é" * (50 * KB + 1), [1, 0, 0]), ValidationError,
     r"content: must be 1 byte to 102,400 bytes of UTF-8 \(100 KB\), got 102,402"),
    ("embedding of another dimension", lambda w: w.db.record_experience(w.a, "x", [1, 0]),
     ValidationError, r"embedding: 2 values, collective 'alpha' has dimension 3 \(fixed"),
    ("embedding with NaN",
     lambda w: w.db.record_experience(w.a, "x", [1, float("nan"), 0]), ValidationError,
     r"embedding: every value must be a finite number \(no NaN or infinity\)"),
    ("embedding with infinity",
     lambda w: w.db.record_experience(w.a, "x", [1, float("inf"), 0]), ValidationError,
     "embedding: every value must be a finite number"),
    ("embedding not numbers", lambda w: w.db.record_experience(w.a, "x", "abc"),
     ValidationError, "embedding: must be a list of numbers"),
    ("no embedding and no embedder", lambda w: w.db.record_experience(w.a, "x"),
     ValidationError, "embedding: required, collective 'alpha' has no embedder"),
    ("a vector from another embedder",
     lambda w: w.db.record_experience(w.t, "x", [0.0] * 384, embedder="e5-small"),
     ValidationError, "embedder: collective 'texts' embeds with 'hash'; a vector from "
     "'e5-small' is refused"),
    ("an unnamed vector where an embedder is set",
     lambda w: w.db.record_experience(w.t, "x", [0.0] * 384), ValidationError,
     "embedder: collective 'texts' embeds with 'hash'; a vector from an unnamed model"),
    ("importance above 1",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], importance=1.5), ValidationError,
     r"importance: Input should be less than or equal to 1 \(got 1.5\)"),
    ("importance below 0",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], importance=-0.1), ValidationError,
     r"importance: Input should be greater than or equal to 0 \(got -0.1\)"),
    ("importance NaN",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], importance=float("nan")),
     ValidationError, "importance: Input should be a finite number"),
    ("confidence above 1",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], confidence=2), ValidationError,
     r"confidence: Input should be less than or equal to 1 \(got 2\)"),
    ("51 domain tags",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], domain=[f"d{i}" for i in range(51)]),
     ValidationError, "domain: List should have at most 50 items after validation, not 51"),
    ("domain tag of 101 characters",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], domain=["d" * 101]),
     ValidationError, "domain.0: String should have at most 100 characters"),
    ("101 related files",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], related_files=["f"] * 101),
     ValidationError, "related_files: List should have at most 100 items after validation"),
    ("file path of 501 characters",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], related_files=["f" * 501]),
     ValidationError, "related_files.0: String should have at most 500 characters"),
    ("source_agent empty",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], source_agent=""), ValidationError,
     "source_agent: String should have at least 1 character"),
    ("source_agent too long",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], source_agent="a" * 257),
     ValidationError, "source_agent: String should have at most 256 characters"),
    ("severity outside the four",
     lambda w: w.db.record_experience(
         w.a, "x", [1, 0, 0],
         experience_type={"kind": "Difficulty", "description": "d", "severity": "Extreme"}),
     ValidationError, "experience_type.severity: Input should be 'Low', 'Medium', 'High' or "
     r"'Critical' \(got 'Extreme'\)"),
    ("unknown experience type",
     lambda w: w.db.record_experience(w.a, "x", [1, 0, 0], experience_type={"kind": "Poem"}),
     ValidationError, "experience_type: Input tag 'Poem' found using 'kind' does not match"),
    ("record into a missing collective",
     lambda w: w.db.record_experience(MISSING, "x", [1, 0, 0]), NotFoundError,
     f"collective_id: no collective {MISSING}"),
    ("content is immutable", lambda w: w.db.update_experience(w.e1, content="new"),
     ValidationError, r"content: is immutable once recorded \(record a new experience"),
    ("embedding is immutable", lambda w: w.db.update_experience(w.e1, embedding=[0, 0, 1]),
     ValidationError, "embedding: is immutable once recorded"),
    ("timestamp is immutable", lambda w: w.db.update_experience(w.e1, timestamp=0),
     ValidationError, "timestamp: is immutable once recorded"),
    ("an update that changes nothing", lambda w: w.db.update_experience(w.e1),
     ValidationError, "update: give at least one of importance, confidence, domain"),
    ("update importance above 1", lambda w: w.db.update_experience(w.e1, importance=3),
     ValidationError, r"importance: Input should be less than or equal to 1 \(got 3\)"),
    ("update a missing experience", lambda w: w.db.update_experience(MISSING, importance=1),
     NotFoundError, f"experience_id: no experience {MISSING}"),
    ("reinforce a missing experience", lambda w: w.db.reinforce_experience(MISSING),
     NotFoundError, f"experience_id: no experience {MISSING}"),
    ("archive a missing experience", lambda w: w.db.archive_experience(MISSING),
     NotFoundError, f"experience_id: no experience {MISSING}"),
    ("delete a missing experience", lambda w: w.db.delete_experience(MISSING),
     NotFoundError, f"experience_id: no experience {MISSING}"),
    ("page size 0", lambda w: w.db.list_experiences(w.a, limit=0), ValidationError,
     "limit: must be an integer in 1..1000, got 0"),
    ("negative offset", lambda w: w.db.list_experiences(w.a, offset=-1), ValidationError,
     "offset: must be >= 0, got -1"),
    # -- relations --
    ("self-relation", lambda w: w.db.store_relation(w.e1, w.e1, "Supports"), ValidationError,
     r"target_id: must differ from source_id \(an experience cannot relate to itself\)"),
    ("unknown relation type", lambda w: w.db.store_relation(w.e1, w.e2, "Likes"),
     ValidationError, "relation_type: Input should be 'Supports', 'Contradicts', "
     r"'Elaborates', 'Supersedes', 'Implies' or 'RelatedTo' \(got 'Likes'\)"),
    ("strength above 1", lambda w: w.db.store_relation(w.e1, w.e2, "Implies", strength=1.01),
     ValidationError, r"strength: Input should be less than or equal to 1 \(got 1.01\)"),
    ("metadata over 10 KB",
     lambda w: w.db.store_relation(w.e1, w.e2, "Implies", metadata="m" * (10 * KB + 1)),
     ValidationError, r"metadata: must be 0 to 10,240 bytes of UTF-8 \(10 KB\), got 10,241"),
    ("missing source", lambda w: w.db.store_relation(MISSING, w.e2, "Implies"),
     NotFoundError, f"source_id: no experience {MISSING}"),
    ("missing target", lambda w: w.db.store_relation(w.e1, MISSING, "Implies"),
     NotFoundError, f"target_id: no experience {MISSING}"),
    ("relation across collectives", lambda w: w.db.store_relation(w.e1, w.eb, "Implies"),
     ValidationError, "target_id: is in collective .*; relations stay within one collective"),
    ("a triple taken twice", lambda w: w.db.store_relation(w.e1, w.e2, "Supports"),
     ConflictError, r"relation: \(.*, Supports\) already exists as relation .*; a triple is"),
    ("related: unknown direction", lambda w: w.db.get_related_experiences(w.e1, "up"),
     ValidationError, "direction: must be 'outgoing', 'incoming' or 'both', got 'up'"),
    ("delete a missing relation", lambda w: w.db.delete_relation(MISSING), NotFoundError,
     f"relation_id: no relation {MISSING}"),
    # -- insights --
    ("insight over 50 KB",
     lambda w: w.db.store_insight(w.a, "i" * (50 * KB + 1), [1, 0, 0],
                                  source_experiences=[w.e1]),
     ValidationError, r"content: must be 1 byte to 51,200 bytes of UTF-8 \(50 KB\)"),
    ("insight without sources",
     lambda w: w.db.store_insight(w.a, "i", [1, 0, 0], source_experiences=[]),
     ValidationError, "source_experiences: List should have at least 1 item"),
    ("insight with 101 sources",
     lambda w: w.db.store_insight(w.a, "i", [1, 0, 0], source_experiences=[w.e1] * 101),
     ValidationError, "source_experiences: List should have at most 100 items"),
    ("insight naming a source twice",
     lambda w: w.db.store_insight(w.a, "i", [1, 0, 0], source_experiences=[w.e1, w.e1]),
     ValidationError, "source_experiences: must not name an experience twice"),
    ("insight from a missing source",
     lambda w: w.db.store_insight(w.a, "i", [1, 0, 0], source_experiences=[MISSING]),
     NotFoundError, f"source_experiences: no experience {MISSING} in collective 'alpha'"),
    ("insight from another collective's experience",
     lambda w: w.db.store_insight(w.a, "i", [1, 0, 0], source_experiences=[w.eb]),
     NotFoundError, "source_experiences: no experience .* in collective 'alpha'"),
    ("insight of another dimension",
     lambda w: w.db.store_insight(w.a, "i", [1, 0], source_experiences=[w.e1]),
     ValidationError, "embedding: 2 values, collective 'alpha' has dimension 3"),
    # -- activities --
    ("task over 1 KB",
     lambda w: w.db.register_activity(w.a, "agent", "t" * (KB + 1)), ValidationError,
     r"task_description: must be 0 to 1,024 bytes of UTF-8 \(1 KB\), got 1,025"),
    ("101 working_on items",
     lambda w: w.db.register_activity(w.a, "agent", "t", ["f"] * 101), ValidationError,
     "working_on: List should have at most 100 items"),
    ("working_on item of 501 characters",
     lambda w: w.db.register_activity(w.a, "agent", "t", ["f" * 501]), ValidationError,
     "working_on.0: String should have at most 500 characters"),
    ("agent_id empty", lambda w: w.db.register_activity(w.a, ""), ValidationError,
     "agent_id: String should have at least 1 character"),
    ("activity in a missing collective", lambda w: w.db.register_activity(MISSING, "agent"),
     NotFoundError, f"collective_id: no collective {MISSING}"),
    ("heartbeat without a registration", lambda w: w.db.update_heartbeat(w.a, "stranger"),
     NotFoundError, "agent_id: 'stranger' has no activity in collective"),
    ("stale threshold of 0", lambda w: w.db.get_active_agents(w.a, stale_after=0),
     ValidationError, "stale_after: must be > 0 seconds, got 0"),
    # -- wisdom --
    ("unknown wisdom category",
     lambda w: w.db.store_wisdom("owner", "Vibes", "p", [1, 0]), ValidationError,
     "category: Input should be 'CodingStyle', 'ArchitecturalPreference'"),
    ("wisdom of another dimension than the owner's",
     lambda w: w.db.store_wisdom("owner", "CodingStyle", "p", [1, 0, 0]), ValidationError,
     "embedding: 3 values, the wisdom of 'owner' has dimension 2"),
    ("wisdom from a collective of another owner",
     lambda w: w.db.store_wisdom("someone", "CodingStyle", "p", [1, 0],
                                 source_collectives=[w.a]),
     NotFoundError, "source_collectives: no collective .* owned by 'someone'"),
    ("wisdom confidence above 1",
     lambda w: w.db.store_wisdom("owner", "CodingStyle", "p", [1, 0], confidence=7),
     ValidationError, r"confidence: Input should be less than or equal to 1 \(got 7\)"),
    # -- searching --
    ("k of 0", lambda w: w.db.search_similar(w.a, [1, 0, 0], k=0), ValidationError,
     "k: Input should be greater than or equal to 1"),
    ("k of 1001", lambda w: w.db.search_similar(w.a, [1, 0, 0], k=1001), ValidationError,
     "k: Input should be less than or equal to 1000"),
    ("query of another dimension", lambda w: w.db.search_similar(w.a, [1, 0]),
     ValidationError, "query: 2 values, collective 'alpha' has dimension 3"),
    ("text query without an embedder", lambda w: w.db.search_similar(w.a, "words"),
     ValidationError, "query: required, collective 'alpha' has no embedder"),
    ("empty text search", lambda w: w.db.search_text(w.a, "  "), ValidationError,
     "text: must contain at least one word"),
    ("filter with importance above 1",
     lambda w: w.db.search_similar(w.a, [1, 0, 0], flt={"min_importance": 2}),
     ValidationError, "min_importance: Input should be less than or equal to 1"),
    ("filter with an unknown type",
     lambda w: w.db.search_similar(w.a, [1, 0, 0], flt={"experience_types": ["Poem"]}),
     ValidationError, "experience_types.0: Input should be 'Difficulty'"),
    ("filter with an unknown field",
     lambda w: w.db.search_similar(w.a, [1, 0, 0], flt={"colour": "red"}),
     ValidationError, "colour: is not a field of this input"),
    ("hybrid with a negative weight",
     lambda w: w.db.search_hybrid(w.a, "one", [1, 0, 0], text_weight=-1), ValidationError,
     "text_weight: Input should be greater than or equal to 0"),
    ("cold threshold above 1", lambda w: w.db.list_cold_experiences(w.a, threshold=2),
     ValidationError, r"threshold: must be a finite number in \[0, 1\], got 2"),
    ("activities of a missing collective", lambda w: w.db.get_active_agents(MISSING),
     NotFoundError, f"collective_id: no collective {MISSING}"),
    # -- analytics --
    ("a write through sql", lambda w: w.db.sql("INSERT INTO meta VALUES ('a', 'b')"),
     ValidationError, "query: only read-only queries are allowed .*, got INSERT"),
    ("EXPLAIN ANALYZE runs its statement",
     lambda w: w.db.sql("EXPLAIN ANALYZE DELETE FROM experience_rows"), ValidationError,
     "query: EXPLAIN ANALYZE runs the statement; use EXPLAIN"),
    ("EXPLAIN of a write", lambda w: w.db.sql("explain DELETE FROM experience_rows"),
     ValidationError, "query: only read-only queries are allowed .*, got DELETE"),
    ("two statements", lambda w: w.db.sql("SELECT 1; DROP TABLE meta"), ValidationError,
     "query: give exactly one statement, got 2"),
    ("context for a missing collective",
     lambda w: w.db.get_context_candidates(collective_id=MISSING, text="x"), NotFoundError,
     f"collective_id: no collective {MISSING}"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "message"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
async def test_bad_input_is_refused_and_changes_nothing(
    world: World, call: Call, error: type[Exception], message: str
) -> None:
    before = (await world.db.digest(), await world.db.log.last_seq())
    activities = await world.db.get_active_agents(world.a)
    with pytest.raises(error, match=message):
        await call(world)
    assert (await world.db.digest(), await world.db.log.last_seq()) == before
    assert await world.db.get_active_agents(world.a) == activities


async def test_every_limit_of_the_data_model_has_a_case() -> None:
    """The table of docs/architecture.md, field by field: a limit without a case fails here."""
    covered = " ".join(message for _, _, _, message in CASES)
    for field in (
        "owner_id", "name", "embedding_dimension", "content", "embedding", "importance",
        "confidence", "domain", "related_files", "source_agent", "severity", "immutable",
        "relation_type", "source_id", "target_id", "strength", "metadata", "triple",
        "source_experiences", "task_description", "working_on", "stale_after", "category",
        "embedder",
    ):  # fmt: skip
        assert re.search(re.escape(field), covered), field


async def test_valid_values_at_the_limits_are_accepted(world: World) -> None:
    db = world.db
    eid = await db.record_experience(
        world.a, "é" * (50 * KB), [1.0, 0, 0], importance=1.0, confidence=0.0,
        domain=[f"{i:0>100}" for i in range(50)], related_files=["f" * 500] * 100,
        source_agent="a" * 256,
        experience_type=ev.Difficulty(description="hard", severity="Critical"),
    )  # fmt: skip
    stored = await db.get_experience(eid)
    assert stored is not None and len(stored.domain) == 50 and stored.importance == 1.0
    assert stored.experience_type == ev.Difficulty(description="hard", severity="Critical")
    rid = await db.store_relation(eid, world.e1, "Elaborates", strength=1.0, metadata="m" * 10 * KB)
    related = await db.get_related_experiences(eid, "outgoing")
    assert [r.relation.relation_id for r in related] == [rid]
    await db.update_experience(eid, importance=0.0, domain=[])
    updated = await db.get_experience(eid)
    assert updated is not None and updated.importance == 0.0 and updated.domain == ()
    assert updated.content == stored.content  # immutable fields kept

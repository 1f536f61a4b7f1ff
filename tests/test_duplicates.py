"""One memory per lesson, if the collective wants it (``on_duplicate``): a new experience
close to a live one of the same type and visibility, by the same owner, is kept
("keep"), reinforces that one ("reinforce") or is recorded and related to it ("link");
a collective's setting and a call's own, single and batch writes, decided by the writer
and the same on every host, on a real embedded NATS (two hosts writing the same lesson
at once converge)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import numpy as np
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from eventlog import EmbeddedNats, ValidationError
from ops.remote import RemotePulseDB
from sync import PulseDB
from tests.harness import Service, eventually, pulse

LESSON = "Retry NATS publishes with the same message id after a timeout"
OTHER = "Compact the DuckDB file after a large delete to give the space back"


@pytest.fixture
async def db(tmp_path: Path, nats_server: EmbeddedNats) -> AsyncIterator[PulseDB]:
    instance = await PulseDB.open(tmp_path / "db", nats_server.url)
    yield instance
    await instance.close()


async def _lessons(db: PulseDB, cid: UUID) -> dict[UUID, int]:
    """Each live experience of a collective, and its applications."""
    return {e.experience_id: e.applications for e in await db.list_experiences(cid, limit=1000)}


async def test_reinforce_counts_the_lesson_once_and_returns_its_id(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", embedder="hash", on_duplicate="reinforce")
    shown = await db.get_collective(cid)
    assert shown is not None and shown.on_duplicate == "reinforce"
    assert shown.duplicate_similarity == 0.95
    first = await db.record_experience(cid, LESSON)
    assert first.outcome == "recorded" and first.duplicate_of is None  # type: ignore[attr-defined]
    again = await db.record_experience(cid, LESSON)
    assert again == first and again.outcome == "reinforced"  # type: ignore[attr-defined]
    assert again.duplicate_of == first  # type: ignore[attr-defined]
    third = await db.record_experience(cid, LESSON)
    assert third == first
    assert await _lessons(db, cid) == {first: 2}
    # not a duplicate: another lesson, another type, another visibility, a call that keeps
    assert (await db.record_experience(cid, OTHER)).outcome == "recorded"  # type: ignore[attr-defined]
    fact = {"kind": "Fact", "statement": "s", "source": "t"}
    assert await db.record_experience(cid, LESSON, experience_type=fact) != first
    assert await db.record_experience(cid, LESSON, visibility="org") != first
    kept = await db.record_experience(cid, LESSON, on_duplicate="keep")
    assert kept != first and kept.outcome == "recorded"  # type: ignore[attr-defined]
    assert len(await _lessons(db, cid)) == 5


async def test_only_the_same_owners_live_valid_experiences_are_duplicated(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", embedder="hash", on_duplicate="reinforce")
    token = await db.create_token("p", scope="write")
    theirs = await db.create_collective("p", "theirs", embedder="hash", on_duplicate="reinforce")
    with db.acting_as(token.token):
        mine = await db.record_experience(theirs, LESSON)
    first = await db.record_experience(theirs, LESSON, visibility="team")  # the operator's
    assert first != mine  # another owner's lesson is not this one's duplicate
    archived = await db.record_experience(cid, OTHER)
    await db.archive_experience(archived)
    assert await db.record_experience(cid, OTHER) != archived
    invalid = await db.record_experience(cid, LESSON)
    await db.invalidate_experience(invalid, "no longer true")
    fresh = await db.record_experience(cid, LESSON)
    assert fresh != invalid and fresh.outcome == "recorded"  # type: ignore[attr-defined]


async def test_a_private_lesson_is_only_its_authors_duplicate(db: PulseDB) -> None:
    """Another agent of the same owner cannot see a private experience: its duplicate
    neither reinforces it nor learns its id (a team one it sees, and reinforces)."""
    cid = await db.create_collective("o", "c", embedder="hash", on_duplicate="reinforce")
    a = await db.create_token("o", scope="write", agent_id="a")
    b = await db.create_token("o", scope="write", agent_id="b")
    with db.acting_as(a.token):
        private = await db.record_experience(cid, LESSON, visibility="private")
        team = await db.record_experience(cid, OTHER)
        assert await db.record_experience(cid, LESSON, visibility="private") == private
    with db.acting_as(b.token):
        own = await db.record_experience(cid, LESSON, visibility="private")
        assert own != private and own.outcome == "recorded"  # type: ignore[attr-defined]
        assert await db.record_experience(cid, OTHER) == team


async def test_link_records_the_new_one_and_relates_it(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", embedding_dimension=3, on_duplicate="link",
                                     duplicate_similarity=0.9)  # fmt: skip
    first = await db.record_experience(cid, "a", embedding=[1.0, 0.0, 0.0])
    close = await db.record_experience(cid, "a'", embedding=[0.99, 0.1, 0.0])  # 0.995
    far = await db.record_experience(cid, "b", embedding=[0.6, 0.8, 0.0])  # 0.6
    assert close.outcome == "linked" and close.duplicate_of == first  # type: ignore[attr-defined]
    assert far.outcome == "recorded"  # type: ignore[attr-defined]
    related = await db.get_related_experiences(close)
    assert [(r.experience.experience_id, r.relation.relation_type) for r in related] == [
        (first, "RelatedTo")
    ]
    assert set(await _lessons(db, cid)) == {first, close, far}
    # a call's own choice over the collective's
    same = await db.record_experience(cid, "a", embedding=[1.0, 0.0, 0.0], on_duplicate="reinforce")
    assert same == first and same.outcome == "reinforced"  # type: ignore[attr-defined]


async def test_a_similarity_of_one_takes_the_same_vector_for_a_duplicate(db: PulseDB) -> None:
    """A vector's cosine with itself, in float32, may be 0.99999994: 1.0 still means the
    same vector, in the memory and within a batch."""
    cid = await db.create_collective("o", "c", embedding_dimension=16, on_duplicate="reinforce",
                                     duplicate_similarity=1.0)  # fmt: skip
    vectors = np.random.default_rng(20).standard_normal((20, 16)).tolist()
    firsts = []
    for n, vector in enumerate(vectors):
        firsts.append(await db.record_experience(cid, f"lesson {n}", embedding=vector))
        again = await db.record_experience(cid, f"lesson {n}", embedding=vector)
        assert again == firsts[-1], (n, again.outcome)  # type: ignore[attr-defined]
    batch = await db.record_experiences(cid, [{"content": "b", "embedding": vectors[0]}] * 2)
    assert batch == [firsts[0], firsts[0]]
    assert sorted((await _lessons(db, cid)).values()) == [1] * 19 + [3]


async def test_a_batch_deduplicates_against_the_memory_and_itself(db: PulseDB) -> None:
    cid = await db.create_collective("o", "c", embedder="hash", on_duplicate="reinforce")
    there = await db.record_experience(cid, OTHER)
    got = await db.record_experiences(
        cid,
        [{"content": LESSON}, {"content": LESSON}, {"content": OTHER},
         {"content": "Pin the cytoscape version"}, {"content": LESSON, "on_duplicate": "link"}],
    )  # fmt: skip
    outcomes = [g.outcome for g in got]  # type: ignore[attr-defined]
    assert outcomes == ["recorded", "reinforced", "reinforced", "recorded", "linked"]
    assert got[1] == got[0] and got[2] == there
    assert got[4].duplicate_of == got[0]  # type: ignore[attr-defined]
    lessons = await _lessons(db, cid)
    assert lessons == {there: 1, got[0]: 1, got[3]: 0, got[4]: 0}


async def test_bad_choices_are_refused_naming_the_field(db: PulseDB) -> None:
    with pytest.raises(ValidationError, match="on_duplicate"):
        await db.create_collective("o", "c", embedder="hash", on_duplicate="merge")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="duplicate_similarity"):
        await db.create_collective("o", "c", embedder="hash", duplicate_similarity=1.5)
    with pytest.raises(ValidationError, match="duplicate_similarity"):
        await db.create_collective("o", "c", embedder="hash", duplicate_similarity=0)
    assert await db.list_collectives() == []
    cid = await db.create_collective("o", "c", embedder="hash")
    with pytest.raises(ValidationError, match="on_duplicate"):
        await db.record_experience(cid, LESSON, on_duplicate="merge")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"items\.0\.on_duplicate"):
        await db.record_experiences(cid, [{"content": LESSON, "on_duplicate": "merge"}])
    assert await _lessons(db, cid) == {}


async def test_a_keyed_call_retried_elsewhere_finds_what_it_recorded_not_a_duplicate(
    tmp_path: Path, db: PulseDB, nats_server: EmbeddedNats
) -> None:
    """A retry with the idempotency key of a call whose answer was lost: its own first
    record is no duplicate of itself (nothing reinforced twice, no relation to itself)."""
    reinforcing = await db.create_collective("o", "r", embedder="hash", on_duplicate="reinforce")
    linking = await db.create_collective("o", "l", embedder="hash", on_duplicate="link")
    other = await PulseDB.open(tmp_path / "other", nats_server.url)
    try:
        for cid, key in ((reinforcing, "retried-r"), (linking, "retried-l")):
            first = await db.record_experience(cid, LESSON, idempotency_key=key)
            await eventually(lambda: other.applied_seq >= db.applied_seq, what="caught up")
            again = await other.record_experience(cid, LESSON, idempotency_key=key)
            assert again == first and again.outcome == "recorded"  # type: ignore[attr-defined]
            assert await _lessons(other, cid) == {first: 0}
            assert await other.get_related_experiences(first) == []
        # a batch too
        items = [{"content": LESSON}, {"content": LESSON}]
        made = await db.record_experiences(reinforcing, items, idempotency_key="batch")
        await eventually(lambda: other.applied_seq >= db.applied_seq, what="caught up")
        retried = await other.record_experiences(reinforcing, items, idempotency_key="batch")
        assert retried == made
        assert sum((await _lessons(other, reinforcing)).values()) == 2
    finally:
        await other.close()


async def test_two_hosts_writing_the_same_lesson_at_once_converge(
    tmp_path: Path, db: PulseDB, nats_server: EmbeddedNats
) -> None:
    """Each call either records the lesson or counts one application of it, and every
    host holds the same: the same experiences, the same counts, the same digest."""
    cid = await db.create_collective("o", "c", embedder="hash", on_duplicate="reinforce")
    other = await PulseDB.open(tmp_path / "other", nats_server.url)
    try:
        await eventually(lambda: other.applied_seq >= db.applied_seq, what="catch-up")
        calls = 12

        async def write(host: PulseDB) -> list[UUID]:
            return list(await asyncio.gather(*(host.record_experience(cid, LESSON)
                                               for _ in range(calls))))  # fmt: skip

        here, there = await asyncio.gather(write(db), write(other))
        await eventually(lambda: other.applied_seq == db.applied_seq, what="both applied all")
        lessons = await _lessons(db, cid)
        assert lessons == await _lessons(other, cid)
        assert sum(1 + n for n in lessons.values()) == 2 * calls  # nothing lost or doubled
        assert set(here) | set(there) == set(lessons)
        # one host never records a lesson twice (its calls wait for each other); once it
        # has seen both, it reinforces the least id
        for written in (here, there):
            assert [r.outcome for r in written].count("recorded") <= 1  # type: ignore[attr-defined]
        assert await db.digest(cid) == await other.digest(cid)
        # the next write reinforces the closest of them, the least id of equals, anywhere
        assert await other.record_experience(cid, LESSON) == min(lessons)
    finally:
        await other.close()


async def test_every_surface_says_what_a_record_did(shared_service: Service) -> None:
    """Over `pulse up`: HTTP (the fast path and the routes) in headers, the Python
    client, MCP's remember and the command line."""
    async with shared_service.client() as client:
        made = await client.post("/v1/create_collective", json={
            "owner_id": "dup", "name": "surfaces", "embedder": "hash",
            "on_duplicate": "reinforce"})  # fmt: skip
        assert made.status_code == 200, made.text
        cid = made.json()
        first = await client.post("/v1/record_experience",
                                  json={"collective_id": cid, "content": LESSON})  # fmt: skip
        assert first.headers["pulse-outcome"] == "recorded"
        assert "pulse-duplicate-of" not in first.headers
        again = await client.post("/v1/record_experience",
                                  json={"collective_id": cid, "content": LESSON})  # fmt: skip
        assert again.json() == first.json()
        assert again.headers["pulse-outcome"] == "reinforced"
        assert again.headers["pulse-duplicate-of"] == first.json()
        # a query the fast path leaves to the framework's routes: the same headers
        routed = await client.post(
            "/v1/record_experience", params=[("format", "json"), ("format", "json")],
            json={"collective_id": cid, "content": LESSON, "on_duplicate": "link"},
        )  # fmt: skip
        assert routed.headers["pulse-outcome"] == "linked", routed.text
        assert routed.headers["pulse-duplicate-of"] == first.json()
        batch = await client.post("/v1/record_experiences", json={
            "collective_id": cid, "items": [{"content": OTHER}, {"content": LESSON}]})  # fmt: skip
        assert batch.headers["pulse-outcomes"] == "recorded,reinforced"
        assert batch.json()[1] == first.json()
        # MCP's remember says it in its answer
        async with (
            shared_service.mcp_client() as http,
            streamable_http_client(f"{shared_service.url}/mcp", http_client=http) as (r, w, _),
            ClientSession(r, w) as session,
        ):
            await session.initialize()
            said = await session.call_tool("remember", {"collective": cid, "content": LESSON})
            assert not said.isError, said
            answer = json.loads(said.content[0].text)  # type: ignore[union-attr]
            assert answer == {"experience_id": first.json(), "outcome": "reinforced",
                              "duplicate_of": first.json()}  # fmt: skip
    # the Python client reads the headers
    remote = RemotePulseDB.from_data_dir(shared_service.data_dir)
    try:
        got = await remote.record_experience(UUID(cid), LESSON)
        assert str(got) == first.json() and got.outcome == "reinforced"
        many = await remote.record_experiences(UUID(cid), [{"content": "A new lesson here"}])
        assert [m.outcome for m in many] == ["recorded"]
    finally:
        await remote.close()
    # the command line, through the running service
    shown = pulse("record", "-c", cid, LESSON, "--json", data_dir=shared_service.data_dir)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"experience_id": first.json(), "outcome": "reinforced",
                                        "duplicate_of": first.json()}  # fmt: skip
    plain = pulse("record", "-c", cid, LESSON, data_dir=shared_service.data_dir)
    assert plain.stdout.strip() == f"{first.json()} (reinforced: a duplicate of {first.json()})"
    linked = pulse("collective", "create", "linked", "--owner", "dup", "--embedder", "hash",
                   "--on-duplicate", "link", "--duplicate-similarity", "0.9", "--json",
                   data_dir=shared_service.data_dir)  # fmt: skip
    assert linked.returncode == 0, linked.stderr
    async with shared_service.client() as client:
        made_id = json.loads(linked.stdout)["collective_id"]
        settings = await client.post("/v1/get_collective", json={"collective_id": made_id})
        assert settings.json()["on_duplicate"] == "link"
        assert settings.json()["duplicate_similarity"] == 0.9


def test_the_benchmark_runs_small() -> None:
    """`python -m ops.bench.duplicates` (docs/benchmarks.md), at a size a test affords:
    every figure, each beside the fixed-English peer and the raw publish."""
    ran = subprocess.run(
        [sys.executable, "-m", "ops.bench.duplicates", "--size", "40", "--writes", "4"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    figures = {line["figure"]: line for line in map(json.loads, ran.stdout.splitlines())}
    assert list(figures) == ["english", "auto", "reinforce, new", "reinforce, duplicate",
                             "link, duplicate", "raw publish"]  # fmt: skip
    assert figures["english"]["vs_english"] == 1.0
    assert all(f["p50_ms"] > 0 and f["vs_raw"] > 0 for f in figures.values())
    assert "p50 vs raw" in ran.stderr

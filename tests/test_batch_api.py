"""record_experiences, the batch write, through every door: the Python API, the blocking
facade, plain HTTP JSON and the remote client. The ids come back in the order of the
items and are readable at once; a refusal names the item and the field, and neither the
state nor the log changes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import numpy as np
import pytest
import pytest_asyncio

from eventlog import ValidationError
from ops.remote import API_METHODS, RemotePulseDB
from sync import PulseDB, PulseDBSync
from tests.harness import Service

in_module_loop = pytest.mark.asyncio(loop_scope="module")


def note(n: int, **fields: Any) -> dict[str, Any]:
    return {"content": f"note {n}", "embedding": [1.0, float(n), 0.5], **fields}


def notes(count: int, changed: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """``count`` valid items, with the fields of ``changed[index]`` replacing an item's."""
    items = [note(n) for n in range(count)]
    for index, fields in (changed or {}).items():
        items[index] = {**items[index], **fields}
    return items


@dataclass
class World:
    db: PulseDB
    a: UUID  # "alpha": 3-d, callers bring vectors
    t: UUID  # "texts": the hash embedder, content alone is enough


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    db = await PulseDB.open(Path(tmp_path_factory.mktemp("batch")))
    try:
        a = await db.create_collective("owner", "alpha", 3)
        t = await db.create_collective("owner", "texts", embedder="hash")
        yield World(db, a, t)
    finally:
        await db.close()


@in_module_loop
async def test_ids_come_back_in_order_and_are_read_at_once(world: World) -> None:
    items = [note(n, domain=[f"d{n % 3}"], importance=n / 300) for n in range(300)]
    items[5]["experience_type"] = {"kind": "Solution", "approach": "retry", "worked": True}
    ids = await world.db.record_experiences(world.a, items)
    assert len(ids) == len(set(ids)) == 300
    for eid, item in zip(ids, items, strict=True):  # no waiting: applied before the return
        found = await world.db.get_experience(eid)
        assert found is not None and found.collective_id == world.a
        assert (found.content, found.domain, found.importance) == (
            item["content"], tuple(item["domain"]), item["importance"]
        )  # fmt: skip
    solution = await world.db.get_experience(ids[5])
    assert solution is not None and type(solution.experience_type).__name__ == "Solution"

    texts = await world.db.record_experiences(
        world.t, [{"content": "only text"}, {"content": "more text", "source_agent": "bot"}]
    )
    stored = [await world.db.get_experience(eid) for eid in texts]
    assert [(e.content, e.source_agent, len(e.embedding)) for e in stored if e] == [
        ("only text", "agent", 384 * 4), ("more text", "bot", 384 * 4)  # embedded here
    ]  # fmt: skip


Call = Callable[[World], Awaitable[Any]]

REFUSALS: list[tuple[str, Call, str]] = [
    ("1,001 items", lambda w: w.db.record_experiences(w.a, notes(1001)),
     "items: must hold 1..1000 experiences, got 1001"),
    ("no items", lambda w: w.db.record_experiences(w.a, []),
     "items: must hold 1..1000 experiences, got 0"),
    ("importance 2 at index 7",
     lambda w: w.db.record_experiences(w.a, notes(10, {7: {"importance": 2}})),
     r"^items\.7\.importance: Input should be less than or equal to 1 \(got 2\)$"),
    ("a wrong-length embedding at index 3",
     lambda w: w.db.record_experiences(w.a, notes(5, {3: {"embedding": [1.0, 0.0]}})),
     r"^items\.3\.embedding: 2 values, collective 'alpha' has dimension 3"),
    ("text only at index 4 without an embedder",
     lambda w: w.db.record_experiences(w.a, notes(6, {4: {"embedding": None}})),
     r"^items\.4\.embedding: required, collective 'alpha' has no embedder"),
    ("an unknown field at index 2",
     lambda w: w.db.record_experiences(w.a, notes(3, {2: {"colour": "red"}})),
     r"^items\.2\.colour: is not a field of this input$"),
    ("empty content at the last index",
     lambda w: w.db.record_experiences(w.a, notes(1000, {999: {"content": ""}})),
     r"^items\.999\.content: must be 1 byte"),
    ("two bad items: both named",
     lambda w: w.db.record_experiences(
         w.a, notes(4, {1: {"confidence": -1}, 3: {"importance": 7}})),
     r"^items\.1\.confidence: .*; items\.3\.importance: "),
]  # fmt: skip


@in_module_loop
@pytest.mark.parametrize(
    ("call", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
async def test_a_refused_batch_changes_nothing(world: World, call: Call, message: str) -> None:
    before = (await world.db.digest(), await world.db.log.last_seq())
    with pytest.raises(ValidationError, match=message):
        await call(world)
    assert (await world.db.digest(), await world.db.log.last_seq()) == before


def test_the_blocking_facade(tmp_path: Path) -> None:
    with PulseDBSync.open(tmp_path / "sync") as db:
        cid = db.create_collective("owner", "alpha", 3)
        ids = db.record_experiences(cid, notes(20))
        assert [db.get_experience(eid).content for eid in ids] == [f"note {n}" for n in range(20)]
        before = (db.digest(), db.get_collective_stats(cid).experiences)
        with pytest.raises(ValidationError, match=r"items\.7\.importance"):
            db.record_experiences(cid, notes(10, {7: {"importance": 2}}))
        assert (db.digest(), db.get_collective_stats(cid).experiences) == before


# -- over HTTP ----------------------------------------------------------------------------------


async def test_over_http_and_through_the_remote_client(service: Service) -> None:
    assert "record_experiences" in API_METHODS
    async with service.client() as client:

        async def post(method: str, **body: Any) -> httpx.Response:
            return await client.post(f"/v1/{method}", json=body)

        async def unchanged() -> tuple[str, int]:
            digest = (await post("digest")).json()
            return digest, (await client.get("/health")).json()["stream_seq"]

        cid = (await post("create_collective", owner_id="o", name="alpha",
                          embedding_dimension=3)).json()  # fmt: skip
        made = await post("record_experiences", collective_id=cid, items=notes(50))
        assert made.status_code == 200, made.text
        ids = made.json()
        assert len(ids) == 50
        for n in (0, 17, 49):
            got = (await post("get_experience", experience_id=ids[n])).json()
            assert got["content"] == f"note {n}"

        before = await unchanged()
        for items, status, message in [
            (notes(10, {7: {"importance": 2}}), 422,
             "items.7.importance: Input should be less than or equal to 1 (got 2)"),
            (notes(1001), 422, "items: must hold 1..1000 experiences, got 1001"),
            (notes(5, {3: {"embedding": [1, 0]}}), 422, "items.3.embedding: 2 values"),
        ]:  # fmt: skip
            refused = await post("record_experiences", collective_id=cid, items=items)
            assert refused.status_code == status, refused.text
            assert refused.json()["error"] == "ValidationError"
            assert message in refused.json()["message"]
        assert await unchanged() == before

    remote = RemotePulseDB.from_data_dir(service.data_dir)  # (as the operator)
    try:
        items = notes(30)
        items[4]["embedding"] = np.array([0.0, 1.0, 0.0], dtype=np.float32)  # numpy travels too
        ids = await remote.record_experiences(UUID(cid), items)
        assert all(isinstance(eid, UUID) for eid in ids) and len(ids) == 30
        found = [await remote.get_experience(eid) for eid in ids]
        assert [e.content for e in found] == [f"note {n}" for n in range(30)]
        with pytest.raises(ValidationError, match=re.escape("items.7.importance")):
            await remote.record_experiences(UUID(cid), notes(10, {7: {"importance": 2}}))
        stats = await remote.get_collective_stats(UUID(cid))
        assert stats.experiences == 80
    finally:
        await remote.close()


@in_module_loop
async def test_every_bad_vector_of_a_batch_is_named(world: World) -> None:
    """Vectors are checked against the collective after the fields: every item with a
    wrong dimension is named, not just the first."""
    items: list[dict[str, object]] = [
        {"content": f"n{i}", "embedding": [1.0, 0.0, 0.0]} for i in range(6)
    ]
    items[1]["embedding"] = [1.0, 0.0]
    items[4]["embedding"] = [1.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValidationError) as refused:
        await world.db.record_experiences(world.a, items)
    assert "items.1.embedding: 2 values" in str(refused.value)
    assert "items.4.embedding: 4 values" in str(refused.value)

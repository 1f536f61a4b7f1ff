"""Forgetting: a delete removes the content and embedding from the log itself (purge by
subject), from every host's tables and indexes, and a rebuild does not bring it back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eventlog import EmbeddedNats
from eventlog.errors import NotFoundError
from projections.projection import Projection, ProjectionSettings
from sync import PulseDB
from tests.harness import raw_payloads

SECRET = "the vault combination is zebra-4417"
SECRET_VECTOR = [0.11, -0.42, 0.89, 0.05]


async def holds_secret(db: PulseDB) -> list[str]:
    """Where this host still keeps the secret: memory, tables, vector indexes, full text
    (looked at on the engine thread, DuckDB flushed first)."""
    return await db.engine.run(_places_of_secret)


def _places_of_secret(p: Projection) -> list[str]:
    places = []
    p.flush()
    for row in [*p.memory.experiences.values(), *p.memory.insights.values()]:
        if "zebra" in (row.content or ""):
            places.append(f"memory {type(row).__name__}")
    con = p.store.con
    for table, column in (("experience_rows", "content"), ("insight_rows", "content")):
        row = con.execute(f"SELECT count(*) FROM {table} WHERE {column} LIKE '%zebra%'").fetchone()
        if row and row[0]:
            places.append(table)
    target = np.asarray(SECRET_VECTOR, dtype=np.float32)
    target /= np.linalg.norm(target)
    for key, index in p.vectors.items():
        _, stored = index.stored()
        norms = np.linalg.norm(stored, axis=1)
        if np.any((stored @ target) > 0.99 * np.maximum(norms, 1e-9)):
            places.append(f"faiss {key}")
    for dim, exact in p.exact.items():  # the memory-mapped exact vectors, read from disk
        exact.sync()
        if dim == len(target):
            on_disk = np.fromfile(exact.path, dtype=np.float32).reshape(-1, dim)
            norms = np.linalg.norm(on_disk, axis=1)
            if np.any((on_disk @ target) > 0.999 * np.maximum(norms, 1e-9)):
                places.append(f"exact vectors {exact.path.name}")
    p.text.commit()
    for kind in ("experience", "insight"):
        for cid in {k[1] for k in p.vectors}:
            if p.text.search(kind, cid, "zebra", 10):
                places.append(f"tantivy {kind}")
    return places


async def test_a_deleted_experience_is_gone_from_the_log_every_host_and_a_rebuild(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    small_hnsw = ProjectionSettings(hnsw_threshold=2)  # host b keeps an HNSW graph
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url, projection_settings=small_hnsw)
    try:
        cid = await a.create_collective("owner", "team", 4)
        keep = [await a.record_experience(cid, f"note {i}", [1, i, 0, 0]) for i in range(4)]
        secret = await a.record_experience(cid, SECRET, SECRET_VECTOR, domain=["ops"])
        await a.update_experience(secret, importance=0.9)
        await a.reinforce_experience(secret)
        await a.store_relation(secret, keep[0], "Supports")
        await b.reinforce_experience(secret)
        await b.sync()
        assert await holds_secret(a) and await holds_secret(
            b
        )  # the checks can see it when it is there
        on_stream = await raw_payloads(a.log)
        assert not any("zebra" in p for p in on_stream)  # sealed on the log (eventlog.sealing)
        assert any(str(secret) in p and "experience.recorded" in p for p in on_stream)

        await b.delete_experience(secret)
        await a.sync()

        on_stream = await raw_payloads(a.log)
        assert not any(str(secret) in p and "experience.recorded" in p for p in on_stream)
        for db in (a, b):
            assert await holds_secret(db) == []
            assert await db.get_experience(secret) is None
            assert await db.search_text(cid, "zebra") == []
            hits = await db.search_similar(cid, SECRET_VECTOR, k=10)
            assert secret not in {h.experience.experience_id for h in hits}
            assert await db.get_related_experiences(keep[0]) == []
            stats = await db.get_collective_stats(cid)
            assert (stats.experiences, stats.relations, stats.applications) == (4, 0, 0)
        digest = await a.digest()
        assert await b.digest() == digest
    finally:
        await a.close()
        await b.close()

    # a third host built from the log alone, and a rebuild of the first: same state
    c = await PulseDB.open(tmp_path / "c", nats_server.url)
    try:
        assert await c.digest() == digest and await holds_secret(c) == []
    finally:
        await c.close()
    from eventlog import JetStreamLog
    from projections.rebuild import rebuild

    log = await JetStreamLog.connect(nats_server.url)
    try:
        _, rebuilt = await rebuild(tmp_path / "a", log)
    finally:
        await log.close()
    assert rebuilt == digest


async def test_a_deleted_collective_leaves_only_its_tombstone(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    b = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        gone = await a.create_collective("owner", "gone", 4)
        stays = await a.create_collective("owner", "stays", 4)
        e = await a.record_experience(gone, SECRET, SECRET_VECTOR)
        other = await a.record_experience(gone, "another note", [0, 1, 0, 0])
        await a.store_relation(e, other, "Implies")
        await a.store_insight(gone, "zebra insight", SECRET_VECTOR, source_experiences=[e])
        await a.reinforce_experience(e)
        kept = await a.record_experience(stays, "unrelated", [0, 0, 1, 0])
        await a.register_activity(gone, "agent-z", "working on the zebra vault")
        await b.sync()

        await b.delete_collective(gone)
        await b.delete_collective(gone)  # repeating is harmless
        await a.sync()

        assert await a.log.latest_activities(gone) == []  # presence goes too
        payloads = await raw_payloads(a.log)
        assert not any("zebra" in p or "another note" in p for p in payloads)
        assert sum("CollectiveDeleted" in p for p in payloads) == 1  # the last tombstone
        assert sum("ExperienceDeleted" in p for p in payloads) == 2  # one per experience
        for db in (a, b):
            assert await holds_secret(db) == []
            assert [c.name for c in await db.list_collectives()] == ["stays"]
            assert await db.get_collective(gone) is None
            assert not await db.engine.run(lambda p: ("experience", gone) in p.vectors)
            assert await db.get_experience(kept) is not None
            await db.engine.flush()
            cursor, _ = await db.engine.cursor()
            count = cursor.execute(
                "SELECT (SELECT count(*) FROM experience_rows WHERE collective_id = $c"
                "        AND (NOT deleted OR content IS NOT NULL))"
                " + (SELECT count(*) FROM relation_rows WHERE collective_id = $c AND NOT deleted)"
                " + (SELECT count(*) FROM insight_rows WHERE collective_id = $c"
                "    AND (NOT deleted OR content IS NOT NULL))"
                " + (SELECT count(*) FROM application_rows WHERE collective_id = $c)",
                {"c": gone},
            ).fetchone()
            db.engine.returned(cursor)
            assert count == (0,)  # only wiped tombstone rows are left
        assert await a.digest() == await b.digest()
    finally:
        await a.close()
        await b.close()
    c = await PulseDB.open(tmp_path / "c", nats_server.url)
    try:
        assert await c.digest() == await _digest_of(tmp_path / "a", nats_server)
    finally:
        await c.close()


async def _digest_of(path: Path, server: EmbeddedNats) -> str:
    db = await PulseDB.open(path, server.url)
    try:
        return await db.digest()
    finally:
        await db.close()


async def test_a_batch_landing_after_its_collectives_tombstone_is_forgotten_whole(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    """Checked before another host's delete was applied here, a batch lands after the
    tombstone: every one of its experiences leaves the stream, then the caller hears."""
    from eventlog import events as ev
    from sync import models
    from sync.experiences import _recorded

    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        cid = await db.create_collective("o", "doomed", 4)
        await db.log.append(ev.CollectiveDeleted(**db.writer.common(), collective_id=cid))
        await db.sync()  # the tombstone another host wrote is applied here
        specs = [
            models.ExperienceIn(collective_id=cid, content=f"zebra {i}", embedding=[1, 0, 0, 0])
            for i in range(5)
        ]
        writer = db.writer
        late = [_recorded(writer.common(), writer.new_id(), spec, spec.embedding) for spec in specs]
        with pytest.raises(NotFoundError, match="was deleted .and 4 more of the batch"):
            await db.writer.write_many(late, atomic=True)  # as record_experiences does
        assert not any("zebra" in p for p in await raw_payloads(db.log))
    finally:
        await db.close()


@pytest.mark.parametrize("what", ["experience", "collective"])
async def test_a_delete_killed_before_its_purge_is_finished_when_the_host_opens(
    nats_server: EmbeddedNats, tmp_path: Path, what: str
) -> None:
    """A process SIGKILLed after a delete's tombstone is applied but before the purge:
    the content is still on the stream (so the kill landed where it should), the purge
    it owed is on record, and opening the instance again finishes it."""
    import json
    import subprocess
    import sys

    from eventlog import JetStreamLog

    worker = subprocess.run(
        [sys.executable, "-m", "tests.forget_worker", str(tmp_path / "host"), nats_server.url,
         what, SECRET],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    assert worker.returncode == -9, worker.stderr
    ids = json.loads(worker.stdout.splitlines()[0])
    log = await JetStreamLog.connect(nats_server.url)
    try:

        def record_of(payloads: list[str]) -> bool:  # the secret's record (sealed)
            return any(ids["experience"] in p and "experience.recorded" in p for p in payloads)

        assert record_of(await raw_payloads(log))
        assert (tmp_path / "host" / "owed-purges.json").read_text() != "{}"

        db = await PulseDB.open(tmp_path / "host", nats_server.url)
        try:
            assert not record_of(await raw_payloads(log))
            assert json.loads((tmp_path / "host" / "owed-purges.json").read_text()) == {}
            assert await db.get_experience(ids["experience"]) is None
            assert await holds_secret(db) == []
        finally:
            await db.close()
    finally:
        await log.close()

"""Languages per document: in a collective of "auto" (the default), whatever its name,
each experience's and insight's text is analyzed in the language its writer detected
from it (recorded in its event, shown in SQL and by the API), and a query in every
language its own text could be; on a real embedded NATS, with a second host that builds
its state from the log alone, a member's restricted search, and a deployment written by
the release before, upgraded."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
import pytest

from eventlog import EmbeddedNats, JetStreamLog
from eventlog import events as ev
from eventlog.codec import HDR_EVENT_TYPE, HDR_MSG_ID, HDR_SCHEMA, encode_body
from eventlog.ids import uuid7
from eventlog.subjects import subject_for
from projections.language import of_query, of_text
from projections.projection import state_dir
from projections.store import Store
from sync import PulseDB
from tests.harness import eventually

# (text, what it is written in, queries in other forms of its words)
MIXED = [
    ("Перезапускати публікацію NATS після тайм-ауту з тим самим Nats-Msg-Id",
     "ukrainian", ["публікації", "публікація після тайм-ауту"]),
    ("Переподключение к базе данных после сбоя занимает до тридцати секунд",
     "russian", ["переподключения к базам", "сбои базы"]),
    ("Die Datenbankverbindungen müssen nach jedem Neustart des Dienstes geprüft werden",
     "german", ["Datenbankverbindung prüfen", "Neustarts"]),
    ("数据库连接池在服务重启后需要重新初始化，否则请求会超时",
     "chinese", ["连接池", "重新初始化数据库"]),
    ("Retry NATS publishes with the same message id after a timeout",
     "english", ["retrying publishing", "timeouts"]),
]  # fmt: skip


@pytest.fixture
async def db(tmp_path: Path, nats_server: EmbeddedNats) -> AsyncIterator[PulseDB]:
    instance = await PulseDB.open(tmp_path / "db", nats_server.url)
    yield instance
    await instance.close()


async def _top(db: PulseDB, cid: UUID, query: str, k: int = 3) -> list[UUID]:
    hits = await db.search_text(cid, query, k=k)
    return [hit.experience.experience_id for hit in hits]


async def test_a_latin_named_default_collective_finds_inflected_words_of_every_language(
    tmp_path: Path, db: PulseDB, nats_server: EmbeddedNats
) -> None:
    cid = await db.create_collective("o", "team-notes", embedder="hash")  # the defaults
    assert (await db.get_collective(cid)).language == "auto"  # type: ignore[union-attr]
    ids = await db.record_experiences(cid, [{"content": text} for text, _, _ in MIXED])
    one = await db.record_experience(cid, "Кеш інвалідувати після кожного деплою сервісу")
    # each text's language is recorded in its event (the row's is the event's alone: a
    # text recorded without one shows None, test_an_old_collective_...), shown by the API
    # and in SQL
    expected = [language for _, language, _ in MIXED]
    shown = [await db.get_experience(i) for i in ids]
    assert [e and e.language for e in shown] == expected
    rows = await db.sql(
        f"SELECT experience_id, language FROM experiences WHERE collective_id = '{cid}'"
    )
    shown_in_sql = {UUID(str(r[0])): r[1] for r in rows.rows}
    assert shown_in_sql == {**dict(zip(ids, expected, strict=True)), one: "ukrainian"}
    # an insight's text too
    insight = await db.store_insight(
        cid, "Die Verbindungen zur Datenbank brechen nach jedem Neustart ab",
        source_experiences=[ids[2]],
    )  # fmt: skip
    said = await db.sql(f"SELECT language FROM insights WHERE insight_id = '{insight}'")
    assert said.rows == [["german"]]
    for eid, (_, language, queries) in zip(ids, MIXED, strict=True):
        for query in queries:
            assert eid in await _top(db, cid, query), (language, query)
    assert one in await _top(db, cid, "інвалідувати кеші")
    # a second host reads the languages from the log, and finds the same
    other = await PulseDB.open(tmp_path / "other", nats_server.url)
    try:
        await eventually(lambda: other.applied_seq >= db.applied_seq, what="catch-up")
        for eid, (_, _, queries) in zip(ids, MIXED, strict=True):
            assert eid in await _top(other, cid, queries[0]), queries[0]
    finally:
        await other.close()


async def test_a_members_search_scores_each_document_in_its_own_language(db: PulseDB) -> None:
    """The restricted search (statistics of what the caller may see) counts each
    candidate's terms again, in that candidate's language."""
    cid = await db.create_collective("o", "shared", embedder="hash")
    ids = await db.record_experiences(cid, [{"content": text} for text, _, _ in MIXED])
    token = await db.create_token("o", scope="read", agent_id="reader")
    with db.acting_as(token.token):
        for eid, (_, language, queries) in zip(ids, MIXED, strict=True):
            assert eid in await _top(db, cid, queries[0]), (language, queries[0])


async def test_a_fixed_language_is_kept_and_nothing_is_detected(db: PulseDB) -> None:
    cid = await db.create_collective("o", "english-only", embedder="hash", language="english")
    eid = await db.record_experience(cid, "Перезапускати публікацію NATS після тайм-ауту")
    found = await db.get_experience(eid)
    assert found is not None and found.language == "english"
    # nothing was detected: the row holds no language of its own (its event had none)
    held = await db.engine.run(lambda p: p.memory.experiences[(eid,)].language)
    assert held is None
    assert eid not in await _top(db, cid, "публікації")  # English analysis: no lemma


def test_detection_tells_prose_from_code_and_too_short_from_anything() -> None:
    assert of_text("Хинтер asyncpg: встановити statement_cache_size=0 для PgBouncer у "
                   "транзакційному режимі") == "ukrainian"  # fmt: skip
    assert of_text("fix it") == "simple"  # too short to tell
    assert of_text("foo_bar(x) /var/lib/nats 0x1F") == "simple"  # code, no prose
    assert of_text("服务重启要优雅关闭：先停止接收新请求，K8s 里配 preStop。") == "chinese"
    # a query: every language its text could be, and simple always
    assert {"ukrainian", "russian", "simple"} <= set(of_query("публікації"))
    assert {"english", "german", "simple"} <= set(of_query("Datenbankverbindungen prüfen"))
    assert {"chinese", "simple"} <= set(of_query("连接池"))


# -- an upgrade from the release before (schema 4) -------------------------------------


def _old_common(instance: UUID, n: int) -> dict[str, Any]:
    return {
        "event_id": uuid7(),
        "instance_id": instance,
        "hlc": ev.pack_hlc(time.time_ns() // 1_000_000 - 1000 + n, 0),
    }


async def test_an_old_collective_that_chose_by_its_name_becomes_auto_on_upgrade(
    tmp_path: Path, nats_server: EmbeddedNats, jetstream_log: JetStreamLog
) -> None:
    """The issue's case: `pulse collective create ua` on the release before recorded
    English (its ASCII name); its Ukrainian text was English-analyzed and "публікації"
    found nothing. Read by this release, it is "auto", and the text is found."""
    host, cid = uuid7(), uuid7()
    eid, fixed_cid, fixed_eid = uuid7(), uuid7(), uuid7()
    text = "Перезапускати публікацію NATS після тайм-ауту"
    old = [
        ev.CollectiveCreated(**_old_common(host, 0), collective_id=cid, owner_id="me",
                             name="ua", embedding_dimension=3, language="english"),
        ev.CollectiveCreated(**_old_common(host, 1), collective_id=fixed_cid, owner_id="me",
                             name="de", embedding_dimension=3, language="german"),
    ] + [
        ev.ExperienceRecorded(
            **_old_common(host, 2 + n), experience_id=e, collective_id=c, content=text,
            embedding=ev.pack_vector([1, 0, 0]), experience_type=ev.Generic(),
            importance=0.5, confidence=0.5, source_agent="a",
        )
        for n, (e, c) in enumerate([(eid, cid), (fixed_eid, fixed_cid)])
    ]  # fmt: skip
    for event in old:
        body = msgspec.msgpack.decode(encode_body(event))
        headers = {HDR_MSG_ID: str(event.event_id), HDR_EVENT_TYPE: str(body["type"]),
                   HDR_SCHEMA: "4"}  # fmt: skip
        await jetstream_log.js.publish(
            subject_for(event), msgspec.msgpack.encode(body), headers=headers
        )
    db = await PulseDB.open(tmp_path / "db", nats_server.url)
    try:
        await eventually(lambda: db.applied_seq >= len(old), what="catch-up")
        assert (await db.get_collective(cid)).language == "auto"  # type: ignore[union-attr]
        assert (await db.get_collective(fixed_cid)).language == "german"  # type: ignore[union-attr]
        assert await _top(db, cid, "публікації") == [eid]  # detected on this host
        found = await db.get_experience(eid)
        assert found is not None and found.language is None  # none was recorded
    finally:
        await db.close()


async def test_a_state_of_the_release_before_is_migrated_and_reindexed(
    tmp_path: Path, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """A host's DuckDB and text index made by the release before (schema 8, analysis 1):
    its collective that chose by its name reads "auto" once opened, and its text is
    indexed again, each document in its language, saying so in its log."""
    data = tmp_path / "db"
    db = await PulseDB.open(data, nats_server.url)
    cid = await db.create_collective("o", "ua", embedder="hash")
    eid = await db.record_experience(cid, "Перезапускати публікацію NATS після тайм-ауту")
    await db.close()
    # back to what the release before left: its schema, its rows, its index's stamp
    store = Store(state_dir(data) / "state.duckdb")
    store.con.execute("UPDATE collective_rows SET language = 'english'")
    store.con.execute("UPDATE experience_rows SET language = NULL")
    store.con.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
    store.close()
    stamp = state_dir(data) / "text" / "analysis.txt"
    stamp.write_text(stamp.read_text().replace("pulse-analysis 2", "pulse-analysis 1"))
    caplog.set_level(logging.WARNING, logger="pulse.projection")
    db = await PulseDB.open(data, nats_server.url)
    try:
        assert (await db.get_collective(cid)).language == "auto"  # type: ignore[union-attr]
        assert await _top(db, cid, "публікації") == [eid]
        said = [r.getMessage() for r in caplog.records if r.name == "pulse.projection"]
        assert any("indexing the text of 1 experiences" in m for m in said), said
        assert any("1 documents indexed again" in m for m in said), said
    finally:
        await db.close()


def test_an_index_emptied_while_a_closing_thread_still_writes_a_file_is_emptied(
    tmp_path: Path,
) -> None:
    """The text index of another analysis is emptied at open; a thread of the index
    closed a moment before may still add a file while the directory is removed, which
    `shutil.rmtree` alone reports as "Directory not empty" (seen once in a full run)."""
    import threading

    from projections.text import _emptied

    for round_ in range(20):
        directory = tmp_path / f"text-{round_}"
        directory.mkdir()
        for n in range(200):
            (directory / f"old-{n}").write_bytes(b"x")
        stop = time.monotonic() + 0.03
        writing = threading.Event()

        def straggler(
            where: Path = directory, until: float = stop, started: threading.Event = writing
        ) -> None:
            n = 0
            started.set()
            while time.monotonic() < until:
                try:
                    (where / f"late-{n}").write_bytes(b"x")
                except OSError:
                    pass  # (the directory is gone for a moment)
                n += 1

        thread = threading.Thread(target=straggler)
        thread.start()
        writing.wait()
        try:
            _emptied(directory)
        finally:
            thread.join()
        left = sorted(p.name for p in directory.iterdir())
        assert all(name.startswith("late-") for name in left), (round_, left[:3])

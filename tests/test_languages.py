"""Recall in the collective's own language: a collective names its text analyzer when it
is created (``language``), every host indexes its text that way, and queries in other
forms of the words find what was recorded, by text and by hybrid search with the
e5-small embedder, on a real embedded NATS."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog import EmbeddedNats, ValidationError
from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.languages import of_name
from ops.bench.language_corpora import CORPORA, DISTRACTORS
from projections.language import analyze, fingerprint
from projections.text import TextIndex, english, english_count
from sync import PulseDB
from tests.harness import eventually, pulse


@pytest.fixture
async def db(tmp_path: Path, nats_server: EmbeddedNats) -> AsyncIterator[PulseDB]:
    instance = await PulseDB.open(tmp_path / "db", nats_server.url)
    yield instance
    await instance.close()


async def _misses(
    db: PulseDB,
    cid: UUID,
    ids: list[UUID],
    corpus: list[tuple[str, list[str]]],
    modes: tuple[str, ...] = ("text", "hybrid"),
) -> list[str]:
    """Each (search, query) whose experience is not among the top 3, for each search
    mode of ``modes``."""
    searches = {"text": db.search_text, "hybrid": db.search_hybrid}
    misses = []
    for eid, (_text, queries) in zip(ids, corpus, strict=True):
        for query in queries:
            for how in modes:
                search = searches[how]
                hits = await search(cid, query, k=3, energy_weight=0)
                if eid not in [hit.experience.experience_id for hit in hits]:
                    misses.append(f"{how}: {query}")
    return misses


@pytest.mark.parametrize("language", ["ukrainian", "german", "chinese", "english"])
async def test_queries_in_other_forms_find_the_experience_in_the_top_3(
    db: PulseDB, language: str
) -> None:
    corpus = CORPORA[language]
    cid = await db.create_collective("o", f"recall {language}", embedder="e5-small",
                                     language=language)  # fmt: skip
    ids = await db.record_experiences(cid, [{"content": text} for text, _ in corpus])
    await db.record_experiences(cid, [{"content": text} for text in DISTRACTORS[language]])
    assert await _misses(db, cid, ids, corpus) == []
    if language != "english":  # words alone, as before languages: text search misses
        # (text search only: the vectors play no part, so the cheap embedder will do)
        plain = await db.create_collective("o", f"plain {language}", embedder="hash",
                                           language="english")  # fmt: skip
        plain_ids = await db.record_experiences(plain, [{"content": t} for t, _ in corpus])
        missed = await _misses(db, plain, plain_ids, corpus, modes=("text",))
        assert len(missed) >= len(corpus) // 2, missed


async def test_the_language_is_in_the_created_event_and_every_host_indexes_by_it(
    tmp_path: Path, db: PulseDB, nats_server: EmbeddedNats
) -> None:
    ukrainian = await db.create_collective("o", "вікі", embedder="hash")  # auto
    chinese = await db.create_collective("o", "记忆", embedder="hash", language="chinese")
    german = await db.create_collective("o", "wiki", embedder="hash", language="german")
    english = await db.create_collective("o", "notes", embedder="hash")
    named = [await db.get_collective(cid) for cid in (ukrainian, chinese, german, english)]
    assert [c and c.language for c in named] == ["auto", "chinese", "german", "auto"]
    created = [
        entry.event async for batch in db.log.read(1) for entry in batch
        if isinstance(entry.event, ev.CollectiveCreated)
    ]  # fmt: skip
    assert [e.language for e in created] == ["auto", "chinese", "german", "auto"]
    found = await db.record_experience(ukrainian, "Публікацію відкладено")
    hits = await db.search_text(ukrainian, "публікації", k=3)
    assert [h.experience.experience_id for h in hits] == [found]
    # a second host builds its state from the log alone, and finds the same
    other = await PulseDB.open(tmp_path / "other", nats_server.url)
    try:
        await eventually(lambda: other.applied_seq >= db.applied_seq, what="catch-up")
        again = await other.search_text(ukrainian, "публікація", k=3)
        assert [h.experience.experience_id for h in again] == [found]
        assert (await other.get_collective(chinese)).language == "chinese"  # type: ignore[union-attr]
    finally:
        await other.close()


async def test_an_unknown_language_is_refused_naming_the_choices(db: PulseDB) -> None:
    with pytest.raises(ValidationError, match=r"language: 'klingon' .*choose one of english"):
        await db.create_collective("o", "n", embedder="hash", language="klingon")
    assert await db.list_collectives() == []  # nothing written


@pytest.mark.parametrize(
    ("name", "language"),
    [("notes", "english"), ("вікі команди", "ukrainian"), ("заметки ёлки", "russian"),
     ("记忆库", "chinese"), ("メモ", "japanese"), ("команда", "simple"), ("μνήμη", "greek")],
)  # fmt: skip
def test_auto_chose_by_the_script_of_the_name_before_schema_5(name: str, language: str) -> None:
    assert of_name(name) == language


def test_the_analyzers_meet_inflected_forms_compounds_and_spaceless_scripts() -> None:
    def shared(language: str, a: str, b: str) -> set[str]:
        return set(analyze(language, a).words) & set(analyze(language, b).words)

    assert shared("ukrainian", "публікацію", "публікації") == {"публікація"}
    assert shared("german", "Häuser", "Haus") == {"haus"}
    assert shared("chinese", "数据库连接失败", "数据库") == {"数据", "据库"}
    assert shared("simple", "Publikation", "publikation") == {"publikation"}
    # combining marks are parts of words (vowel signs, viramas, vowel points)
    assert analyze("hindi", "भाषाओं").words == ["भाष"]
    assert analyze("tamil", "தமிழ் மொழி").words == ["தமிழ்", "மொழி"]
    assert analyze("arabic", "الكِتَابُ").words == analyze("arabic", "الكتاب").words
    assert shared("turkish", "İstanbul", "istanbul") == {"istanbul"}
    # a compound holds the grams of its parts
    compound = set(analyze("german", "Datenbankverbindung").grams)
    assert set(analyze("german", "Verbindung").grams) <= compound


def test_the_command_line_creates_a_collective_in_a_language(tmp_path: Path) -> None:
    data = tmp_path / "data"
    made = pulse("collective", "create", "вікі", "--owner", "me", "--embedder", "hash",
                 "--language", "ukrainian", "--json", data_dir=data)  # fmt: skip
    assert made.returncode == 0, made.stderr
    cid = json.loads(made.stdout)["collective_id"]
    recorded = pulse("record", "-c", cid, "Публікацію статті відкладено", data_dir=data)
    assert recorded.returncode == 0, recorded.stderr
    found = pulse("search", "-c", cid, "публікації", "--mode", "text", "--json", data_dir=data)
    assert found.returncode == 0, found.stderr
    assert [hit["experience"]["experience_id"] for hit in json.loads(found.stdout)] == [
        recorded.stdout.strip()
    ]
    refused = pulse("collective", "create", "x", "--owner", "me", "--embedder", "hash",
                    "--language", "klingon", data_dir=data)  # fmt: skip
    assert refused.returncode == 2 and "--language: invalid choice: 'klingon'" in refused.stderr


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    language=st.sampled_from(
        ["ukrainian", "german", "chinese", "simple", "english", "hindi", "arabic", "turkish"]
    ),
    text=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=200),
)
def test_any_text_in_any_language_is_found_by_itself(
    tmp_path: Path, language: str, text: str
) -> None:
    index = TextIndex(tmp_path / f"text-{uuid7()}")
    try:
        doc, cid = uuid7(), uuid7()
        index.put("experience", doc, cid, text, language)
        analysis = analyze(language, text)
        assert not any(c.isspace() for term in analysis.words + analysis.grams for c in term)
        hits = index.search("experience", cid, text, 3, language=language)
        if language != "english" and analysis.words:
            assert [hit[0] for hit in hits] == [doc]
        assert [hit[0] for hit in hits] in ([], [doc])
    finally:
        index.close()


@settings(max_examples=300)
@given(
    text=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=300)
    | st.lists(
        st.sampled_from(
            [
                "Retry",
                "NATS's",
                "ÜBER",
                "straße",
                "x_y",
                "ǅemal",
                "İstanbul",
                "a" * 39,
                "a" * 40,
                "ﬁ" * 20,
                "12,5",
                "naïve",
            ]
        ),  # fmt: skip
        max_size=40,
    ).map(" ".join)  # fmt: skip
)
def test_an_english_documents_length_is_counted_as_the_index_analyzes_it(text: str) -> None:
    """The length BM25 reads for an English document is counted by ``english_count``
    (no lowercasing, no stemming): the same number of terms as ``english``, the analyzer
    of what the index holds, for any text."""
    assert len(english_count().analyze(text)) == len(english().analyze(text))


def test_a_language_this_release_lacks_is_analyzed_as_simple(tmp_path: Path) -> None:
    """A later release's language in a created event is not refused (a host that refused
    it would set aside every event of the collective): its text is analyzed as simple."""
    import msgspec

    from eventlog.codec import decode_event, encode_event
    from eventlog.log import LogEntry
    from projections.projection import Projection
    from tests import factories as f

    cid = f.uuid7()
    created = msgspec.structs.replace(f.collective(cid), language="klingon")
    wire = encode_event(created)
    assert decode_event(wire.payload, wire.headers, subject=wire.subject) == created
    lesson = f.experience(cid, "Qapla' batlh")
    projection = Projection(tmp_path / "state")
    try:
        projection.apply([LogEntry(1, "pulse.test", created), LogEntry(2, "pulse.test", lesson)])
        projection.sync_indexes()  # (as the engine does after a batch)
        assert projection.memory.collective_language(cid) == "simple"
        hits = projection.text.search("experience", cid, "BATLH", 3, language="simple")
        assert [hit[0] for hit in hits] == [lesson.experience_id]
    finally:
        projection.close()


def test_an_index_made_by_another_analysis_is_made_again(tmp_path: Path) -> None:
    """The stemmers' or the dictionary's versions are stamped beside the text index; one
    made under others is emptied (the projection fills it again from its rows)."""
    from projections.text import ANALYSIS_STAMP

    index = TextIndex(tmp_path / "text")
    index.put("experience", uuid7(), uuid7(), "Häuser", "german")
    index.close()
    assert not TextIndex(tmp_path / "text").recreated  # the same analysis: kept
    stamp = tmp_path / "text" / ANALYSIS_STAMP
    stamp.write_text(stamp.read_text().replace("PyStemmer", "PyStemmer 2.2.0 was"))
    again = TextIndex(tmp_path / "text")
    assert again.recreated and stamp.read_text() == fingerprint()
    again.close()

"""The labelled recall set (``ops.bench.recall_set``) is what its docstring says: 480
lessons, 120 in each of four languages, every lesson with a paraphrasing query in its
own language (no long run of the lesson's words copied), a quarter with a query across
languages; and its loader refuses a malformed line, naming where. The benchmark's
scoring (``ops.bench.recall.scores``) counts recall@5 and MRR@10 as defined."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ops.bench.recall import groups, scores
from ops.bench.recall_set import LANGUAGES, Query, load


def test_the_set_holds_what_it_says() -> None:
    lessons = load()
    assert [sum(lesson.language == language for lesson in lessons) for language in LANGUAGES] == [
        120, 120, 120, 120,
    ]  # fmt: skip
    queries = [query for lesson in lessons for query in lesson.queries]
    across = [query for query in queries if query.across]
    assert len(across) >= 100
    assert {query.language for query in across} == {*LANGUAGES, "russian"}
    for lesson in lessons:
        own = lesson.queries[0]
        assert own.language == lesson.language and own.lesson == lesson.id
        if lesson.language == "chinese":  # no run of 6 characters of the lesson
            runs = {lesson.text[i : i + 6] for i in range(len(lesson.text) - 5)}
            assert not any(own.text[i : i + 6] in runs for i in range(len(own.text) - 5))
            assert re.search("[\u4e00-\u9fff]", lesson.text), lesson.id
        else:  # no run of 4 of the lesson's words
            words = re.findall(r"\w+", lesson.text.lower())
            asked = re.findall(r"\w+", own.text.lower())
            runs4 = {tuple(words[i : i + 4]) for i in range(len(words) - 3)}
            assert not any(tuple(asked[i : i + 4]) in runs4 for i in range(len(asked) - 3))
    texts = [lesson.text for lesson in lessons]
    assert len(set(texts)) == len(texts)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ({"id": "en-1", "language": "german", "lesson": "x", "queries": []}, "language"),
        ({"id": "en-1", "language": "english", "lesson": " ", "queries": []}, "lesson"),
        ({"id": "en-1", "language": "english", "lesson": "x"}, "keys"),
        ({"id": "en-1", "language": "english", "lesson": "x",
          "queries": [{"text": "y", "language": "klingon"}]}, "queries"),
        ({"id": "en-1", "language": "english", "lesson": "x",
          "queries": [{"text": "y", "language": "german"}]}, "the first must be in english"),
    ],
)  # fmt: skip
def test_a_malformed_line_is_refused_naming_where(
    tmp_path: Path, line: dict[str, object], said: str
) -> None:
    good = {"id": "x-1", "language": "", "lesson": "a lesson", "queries": []}
    for language in LANGUAGES:
        rows = [{**good, "id": f"{language}-1", "language": language,
                 "queries": [{"text": "asked", "language": language}]}]  # fmt: skip
        if language == "english":
            rows.append(line)
        (tmp_path / f"{language}.jsonl").write_text("\n".join(map(json.dumps, rows)))
    with pytest.raises(ValueError, match=f"english.jsonl:2: .*{said}"):
        load(tmp_path)


def test_recall_and_mrr_count_as_defined() -> None:
    a = Query("a", "english", "l1", False)
    b = Query("b", "german", "l2", False)
    c = Query("c", "german", "l3", True)
    ranked = {a: ["l1", "x"], b: ["x", "y", "z", "w", "v", "l2"], c: ["x"]}
    assert scores(ranked, [a, b, c]) == (1 / 3, (1 + 1 / 6 + 0) / 3)
    by = groups([a, b, c])
    assert by["english"] == [a] and by["german"] == [b] and by["across languages"] == [c]

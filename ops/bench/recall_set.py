"""A labelled set for measuring recall: short lessons of the kind agents record, each
with the queries that should find it (``data/recall/<language>.jsonl``).

480 lessons: 120 each in English, Ukrainian, German and Chinese, written for Pulse (no
text taken from elsewhere), on many topics of software work, no two so close that a
query for one fairly matches another. Each lesson has a query in its own language that
paraphrases it: other words, and in Ukrainian and German other inflected forms of its
key words (a search must stem or lemmatize to find them by words). A quarter of the
lessons also have a query in another language, for recall across languages (English,
Ukrainian, German, Chinese and Russian queries).

Each line: ``{"id": "uk-007", "language": "ukrainian", "lesson": "...", "queries":
[{"text": "...", "language": "ukrainian"}, ...]}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FOLDER = Path(__file__).parent / "data" / "recall"
LANGUAGES = ("english", "ukrainian", "german", "chinese")  # of the lessons
QUERY_LANGUAGES = (*LANGUAGES, "russian")


@dataclass(frozen=True)
class Query:
    text: str
    language: str
    lesson: str  # the id of the lesson it should find
    across: bool  # in another language than its lesson's


@dataclass(frozen=True)
class Lesson:
    id: str
    language: str
    text: str
    queries: tuple[Query, ...]


def load(folder: Path = FOLDER) -> list[Lesson]:
    """Every lesson of the set, by language then id; ValueError naming the file, line
    and field of a malformed one."""
    lessons: list[Lesson] = []
    for language in LANGUAGES:
        path = folder / f"{language}.jsonl"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.name}:{number}"
            row = json.loads(line)
            if set(row) != {"id", "language", "lesson", "queries"}:
                raise ValueError(f"{where}: keys must be id, language, lesson, queries")
            if row["language"] != language:
                raise ValueError(f"{where}: language: must be {language}")
            if not isinstance(row["lesson"], str) or not row["lesson"].strip():
                raise ValueError(f"{where}: lesson: must be a non-empty text")
            queries = []
            for query in row["queries"]:
                if query.get("language") not in QUERY_LANGUAGES or not query.get("text"):
                    raise ValueError(f"{where}: queries: a text in one of {QUERY_LANGUAGES}")
                queries.append(Query(query["text"], query["language"], row["id"],
                                     query["language"] != language))  # fmt: skip
            if not queries or queries[0].across:
                raise ValueError(f"{where}: queries: the first must be in {language}")
            lessons.append(Lesson(row["id"], language, row["lesson"], tuple(queries)))
    ids = [lesson.id for lesson in lessons]
    if len(set(ids)) != len(ids):
        raise ValueError("ids: must be unique")
    return lessons

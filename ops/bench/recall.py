"""Benchmark: recall on the labelled set (``ops.bench.recall_set``), by language, beside
Postgres with pgvector and full-text search.

    python -m ops.bench.recall [--no-pg]

The 480 lessons (English, Ukrainian, German, Chinese) go into Pulse collectives with the
``e5-small`` embedder (vectors computed once and given to each, so every system searches
the same vectors):

- ``lessons``: made as a new user makes one, a Latin name and the default language
  (``auto``). What vector, text and hybrid search find there is Pulse's figure;
- one collective per fixed analyzer (``english``, ``ukrainian``, ``german``, ``chinese``,
  ``russian``), for text search: a query searched with the fixed English analyzer, and
  with the analyzer of the query's own language (the "right fixed analyzer").

Postgres (``ops.bench.pg``: pgvector's HNSW, a ``simple`` tsvector, the same Reciprocal
Rank Fusion over 50 candidates of each ranking) holds the same lessons and vectors, and
answers the same queries by vector, text and both.

Each query has one lesson it should find. For each language of the queries (those in
their lesson's language; those across languages apart), recall@5 (the share whose lesson
is among the first 5) and MRR@10 (the mean of 1/rank, 0 past 10). Searches weigh no
energy (``energy_weight=0``): every lesson is as important and as new as another.

Prints one JSON line per figure and a table on stderr, with the issue's targets: hybrid
recall@5 at least the baseline's in every language, and text search in each language at
least as good as with the right fixed analyzer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import numpy as np

from ops.bench import emitter, table
from ops.bench.recall_set import LANGUAGES, Lesson, Query, load

K = 10  # results asked for (MRR@10); recall is counted in the first RECALL_AT
RECALL_AT = 5
POOL = 50  # candidates of each ranking the baseline's fusion takes (Pulse's: max(4k, 50))
E5 = "e5-small"
FIXED = ("english", "ukrainian", "german", "chinese", "russian")
emit = emitter("recall")

Ranked = dict[Query, list[str]]  # each query's results, as lesson ids, best first


def vectors(lessons: Sequence[Lesson], queries: Sequence[Query]) -> tuple[Any, Any]:
    """The lessons' passage vectors and the queries' query vectors (e5-small)."""
    from sync.embedders import E5SmallEmbedder

    model = E5SmallEmbedder()
    passages = model.embed_documents([lesson.text for lesson in lessons])
    asked = np.stack([model.embed_query(query.text) for query in queries])
    return passages, asked


async def pulse(
    lessons: Sequence[Lesson], queries: Sequence[Query], passages: Any, asked: Any
) -> dict[str, Ranked]:
    """Each system of Pulse's: its results for every query."""
    from sync import PulseDB

    found: dict[str, Ranked] = {}
    with tempfile.TemporaryDirectory(prefix="pulse-bench-recall-") as tmp:
        db = await PulseDB.open(Path(tmp) / "host")
        try:

            async def collective(name: str, language: str | None) -> dict[UUID, str]:
                cid = await db.create_collective(
                    "bench", name, embedder=E5, language=language or "auto"
                )
                items = [{"content": lesson.text, "embedding": vector.tolist(),
                          "embedder": E5}
                         for lesson, vector in zip(lessons, passages, strict=True)]  # fmt: skip
                ids = await db.record_experiences(cid, items)
                collectives[name] = cid
                return {eid: lesson.id for eid, lesson in zip(ids, lessons, strict=True)}

            collectives: dict[str, UUID] = {}
            lesson_of = await collective("lessons", None)
            for language in FIXED:
                lesson_of |= await collective(f"lessons-{language}", language)

            async def ranked(call: Callable[[Query, int], Awaitable[Any]]) -> Ranked:
                out: Ranked = {}
                for i, query in enumerate(queries):
                    hits = await call(query, i)
                    out[query] = [lesson_of[h.experience.experience_id] for h in hits]
                return out

            auto = collectives["lessons"]
            found["pulse vector"] = await ranked(
                lambda q, i: db.search_similar(auto, asked[i], k=K, embedder=E5, energy_weight=0.0)
            )
            found["pulse text"] = await ranked(
                lambda q, i: db.search_text(auto, q.text, k=K, energy_weight=0.0)
            )
            found["pulse hybrid"] = await ranked(
                lambda q, i: db.search_hybrid(
                    auto, q.text, asked[i], k=K, embedder=E5, energy_weight=0.0
                )
            )
            english = collectives["lessons-english"]
            found["text, fixed english"] = await ranked(
                lambda q, i: db.search_text(english, q.text, k=K, energy_weight=0.0)
            )
            found["text, right fixed"] = await ranked(
                lambda q, i: db.search_text(
                    collectives[f"lessons-{q.language}"], q.text, k=K, energy_weight=0.0
                )
            )
        finally:
            await db.close()
    return found


def postgres(
    lessons: Sequence[Lesson], queries: Sequence[Query], passages: Any, asked: Any
) -> dict[str, Ranked]:
    """The baseline's results for every query: pgvector, full text, and both fused."""
    from ops.bench.pg import HYBRID, RECORD, SIMILAR, TEXT, Postgres, Vector, or_query

    found: dict[str, Ranked] = {"pg vector": {}, "pg text": {}, "pg hybrid": {}}
    with tempfile.TemporaryDirectory(prefix="pulse-bench-recall-pg-") as tmp:
        with Postgres.start(Path(tmp) / "pg", shared_buffers="256MB") as server:
            with server.connect() as connection:
                server.create(connection)
                cid = UUID(int=1)
                lesson_of: dict[UUID, str] = {}
                with connection.cursor() as cursor:
                    for n, (lesson, vector) in enumerate(zip(lessons, passages, strict=True)):
                        eid = UUID(int=1000 + n)
                        lesson_of[eid] = lesson.id
                        row = {"id": eid, "c": cid, "content": lesson.text, "importance": 0.5}
                        cursor.execute(RECORD, {**row, "v": Vector(vector)})
                server.index(connection, m=16, ef_construction=200)
                connection.execute("SET hnsw.ef_search = 100")
                for i, query in enumerate(queries):
                    params = {"c": cid, "q": Vector(asked[i]), "t": or_query(query.text),
                              "k": K, "pool": POOL}  # fmt: skip
                    for name, statement in (("pg vector", SIMILAR), ("pg text", TEXT),
                                            ("pg hybrid", HYBRID)):  # fmt: skip
                        rows = connection.execute(statement, params).fetchall()
                        found[name][query] = [lesson_of[row[0]] for row in rows]
    return found


def scores(ranked: Ranked, queries: Sequence[Query]) -> tuple[float, float]:
    """recall@RECALL_AT and MRR@K of ``queries`` in ``ranked``."""
    hits = reciprocal = 0.0
    for query in queries:
        results = ranked[query]
        if query.lesson in results[:RECALL_AT]:
            hits += 1
        if query.lesson in results[:K]:
            reciprocal += 1 / (results.index(query.lesson) + 1)
    return hits / len(queries), reciprocal / len(queries)


def groups(queries: Sequence[Query]) -> dict[str, list[Query]]:
    """The queries by language (in their lesson's language), and those across languages."""
    by: dict[str, list[Query]] = {language: [] for language in LANGUAGES}
    by["across languages"] = []
    for query in queries:
        by["across languages" if query.across else query.language].append(query)
    return by


def main(with_pg: bool) -> None:
    lessons = load()
    queries = [query for lesson in lessons for query in lesson.queries]
    started = time.perf_counter()
    passages, asked = vectors(lessons, queries)
    print(f"{len(lessons)} lessons, {len(queries)} queries embedded (e5-small) in "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)  # fmt: skip
    found = asyncio.run(pulse(lessons, queries, passages, asked))
    if with_pg:
        found |= postgres(lessons, queries, passages, asked)
    systems = list(found)
    rows = []
    for group, members in groups(queries).items():
        figures = {name: scores(found[name], members) for name in systems}
        checks = []
        if with_pg:
            checks.append(
                ("hybrid >= pg hybrid", figures["pulse hybrid"][0] >= figures["pg hybrid"][0])
            )
        if group != "across languages":
            right = figures["text, right fixed"][0]
            checks.append(("text >= right fixed", figures["pulse text"][0] >= right))
        for name, (recall, mrr) in figures.items():
            emit(name, queries=group, count=len(members), recall_at_5=round(recall, 3),
                 mrr_at_10=round(mrr, 3))  # fmt: skip
        emit("targets", queries=group, **{label: met for label, met in checks})
        said = ", ".join(("" if met else "NOT ") + label for label, met in checks)
        shown = [f"{figures[n][0]:.2f}/{figures[n][1]:.2f}" for n in systems]
        rows.append([f"{group} ({len(members)})", *shown, said])
    print(f"\nrecall@{RECALL_AT} / MRR@{K} by the language of the queries", file=sys.stderr)
    print(table(["queries", *systems, "targets"], rows), file=sys.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-pg", action="store_true", help="without the Postgres baseline")
    main(not parser.parse_args().no_pg)

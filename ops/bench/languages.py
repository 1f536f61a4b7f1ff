"""Recall and cost of a collective's text analyzer (``projections.language``).

    python -m ops.bench.languages [--documents 5000]

- recall: for each corpus of ``ops.bench.language_corpora`` (Ukrainian, German, Chinese,
  English, each with its distractors), the share of queries whose experience is first
  and in the top 3, by text and by hybrid
  search (the e5-small embedder), in a collective of the corpus's language, beside the
  same corpus in a collective analyzed as before languages existed (``english``: tantivy's
  en_stem) and in a ``simple`` one. A host on an embedded NATS.
- index: indexing ``--documents`` experiences of each language into the text index and
  committing, beside the same count of English ones through tantivy's own analyzer (what
  every collective cost before): the Python analysis is the difference.

Prints one JSON line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from uuid import UUID

from eventlog.ids import uuid7
from ops.bench import emitter
from ops.bench.language_corpora import CORPORA, DISTRACTORS

emit = emitter("languages")


async def recall() -> None:
    from sync import PulseDB

    with tempfile.TemporaryDirectory() as tmp:
        db = await PulseDB.open(Path(tmp) / "host")
        try:
            for language, corpus in CORPORA.items():
                found: dict[str, dict[str, float]] = {}
                for analyzer in dict.fromkeys((language, "english", "simple")):
                    cid = await db.create_collective(
                        "bench", f"{language} as {analyzer}", embedder="e5-small",
                        language=analyzer,
                    )  # fmt: skip
                    ids = await db.record_experiences(cid, [{"content": t} for t, _ in corpus])
                    others = [{"content": text} for text in DISTRACTORS[language]]
                    await db.record_experiences(cid, others)
                    found[analyzer] = await _recall(db, cid, ids, corpus)
                for at in (1, 3):
                    emit(f"recall_at_{at}", corpus=language, **{
                        f"{how}_{analyzer}": round(shares[f"{how}@{at}"], 3)
                        for analyzer, shares in found.items() for how in ("text", "hybrid")
                    })  # fmt: skip
        finally:
            await db.close()


async def _recall(
    db: object, cid: UUID, ids: list[UUID], corpus: list[tuple[str, list[str]]]
) -> dict[str, float]:
    """The share of queries whose experience is first ("text@1") or in the top 3."""
    hits = {f"{how}@{at}": 0 for how in ("text", "hybrid") for at in (1, 3)}
    total = 0
    for eid, (_text, queries) in zip(ids, corpus, strict=True):
        for query in queries:
            total += 1
            for how in ("text", "hybrid"):
                search = getattr(db, f"search_{how}")
                top = [
                    hit.experience.experience_id
                    for hit in await search(cid, query, k=3, energy_weight=0)
                ]
                hits[f"{how}@1"] += top[:1] == [eid]
                hits[f"{how}@3"] += eid in top
    return {name: count / total for name, count in hits.items()}


def index_cost(documents: int) -> None:
    from projections.language import analyze
    from projections.text import TextIndex

    times: dict[str, float] = {}
    loads: dict[str, float] = {}
    for language, corpus in CORPORA.items():
        texts = [text for text, _ in corpus]
        with tempfile.TemporaryDirectory() as tmp:
            index = TextIndex(Path(tmp) / "text")
            cid = uuid7()
            if language != "english":  # its libraries loaded once, before (timed apart)
                start = time.perf_counter()
                analyze(language, texts[0])
                loads[language] = time.perf_counter() - start
            start = time.perf_counter()
            for i in range(documents):
                # each document a little different, as real ones are (caches aside)
                content = f"{texts[i % len(texts)]} {texts[(i * 7) % len(texts)]} {i}"
                index.put("experience", uuid7(), cid, content, language)
            index.commit()
            times[language] = time.perf_counter() - start
            index.close()
    for language, took in times.items():
        if language != "english":
            emit("index", language=language, documents=documents,
                 us_per_document=round(took / documents * 1e6, 1),
                 english_us_per_document=round(times["english"] / documents * 1e6, 1),
                 ratio=round(times["english"] / took, 3),
                 first_use_s=round(loads[language], 3))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=5000, help="documents indexed")
    args = parser.parse_args()
    index_cost(args.documents)  # first: it times the libraries' first load too
    asyncio.run(recall())


if __name__ == "__main__":
    main()

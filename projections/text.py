"""Full-text search: a tantivy (BM25) index over experience and insight content.

Documents are keyed by ``id``; every change is delete-then-add by that key, so
re-applying a change (catching up after a crash) never duplicates a document. Each kind
has its own text field, so a search names its kind by the field it reads rather than by
a filter clause; the collective is a filter only when the index holds more than one
collective's documents of that kind (a conjunction with a term every document carries
makes tantivy score every match, where a plain query skips the ones that cannot make
the top k). What is
archived or otherwise hidden is filtered by the caller against DuckDB. Changes are
committed lazily: by the next search (so a search sees every change made before it),
or when the projection saves its indexes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from uuid import UUID

import tantivy

from projections import language as lang

_THREADS = min(2, os.cpu_count() or 1)  # indexing threads of the writer (it runs beside us)


KINDS = ("experience", "insight")
# a collective of any language but English is analyzed in Python (projections.language):
# its words and its grams go to fields of their own, as terms separated by spaces
WORDS, GRAMS = "_words", "_grams"
GRAM_WEIGHT = 0.5  # a matching gram counts for less than a matching word
ANALYSIS_STAMP = "analysis.txt"  # which analysis made the index's terms (lang.fingerprint)


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw")
    builder.add_text_field("collective", stored=False, tokenizer_name="raw")
    for kind in KINDS:  # the content, in the field of its kind
        builder.add_text_field(kind, stored=False, tokenizer_name="en_stem")
        builder.add_text_field(kind + WORDS, stored=False, tokenizer_name="whitespace")
        builder.add_text_field(kind + GRAMS, stored=False, tokenizer_name="whitespace")
    return builder.build()


def _fields(kind: str, collective_id: UUID, content: str, language: str) -> dict[str, str]:
    """The fields of a document of ``kind``: its content analyzed by ``language``."""
    fields = {"collective": str(collective_id)}
    if language == lang.ENGLISH:
        fields[kind] = content
    else:
        analysis = lang.analyze(language, content)
        fields[kind + WORDS] = " ".join(analysis.words)
        fields[kind + GRAMS] = " ".join(analysis.grams)
    return fields


class TextIndex:
    """The tantivy index of one projection (all collectives; filtered per query)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        # it held another schema, or terms another analysis made (the stemmers' or the
        # dictionary's versions changed, so queries would be analyzed otherwise than what
        # they look for): emptied, to be filled again
        self.recreated = False
        stamp, analysis = directory / ANALYSIS_STAMP, lang.fingerprint()
        if any(directory.iterdir()) and (
            not stamp.exists() or stamp.read_text(encoding="utf-8") != analysis
        ):
            shutil.rmtree(directory)
            directory.mkdir(parents=True)
            self.recreated = True
        try:
            self.index = tantivy.Index(_schema(), path=str(directory))
        except ValueError:
            shutil.rmtree(directory)
            directory.mkdir(parents=True)
            self.index = tantivy.Index(_schema(), path=str(directory))
            self.recreated = True
        stamp.write_text(analysis, encoding="utf-8")
        self._writer: tantivy.IndexWriter | None = None
        self._dirty = False

    @property
    def writer(self) -> tantivy.IndexWriter:
        if self._writer is None:
            self._writer = self.index.writer(heap_size=64_000_000, num_threads=_THREADS)
        return self._writer

    def put(
        self, kind: str, doc_id: UUID, collective_id: UUID, content: str, language: str
    ) -> None:
        self.remove(doc_id)
        fields = _fields(kind, collective_id, content, language)
        self.writer.add_document(tantivy.Document(id=str(doc_id), **fields))

    def remove(self, doc_id: UUID) -> None:
        self.writer.delete_documents_by_term("id", str(doc_id))
        self._dirty = True

    def remove_collective(self, collective_id: UUID) -> None:
        self.writer.delete_documents_by_term("collective", str(collective_id))
        self._dirty = True

    def rewrite(self, documents: Iterable[tuple[str, UUID, UUID, str, str]]) -> int:
        """Empty the index and fill it again with ``documents`` (kind, id, collective,
        content, language) in one commit, then remove the files no commit uses: what deleted
        documents left in segments goes with them (tantivy-py cannot force a merge).
        Returns how many documents it holds."""
        writer = self.writer
        writer.delete_all_documents()
        count = 0
        for kind, doc_id, collective_id, content, language in documents:
            fields = _fields(kind, collective_id, content, language)
            writer.add_document(tantivy.Document(id=str(doc_id), **fields))
            count += 1
        writer.commit()
        writer.garbage_collect_files()
        self.index.reload()
        self._dirty = False
        return count

    def commit(self) -> None:
        if self._writer is not None and self._dirty:
            self._writer.commit()
            self._dirty = False
            self.index.reload()

    def search(
        self,
        kind: str,
        collective_id: UUID,
        text: str,
        limit: int,
        *,
        language: str = lang.ENGLISH,
        alone: bool = False,
    ) -> list[tuple[UUID, float]]:
        """(id, BM25 score) of the best matches, best first, in a collective whose text is
        analyzed by ``language``. English queries are parsed leniently (tantivy's query
        syntax, errors forgiven); in other languages the query's words and grams are
        looked up as they are, any of them matching. ``alone``: the caller knows every
        document of this kind belongs to this collective (no filter needed)."""
        self.commit()
        if language == lang.ENGLISH:
            query, _errors = self.index.parse_query_lenient(text, [kind])
        else:
            analyzed = self._analyzed_query(kind, language, text)
            if analyzed is None:
                return []
            query = analyzed
        if not alone:
            query = tantivy.Query.boolean_query(
                [
                    (tantivy.Occur.Must, query),
                    (
                        tantivy.Occur.Must,
                        tantivy.Query.term_query(
                            self.index.schema, "collective", str(collective_id)
                        ),
                    ),
                ]
            )
        if limit <= 0:
            return []
        searcher = self.index.searcher()
        # one more, to see whether the cut falls inside a tie; if it does, up to twice as
        # many, so ties across the cut are ordered by id on every host (a tie wider than
        # that, as when many documents of one length share one matching word, is cut
        # where tantivy cuts it: fetching it whole could mean thousands of documents)
        fetch = limit + 1
        hits = searcher.search(query, fetch).hits
        if len(hits) == fetch and hits[-1][0] >= hits[limit - 1][0]:
            hits = searcher.search(query, 2 * limit + 1).hits
        found = [(UUID(searcher.doc(address)["id"][0]), float(score)) for score, address in hits]
        found.sort(key=lambda hit: (-hit[1], hit[0]))  # one order on every host
        return found[:limit]

    def _analyzed_query(self, kind: str, language: str, text: str) -> tantivy.Query | None:
        """Any of the words of ``text`` (analyzed by ``language``) or, with less weight,
        any of its grams; None when it has neither."""
        analysis = lang.analyze(language, text)
        schema = self.index.schema
        clauses = [
            (tantivy.Occur.Should, tantivy.Query.term_query(schema, kind + WORDS, word))
            for word in dict.fromkeys(analysis.words)
        ]
        clauses += [
            (
                tantivy.Occur.Should,
                tantivy.Query.boost_query(
                    tantivy.Query.term_query(schema, kind + GRAMS, gram), GRAM_WEIGHT
                ),
            )
            for gram in dict.fromkeys(analysis.grams)
        ]
        return tantivy.Query.boolean_query(clauses) if clauses else None

    def close(self) -> None:
        self.commit()
        if self._writer is not None:
            self._writer.wait_merging_threads()
            self._writer = None

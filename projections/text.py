"""Full-text search: a tantivy (BM25) index over experience and insight content.

Documents are keyed by ``id``; every change is delete-then-add by that key, so
re-applying a change (catching up after a crash) never duplicates a document. What is
archived or otherwise hidden is filtered by the caller against DuckDB. Changes are
committed lazily: by the next search (so a search sees every change made before it),
or when the projection saves its indexes.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import tantivy


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw")
    builder.add_text_field("kind", stored=False, tokenizer_name="raw")
    builder.add_text_field("collective", stored=False, tokenizer_name="raw")
    builder.add_text_field("content", stored=False, tokenizer_name="en_stem")
    return builder.build()


class TextIndex:
    """The tantivy index of one projection (all collectives; filtered per query)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.index = tantivy.Index(_schema(), path=str(directory))
        self._writer: tantivy.IndexWriter | None = None
        self._dirty = False

    @property
    def writer(self) -> tantivy.IndexWriter:
        if self._writer is None:
            self._writer = self.index.writer(heap_size=64_000_000, num_threads=1)
        return self._writer

    def put(self, kind: str, doc_id: UUID, collective_id: UUID, content: str) -> None:
        self.remove(doc_id)
        self.writer.add_document(
            tantivy.Document(
                id=str(doc_id), kind=kind, collective=str(collective_id), content=content
            )
        )

    def remove(self, doc_id: UUID) -> None:
        self.writer.delete_documents_by_term("id", str(doc_id))
        self._dirty = True

    def remove_collective(self, collective_id: UUID) -> None:
        self.writer.delete_documents_by_term("collective", str(collective_id))
        self._dirty = True

    def commit(self) -> None:
        if self._writer is not None and self._dirty:
            self._writer.commit()
            self._dirty = False
            self.index.reload()

    def search(
        self, kind: str, collective_id: UUID, text: str, limit: int
    ) -> list[tuple[UUID, float]]:
        """(id, BM25 score) of the best matches, best first; query syntax errors are
        forgiven (the text is parsed leniently)."""
        self.commit()
        parsed, _errors = self.index.parse_query_lenient(text, ["content"])
        query = tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Must, parsed),
                (tantivy.Occur.Must, tantivy.Query.term_query(self.index.schema, "kind", kind)),
                (
                    tantivy.Occur.Must,
                    tantivy.Query.term_query(self.index.schema, "collective", str(collective_id)),
                ),
            ]
        )
        searcher = self.index.searcher()
        hits = searcher.search(query, limit).hits
        return [(UUID(searcher.doc(address)["id"][0]), float(score)) for score, address in hits]

    def close(self) -> None:
        self.commit()
        if self._writer is not None:
            self._writer.wait_merging_threads()
            self._writer = None

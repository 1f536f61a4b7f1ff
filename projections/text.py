"""Full-text search: a tantivy index over experience and insight content, and BM25 scores
computed from what the caller may see.

Documents are keyed by ``id``; every change is delete-then-add by that key, so
re-applying a change (catching up after a crash) never duplicates a document. Each kind
has its own text field, so a search names its kind by the field it reads rather than by
a filter clause; the collective is a filter only when the index holds more than one
collective's documents of that kind (a conjunction with a term every document carries
makes tantivy score every match, where a plain query skips the ones that cannot make
the top k). What is archived or otherwise hidden is filtered by the caller against the
engine's memory. Changes are committed lazily: by the next search (so a search sees
every change made before it), or when the projection saves its indexes. A save commits
on its own thread (``commit_behind``: a commit takes tens of milliseconds, and tantivy
lets go of the GIL meanwhile); the changes made while it runs are held here in order and
handed to the writer once it ends (tantivy's writer takes nothing while it commits).

Search text is words, never query syntax: the text is analyzed as the collective's
documents are (``en_stem`` for English, ``projections.language`` otherwise) and the
terms are looked up as they are, any of them matching. ``experience:*``, quotes,
parentheses, ``AND`` and field names are words like any other (or nothing).

Two ways to score, by who asks (``search``):

- a caller that sees everything (an admin, the local operator): tantivy's BM25, whose
  statistics (how many documents hold a word, how many there are, their average
  length) count every document of the index, every collective's.
- any other caller (a ``Viewer``): BM25 computed here from the statistics of the
  documents of the collective it may see, and of nothing else. Its document frequencies
  and document count are tantivy counts under a filter on indexed ``visibility`` and
  ``author`` fields (the rule of ``eventlog.access.Viewer``), the average length a sum over
  the ``length`` fast field under the same filter; the term frequencies and length of
  each candidate come from analyzing its content again (kept for the documents scored
  last). The candidates are the visible documents holding a query term; when more than
  ``CANDIDATES_MAX`` do, the terms are taken rarest first while their documents fit, and
  past that the documents with the largest ``order`` (the low bits of their id): every
  step depends only on visible documents, so two worlds that differ in what the caller
  may not see give it the same ids, order and scores. Otherwise the order of hits, not
  just their scores, would tell whether a guessed word occurs in what it may not read.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import logging
import math
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import tantivy

from eventlog.access import DEFAULT_VISIBILITY
from projections import language as lang

if TYPE_CHECKING:
    from eventlog.access import Viewer

log = logging.getLogger("pulse.text")

_THREADS = min(2, os.cpu_count() or 1)  # indexing threads of the writer (it runs beside us)


KINDS = ("experience", "insight")
# a collective of any language but English is analyzed in Python (projections.language):
# its words and its grams go to fields of their own, as terms separated by spaces
WORDS, GRAMS = "_words", "_grams"
GRAM_WEIGHT = 0.5  # a matching gram counts for less than a matching word
ANALYSIS_STAMP = "analysis.txt"  # which analysis made the index's terms (lang.fingerprint)
BM25_K1, BM25_B = 1.2, 0.75  # tantivy's (and Lucene's) constants
CANDIDATES_MAX = 1000  # visible documents a restricted search scores, at most
ANALYZED_MAX = 20_000  # documents whose analysis is kept for the next restricted search

# a document's analysis: (term -> count, length) of its main field (English words, or
# the words of another language) and of its grams (empty for English)
Counts = tuple[dict[str, int], int, dict[str, int], int]
Document = tuple[str, UUID, UUID, str, str, str | None, str | None, str | None]


@lru_cache(maxsize=1)
def english() -> tantivy.TextAnalyzer:
    """tantivy's ``en_stem`` as a Python analyzer: simple words, long ones removed, lower
    case, English Snowball stems (what the English fields index)."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


@lru_cache(maxsize=1)
def english_count() -> tantivy.TextAnalyzer:
    """``english`` without its lowercasing and stemming, which map each term to one term:
    the same number of terms (a document's length), at about a third of the cost (every
    English document is counted as it is indexed, on the write's and the fold's path)."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .build()
    )


def author_term(owner: str | None, agent: str | None) -> str:
    """The ``author`` field's term of a principal (an agent of None differs from "")."""
    return json.dumps([owner, agent])


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw")
    builder.add_text_field("collective", stored=False, tokenizer_name="raw")
    # who may see a document (eventlog.access): fixed when it is created, like its content
    builder.add_text_field("kind", stored=False, tokenizer_name="raw")
    builder.add_text_field("visibility", stored=False, tokenizer_name="raw")
    builder.add_text_field("author", stored=False, tokenizer_name="raw")
    # its length in terms (main field, grams), and an order for the cut of candidates
    builder.add_integer_field("length", stored=False, indexed=False, fast=True)
    builder.add_integer_field("gram_length", stored=False, indexed=False, fast=True)
    builder.add_integer_field("order", stored=False, indexed=False, fast=True)
    builder.add_integer_field("high", stored=False, indexed=False, fast=True)  # the id again,
    # as two numbers a search reads for many documents at once (``fast_field_values``)
    for kind in KINDS:  # the content, in the field of its kind
        builder.add_text_field(kind, stored=False, tokenizer_name="en_stem")
        builder.add_text_field(kind + WORDS, stored=False, tokenizer_name="whitespace")
        builder.add_text_field(kind + GRAMS, stored=False, tokenizer_name="whitespace")
    return builder.build()


def analyzed(content: str, language: str) -> Counts:
    """The terms of ``content`` as the index holds them, counted."""
    if language == lang.ENGLISH:
        main, grams = english().analyze(content), []
    elif language == lang.ENGLISH_AMONG_OTHERS:
        main, grams = english().analyze(content), lang.analyze(lang.SIMPLE, content).grams
    else:
        analysis = lang.analyze(language, content)
        main, grams = analysis.words, analysis.grams
    return _counted(main), len(main), _counted(grams), len(grams)


def _counted(terms: Iterable[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for term in terms:
        found[term] = found.get(term, 0) + 1
    return found


def _fields(document: Document) -> dict[str, Any]:
    """The fields of a document: its content analyzed by its language, its length in
    terms, who may see it."""
    kind, doc_id, collective_id, content, language, visibility, owner, agent = document
    fields: dict[str, Any] = {
        "id": str(doc_id),
        "collective": str(collective_id),
        "kind": kind,
        "visibility": visibility or DEFAULT_VISIBILITY,  # (rows from before visibility)
        "author": author_term(owner, agent),
        "order": _signed(doc_id.int & (2**64 - 1)),
        "high": _signed(doc_id.int >> 64),
    }
    if language in (lang.ENGLISH, lang.ENGLISH_AMONG_OTHERS):
        fields[kind] = content
        fields["length"], fields["gram_length"] = len(english_count().analyze(content)), 0
        if language == lang.ENGLISH_AMONG_OTHERS:
            grams = lang.analyze(lang.SIMPLE, content).grams
            fields[kind + GRAMS] = " ".join(grams)
            fields["gram_length"] = len(grams)
    else:
        analysis = lang.analyze(language, content)
        fields[kind + WORDS] = " ".join(analysis.words)
        fields[kind + GRAMS] = " ".join(analysis.grams)
        fields["length"], fields["gram_length"] = len(analysis.words), len(analysis.grams)
    return fields


def _signed(value: int) -> int:
    """An unsigned 64-bit number as the signed one with the same bits (an i64 field)."""
    return value - 2**64 if value >= 2**63 else value


def _uuid(high: int, low: int) -> UUID:
    return UUID(int=((high % 2**64) << 64) | (low % 2**64))


def bm25(idf: float, tf: int, length: int, average: float) -> float:
    """One term's BM25 score in one document."""
    norm = BM25_K1 * (1 - BM25_B + BM25_B * length / average) if average > 0 else BM25_K1
    return idf * tf * (BM25_K1 + 1) / (tf + norm)


def idf(documents: int, holding: int) -> float:
    """BM25's inverse document frequency (tantivy's): ln(1 + (N - n + 0.5) / (n + 0.5))."""
    return math.log(1 + (documents - holding + 0.5) / (holding + 0.5))


def _count(searcher: tantivy.Searcher, query: tantivy.Query) -> int:
    """How many documents match ``query``."""
    found: int = searcher.search(query, 1, count=True).count  # type: ignore[attr-defined]
    return found


def _emptied(directory: Path) -> None:
    """Remove ``directory`` and make it again, empty. tantivy's threads of an index closed
    a moment ago (its files' garbage collection) may still add or remove a file while the
    removal lists them ("Directory not empty": seen once in a full run); asked again, up
    to five times."""
    for attempt in range(5):
        try:
            shutil.rmtree(directory)
            break
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.ENOENT) or attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))
    directory.mkdir(parents=True)


class TextIndex:
    """The tantivy index of one projection (all collectives; filtered per query)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        # it held another schema, or terms another analysis made (the stemmers' or the
        # dictionary's versions changed, so queries would be analyzed otherwise than what
        # they look for): emptied, to be filled again
        self.recreated = False
        stamp = directory / ANALYSIS_STAMP  # (another schema: tantivy refuses to open it)
        analysis = lang.fingerprint()
        if any(directory.iterdir()) and (
            not stamp.exists() or stamp.read_text(encoding="utf-8") != analysis
        ):
            _emptied(directory)
            self.recreated = True
        try:
            self.index = tantivy.Index(_schema(), path=str(directory))
        except ValueError:
            _emptied(directory)
            self.index = tantivy.Index(_schema(), path=str(directory))
            self.recreated = True
        stamp.write_text(analysis, encoding="utf-8")
        self._writer: tantivy.IndexWriter | None = None
        self._dirty = False
        # a commit under way on another thread (``commit_behind``), and the changes made
        # meanwhile, in order: (put's document fields, or None to remove) by id, or a
        # collective removed
        self._committing: concurrent.futures.Future[None] | None = None
        self._held: list[tuple[str, Any]] = []
        # the analysis of documents scored lately (restricted searches), by id
        self._analyzed: OrderedDict[UUID, Counts] = OrderedDict()  # least recent first

    @property
    def writer(self) -> tantivy.IndexWriter:
        if self._writer is None:
            self._writer = self.index.writer(heap_size=64_000_000, num_threads=_THREADS)
        return self._writer

    def put(
        self,
        kind: str,
        doc_id: UUID,
        collective_id: UUID,
        content: str,
        language: str,
        visibility: str | None = None,
        author_owner: str | None = None,
        author_agent: str | None = None,
    ) -> None:
        fields = _fields(
            (kind, doc_id, collective_id, content, language, visibility, author_owner,
             author_agent)
        )  # fmt: skip
        self._analyzed.pop(doc_id, None)
        self._dirty = True
        if self._holding():
            self._held.append(("put", fields))
            return
        writer = self.writer
        writer.delete_documents_by_term("id", fields["id"])
        writer.add_document(tantivy.Document(**fields))

    def remove(self, doc_id: UUID) -> None:
        self._analyzed.pop(doc_id, None)
        self._dirty = True
        if self._holding():
            self._held.append(("id", str(doc_id)))
            return
        self.writer.delete_documents_by_term("id", str(doc_id))

    def remove_collective(self, collective_id: UUID) -> None:
        self._analyzed.clear()
        self._dirty = True
        if self._holding():
            self._held.append(("collective", str(collective_id)))
            return
        self.writer.delete_documents_by_term("collective", str(collective_id))

    def _holding(self) -> bool:
        """Whether a commit is under way on another thread (changes are held meanwhile);
        one that ended is settled first (``_settle``)."""
        committing = self._committing
        if committing is None:
            return False
        if not committing.done():
            return True
        self._settle()
        return False

    def _settle(self) -> None:
        """Wait for a commit under way on another thread, then hand the writer what was
        held meanwhile, in order. A commit that failed is logged: its changes are still
        the writer's, committed with the next."""
        committing, self._committing = self._committing, None
        if committing is None:
            return
        try:
            committing.result()
        except Exception:
            log.exception("committing the text index in the background failed; committed later")
            self._dirty = True
        held, self._held = self._held, []
        if held:
            writer = self.writer
            for what, value in held:
                if what == "put":
                    writer.delete_documents_by_term("id", value["id"])
                    writer.add_document(tantivy.Document(**value))
                else:
                    writer.delete_documents_by_term(what, value)
            self._dirty = True

    def commit_behind(self) -> Callable[[], None] | None:
        """A commit of every change made so far, to run on another thread (None: none to
        commit); the changes made until it has run are held (the module doc). The
        caller runs what this returns, once, in any case."""
        self._settle()
        if self._writer is None or not self._dirty:
            return None
        writer, done = self._writer, concurrent.futures.Future[None]()
        self._committing = done
        self._dirty = False

        def run() -> None:
            try:
                writer.commit()
                self.index.reload()
            except BaseException as exc:
                done.set_exception(exc)
                raise
            done.set_result(None)

        return run

    def rewrite(self, documents: Iterable[Document]) -> int:
        """Empty the index and fill it again with ``documents`` (kind, id, collective,
        content, language, visibility, author owner, author agent) in one commit, then
        remove the files no commit uses: what deleted documents left in segments goes
        with them (tantivy-py cannot force a merge). Returns how many documents it
        holds."""
        self._settle()
        writer = self.writer
        writer.delete_all_documents()
        self._analyzed.clear()
        count = 0
        for document in documents:
            writer.add_document(tantivy.Document(**_fields(document)))
            count += 1
        writer.commit()
        writer.garbage_collect_files()
        self.index.reload()
        self._dirty = False
        return count

    def commit(self) -> None:
        """Commit every change made so far (waiting for one under way elsewhere first)."""
        self._settle()
        if self._writer is not None and self._dirty:
            self._writer.commit()
            self._dirty = False
            self.index.reload()

    def _keep(self, doc_id: UUID, counts: Counts) -> None:
        self._analyzed[doc_id] = counts
        while len(self._analyzed) > ANALYZED_MAX:
            self._analyzed.popitem(last=False)

    def search(
        self,
        kind: str,
        collective_id: UUID,
        text: str,
        limit: int,
        *,
        language: str | tuple[str, ...] = lang.ENGLISH,
        alone: bool = False,
        viewer: Viewer | None = None,
        content: Callable[[UUID], tuple[str, str] | None] | None = None,
    ) -> list[tuple[UUID, float]]:
        """(id, BM25 score) of the best matches, best first, in a collective whose text is
        analyzed by ``language`` (several: the query is analyzed in each, and matches the
        documents of any; a collective of "auto"): any of the words of ``text`` (and, in
        languages other than English, with less weight any of its grams). ``alone``: the
        caller knows every document of this kind belongs to this collective (no filter
        needed). ``viewer``: scored from the statistics of what it may see (the module
        doc); ``content`` gives the text of a candidate and its language (None: gone), to
        count its terms."""
        self.commit()
        if limit <= 0:
            return []
        languages = (language,) if isinstance(language, str) else language
        terms = self._query_terms(kind, languages, text)
        if not terms:
            return []
        if viewer is not None:
            assert content is not None
            return self._visible_search(kind, collective_id, terms, limit, viewer, content)
        schema = self.index.schema
        query = tantivy.Query.boolean_query(
            [
                (
                    tantivy.Occur.Should,
                    tantivy.Query.boost_query(
                        tantivy.Query.term_query(schema, field, term), weight
                    ),
                )
                for field, term, weight in terms
            ]
        )
        if not alone:
            query = tantivy.Query.boolean_query(
                [
                    (tantivy.Occur.Must, query),
                    (
                        tantivy.Occur.Must,
                        tantivy.Query.term_query(schema, "collective", str(collective_id)),
                    ),
                ]
            )
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

    def _query_terms(
        self, kind: str, languages: tuple[str, ...], text: str
    ) -> list[tuple[str, str, float]]:
        """(field, term, weight) of each distinct term of ``text`` analyzed in each of
        ``languages``: its words, and in a language other than English its grams (with
        less weight)."""
        terms: dict[tuple[str, str], float] = {}
        for language in languages:
            if language == lang.ENGLISH:
                for term in english().analyze(text):
                    terms.setdefault((kind, term), 1.0)
                continue
            analysis = lang.analyze(language, text)
            for word in analysis.words:
                terms.setdefault((kind + WORDS, word), 1.0)
            for gram in analysis.grams:
                terms.setdefault((kind + GRAMS, gram), GRAM_WEIGHT)
        return [(field, term, weight) for (field, term), weight in terms.items()]

    def _visible(self, kind: str, collective_id: UUID, viewer: Viewer) -> tantivy.Query:
        """The documents of ``kind`` in a collective that ``viewer`` may see."""
        schema = self.index.schema
        seen, author = viewer.reach()

        def term(field: str, value: str) -> tantivy.Query:
            return tantivy.Query.term_query(schema, field, value)

        who = [(tantivy.Occur.Should, term("visibility", v)) for v in seen]
        if author is not None:  # (its own private rows; its others are in ``seen``)
            who.append((tantivy.Occur.Should, term("author", author_term(*author))))
        return tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Must, term("collective", str(collective_id))),
                (tantivy.Occur.Must, term("kind", kind)),
                (tantivy.Occur.Must, tantivy.Query.boolean_query(who)),
            ]
        )

    def _visible_search(
        self,
        kind: str,
        collective_id: UUID,
        terms: list[tuple[str, str, float]],
        limit: int,
        viewer: Viewer,
        content: Callable[[UUID], tuple[str, str] | None],
    ) -> list[tuple[UUID, float]]:
        """BM25 over the documents ``viewer`` may see (the module doc)."""
        searcher = self.index.searcher()
        visible = self._visible(kind, collective_id, viewer)
        documents = _count(searcher, visible)
        if not documents:
            return []
        sums = searcher.aggregate(
            visible,
            {"main": {"sum": {"field": "length"}}, "grams": {"sum": {"field": "gram_length"}}},
        )
        average = {
            part: float(sums.get(part, {}).get("value") or 0.0) / documents
            for part in ("main", "grams")
        }
        schema = self.index.schema

        def within(query: tantivy.Query) -> tantivy.Query:
            return tantivy.Query.boolean_query(
                [(tantivy.Occur.Must, query), (tantivy.Occur.Must, visible)]
            )

        weighted = []  # (field, term, weight, documents holding it, its query)
        for field, term, weight in terms:
            query = tantivy.Query.term_query(schema, field, term)
            holding = _count(searcher, within(query))
            if holding:
                weighted.append((field, term, weight, holding, query))
        if not weighted:
            return []
        # the candidates: the documents of the rarest terms, as many terms as fit
        weighted.sort(key=lambda t: (t[3], t[0], t[1]))
        chosen: list[tuple[str, str, float, int, tantivy.Query]] = []
        fits = 0
        for item in weighted:
            if chosen and fits + item[3] > CANDIDATES_MAX:
                break
            chosen.append(item)
            fits += item[3]
        query = tantivy.Query.boolean_query([(tantivy.Occur.Should, c[4]) for c in chosen])
        hits = searcher.search(within(query), CANDIDATES_MAX, order_by_field="order").hits
        addresses = [address for _, address in hits]
        highs = searcher.fast_field_values("high", addresses)
        scored = []
        for (low, _), high in zip(hits, highs, strict=True):
            doc_id = _uuid(int(high or 0), low)
            counts = self._analyzed.get(doc_id)
            if counts is not None:
                self._analyzed.move_to_end(doc_id)
            else:
                found = content(doc_id)
                if found is None:
                    continue
                counts = analyzed(*found)
                self._keep(doc_id, counts)
            main, main_length, grams, grams_length = counts
            score = 0.0
            for field, term, weight, holding, _ in weighted:
                gram = field.endswith(GRAMS)
                tf = (grams if gram else main).get(term, 0)
                if tf:
                    score += weight * bm25(
                        idf(documents, holding), tf,
                        grams_length if gram else main_length,
                        average["grams" if gram else "main"],
                    )  # fmt: skip
            scored.append((doc_id, score))
        scored.sort(key=lambda hit: (-hit[1], hit[0]))
        return scored[:limit]

    def close(self) -> None:
        self.commit()
        if self._writer is not None:
            self._writer.wait_merging_threads()
            self._writer = None

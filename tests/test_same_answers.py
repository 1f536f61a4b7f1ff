"""Same answers everywhere: hosts that received the same events, in different orders, in
different batches and some of them twice, reach the same digest and then answer alike.

Exact searches (a flat index, or a filter leaving few candidates under HNSW) return the
same ids in the same order with the same scores on every host; HNSW searches share at
least 95% of their top k, and so do BM25 and hybrid searches (see
``test_search_text_overlaps_on_every_host`` for why text scores are not exact). A host
missing one event differs, so the checks can fail.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections import queries as q
from projections.projection import Projection, ProjectionSettings
from tests.harness import by_profile
from tests.histories import redeliveries

Vectors = npt.NDArray[np.float32]

N, DIM, CLUSTERS, QUERIES = 3000, 64, 30, 50
EXACT_QUERIES = 20  # exact searches must agree on every one: fewer suffice
HNSW_THRESHOLD = 300  # well below N: every HNSW host converts part way through its stream
FLAT_THRESHOLD = N + 1  # never reached: the index stays exact
SCORE_TOLERANCE = 1e-6
LEAST_OVERLAP = 0.95
BASE_MS = 1_700_000_000_000

WORDS = [
    "cache", "retry", "timeout", "schema", "index", "deploy", "parser", "lock", "socket",
    "budget", "queue", "thread", "memory", "latency", "token", "cluster", "replica",
    "snapshot", "vector", "migration",
]  # fmt: skip
RARE = "rare"  # a tag on few experiences: a filter on it leaves an exact scan under HNSW


def stamp(ms: int, instance: UUID) -> dict[str, object]:
    """The fields every event carries: a fresh event id, the writer and an HLC."""
    return {"event_id": uuid7(), "instance_id": instance, "hlc": ev.pack_hlc(BASE_MS + ms)}


@dataclass
class Corpus:
    """One event set and what it is expected to leave behind."""

    collective: UUID
    events: list[ev.Event]
    ids: list[UUID]  # experience ids, in recording order
    vectors: Vectors  # their embeddings, same order
    queries: Vectors
    deleted: set[UUID] = field(default_factory=set)
    archived: set[UUID] = field(default_factory=set)  # archived at the end (LWW)


def build_corpus(seed: int = 20) -> Corpus:
    """A collective, N clustered experiences, then updates (some conflicting), archives,
    unarchives (some older than the archive they race) and deletes (some of experiences
    also updated or archived), and a few reinforcements."""
    rng = np.random.default_rng(seed)
    writers = [uuid7() for _ in range(3)]
    centers = rng.normal(size=(CLUSTERS, DIM))
    vectors = (centers[rng.integers(0, CLUSTERS, N)] + 0.35 * rng.normal(size=(N, DIM))).astype(
        np.float32
    )
    queries = (
        centers[rng.integers(0, CLUSTERS, QUERIES)] + 0.35 * rng.normal(size=(QUERIES, DIM))
    ).astype(np.float32)
    cid = uuid7()
    events: list[ev.Event] = [
        ev.CollectiveCreated(
            **stamp(0, writers[0]),  # type: ignore[arg-type]
            collective_id=cid, owner_id="o", name="same answers", embedding_dimension=DIM,
        )
    ]  # fmt: skip
    ids = [uuid7() for _ in range(N)]
    rare = set(rng.choice(N, 60, replace=False).tolist())
    for i, eid in enumerate(ids):
        tags = [str(t) for t in rng.choice(["alpha", "beta", "gamma"], rng.integers(1, 3))]
        if i in rare:
            tags.append(RARE)
        kind: ev.ExperienceType = (
            ev.Fact(statement=f"fact {i}", source="test") if i % 3 == 0 else ev.Generic()
        )
        content = " ".join(str(w) for w in rng.choice(WORDS, int(rng.integers(3, 9))))
        events.append(
            ev.ExperienceRecorded(
                **stamp(1 + i, writers[i % 3]),  # type: ignore[arg-type]
                experience_id=eid, collective_id=cid, content=f"{content} item{i}",
                embedding=vectors[i].tobytes(), experience_type=kind,
                importance=float(rng.choice([0.1, 0.3, 0.5, 0.7, 0.9])),
                confidence=float(rng.choice([0.25, 0.5, 0.75])), source_agent="agent",
                domain=tuple(sorted(set(tags))),
            )
        )  # fmt: skip
    corpus = Corpus(cid, events, ids, vectors, queries)
    later = N + 10  # every change is stamped after every recording
    picks = [int(i) for i in rng.permutation(N)]
    updated, archived, deleted = picks[:400], picks[400:700], picks[700:850]
    deleted += picks[:40] + picks[400:430]  # also deleted: some updated, some archived
    for n, i in enumerate(updated):
        events.append(
            ev.ExperienceUpdated(
                **stamp(later + n, writers[n % 3]),  # type: ignore[arg-type]
                experience_id=ids[i], collective_id=cid,
                importance=float(rng.choice([0.2, 0.6, 0.95])),
                domain=("beta", RARE) if n % 50 == 0 else None,
            )
        )  # fmt: skip
        if n % 4 == 0:  # a concurrent update by another writer: the later HLC wins
            events.append(
                ev.ExperienceUpdated(
                    **stamp(later + n + (7 if n % 8 else -7), writers[(n + 1) % 3]),  # type: ignore[arg-type]
                    experience_id=ids[i], collective_id=cid, importance=0.05, confidence=0.95,
                )
            )  # fmt: skip
    for n, i in enumerate(archived):
        events.append(
            ev.ExperienceArchived(
                **stamp(later + 1000 + n, writers[n % 3]),  # type: ignore[arg-type]
                experience_id=ids[i], collective_id=cid,
            )
        )  # fmt: skip
        if n % 5 == 0:  # unarchived: later than the archive (wins) or earlier (loses)
            events.append(
                ev.ExperienceUnarchived(
                    **stamp(later + 1000 + n + (500 if n % 10 else -500), writers[(n + 2) % 3]),  # type: ignore[arg-type]
                    experience_id=ids[i], collective_id=cid,
                )
            )  # fmt: skip
        if n % 10 != 5:
            corpus.archived.add(ids[i])
    for n, i in enumerate(deleted):
        events.append(
            ev.ExperienceDeleted(
                **stamp(later + 2000 + n, writers[n % 3]),  # type: ignore[arg-type]
                experience_id=ids[i], collective_id=cid,
            )
        )  # fmt: skip
        corpus.deleted.add(ids[i])
    for n, i in enumerate(picks[900:1000]):
        events.append(
            ev.ExperienceReinforced(
                **stamp(later + 3000 + n, writers[n % 3]),  # type: ignore[arg-type]
                experience_id=ids[i], collective_id=cid, applications=1 + n % 4,
            )
        )  # fmt: skip
    corpus.archived -= corpus.deleted
    return corpus


def entries(events: Sequence[ev.Event]) -> list[LogEntry]:
    """A host's own stream: sequence numbers 1.. in the order it received them."""
    return [LogEntry(seq, "pulse.test", event) for seq, event in enumerate(events, start=1)]


def deliver(projection: Projection, events: Sequence[ev.Event], batch_sizes: Sequence[int]) -> None:
    """Apply in batches (cycling through ``batch_sizes``), syncing the indexes after each
    batch as the engine does, so every host inserts its vectors in its own order."""
    stream = entries(events)
    start, n = 0, 0
    while start < len(stream):
        size = batch_sizes[n % len(batch_sizes)]
        projection.apply(stream[start : start + size])
        projection.sync_indexes()
        start, n = start + size, n + 1


def orders(corpus: Corpus) -> dict[str, tuple[list[ev.Event], list[int]]]:
    """Three deliveries of the same events: in order, shuffled with redeliveries, reversed
    (the collective last); each with batches of its own sizes."""
    shuffled = list(corpus.events)
    chooser = random.Random(7)
    chooser.shuffle(shuffled)
    for event in chooser.sample(corpus.events, 300):  # redelivered after a reconnect
        shuffled.insert(chooser.randrange(len(shuffled) + 1), event)
    return {
        "in order": (list(corpus.events), [500]),
        "shuffled": (shuffled, [137, 1, 911, 64]),
        "reversed": (corpus.events[::-1], [1000, 3, 250]),
    }


Hosts = dict[str, Projection]


def open_hosts(corpus: Corpus, directory: Path, threshold: int) -> Hosts:
    hosts = {}
    for name, (events, sizes) in orders(corpus).items():
        projection = Projection(
            directory / name.replace(" ", "-"), ProjectionSettings(hnsw_threshold=threshold)
        )
        deliver(projection, events, sizes)
        hosts[name] = projection
    return hosts


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return build_corpus()


@pytest.fixture(scope="module")
def flat_hosts(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    hosts = open_hosts(corpus, tmp_path_factory.mktemp("flat"), FLAT_THRESHOLD)
    yield hosts
    for projection in hosts.values():
        projection.close()


@pytest.fixture(scope="module")
def hnsw_hosts(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    hosts = open_hosts(corpus, tmp_path_factory.mktemp("hnsw"), HNSW_THRESHOLD)
    yield hosts
    for projection in hosts.values():
        projection.close()


FILTERS = {
    "any live": q.ANY_LIVE,
    "include archived": q.ExperienceFilter(include_archived=True),
    "min importance": q.ExperienceFilter(min_importance=0.5),
    "domains": q.ExperienceFilter(domains=("beta",)),
    "facts, archived too": q.ExperienceFilter(experience_types=("Fact",), include_archived=True),
    "rare": q.ExperienceFilter(domains=(RARE,)),
    "rare, archived too": q.ExperienceFilter(domains=(RARE,), include_archived=True),
}

Hits = list[tuple[UUID, float]]


def similar(p: Projection, corpus: Corpus, query: Vectors, k: int, flt: q.ExperienceFilter) -> Hits:
    return [
        (r.experience.experience_id, r.score)
        for r in q.similar_experiences(p, corpus.collective, query, k, flt)
    ]


def assert_same_hits(expected: Hits, found: Hits, what: str) -> None:
    """The same ids in the same order, each score within SCORE_TOLERANCE."""
    assert [i for i, _ in found] == [i for i, _ in expected], f"{what}: other ids or order"
    worst = max((abs(a - b) for (_, a), (_, b) in zip(expected, found, strict=True)), default=0.0)
    assert worst <= SCORE_TOLERANCE, f"{what}: scores differ by {worst}"


def test_every_delivery_order_gives_the_same_digest(
    corpus: Corpus, flat_hosts: Hosts, hnsw_hosts: Hosts
) -> None:
    digests = {f"flat {n}": p.digest() for n, p in flat_hosts.items()}
    digests |= {f"hnsw {n}": p.digest() for n, p in hnsw_hosts.items()}
    assert len(set(digests.values())) == 1, digests
    key = ("experience", corpus.collective)
    assert not any(p.vectors[key].is_hnsw for p in flat_hosts.values())
    assert all(p.vectors[key].is_hnsw for p in hnsw_hosts.values())


@pytest.mark.parametrize("k", [10, 50])
@pytest.mark.parametrize("filter_name", list(FILTERS))
def test_exact_similar_search_is_the_same_on_every_host(
    corpus: Corpus, flat_hosts: Hosts, filter_name: str, k: int
) -> None:
    flt = FILTERS[filter_name]
    first, *others = flat_hosts.items()
    for n, query in enumerate(corpus.queries[:EXACT_QUERIES]):
        expected = similar(first[1], corpus, query, k, flt)
        assert expected, f"query {n}: no hits to compare"
        ids = {i for i, _ in expected}
        assert not ids & corpus.deleted, "a deleted experience was returned"
        if not flt.include_archived:
            assert not ids & corpus.archived, "an archived experience was returned"
        for name, p in others:
            found = similar(p, corpus, query, k, flt)
            assert_same_hits(expected, found, f"{name} vs {first[0]}, query {n}, {filter_name}")


def test_exact_search_matches_brute_force(corpus: Corpus, flat_hosts: Hosts) -> None:
    """What the hosts agree on is the right answer: numpy over the live, unarchived rows."""
    live = [
        n for n, i in enumerate(corpus.ids) if i not in corpus.deleted and i not in corpus.archived
    ]
    unit = corpus.vectors[live] / np.linalg.norm(corpus.vectors[live], axis=1, keepdims=True)
    p = flat_hosts["shuffled"]
    for query in corpus.queries[:10]:
        scores = unit @ (query / np.linalg.norm(query))
        top = np.argsort(-scores)[:10]
        expected = [(corpus.ids[live[t]], float(scores[t])) for t in top]
        found = similar(p, corpus, query, 10, q.ANY_LIVE)
        assert [i for i, _ in found] == [i for i, _ in expected]
        assert np.allclose([s for _, s in found], [s for _, s in expected], atol=1e-5)


def text_hits(p: Projection, collective: UUID, text: str, k: int, flt: q.ExperienceFilter) -> Hits:
    return [
        (r.experience.experience_id, r.score) for r in q.search_text(p, collective, text, k, flt)
    ]


TEXTS = ["cache", "retry timeout", "schema migration", "vector index", "lock thread queue"]


def overlap(left: Sequence[Hits], right: Sequence[Hits]) -> float:
    """The share of the top k two hosts have in common, over several queries."""
    shared = sum(
        len({i for i, _ in a} & {i for i, _ in b}) for a, b in zip(left, right, strict=True)
    )
    return shared / max(1, sum(len(a) for a in left))


@pytest.mark.parametrize("filter_name", ["any live", "include archived", "min importance"])
def test_search_text_overlaps_on_every_host(
    corpus: Corpus, flat_hosts: Hosts, hnsw_hosts: Hosts, filter_name: str
) -> None:
    """BM25 is approximate across hosts in one way: tantivy counts a removed document in
    a word's document frequency until the segment holding it is merged, so hosts whose
    histories differ score slightly differently (as Lucene does). At least 95% of the
    top k is shared, and equal scores come back in one order (by id) everywhere."""
    flt = FILTERS[filter_name]
    hosts = {f"flat {n}": p for n, p in flat_hosts.items()} | {
        f"hnsw {n}": p for n, p in hnsw_hosts.items()
    }
    results = {
        name: [text_hits(p, corpus.collective, text, 20, flt) for text in TEXTS]
        for name, p in hosts.items()
    }
    first, *others = results.items()
    assert all(first[1]), "no hits to compare"
    for name, found in others:
        for hits in found:
            assert hits == sorted(hits, key=lambda h: (-h[1], h[0])), "ties not ordered by id"
        shared = overlap(first[1], found)
        assert shared >= LEAST_OVERLAP, f"{name} vs {first[0]}, {filter_name}: {shared:.3f}"


def test_hybrid_search_overlaps_on_every_host(corpus: Corpus, flat_hosts: Hosts) -> None:
    first, *others = flat_hosts.items()
    expected = [
        [(r.experience.experience_id, r.score) for r in q.hybrid_experiences(
            first[1], corpus.collective, text, query, 30)]
        for text, query in zip(TEXTS, corpus.queries, strict=False)
    ]  # fmt: skip
    for name, p in others:
        found = [
            [(r.experience.experience_id, r.score) for r in q.hybrid_experiences(
                p, corpus.collective, text, query, 30)]
            for text, query in zip(TEXTS, corpus.queries, strict=False)
        ]  # fmt: skip
        shared = overlap(expected, found)
        assert shared >= LEAST_OVERLAP, f"{name} vs {first[0]}, hybrid: {shared:.3f}"


@pytest.mark.parametrize("filter_name", ["any live", "include archived", "min importance"])
def test_hnsw_top_k_overlaps_on_every_host(
    corpus: Corpus, hnsw_hosts: Hosts, filter_name: str
) -> None:
    """At least 95% of the top k shared on average; a hit both return has one score (the
    candidates are re-ranked exactly)."""
    flt = FILTERS[filter_name]
    names = list(hnsw_hosts)
    for k in (10, 20):
        hits = {
            name: [dict(similar(p, corpus, query, k, flt)) for query in corpus.queries]
            for name, p in hnsw_hosts.items()
        }
        assert all(len(found) == k for found in hits[names[0]]), "fewer than k hits"
        for a, b in [(x, y) for n, x in enumerate(names) for y in names[n + 1 :]]:
            shared = 0
            for n, (left, right) in enumerate(zip(hits[a], hits[b], strict=True)):
                both = left.keys() & right.keys()
                shared += len(both)
                worst = max((abs(left[i] - right[i]) for i in both), default=0.0)
                assert worst <= SCORE_TOLERANCE, f"{a} vs {b}, query {n}: scores differ by {worst}"
            overlap = shared / (k * len(corpus.queries))
            assert overlap >= LEAST_OVERLAP, f"{a} vs {b}, k={k}, {filter_name}: {overlap:.3f}"


@pytest.mark.parametrize("filter_name", ["rare", "rare, archived too"])
def test_hnsw_search_over_few_candidates_is_exact(
    corpus: Corpus, flat_hosts: Hosts, hnsw_hosts: Hosts, filter_name: str
) -> None:
    """A filter leaving few candidates is scanned exactly: every HNSW host gives what the
    flat hosts give."""
    flt = FILTERS[filter_name]
    flat = flat_hosts["in order"]
    live = flat.memory.live_experiences_of(corpus.collective)
    candidates = sum(1 for r in live if q._passes(r, flt))
    assert 20 < candidates <= 4 * HNSW_THRESHOLD // 10, candidates  # the exact-scan path
    for k in (10, 20):
        for n, query in enumerate(corpus.queries[:EXACT_QUERIES]):
            expected = similar(flat, corpus, query, k, flt)
            for name, p in hnsw_hosts.items():
                found = similar(p, corpus, query, k, flt)
                assert_same_hits(expected, found, f"hnsw {name}, query {n}, k={k}, {filter_name}")


def test_a_host_missing_one_event_answers_differently(
    corpus: Corpus, flat_hosts: Hosts, tmp_path: Path
) -> None:
    """The checks above can fail: drop the recording of query 0's best hit on one host."""
    full = flat_hosts["in order"]
    best = similar(full, corpus, corpus.queries[0], 10, q.ANY_LIVE)[0][0]
    missing = [
        e
        for e in corpus.events
        if not (isinstance(e, ev.ExperienceRecorded) and e.experience_id == best)
    ]
    assert len(missing) == len(corpus.events) - 1
    p = Projection(tmp_path / "missing", ProjectionSettings(hnsw_threshold=FLAT_THRESHOLD))
    deliver(p, missing, [700])
    try:
        assert p.digest() != full.digest()
        found = similar(p, corpus, corpus.queries[0], 10, q.ANY_LIVE)
        with pytest.raises(AssertionError):
            assert_same_hits(similar(full, corpus, corpus.queries[0], 10, q.ANY_LIVE), found, "")
    finally:
        p.close()


# -- any delivery of a small history, some events twice, in any batches --------------------

SMALL_DIM = 8
_rng = np.random.default_rng(3)
SMALL_VECTORS = _rng.normal(size=(12, SMALL_DIM)).astype(np.float32)
SMALL_QUERIES = _rng.normal(size=(4, SMALL_DIM)).astype(np.float32)
SMALL = UUID(int=0x5A)
SMALL_IDS = [UUID(int=0x100 + i) for i in range(len(SMALL_VECTORS))]
WRITERS = [UUID(int=0xA0 + i) for i in range(2)]


def small_event(draw: st.DrawFn, ms: int) -> ev.Event:
    common = {
        "event_id": draw(st.uuids()),
        "instance_id": draw(st.sampled_from(WRITERS)),
        "hlc": ev.pack_hlc(BASE_MS + ms),
    }
    n = draw(st.integers(0, len(SMALL_IDS) - 1))
    eid, cid = SMALL_IDS[n], SMALL
    kind = draw(st.sampled_from(["record"] * 3 + ["update", "archive", "unarchive", "delete"]))
    if kind == "record":
        return ev.ExperienceRecorded(
            **common,  # type: ignore[arg-type]
            experience_id=eid, collective_id=cid,
            content=draw(st.sampled_from(["cache lock", "cache", "retry lock"])),
            embedding=SMALL_VECTORS[n].tobytes(), experience_type=ev.Generic(),
            importance=draw(st.sampled_from([0.2, 0.8])), confidence=0.5, source_agent="a",
            domain=draw(st.sampled_from([("x",), ("y",), ("x", "y")])),
        )  # fmt: skip
    if kind == "update":
        return ev.ExperienceUpdated(
            **common,  # type: ignore[arg-type]
            experience_id=eid, collective_id=cid,
            importance=draw(st.sampled_from([None, 0.1, 0.9])),
            domain=draw(st.sampled_from([None, ("x",), ("y",)])),
        )  # fmt: skip
    flag: dict[str, type[ev.ExperienceArchived | ev.ExperienceUnarchived]] = {
        "archive": ev.ExperienceArchived,
        "unarchive": ev.ExperienceUnarchived,
    }
    made = flag.get(kind, ev.ExperienceDeleted)
    return made(**common, experience_id=eid, collective_id=cid)  # type: ignore[arg-type]


@st.composite
def small_histories(draw: st.DrawFn) -> list[ev.Event]:
    collective = ev.CollectiveCreated(
        event_id=draw(st.uuids()), instance_id=WRITERS[0], hlc=ev.pack_hlc(BASE_MS),
        collective_id=SMALL, owner_id="o", name="small", embedding_dimension=SMALL_DIM,
    )  # fmt: skip
    times = draw(st.lists(st.integers(1, 30), min_size=1, max_size=30))
    return [collective, *(small_event(draw, ms) for ms in times)]


SMALL_FILTERS = [
    q.ANY_LIVE,
    q.ExperienceFilter(include_archived=True),
    q.ExperienceFilter(domains=("y",), min_importance=0.5),
]


def two_hosts(data: st.DataObject, directory: Path) -> tuple[Projection, Projection]:
    """A small history delivered to two hosts, each in an order and batches of its own,
    some events twice."""
    events = data.draw(small_histories())
    hosts = []
    for name in ("a", "b"):
        delivered = data.draw(redeliveries(events))
        sizes = data.draw(st.lists(st.integers(1, 8), min_size=1, max_size=3))
        p = Projection(directory / name, ProjectionSettings(hnsw_threshold=1000))
        deliver(p, delivered, sizes)
        hosts.append(p)
    return hosts[0], hosts[1]


@settings(max_examples=by_profile(ci=12, dev=50))  # each example ~0.7 CPU-s
@given(st.data())
def test_any_delivery_of_a_small_history_gives_the_same_digest_and_similar_hits(
    data: st.DataObject,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        a, b = two_hosts(data, Path(tmp))
        try:
            assert a.digest() == b.digest()
            for flt in SMALL_FILTERS:
                for query in SMALL_QUERIES:
                    assert_same_hits(
                        similar_small(a, query, flt), similar_small(b, query, flt), repr(flt)
                    )
        finally:
            a.close()
            b.close()


def test_equal_text_scores_come_back_in_one_order(tmp_path: Path) -> None:
    """Two experiences with the same content score alike: every host returns them by
    id, whatever order it indexed them in."""
    cid, instance = uuid7(), uuid7()
    created = ev.CollectiveCreated(
        **stamp(0, instance), collective_id=cid, owner_id="o", name="c",  # type: ignore[arg-type]
        embedding_dimension=4,
    )  # fmt: skip
    twins = [
        ev.ExperienceRecorded(
            **stamp(1 + i, instance),
            experience_id=uuid7(),
            collective_id=cid,  # type: ignore[arg-type]
            content="cache lock cache",
            embedding=np.ones(4, dtype=np.float32).tobytes(),
            experience_type=ev.Generic(),
            importance=0.5,
            confidence=0.5,
            source_agent="a",
        )  # fmt: skip
        for i in range(6)
    ]
    answers = []
    for n, order in enumerate([twins, twins[::-1], twins[3:] + twins[:3]]):
        p = Projection(tmp_path / str(n))
        p.apply([LogEntry(i, "s", e) for i, e in enumerate([created, *order], 1)])
        answers.append([i for i, _ in text_hits(p, cid, "cache", 4, q.ANY_LIVE)])
        p.close()
    expected = sorted(t.experience_id for t in twins)[:4]
    assert answers == [expected] * 3


def similar_small(p: Projection, query: Vectors, flt: q.ExperienceFilter) -> Hits:
    return [
        (r.experience.experience_id, r.score)
        for r in q.similar_experiences(p, SMALL, query, 5, flt)
    ]

"""Similar-search recall@20 against exact numpy search on 20,000 clustered 384-dimension
vectors: 1.0 while the index is exact, at least 0.95 once it is HNSW."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections import queries as q
from projections.projection import Projection, ProjectionSettings

N, DIM, CLUSTERS, QUERIES, K = 20_000, 384, 40, 50, 20


@pytest.fixture(scope="module")
def corpus() -> tuple[list[LogEntry], np.ndarray, np.ndarray, list]:  # type: ignore[type-arg]
    rng = np.random.default_rng(20)
    centers = rng.normal(size=(CLUSTERS, DIM))
    vectors = (centers[rng.integers(0, CLUSTERS, N)] + 0.35 * rng.normal(size=(N, DIM))).astype(
        np.float32
    )
    queries = (
        centers[rng.integers(0, CLUSTERS, QUERIES)] + 0.35 * rng.normal(size=(QUERIES, DIM))
    ).astype(np.float32)
    cid, instance = uuid7(), uuid7()
    common = {"instance_id": instance, "hlc": ev.pack_hlc(1_700_000_000_000)}
    events: list[ev.Event] = [
        ev.CollectiveCreated(event_id=uuid7(), **common, collective_id=cid, owner_id="o",  # type: ignore[arg-type]
                             name="recall", embedding_dimension=DIM)
    ]  # fmt: skip
    ids = []
    for i in range(N):
        eid = uuid7()
        ids.append(eid)
        events.append(
            ev.ExperienceRecorded(
                event_id=uuid7(),
                **common,
                experience_id=eid,
                collective_id=cid,  # type: ignore[arg-type]
                content=f"vector {i}",
                embedding=vectors[i].tobytes(),
                experience_type=ev.Generic(),
                importance=0.5,
                confidence=0.5,
                source_agent="recall",
            )  # fmt: skip
        )
    entries = [LogEntry(seq, "s", e) for seq, e in enumerate(events, start=1)]
    return entries, vectors, queries, [cid, ids]


def recall(projection: Projection, vectors: np.ndarray, queries: np.ndarray, cid, ids) -> float:  # type: ignore[no-untyped-def, type-arg]
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    hits = 0
    for query in queries:
        exact = np.argsort(-(unit @ (query / np.linalg.norm(query))))[:K]
        truth = {ids[i] for i in exact}
        found = {
            r.experience.experience_id for r in q.similar_experiences(projection, cid, query, k=K)
        }
        hits += len(truth & found)
    return hits / (K * len(queries))


@pytest.mark.parametrize(
    ("threshold", "hnsw", "least"), [(N + 1, False, 1.0), (10_000, True, 0.95)]
)
def test_recall_at_20(tmp_path: Path, corpus, threshold: int, hnsw: bool, least: float) -> None:  # type: ignore[no-untyped-def]
    entries, vectors, queries, (cid, ids) = corpus
    projection = Projection(tmp_path / "state", ProjectionSettings(hnsw_threshold=threshold))
    for start in range(0, len(entries), 2000):
        projection.apply(entries[start : start + 2000])
        projection.sync_indexes()  # as the engine does after every batch
    assert projection.vectors[("experience", cid)].is_hnsw is hnsw
    measured = recall(projection, vectors, queries, cid, ids)
    assert measured >= least, f"recall@{K} = {measured}"
    projection.close()

"""Recall of the vector graph by how it was built: at once, as FAISS alone builds it, or
online, as a host's ingest builds it.

    python -m ops.bench.graph_build [--n 200000] [--shape 1000000] [--queries 1000]

The million's second run read recall@10 0.921 where FAISS alone read 0.956, with no
change to the vector code since the first run's 0.960. This puts the builds side by
side on the same vectors and queries, in one process: ``n`` unit vectors drawn from the
clusters of ``ops.bench.scale`` at ``--shape`` experiences (the million's 1,000 clusters
by default: ``n`` of them are a sparser, harder sample than a scale run of ``n``), the
exact top 10 by numpy as the truth, ``projections.vectors.graph_index`` searched at
Pulse's breadth (efSearch 128), and each graph's 20 best candidates re-ranked by their
exact vectors, as Pulse searches:

- ``bulk``: trained and filled in one ``add`` (the peer of ``ops.bench.scale``);
- ``chunks-C``: trained on the first ``hnsw_threshold`` vectors and filled with them
  (Pulse's first graph), then ``add`` calls of ``C`` vectors;
- ``efc-E``: the same with chunks of 2,048 and efConstruction ``E`` (Pulse builds a
  graph in one add at 80, ``HNSW_EF_CONSTRUCTION``, and inserts into it at 128,
  ``HNSW_EF_ONLINE``);
- ``pulse``: Pulse's own ``VectorIndex``, fed batches of 256 at an ingest's pace (its
  pending vectors and background inserter; ``--pace`` vectors a second).

Output: one JSON line per build (its seconds, recall@10 of the graph alone and
re-ranked, ``vs_bulk``: the re-ranked recall over the bulk build's); build times are
comparable only within one run on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss as _faiss
import numpy as np
import numpy.typing as npt

from ops.bench.scale import Shape, exact_neighbours
from projections.projection import ProjectionSettings
from projections.vectors import HNSW_EF_CONSTRUCTION, ExactVectors, VectorIndex, graph_index

faiss: Any = _faiss
Matrix = npt.NDArray[np.float32]
K, CANDIDATES = 10, 20
TRUTH_ROWS = 50_000  # vectors a step of the exact search holds (its scores: queries x this)


def recall(found: Sequence[Sequence[int]], truth: npt.NDArray[np.int64]) -> float:
    return float(np.mean([len(set(f[:K]) & set(t)) / K for f, t in zip(found, truth, strict=True)]))


class Bench:
    def __init__(self, n: int, shape: int, queries: int, seed: int) -> None:
        clusters = Shape(shape, seed)
        x, _ = clusters.draw(n, np.random.default_rng([seed, 1]))
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        q, _ = clusters.draw(queries, np.random.default_rng([seed, 2]))
        self.q = np.ascontiguousarray(q, dtype=np.float32)
        rows = ((first, self.x[first : first + TRUTH_ROWS]) for first in range(0, n, TRUTH_ROWS))
        self.truth = exact_neighbours(self.q, rows, k=K)
        settings = ProjectionSettings()
        self.threshold, self.ef_search = settings.hnsw_threshold, settings.ef_search

    def graph(
        self, chunk: int | None, ef_construction: int = HNSW_EF_CONSTRUCTION
    ) -> dict[str, Any]:
        """A graph built at once (``chunk`` None) or online in chunks, and its recall."""
        x, index = self.x, graph_index(self.x.shape[1])
        index.hnsw.efConstruction = ef_construction
        faiss.omp_set_num_threads(os.cpu_count() or 1)  # (as FAISS alone builds it)
        started = time.perf_counter()
        if chunk is None:
            index.train(x)
            index.add(x)
        else:
            first = min(self.threshold, len(x))
            index.train(x[:first])
            index.add(x[:first])
            for start in range(first, len(x), chunk):
                index.add(x[start : start + chunk])
        seconds = time.perf_counter() - started
        index.hnsw.efSearch = self.ef_search
        faiss.omp_set_num_threads(1)
        _, found = index.search(self.q, CANDIDATES)
        reranked = [
            c[np.argsort(-(x[c[c >= 0]] @ v), kind="stable")][:K]
            for c, v in zip(found, self.q, strict=True)
        ]
        graph = recall(found.tolist(), self.truth)
        return {"seconds": round(seconds, 2), "graph_recall": round(graph, 4),
                "recall": round(recall(reranked, self.truth), 4)}  # fmt: skip

    def pulse(self, batch: int, pace: float) -> dict[str, Any]:
        """Pulse's ``VectorIndex`` fed as an ingest feeds it, searched as Pulse searches."""
        x, dim = self.x, self.x.shape[1]
        with tempfile.TemporaryDirectory() as work:
            exact = ExactVectors(Path(work) / "exact.f32", dim)
            index = VectorIndex(dim, exact, self.threshold, self.ef_search)
            started = time.perf_counter()
            for start in range(0, len(x), batch):
                ids = list(range(start + 1, min(len(x), start + batch) + 1))  # (vec_ids from 1)
                index.add(ids, x[start : start + batch], [uuid.uuid4() for _ in ids])
                time.sleep(len(ids) / pace)
            index.wait()
            seconds = time.perf_counter() - started
            found = [[vec_id - 1 for vec_id, _ in index.search(v[None], K)] for v in self.q]
            exact.close()
        return {"seconds": round(seconds, 2), "recall": round(recall(found, self.truth), 4)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.graph_build", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--n", type=int, default=200_000, help="vectors (200,000)")
    parser.add_argument("--shape", type=int, default=1_000_000,
                        help="the scale run whose clusters they come from (1,000,000)")  # fmt: skip
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--chunks", default="2048,47500",
                        help="online builds, vectors per add (2048,47500)")  # fmt: skip
    parser.add_argument("--efc", default="128", help="efConstructions with chunks of 2,048 (128)")
    parser.add_argument("--pace", type=float, default=1400.0,
                        help="vectors a second fed to Pulse's index (1400; 0: none)")  # fmt: skip
    options = parser.parse_args(argv)
    if options.n < 1 or options.queries < 1 or options.shape < 1:
        parser.error("--n, --queries and --shape must be positive")
    try:
        chunks = [int(c) for c in options.chunks.split(",") if c]
        efcs = [int(e) for e in options.efc.split(",") if e]
    except ValueError:
        parser.error("--chunks and --efc: comma-separated whole numbers")
    if any(c < 1 for c in chunks) or any(e < 1 for e in efcs):
        parser.error("--chunks and --efc: positive numbers")
    bench = Bench(options.n, options.shape, options.queries, options.seed)
    builds: list[tuple[str, Any]] = [("bulk", lambda: bench.graph(None))]
    builds += [(f"chunks-{c}", lambda c=c: bench.graph(c)) for c in chunks]
    builds += [(f"efc-{e}", lambda e=e: bench.graph(2048, e)) for e in efcs]
    if options.pace > 0:
        builds.append(("pulse", lambda: bench.pulse(256, options.pace)))
    bulk: float | None = None
    for name, build in builds:
        print(f"graph_build: {name} ...", file=sys.stderr, flush=True)
        result = build()
        bulk = result["recall"] if bulk is None else bulk
        print(json.dumps({"bench": "graph_build", "build": name, "n": options.n,
                          "shape": options.shape, **result,
                          "vs_bulk": round(result["recall"] / bulk, 4) if bulk else None}),
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FAISS indexes, one per collective and kind (experiences, insights): cosine similarity
as inner product of L2-normalized vectors.

An index is exact (``IndexFlatIP``) while small and becomes HNSW once it holds more than
``hnsw_threshold`` vectors. Ids are the rows' local ``vec_id``. Vectors that must not be
returned (archived unless asked for, deleted, invalid) are filtered by an ID selector at
search time; a flat index also drops deleted vectors at once, an HNSW index keeps their
graph nodes until it is rebuilt (compaction) but overwrites their vectors with zeros at
once, so a forgotten embedding is not kept in memory or in the saved file. With a
filter that leaves few candidates, search is an exact scan over just those candidates,
so a filter never costs recall.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable
from uuid import UUID

import faiss as _faiss
import numpy as np
import numpy.typing as npt

faiss: Any = _faiss  # its bundled stubs miss SearchParametersHNSW and selector arguments

Matrix = npt.NDArray[np.float32]


def normalized(vectors: Matrix) -> Matrix:
    out = np.array(vectors, dtype=np.float32, copy=True).reshape(-1, vectors.shape[-1])
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


@dataclass
class VectorIndex:
    """One collective's vectors of one kind."""

    dim: int
    hnsw_threshold: int = 10_000
    ef_search: int = 128
    index: Any = field(init=False)  # faiss.IndexIDMap2
    members: set[int] = field(default_factory=set)  # vec_ids in the FAISS index
    keys: dict[int, UUID] = field(default_factory=dict)  # vec_id -> experience / insight id
    hidden: set[int] = field(default_factory=set)  # archived: only when asked for
    gone: set[int] = field(default_factory=set)  # deleted or invalid, still in HNSW
    _selectors: dict[bool, Any] = field(default_factory=dict)  # cached faiss.IDSelector

    def __post_init__(self) -> None:
        self.index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))

    @property
    def is_hnsw(self) -> bool:
        return not isinstance(faiss.downcast_index(self.index.index), faiss.IndexFlat)

    def add(self, ids: list[int], vectors: Matrix, keys: list[UUID]) -> None:
        fresh = [i for i, vid in enumerate(ids) if vid not in self.members]
        if not fresh:
            return
        for i in fresh:
            self.keys[ids[i]] = keys[i]
        new_ids = np.array([ids[i] for i in fresh], dtype=np.int64)
        self.index.add_with_ids(normalized(vectors[fresh]), new_ids)
        self.members.update(new_ids.tolist())
        self.gone.difference_update(new_ids.tolist())
        self._selectors.clear()
        if not self.is_hnsw and self.index.ntotal > self.hnsw_threshold:
            self._to_hnsw()

    def set_hidden(self, vec_id: int, hidden: bool) -> None:
        if (vec_id in self.hidden) != hidden:
            (self.hidden.add if hidden else self.hidden.discard)(vec_id)
            self._selectors.clear()

    def remove(self, vec_ids: Iterable[int]) -> None:
        drop = [v for v in vec_ids if v in self.members]
        if not drop:
            return
        self.hidden.difference_update(drop)
        if self.is_hnsw:
            self.gone.update(drop)
            self._erase(drop)
        else:
            self.index.remove_ids(np.array(drop, dtype=np.int64))
            self.members.difference_update(drop)
            for vec_id in drop:
                self.keys.pop(vec_id, None)
        self._selectors.clear()

    def _erase(self, vec_ids: list[int]) -> None:
        """Zero the stored vectors of ``vec_ids`` in an HNSW index (forgetting)."""
        storage = faiss.downcast_index(faiss.downcast_index(self.index.index).storage)
        stored = faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * self.dim)
        positions = np.nonzero(np.isin(faiss.vector_to_array(self.index.id_map), vec_ids))[0]
        stored.reshape(-1, self.dim)[positions] = 0.0

    def _to_hnsw(self) -> None:
        ids = np.array(sorted(self.members - self.gone), dtype=np.int64)
        vectors = np.vstack([self.index.reconstruct(int(i)) for i in ids]) if len(ids) else None
        graph = faiss.IndexHNSWFlat(self.dim, 32, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = 80
        self.index = faiss.IndexIDMap2(graph)
        if vectors is not None:
            self.index.add_with_ids(vectors, ids)
        self.members = set(ids.tolist())
        self.keys = {vec_id: self.keys[vec_id] for vec_id in self.members}
        self.gone.clear()
        self._selectors.clear()

    def search(
        self,
        query: Matrix,
        k: int,
        *,
        include_archived: bool = False,
        allowed: set[int] | None = None,
    ) -> list[tuple[int, float]]:
        """The k nearest (vec_id, cosine similarity), best first."""
        if k <= 0 or not self.members:
            return []
        q = normalized(np.asarray(query, dtype=np.float32))
        if allowed is not None:
            candidates = allowed & self.members
            candidates -= self.gone
            if not include_archived:
                candidates -= self.hidden
            if not candidates:
                return []
            if self.is_hnsw and len(candidates) <= 4 * self.hnsw_threshold // 10 + k:
                return self._exact(q, k, candidates)
            selector: Any = faiss.IDSelectorBatch(
                np.fromiter(candidates, dtype=np.int64, count=len(candidates))
            )
        else:
            selector = self._excluding(include_archived)
        if self.is_hnsw:
            params: Any = faiss.SearchParametersHNSW(
                sel=selector, efSearch=max(self.ef_search, 2 * k)
            )
        else:
            params = faiss.SearchParameters(sel=selector)
        scores, ids = self.index.search(q, k, params=params)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]

    def _excluding(self, include_archived: bool) -> Any:
        selector = self._selectors.get(include_archived)
        if selector is None:
            excluded = self.gone if include_archived else self.gone | self.hidden
            batch = faiss.IDSelectorBatch(
                np.fromiter(excluded, dtype=np.int64, count=len(excluded))
            )
            selector = faiss.IDSelectorNot(batch)
            selector.keep_alive = batch  # the SWIG wrapper does not keep its argument alive
            self._selectors[include_archived] = selector
        return selector

    def _exact(self, q: Matrix, k: int, candidates: set[int]) -> list[tuple[int, float]]:
        ids = np.fromiter(candidates, dtype=np.int64, count=len(candidates))
        vectors = np.vstack([self.index.reconstruct(int(i)) for i in ids])
        scores = vectors @ q[0]
        top = np.argsort(-scores)[:k]
        return [(int(ids[i]), float(scores[i])) for i in top]

    # -- persistence ------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        faiss.write_index(self.index, str(tmp))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path, dim: int, hnsw_threshold: int, ef_search: int) -> VectorIndex:
        loaded = cls(dim, hnsw_threshold, ef_search)
        index = faiss.read_index(str(path))
        if index.d != dim:
            return loaded  # stale file from another life of this collective: start over
        loaded.index = index
        loaded.members = set(faiss.vector_to_array(index.id_map).tolist())
        return loaded


def write_manifest(directory: Path, seq: int, entries: dict[str, int]) -> None:
    """Record the sequence every index file in ``directory`` reflects (written last)."""
    tmp = directory / "manifest.json.tmp"
    tmp.write_text(json.dumps({"seq": seq, "indexes": entries}))
    os.replace(tmp, directory / "manifest.json")


def read_manifest(directory: Path) -> tuple[int, dict[str, int]]:
    try:
        data = json.loads((directory / "manifest.json").read_text())
        return int(data["seq"]), {str(k): int(v) for k, v in data["indexes"].items()}
    except (OSError, ValueError, KeyError):
        return 0, {}

"""Vector search: exact vectors on disk, a compact index in memory.

Two parts, both keyed by the rows' local ``vec_id``:

- ``ExactVectors``: the float32 vectors of one dimension, one slot per ``vec_id`` in a
  memory-mapped file (``vectors/exact-<dim>.f32``). Rows hold where their vector is
  (``fold.held``: an int; a read takes a view of the slot) instead of their own copy,
  so each vector is in the process once, and only the pages a search or a read touches
  are resident: the kernel keeps the rest in its page cache or on disk. A forgotten
  vector is overwritten with zeros.
- ``VectorIndex``: one collective's vectors of one kind. Exact (``IndexFlatIP``) while
  small; past ``hnsw_threshold`` vectors an HNSW graph over 8-bit scalar-quantized
  copies (a quarter of the float32 size). The graph proposes twice the asked-for
  candidates and they are re-ranked against the exact vectors, so scores are exact
  cosine similarities and recall stays where a float32 graph has it (the same choice
  as "quantized in memory, originals on disk, rescoring" in dedicated vector stores).

Cosine similarity is the inner product of L2-normalized vectors. Vectors that must not
be returned (archived unless asked for, deleted, invalid) are filtered by an ID
selector inside the FAISS search; a filter that leaves few candidates is answered by an
exact scan over just those, so a filter never costs recall. A flat index drops deleted
vectors at once; an HNSW graph keeps their nodes (with zeroed codes) until more than
``COMPACT_FRACTION`` of it is gone, then a new graph is built from the live vectors on
a background thread and swapped in by the owner thread, with what was removed during
the build erased in it and what was added meanwhile pending (below).

Vectors added to a graph are not inserted into it at once (a single-vector HNSW insert
costs a few hundred microseconds of the owner thread, which every write would wait for):
they are *pending*, found by an exact scan of them beside the graph search (merged
before the re-ranking: the same scores, filters and cut), and a background worker
(``_INSERTER``, one thread; FAISS releases the GIL) inserts them in chunks of about
``INSERT_SECONDS``, each under the index's lock, so a search waits for at most one
chunk. Past ``PENDING_CAP`` pending vectors (writes faster than the worker, a catch-up)
the adding thread inserts the excess itself, in one bulk call, and a save inserts what
is pending before it writes the graph. A catch-up (a rebuild) adds with ``defer``: an
index with no graph yet keeps what it is given out of FAISS, and its first use builds
it in one add. After a crash, vectors that were pending or deferred are in no saved
graph: like any row behind the saved indexes, the projection adds them again
when it opens.

OpenMP: ``omp_set_num_threads`` sets the calling thread's own team size; a search runs
with ``SEARCH_THREADS`` (1: FAISS's spinning workers cost a single-query search more
than they give, on a shared machine several times more), background inserts with
``INSERT_THREADS``, bulk builds (a graph from scratch, the inline catch-up) with every
core.

A caller that may not see every row (``eventlog.access``: not an admin) is answered by an
exact scan of the rows it may see (``search(exact=True)``), never by the graph: a
graph is built over every vector of the collective, in the order they came (and in
parallel), so which rows an approximate search finds depends on rows the caller may
not see, and two worlds that differ only in those would answer it differently. Ties
at the cut are broken by the rows' keys, not by vec_ids (numbered as rows arrive on
this host). Per-visibility graphs would cost less per search but still depend on the
order and the parallelism of their construction. The scan's cost is gathering the
rows from the exact file; the last ``SCANS_KEPT`` gathered sets (up to
``SCAN_KEPT_BYTES`` each) are kept, so a caller's next search over the same rows is
one matrix product (``python -m ops.bench.projection --only visible_search`` measures
it beside the graph).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import math
import mmap
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Iterable
from uuid import UUID

import faiss as _faiss
import numpy as np
import numpy.typing as npt

faiss: Any = _faiss  # its bundled stubs miss SearchParametersHNSW and selector arguments

Matrix = npt.NDArray[np.float32]

HNSW_M = 32  # graph neighbours per node (64 on the bottom layer)
HNSW_EF_CONSTRUCTION = 80  # a graph built in one add (the first, a compaction)
# Vectors inserted into a graph that exists (the inserter's chunks, the excess past the
# cap, a catch-up) search wider for their neighbours: a graph built online is worse than
# one built in one add at the same breadth (FAISS inserts a batch's upper levels first),
# and at a million it fell below the recall target (0.941 against FAISS's one add at 80:
# 0.956; ``python -m ops.bench.graph_build``: 128 online beats one add at 80)
HNSW_EF_ONLINE = 128
COMPACT_FRACTION = 0.2  # a graph is rebuilt once this share of its nodes is gone
INSERT_SECONDS = 0.002  # about the time of one background chunk of inserts
PENDING_CAP = 4096  # past this many pending vectors, the adding thread inserts the excess
STABLE_WAIT = 0.05  # what the adding thread waits for the inserter's chunk to end, at most
# OpenMP team sizes by use (``omp_set_num_threads`` is per calling thread)
SEARCH_THREADS, INSERT_THREADS, BULK_THREADS = 1, 1, os.cpu_count() or 1
_CHUNK = 4096  # vector slots per mapping of an exact-vectors file
RELEASE_EVERY = 4096  # vectors put or read between two ``ExactVectors.release``
# exact scans kept per index (``_scanned``): of this many rows or more, at most this
# many, each at most this large (a copy of the rows scanned, and their norms)
SCAN_KEPT_MIN, SCANS_KEPT, SCAN_KEPT_BYTES = 1000, 2, 128 * 2**20

# Background work for the indexes; FAISS parallelises each build itself. Inserts and
# compactions have a worker each, so pending vectors never wait behind a compaction.
_INSERTER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulse-faiss-insert")
_COMPACTOR = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulse-faiss-compact")
_omp = threading.local()


def _threads(n: int) -> None:
    """Set this thread's OpenMP team size for FAISS's next calls (if it differs)."""
    if getattr(_omp, "n", None) != n:
        faiss.omp_set_num_threads(n)
        _omp.n = n


def graph_index(dim: int) -> Any:
    """The approximate index Pulse uses past ``hnsw_threshold`` vectors, without ids:
    an HNSW graph over 8-bit scalar-quantized vectors (inner product). It must be
    trained (``train``) before vectors are added; candidates it returns are re-ranked
    against the exact vectors. Benchmarks build the same index alone as the peer."""
    index = faiss.IndexHNSWSQ(
        dim, faiss.ScalarQuantizer.QT_8bit, HNSW_M, faiss.METRIC_INNER_PRODUCT
    )
    index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    return index


def normalized(vectors: Matrix) -> Matrix:
    out = np.array(vectors, dtype=np.float32, copy=True).reshape(-1, vectors.shape[-1])
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


class ExactVectors:
    """Float32 vectors of one dimension in a memory-mapped file, slot = ``vec_id``,
    as recorded (not normalized: rows read their embedding from here).

    The whole file is one mapping; when it must grow, a larger one replaces it for new
    work while views into the old one stay valid (the kernel maps the same file pages),
    so a ``view`` is good for as long as it is held. Slots of other dimensions' vec_ids
    are holes (a sparse file: no disk, no memory)."""

    def __init__(self, path: Path, dim: int) -> None:
        self.path = path
        self.dim = dim
        self.slot_bytes = 4 * dim
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._slots = 0
        self._mapped: mmap.mmap | None = None
        self._view = memoryview(b"")
        self._array: Matrix = np.zeros((0, dim), dtype=np.float32)
        self._dirty = False
        self._written = 0  # slots put or read since the last ``release``
        # the mappings the file had before it grew, which rows' views may still read: a
        # release lets go of their pages too (address space only, of at most twice the
        # file: each mapping is twice the last)
        self._old: list[mmap.mmap] = []
        size = os.fstat(self._fd).st_size
        if size >= self.slot_bytes:
            self._map(size // self.slot_bytes)

    def _map(self, slots: int) -> None:
        if os.fstat(self._fd).st_size < slots * self.slot_bytes:
            os.ftruncate(self._fd, slots * self.slot_bytes)
        if self._mapped is not None and self._dirty:
            self._mapped.flush()
            os.fdatasync(self._fd)  # (what put wrote with pwrite)
            self._dirty = False
        if self._mapped is not None:  # (views into it stay good: ``release`` reaches it)
            self._old.append(self._mapped)
        self._mapped = mmap.mmap(self._fd, slots * self.slot_bytes)
        self._view = memoryview(self._mapped)
        self._array = np.frombuffer(self._mapped, dtype=np.float32).reshape(slots, self.dim)
        self._slots = slots

    def _reach(self, last_vec_id: int) -> None:
        if last_vec_id >= self._slots:
            self._map(max(_CHUNK, 2 * self._slots, last_vec_id + 1))

    def put(self, vec_ids: Iterable[int], vectors: Matrix) -> None:
        """Store vectors in their slots. Slots that make one run (what a host writes: new
        vec_ids, in any order) are written with ``pwrite``, so their pages do not become
        resident in this process as pages written through the mapping do."""
        ids = np.fromiter(vec_ids, dtype=np.int64)
        if not len(ids):
            return
        low, high = int(ids.min()), int(ids.max())
        self._reach(high)
        order = np.argsort(ids, kind="stable") if high - low + 1 == len(ids) else None
        if order is not None and bool((ids[order] == np.arange(low, high + 1)).all()):
            data = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32)[order]).tobytes()
            os.pwrite(self._fd, data, low * self.slot_bytes)
        else:
            self._array[ids] = vectors
        self._dirty = True
        self._written += len(ids)
        if self._written >= RELEASE_EVERY:
            self.release()

    def release(self) -> None:
        """Drop this file's pages from this process's resident memory (``MADV_DONTNEED``
        on a shared file mapping: the page cache keeps them, dirty or not, and a later
        read maps them again): the pages that reads touched, through views (a DuckDB
        write copies each new row's embedding), the inserter and searches. Without it,
        every vector a host writes stays resident: 1.5 GB of RSS at a million."""
        self._written = 0
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        for mapped in (*self._old, self._mapped):
            if mapped is not None and len(mapped):
                mapped.madvise(mmap.MADV_DONTNEED)

    def view(self, vec_id: int) -> memoryview:
        """The stored bytes of one vector, without a copy."""
        self._reach(vec_id)
        start = vec_id * self.slot_bytes
        return self._view[start : start + self.slot_bytes]

    def get(self, vec_ids: npt.NDArray[np.int64]) -> Matrix:
        """The vectors of ``vec_ids`` (a copy), in that order."""
        if not len(vec_ids):
            return self._array[vec_ids]
        self._reach(int(vec_ids.max()))
        out = self._array[vec_ids]
        self._written += len(vec_ids)  # (pages read stay resident as pages written did)
        if self._written >= RELEASE_EVERY:
            self.release()
        return out

    def unit(self, vec_ids: npt.NDArray[np.int64]) -> Matrix:
        """The L2-normalized vectors of ``vec_ids``."""
        out = self.get(vec_ids)
        norms = np.sqrt(np.einsum("ij,ij->i", out, out))[:, None]
        np.divide(out, norms, out=out, where=norms > 0)
        return out

    def erase(self, vec_ids: Iterable[int]) -> None:
        ids = np.fromiter(vec_ids, dtype=np.int64)
        if len(ids):
            self._reach(int(ids.max()))
            self._array[ids] = 0.0
            self._dirty = True

    def close(self) -> None:
        """Close the file; the mappings stay valid while views of them are held."""
        self.sync()
        os.close(self._fd)

    def sync(self, *, every_page: bool = False) -> None:
        """Write what changed to the file (before the manifest says it is there), then
        let its pages go from this process's memory (``release``).
        ``every_page``: whether or not this thread saw a change (a background save: the
        owner thread may be writing meanwhile, and its changes need not be flushed)."""
        mapped = self._mapped
        if mapped is not None and (self._dirty or every_page):
            if not every_page:
                self._dirty = False
            mapped.flush()
            os.fdatasync(self._fd)  # (what put wrote with pwrite)
        self.release()


@dataclass
class VectorIndex:
    """One collective's vectors of one kind (see the module doc).

    Threads: the owner thread (the projection's) makes every call; the inserter only
    moves pending vectors into the graph, under ``_lock`` (held for one chunk), and so
    does every owner-thread use of the graph or of ``pending`` past adding to it."""

    dim: int
    exact: ExactVectors
    hnsw_threshold: int = 10_000
    ef_search: int = 128
    index: Any = field(init=False)  # faiss.IndexIDMap (no reverse map: ids are ours)
    members: set[int] = field(default_factory=set)  # vec_ids in the index (graph or pending)
    keys: dict[int, UUID] = field(default_factory=dict)  # vec_id -> experience / insight id
    hidden: set[int] = field(default_factory=set)  # archived: only when asked for
    gone: set[int] = field(default_factory=set)  # deleted or invalid, still in HNSW
    # HNSW: members not in the graph yet, oldest first (the inserter's queue)
    pending: dict[int, None] = field(default_factory=dict)
    # flat: members added with ``defer`` (a catch-up), in no FAISS index yet
    deferred: dict[int, None] = field(default_factory=dict)
    _selectors: dict[bool, Any] = field(default_factory=dict)  # cached faiss.IDSelector
    _positions: npt.NDArray[np.int64] | None = None  # HNSW: vec_id at each graph position
    _positions_room: npt.NDArray[np.int64] | None = None  # ... a view of this (it grows)
    _position_of: npt.NDArray[np.int32] | None = None  # ... and the reverse, by vec_id
    _graph: tuple[Any, Any] | None = None  # (the index, its HNSW graph), looked up once
    _flat: Any = None  # the index, known to be flat (a downcast costs ~15 us)
    _params: dict[tuple[int, int], tuple[Any, Any]] = field(default_factory=dict)
    # the vectors (and norms) of the last exact scans by key, by the vec_ids scanned: a
    # restricted caller's next search over the same rows is one matrix product
    _scans: dict[bytes, tuple[Matrix, npt.NDArray[np.float32]]] = field(default_factory=dict)
    compacting: concurrent.futures.Future[tuple[Any, set[int]]] | None = None
    # the graph and ``pending`` (but adding to it); the inserter holds it for a chunk
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # the owner thread waiting for ``_lock`` (``_held``): the inserter lets it in first
    _turn: threading.Condition = field(default_factory=threading.Condition)
    _wanted: int = 0
    # adding to ``pending`` and starting the inserter, beside the inserter taking a chunk
    _queue: threading.Lock = field(default_factory=threading.Lock)
    # held while the index must not change (a background save writing it: ``write``);
    # whatever changes the index (but adding to ``pending``) takes it before ``_lock``,
    # searches do not (they only read, beside the write)
    _stable: threading.Lock = field(default_factory=threading.Lock)
    _writing: bool = False  # a save is writing the index (holding ``_stable``)
    inserting: concurrent.futures.Future[None] | None = None  # the inserter's run
    _chunk: int = 16  # vectors per background chunk, adjusted to take INSERT_SECONDS

    def __post_init__(self) -> None:
        self.index = faiss.IndexIDMap(faiss.IndexFlatIP(self.dim))

    @property
    def is_hnsw(self) -> bool:
        self._settle()
        return self._is_graph()

    def _is_graph(self) -> bool:
        if self._graph is not None and self._graph[0] is self.index:
            return True
        if self._flat is self.index:
            return False
        inner = faiss.downcast_index(self.index.index)
        if isinstance(inner, faiss.IndexFlat):
            self._flat = self.index
            return False
        self._graph = (self.index, inner)
        return True

    def _settle(self, *, block: bool = False) -> None:
        """Swap in a finished compaction (unless a save is writing the index; ``block``:
        wait for it)."""
        if self.compacting is not None and self.compacting.done():
            if block:
                with self._steady():
                    self._swap()
            elif self._stable.acquire(blocking=False):
                try:
                    self._swap()
                finally:
                    self._stable.release()

    def _graph_positions(self) -> npt.NDArray[np.int64]:
        """The vec_id at each position of the HNSW graph (searched without the id map);
        under ``_lock``. Inserts append: only the new tail is read (into room that
        doubles), and the reverse map, if made, is extended with it."""
        total = int(self.index.ntotal)
        positions, room = self._positions, self._positions_room
        if positions is not None and len(positions) == total:
            return positions
        if positions is None or room is None or len(positions) > total:
            room = faiss.vector_to_array(self.index.id_map).astype(np.int64)
            start, self._position_of = total, None
        else:
            start = len(positions)
            if len(room) < total:
                room = np.empty(max(total, 2 * len(room)), dtype=np.int64)
                room[:start] = positions
            ids = faiss.rev_swig_ptr(self.index.id_map.data(), total)
            room[start:total] = ids[start:]
        self._positions_room, self._positions = room, room[:total]
        reverse = self._position_of
        if reverse is not None and start < total:
            tail = room[start:total]
            top = int(tail.max()) + 1
            if top > len(reverse):
                grown = np.full(max(top, 2 * len(reverse)), -1, dtype=np.int32)
                grown[: len(reverse)] = reverse
                reverse = self._position_of = grown
            reverse[tail] = np.arange(start, total, dtype=np.int32)
        return room[:total]

    def _held(self) -> AbstractContextManager[None]:
        """``_lock``, for the owner thread: ahead of the inserter's next chunk (a lock is
        not fair: the inserter, holding the GIL, would take it again at once)."""
        return self._ahead(self._lock)

    def _steady(self) -> AbstractContextManager[None]:
        """``_stable``, for the owner thread: ahead of the inserter's next chunk (which
        takes it too), as ``_held`` is for ``_lock``; a save writing the index is waited
        for."""
        return self._ahead(self._stable)

    @contextmanager
    def _ahead(self, lock: threading.Lock) -> Iterator[None]:
        """``lock``, taken with the inserter told that the owner thread waits for it."""
        with self._turn:
            self._wanted += 1
        try:
            lock.acquire()
        finally:
            with self._turn:
                self._wanted -= 1
                self._turn.notify_all()
        try:
            yield
        finally:
            lock.release()

    def _positions_of(self, vec_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The graph positions of ``vec_ids`` (those in the graph); under ``_lock``."""
        positions = self._graph_positions()
        if self._position_of is None:
            top = int(positions.max()) + 1 if len(positions) else 0
            self._position_of = np.full(top, -1, dtype=np.int32)
            self._position_of[positions] = np.arange(len(positions), dtype=np.int32)
        inside = vec_ids[vec_ids < len(self._position_of)]
        found = self._position_of[inside]
        return found[found >= 0].astype(np.int64)

    def _bitmap(self, positions: npt.NDArray[np.int64]) -> Any:
        """A selector of graph ``positions``; any other (or later) position is out."""
        keep = np.zeros(int(self.index.ntotal), dtype=bool)
        keep[positions] = True
        bits = np.packbits(keep, bitorder="little")
        selector = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))  # (n: bytes)
        selector.keep_alive = bits  # FAISS reads the numpy buffer: keep it alive
        return selector

    def add(
        self, ids: list[int], vectors: Matrix, keys: list[UUID], *, defer: bool = False
    ) -> None:
        """Add vectors (those not held yet). ``defer`` (a catch-up, a rebuild): while the
        index has no graph yet, only keep them (the exact file, the members); the first
        use of the index that needs them in FAISS builds it from all of them at once:
        a graph in one add at ``HNSW_EF_CONSTRUCTION`` with every core, as FAISS alone
        builds one, instead of one built online as the fold goes (a rebuild of a million
        spent half its time inserting at ``HNSW_EF_ONLINE``, beside the fold)."""
        self._settle()
        fresh = [i for i, vid in enumerate(ids) if vid not in self.members]
        if not fresh:
            return
        for i in fresh:
            self.keys[ids[i]] = keys[i]
        new_ids = np.array([ids[i] for i in fresh], dtype=np.int64)
        self.exact.put(new_ids.tolist(), vectors[fresh])
        self.members.update(new_ids.tolist())
        self.gone.difference_update(new_ids.tolist())
        self._selectors.clear()
        flat = not self._is_graph()
        if flat and (defer or self.deferred):
            self.deferred.update(dict.fromkeys(new_ids.tolist()))
            if not defer:
                self._build_deferred()
        elif flat and len(self.members) - len(self.gone) > self.hnsw_threshold:
            self._to_hnsw()  # takes the new vectors from the exact file
        elif flat:
            with self._steady():
                self.index.add_with_ids(normalized(vectors[fresh]), new_ids)
        else:
            with self._queue:
                self.pending.update(dict.fromkeys(new_ids.tolist()))
                if self.inserting is None:
                    self.inserting = _INSERTER.submit(self._insert_pending)
            # the inserter falls behind: help it, so the vectors searched exactly stay
            # few and the graph is not owed minutes of work (not while a save writes
            # the graph: what is pending meanwhile is searched exactly, inserted after)
            if len(self.pending) > PENDING_CAP and self._stable_soon():
                try:
                    with self._held():
                        self._insert(len(self.pending) - PENDING_CAP // 2, BULK_THREADS)
                finally:
                    self._stable.release()

    def _build_deferred(self) -> None:
        """Put the deferred vectors into FAISS: the graph of every live vector, or the
        flat index while they are few."""
        if not self.deferred:
            return
        if len(self.members) - len(self.gone) > self.hnsw_threshold:
            self._to_hnsw()
        else:
            ids = np.fromiter(self.deferred, np.int64, len(self.deferred))
            with self._steady():
                self.index.add_with_ids(self.exact.unit(ids), ids)
        self.deferred.clear()

    def _stable_soon(self) -> bool:
        """Take ``_stable`` for the owner thread if it is free within ``STABLE_WAIT``:
        ahead of the inserter's next chunk (a chunk ends within about INSERT_SECONDS),
        but not behind a save writing the index (seconds). A try without waiting, as
        before, almost never found the lock free while the inserter worked chunk after
        chunk: a million's ingest left the graph minutes behind its acknowledgements."""
        if self._writing:  # (a save: the excess waits for it, searched exactly)
            return False
        with self._turn:
            self._wanted += 1
        try:
            return self._stable.acquire(timeout=STABLE_WAIT)
        finally:
            with self._turn:
                self._wanted -= 1
                self._turn.notify_all()

    def _insert(self, count: int, threads: int) -> int:
        """Insert the oldest ``count`` pending vectors into the graph (under ``_lock``);
        returns how many."""
        with self._queue:
            chunk = list(islice(self.pending, count))
        if not chunk:
            return 0
        ids = np.array(chunk, dtype=np.int64)
        _threads(threads)
        faiss.downcast_index(self.index.index).hnsw.efConstruction = HNSW_EF_ONLINE
        self.index.add_with_ids(self.exact.unit(ids), ids)
        with self._queue:
            for vec_id in chunk:
                del self.pending[vec_id]
        hidden = self.hidden
        if any(vec_id in hidden for vec_id in chunk):
            self._selectors.clear()  # cached exclusions predate these positions
        return len(chunk)

    def _insert_pending(self) -> None:
        """The inserter: pending vectors into the graph, a chunk of about
        ``INSERT_SECONDS`` at a time, until none is left."""
        try:
            while True:
                with self._turn:  # the owner thread first
                    self._turn.wait_for(lambda: not self._wanted)
                with self._stable, self._lock:
                    with self._queue:
                        if not self.pending:
                            self.inserting = None
                            return
                    start = time.perf_counter()
                    done = self._insert(self._chunk, INSERT_THREADS)
                    took = time.perf_counter() - start
                if done == self._chunk and took > 0:  # aim the next chunk at INSERT_SECONDS
                    aim = self._chunk * INSERT_SECONDS / took
                    self._chunk = max(1, min(1024, round((self._chunk + aim) / 2)))
        except BaseException:
            with self._queue:  # the next add starts another; until then they are searched
                self.inserting = None
            raise

    def set_hidden(self, vec_id: int, hidden: bool) -> None:
        if (vec_id in self.hidden) != hidden:
            (self.hidden.add if hidden else self.hidden.discard)(vec_id)
            self._selectors.clear()

    def remove(self, vec_ids: Iterable[int]) -> None:
        """Take vectors out of the index, and overwrite them with zeros in the exact
        file (a row that keeps its embedding must hold its own copy first)."""
        self._settle()
        drop = [v for v in vec_ids if v in self.members and v not in self.gone]
        if not drop:
            return
        self.hidden.difference_update(drop)
        if self.is_hnsw:
            with self._steady(), self._held():  # no chunk being inserted: a pending one stays out
                with self._queue:  # (pending values are None: 0 says "was not pending")
                    waiting = {v for v in drop if self.pending.pop(v, 0) is None}
                self.exact.erase(drop)
                inside = [v for v in drop if v not in waiting]
                self.gone.update(inside)
                self._erase_codes(self.index, inside)
            self.members.difference_update(waiting)
            for vec_id in waiting:
                self.keys.pop(vec_id, None)
            if len(self.gone) > COMPACT_FRACTION * len(self.members):
                self.compact()
        else:
            self.exact.erase(drop)
            for vec_id in drop:
                self.deferred.pop(vec_id, None)
            with self._steady():
                self.index.remove_ids(np.array(drop, dtype=np.int64))
            self.members.difference_update(drop)
            for vec_id in drop:
                self.keys.pop(vec_id, None)
        self._selectors.clear()
        self._scans.clear()  # (copies of what is forgotten go with it)

    def _erase_codes(self, index: Any, vec_ids: list[int]) -> None:
        """Overwrite the stored codes of ``vec_ids`` in an HNSW index (forgetting)."""
        if not vec_ids:
            return
        storage = faiss.downcast_index(faiss.downcast_index(index.index).storage)
        codes = faiss.rev_swig_ptr(storage.codes.data(), storage.ntotal * storage.code_size)
        positions = np.nonzero(np.isin(faiss.vector_to_array(index.id_map), vec_ids))[0]
        # the code of a zero vector, not code 0: that decodes to each dimension's minimum,
        # a large vector every deleted node would share, crowding out live neighbours
        zero = storage.sa_encode(np.zeros((1, storage.d), dtype=np.float32))
        codes.reshape(storage.ntotal, storage.code_size)[positions] = zero[0]

    def _live_ids(self) -> npt.NDArray[np.int64]:
        return np.array(sorted(self.members - self.gone), dtype=np.int64)

    def _to_hnsw(self) -> None:
        ids = self._live_ids()
        _threads(BULK_THREADS)
        self.index = _build_graph(self.dim, self.exact.unit(ids), ids)
        self.deferred.clear()
        self._positions = None
        self.members = set(ids.tolist())
        self.keys = {vec_id: self.keys[vec_id] for vec_id in self.members}
        self.gone.clear()
        self._selectors.clear()

    # -- compaction ---------------------------------------------------------------------------

    def compact(self) -> None:
        """Start building a graph of the live vectors only (pending ones too), on the
        background worker; the owner thread swaps it in at its next use of the index
        once it is done."""
        if self.compacting is not None or not self.is_hnsw:
            return
        ids = self._live_ids()
        vectors = self.exact.unit(ids)
        self.compacting = _COMPACTOR.submit(
            lambda: (_build_graph(self.dim, vectors, ids), set(ids.tolist()))
        )

    def _swap(self) -> None:
        assert self.compacting is not None
        compacting, self.compacting = self.compacting, None
        try:
            built, snapshot = compacting.result()
        except Exception:  # keep serving from the old graph; the next removal retries
            return
        with self._held():
            live = self.members - self.gone
            left = sorted(snapshot - live)  # removed during the build
            self._erase_codes(built, left)
            self.index = built
            self._positions = None
            with self._queue:  # what arrived during the build waits for the inserter
                self.pending = dict.fromkeys(sorted(live - snapshot))
                if self.pending and self.inserting is None:
                    self.inserting = _INSERTER.submit(self._insert_pending)
            self.members = snapshot | live
            self.gone = set(left)
            self._selectors.clear()
        keys = self.keys  # (a pending vector removed during the build has none left)
        self.keys = {vec_id: keys[vec_id] for vec_id in self.members if vec_id in keys}
        self.hidden &= self.members

    def wait(self) -> None:
        """Finish any compaction under way and insert every pending vector (saving,
        closing, tests)."""
        if self.compacting is not None:
            concurrent.futures.wait([self.compacting])
        self._settle(block=True)
        self._build_deferred()
        self.wait_pending()

    def wait_pending(self) -> None:
        """Insert every pending vector, on this thread (in one bulk call)."""
        if self.pending:
            with self._steady(), self._held():
                self._insert(len(self.pending), BULK_THREADS)

    # -- searching ------------------------------------------------------------------------------

    def search(
        self,
        query: Matrix,
        k: int,
        *,
        include_archived: bool = False,
        allowed: npt.NDArray[np.int64] | None = None,
        exact: bool = False,
    ) -> list[tuple[int, float]]:
        """The k nearest (vec_id, cosine similarity), best first; with ``allowed``, among
        those vec_ids only (live ones, archived or not as the caller decided). ``exact``
        (with ``allowed``): a scan of those, never the graph, ties cut by key: the
        answer depends on the allowed vectors alone (a graph's depends on every vector
        it holds, and on the order they came in)."""
        self._settle()
        self._build_deferred()
        if k <= 0 or not self.members:
            return []
        q = np.asarray(query, dtype=np.float32).reshape(1, -1)
        length = math.sqrt(float(q[0] @ q[0]))
        q = q / length if length > 0 else q
        hnsw = self.is_hnsw
        if allowed is not None:
            candidates = np.asarray(allowed, dtype=np.int64)
            if not len(candidates):
                return []
            if exact:
                return self._exact(q, k, candidates, by_key=True)
            if hnsw and len(candidates) <= 4 * self.hnsw_threshold // 10 + k:
                return self._exact(q, k, candidates)
            if hnsw:
                return self._graph_search(q, k, include_archived, candidates)
            selector: Any = faiss.IDSelectorBatch(candidates)
        elif hnsw:
            return self._graph_search(q, k, include_archived, None)
        else:
            selector = self._excluding(include_archived)
        params = faiss.SearchParameters(sel=selector)
        _threads(SEARCH_THREADS)  # (a flat search too: OpenMP's idle team spins)
        scores, ids = self.index.search(q, k, params=params)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]

    def _graph_search(
        self, q: Matrix, k: int, include_archived: bool, allowed: npt.NDArray[np.int64] | None
    ) -> list[tuple[int, float]]:
        """Twice the candidates from the quantized graph (searched by position, past the
        id map) and every pending vector the search may return, re-ranked by their
        exact vectors."""
        fetch = max(2 * k, k + 10)
        _threads(SEARCH_THREADS)
        with self._held():
            self._is_graph()  # (looks the graph up once)
            assert self._graph is not None
            if allowed is not None:
                selector = self._bitmap(self._positions_of(allowed))
            else:
                selector = self._excluding(include_archived)
            key = (id(selector), fetch)
            params = self._params.get(key)
            if params is None or params[0] is not selector:
                if len(self._params) > 64:
                    self._params.clear()
                made = faiss.SearchParametersHNSW(sel=selector, efSearch=max(self.ef_search, fetch))
                params = self._params[key] = (selector, made)
            _, found = self._graph[1].search(q, fetch, params=params[1])
            at = found[0][found[0] >= 0]
            candidates = self._graph_positions()[at]
            pending = np.fromiter(self.pending, np.int64, len(self.pending))
        if len(pending):
            if allowed is not None:
                pending = pending[np.isin(pending, allowed)]
            elif not include_archived and self.hidden:
                hidden = self.hidden
                pending = pending[[vec_id not in hidden for vec_id in pending.tolist()]]
            candidates = np.concatenate([candidates, pending])
        return self._exact(q, k, candidates)

    def _exact(
        self, q: Matrix, k: int, ids: npt.NDArray[np.int64], *, by_key: bool = False
    ) -> list[tuple[int, float]]:
        """The k best of ``ids`` by exact cosine, ties by vec_id (one order everywhere);
        ``by_key``: ties by the rows' keys (vec_ids are numbered as rows arrive on this
        host, so the same rows may have other numbers elsewhere)."""
        if not len(ids):
            return []
        ids = np.sort(ids)
        vectors, norms = self._scanned(ids) if by_key else self._gathered(ids)
        scores = np.divide(
            vectors @ q[0], norms, out=np.zeros(len(ids), np.float32), where=norms > 0
        )
        if by_key and len(ids) > k:  # everything tied with the k-th, cut by key below
            kth = np.partition(-scores, k - 1)[k - 1]
            top = np.flatnonzero(-scores <= kth)
        else:
            top = np.argsort(-scores, kind="stable")[:k]
        found = list(zip(ids[top].tolist(), scores[top].tolist(), strict=True))
        if by_key:
            keys = self.keys
            found.sort(key=lambda hit: (-hit[1], keys.get(hit[0]) or UUID(int=0)))
        return found[:k]

    def _gathered(self, ids: npt.NDArray[np.int64]) -> tuple[Matrix, npt.NDArray[np.float32]]:
        """The vectors of ``ids`` (sorted) and their norms."""
        vectors = self.exact.get(ids)
        return vectors, np.sqrt(np.einsum("ij,ij->i", vectors, vectors))

    def _scanned(self, ids: npt.NDArray[np.int64]) -> tuple[Matrix, npt.NDArray[np.float32]]:
        """``_gathered``, kept for the next scan of the same rows (the last
        ``SCANS_KEPT`` sets of ``SCAN_KEPT_MIN`` rows or more, each of at most
        ``SCAN_KEPT_BYTES``). Gathering the rows from the exact file is
        most of a scan's time; the product over a kept copy is the same computation
        (the same matrix), so its scores are the same to the last bit."""
        if not SCAN_KEPT_MIN <= len(ids) <= SCAN_KEPT_BYTES // (4 * self.dim + 4):
            return self._gathered(ids)
        key = hashlib.blake2b(ids.tobytes(), digest_size=16).digest()
        found = self._scans.pop(key, None)
        if found is None:
            found = self._gathered(ids)
        self._scans[key] = found  # (the most recent last)
        while len(self._scans) > SCANS_KEPT:
            del self._scans[next(iter(self._scans))]
        return found

    def _excluding(self, include_archived: bool) -> Any:
        """The selector of what a search may return (cached until the sets change);
        None when that is everything. For a graph (under ``_lock``): every position but
        the excluded ones', so the positions inserted later are in."""
        if include_archived in self._selectors:
            return self._selectors[include_archived]
        excluded = self.gone if include_archived else self.gone | self.hidden
        selector: Any
        if not excluded:
            selector = None
        elif self._is_graph():
            ids = np.fromiter(excluded, dtype=np.int64, count=len(excluded))
            out = self._bitmap(self._positions_of(ids))
            selector = faiss.IDSelectorNot(out)
            selector.keep_alive = out  # the SWIG wrapper does not keep its argument alive
        else:
            batch = faiss.IDSelectorBatch(
                np.fromiter(excluded, dtype=np.int64, count=len(excluded))
            )
            selector = faiss.IDSelectorNot(batch)
            selector.keep_alive = batch
        self._selectors[include_archived] = selector
        return selector

    def stored(self) -> tuple[npt.NDArray[np.int64], Matrix]:
        """Every vec_id in the FAISS index and the vector FAISS keeps for it (decoded
        from its codes): what forgetting must have overwritten."""
        self._settle()
        self._build_deferred()
        with self._held():
            inner = faiss.downcast_index(self.index.index)
            if not isinstance(inner, faiss.IndexFlat):
                inner = faiss.downcast_index(inner.storage)
            ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
            total = inner.ntotal
            vectors = inner.reconstruct_n(0, total) if total else np.zeros((0, self.dim))
        return ids, vectors.astype(np.float32)

    # -- persistence ------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Write the graph, pending vectors inserted first (at most ``PENDING_CAP``,
        most often none or a few: the file is whole, and opening it adds nothing back).
        A compaction still running is saved next time."""
        self._settle(block=True)
        self._build_deferred()
        self.wait_pending()
        self.write(path)

    def write(self, path: Path) -> None:
        """Write the index as it is (pending vectors are in no file: an open adds them
        again), from any thread: nothing changes it meanwhile (``_stable``), and searches
        go on beside the write. What waits: the inserter, a removal, a swap and a flat
        add on this index; an add past ``PENDING_CAP`` leaves the excess pending (it
        waits ``STABLE_WAIT`` at most)."""
        tmp = path.with_suffix(".tmp")
        with self._stable:
            with self._lock:  # (a swap replaces it under both)
                index = self.index
            self._writing = True
            try:
                faiss.write_index(index, str(tmp))
            finally:
                self._writing = False
        os.replace(tmp, path)

    @classmethod
    def load(
        cls,
        path: Path,
        exact: ExactVectors,
        hnsw_threshold: int,
        ef_search: int,
        read: Any = None,
    ) -> VectorIndex:
        """The index saved at ``path`` (``read``: the FAISS index already read from it)."""
        loaded = cls(exact.dim, exact, hnsw_threshold, ef_search)
        index = read_index_file(path) if read is None else read
        if index.d != exact.dim or not isinstance(index, faiss.IndexIDMap):
            return loaded  # stale file from another life of this collective: start over
        loaded.index = index
        loaded.members = set(faiss.vector_to_array(index.id_map).tolist())
        return loaded


def read_index_file(path: Path) -> Any:
    """A saved FAISS index, read (FAISS lets go of the GIL while it reads)."""
    return faiss.read_index(str(path))


def _build_graph(dim: int, vectors: Matrix, ids: npt.NDArray[np.int64]) -> Any:
    """A trained, filled HNSW index over ``vectors`` (normalized) with ``ids``."""
    graph = graph_index(dim)
    graph.train(vectors if len(vectors) else np.zeros((1, dim), dtype=np.float32))
    index = faiss.IndexIDMap(graph)
    if len(ids):
        index.add_with_ids(vectors, ids)
    return index


# 1: float32 graphs, no exact-vectors file; 2: one text field for every kind. An older
# manifest reads as "no saved index": the indexes are filled again from the rows.
FORMAT = 3


def write_manifest(directory: Path, seq: int, entries: dict[str, int]) -> None:
    """Record the sequence every index file in ``directory`` reflects (written last)."""
    tmp = directory / "manifest.json.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, "seq": seq, "indexes": entries}))
    os.replace(tmp, directory / "manifest.json")


def read_manifest(directory: Path) -> tuple[int, dict[str, int]]:
    try:
        data = json.loads((directory / "manifest.json").read_text())
        if data.get("format") != FORMAT:
            return 0, {}
        return int(data["seq"]), {str(k): int(v) for k, v in data["indexes"].items()}
    except (OSError, ValueError, KeyError):
        return 0, {}

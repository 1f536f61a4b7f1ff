"""Benchmark: a million memories on one host (issue 28, target 4), each Pulse figure
beside FAISS building and searching the same index alone in the same run.

    python -m ops.bench.scale [--size 1.0] [--queries 1000] [--callers 4]
                              [--hnsw-threshold 10000] [--ef-search 128]

``--size`` scales the run: 1.0 is 1,000,000 experiences, 0.05 is 50,000. One
temporary directory holds everything (removed at the end, on failure and on Ctrl-C);
one embedded NATS server (syncing every write, as a data directory's own does) holds
the log. Each phase runs in a process of its own (``--child``), so the memory of one
is not counted in another's and the peer's build does not share a heap with Pulse:

1. data (this process): ``n`` unit vectors of 384 dimensions written to a file, in
   chunks (reproducible from ``--seed``): 40 topics, ``max(16, n / 1000)`` clusters
   under them with Zipf-like sizes, each item its cluster's center plus a spread in the
   cluster's own 8-dimensional subspace plus isotropic noise (nearest neighbours have a
   cosine of about 0.8, unrelated items about 0: the shape of sentence embeddings).
   The queries are drawn the same way with another seed. Each experience's text
   (about 215 bytes: ``note <i>:`` and pseudo-words from a Zipf-like vocabulary of
   5,000, each cluster with favourite words) is made from its number when it is sent.
2. faiss: ``projections.vectors.graph_index(384)`` (the HNSW graph over 8-bit scalar
   quantized codes Pulse uses past ``hnsw_threshold``) trained on and filled with the
   same vectors, alone: its build time is the peer of the ingest and of the rebuild.
   Then the exact top 10 of every query by brute force (numpy, in chunks): the ground
   truth of recall.
3. log: the floor of any ingest through the log: raw nats-py publishing each item's
   bytes (vector and text) to a stream of its own on the same server, ``BATCH`` at a
   time from ``--callers`` tasks, each batch one JetStream atomic batch (as
   ``record_experiences`` writes one), each task waiting for its batch's answer.
4. ingest: an in-process ``PulseDB`` on the server; ``record_experiences`` of 1,000
   items from ``--callers`` concurrent tasks until all are acknowledged (each call
   returns once this host applied it), with a progress line on stderr; VmRSS of this
   process (``/proc/self/status``) then, beside what it was before ``PulseDB.open``.
5. search: a fresh process opens the same data directory (the time of
   ``PulseDB.open``: the state on disk), makes one search, and reads its VmRSS (the
   restart figure). Then ``search_similar`` (k=10, ``energy_weight=0``: nearest by
   meaning) beside the peer's own ``search`` of its index (efSearch = ``--ef-search``,
   Pulse's breadth; k=10, one query at a time), alternating in blocks of 50; recall@10
   of both against the ground truth. Then the same searches while 8 tasks call
   ``record_experience`` in a loop (new vectors and texts): their p50 and p99.
6. rebuild: ``sync.maintenance.rebuild`` (what ``pulse rebuild`` runs) on the data
   directory, in seconds per event of the log, beside the peer's build in seconds per
   vector.

Figures: one JSON line each (``value``, ``better``, ``target``, ``met`` and the details
it comes from), then a ``summary`` line; a table on stderr. A phase that fails stops the
run (the temporary directory is removed, whatever runs is stopped, as on Ctrl-C), except
the rebuild: its figure is then printed with ``value`` null and the error. Each phase's
result is kept in the work directory too (``result-<phase>.json``); ``--work DIR`` runs
in DIR and keeps it, and ``--child PHASE DIR`` runs one phase of it again (starting the
kept log's server if none runs), e.g. under a profiler.

- ``raw_log_vs_faiss_build``: messages/s of the raw log / vectors/s of the peer's
  build: what ``ingest_vs_faiss_build`` could reach were Pulse's own work free (below
  0.8, that target cannot be met on this machine by a design that logs every
  experience, synced, before acknowledging it).
- ``ingest_vs_faiss_build``: experiences/s acknowledged / vectors/s of the peer's
  build; >= 0.8 (``vs_raw_log``: over the raw log's rate).
- ``similar_p50_vs_faiss``: ``search_similar`` p50 / the peer's search p50; <= 1.5,
  at ``similar_recall_at_10`` >= 0.95 (the peer's recall is printed beside it).
- ``similar_p99_over_p50_writing``: p99 / p50 of the searches while 8 writers write;
  <= 3.
- ``memory_ingesting_vs_raw`` / ``memory_restarted_vs_raw``: VmRSS growth of the
  process (from before ``PulseDB.open`` to after the ingest, resp. to after a fresh
  process opened the directory and searched once) per experience / its raw bytes
  (1,536 of vector + its text's UTF-8 bytes); <= 1.5. The totals, RssAnon and RssFile
  (the exact vectors' mapped file is RssFile) are printed beside them.
- ``rebuild_vs_faiss_build``: rebuild seconds per event / peer build seconds per
  vector; <= 1.5.
- ``open_seconds``: ``PulseDB.open`` of the data directory after the ingest; <= 10.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FunctionType, MethodType, ModuleType
from typing import Any, Literal
from uuid import UUID

import faiss as _faiss
import numpy as np
import numpy.typing as npt

from eventlog import EmbeddedNats, JetStreamLog
from ops.bench import emitter
from projections.projection import ProjectionSettings
from projections.vectors import graph_index

faiss: Any = _faiss  # as in projections/vectors.py: its stubs miss the Python wrappers

Vectors = npt.NDArray[np.float32]
Better = Literal["higher", "lower"]

DIM, K, BATCH = 384, 10, 1000
FULL = 1_000_000  # experiences at --size 1
TOPICS, RANK, SPREAD, NOISE = 40, 8, 0.6, 0.5  # the shape of the vectors (see the doc)
VOCABULARY, TEXT_WORDS = 5000, 48
TEXT_MIN, TEXT_MAX = 150, 280  # text length in characters: about 215 on average
WRITERS = 8
BLOCK = 50  # searches per turn when alternating Pulse and the peer
CHUNK = 50_000  # vectors per chunk when generating them and in the exact search
REPO = Path(__file__).resolve().parents[2]

emit = emitter("scale")


def sig(x: float) -> float:
    """Three significant digits."""
    return float(f"{x:.3g}")


# -- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one run measures; written to the work directory for the phases' processes."""

    n: int
    queries: int = 1000  # searches per side, quiet, and again while writers write
    truth_queries: int = 500  # of those, the first this many are checked for recall
    callers: int = 4  # concurrent record_experiences calls while ingesting
    hnsw_threshold: int = ProjectionSettings().hnsw_threshold
    ef_search: int = ProjectionSettings().ef_search
    seed: int = 28
    writes_max: int = 20_000  # new experiences the writers may write (at most)
    breakdown: bool = True  # where the memory is, after the figures are read (``breakdown``)
    collective: str = ""  # set once the ingest has created it

    @classmethod
    def sized(cls, size: float, **overrides: Any) -> Plan:
        n = max(100, round(FULL * size))
        plan = cls(n=n, **overrides)
        return replace(plan, truth_queries=min(plan.truth_queries, plan.queries))

    def settings(self) -> ProjectionSettings:
        return ProjectionSettings(hnsw_threshold=self.hnsw_threshold, ef_search=self.ef_search)


# -- the data ----------------------------------------------------------------------------------


def unit(x: npt.NDArray[Any]) -> Vectors:
    out = np.asarray(x, dtype=np.float32)
    return np.asarray(out / np.linalg.norm(out, axis=-1, keepdims=True), dtype=np.float32)


class Shape:
    """The clusters the vectors are drawn from (see the module doc), from ``seed``."""

    def __init__(self, n: int, seed: int) -> None:
        rng = np.random.default_rng([seed, 0])
        self.clusters = max(16, n // 1000)
        topics = unit(rng.normal(size=(TOPICS, DIM)))
        of_topic = rng.integers(0, TOPICS, self.clusters)
        self.centers = unit(
            0.6 * topics[of_topic] + 0.8 * unit(rng.normal(size=(self.clusters, DIM)))
        )
        # each cluster's own directions of spread (columns of about unit length)
        self.bases = (rng.normal(size=(self.clusters, DIM, RANK)) / math.sqrt(DIM)).astype(
            np.float32
        )
        weights = 1 / (np.arange(self.clusters) + 1.0) ** 0.8
        self.weights = weights / weights.sum()

    def draw(self, count: int, rng: np.random.Generator) -> tuple[Vectors, npt.NDArray[np.int32]]:
        """``count`` unit vectors and their clusters."""
        labels = rng.choice(self.clusters, size=count, p=self.weights).astype(np.int32)
        z = rng.normal(size=(count, RANK)).astype(np.float32) * (SPREAD / math.sqrt(RANK))
        x = self.centers[labels] + NOISE / math.sqrt(DIM) * rng.normal(size=(count, DIM))
        for cluster in np.unique(labels):
            at = np.flatnonzero(labels == cluster)
            x[at] += z[at] @ self.bases[cluster].T
        return unit(x), labels


class Texts:
    """Each experience's text, made from its number and cluster (reproducible)."""

    SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "del", "mor",
                 "tin", "gar", "bel", "sun", "rek", "fal", "ost", "qui")  # fmt: skip

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng([seed, 1])
        syllables = np.array(self.SYLLABLES)
        self.words = [
            "".join(syllables[rng.integers(0, len(syllables), int(rng.integers(2, 4)))])
            for _ in range(VOCABULARY)
        ]
        self.seed = seed

    def make(self, prefix: str, first: int, labels: npt.NDArray[np.int32]) -> list[str]:
        """The texts of items ``first``, ``first + 1``, ... of clusters ``labels``."""
        rng = np.random.default_rng([self.seed, 2, first, len(prefix)])
        ranks = np.minimum(rng.zipf(1.3, size=(len(labels), TEXT_WORDS)), VOCABULARY) - 1
        shift = np.where(ranks < 20, 0, 97 * labels[:, None].astype(np.int64))  # shared top 20
        chosen = (ranks + shift) % VOCABULARY
        lengths = rng.integers(TEXT_MIN, TEXT_MAX + 1, len(labels))
        words = self.words
        out = []
        for i, (row, length) in enumerate(zip(chosen.tolist(), lengths.tolist(), strict=True)):
            text = f"{prefix} {first + i}: " + " ".join(words[w] for w in row)
            cut = text.rfind(" ", 0, length)
            out.append(text[:cut] if cut > 0 else text[:length])
        return out


def number_of(content: str) -> int:
    """The item number a text was made for (``note <i>: ...``)."""
    return int(content.split(":", 1)[0].split()[1])


@dataclass(frozen=True)
class Files:
    """The data of one run in its work directory."""

    work: Path

    @property
    def plan(self) -> Path:
        return self.work / "plan.json"

    @property
    def vectors(self) -> Path:
        return self.work / "vectors.f32"

    @property
    def texts(self) -> Path:
        return self.work / "texts.utf8"

    @property
    def text_offsets(self) -> Path:
        return self.work / "texts.i64"

    @property
    def queries(self) -> Path:
        return self.work / "queries.f32"

    @property
    def writes(self) -> Path:
        return self.work / "writes.f32"

    @property
    def write_labels(self) -> Path:
        return self.work / "writes.i32"

    @property
    def truth(self) -> Path:
        return self.work / "truth.i64"

    @property
    def peer(self) -> Path:
        return self.work / "peer.faiss"

    @property
    def nats(self) -> Path:
        return self.work / "log"

    @property
    def data_dir(self) -> Path:
        return self.work / "pulse"

    def read_plan(self) -> Plan:
        return Plan(**json.loads(self.plan.read_text()))

    def write_plan(self, plan: Plan) -> None:
        self.plan.write_text(json.dumps(asdict(plan)))


def write_data(files: Files, plan: Plan, say: Callable[[str], None]) -> None:
    """The vectors (in chunks, each from a seed of its own), their clusters, the
    queries and the writers' vectors, to files."""
    shape, texts = Shape(plan.n, plan.seed), Texts(plan.seed)
    with (
        open(files.vectors, "wb") as vectors,
        open(files.texts, "wb") as text_file,
        open(files.text_offsets, "wb") as offsets,
    ):
        offsets.write(np.zeros(1, dtype=np.int64).tobytes())
        written = 0
        for number, start in enumerate(range(0, plan.n, CHUNK)):
            rng = np.random.default_rng([plan.seed, 3, number])
            x, at = shape.draw(min(CHUNK, plan.n - start), rng)
            vectors.write(x.tobytes())
            encoded = [t.encode() for t in texts.make("note", start, at)]
            text_file.write(b"".join(encoded))
            ends = written + np.cumsum([len(t) for t in encoded], dtype=np.int64)
            offsets.write(ends.tobytes())
            written = int(ends[-1])
            say(f"data {min(plan.n, start + CHUNK):,}/{plan.n:,} vectors and texts")
    queries, _ = shape.draw(plan.queries, np.random.default_rng([plan.seed, 4]))
    files.queries.write_bytes(queries.tobytes())
    writes, at = shape.draw(min(plan.writes_max, 2000), np.random.default_rng([plan.seed, 5]))
    files.writes.write_bytes(writes.tobytes())
    files.write_labels.write_bytes(at.tobytes())


def read_rows(fd: int, first: int, count: int, width: int, dtype: Any) -> npt.NDArray[Any]:
    """Rows ``first`` .. ``first + count - 1`` of a file of ``width``-wide rows, read
    (not mapped: mapped pages would count in the reader's VmRSS)."""
    size = np.dtype(dtype).itemsize * width
    data = os.pread(fd, count * size, first * size)
    return np.frombuffer(data, dtype=dtype).reshape(count, width)


def read_texts(texts_fd: int, offsets_fd: int, first: int, count: int) -> list[str]:
    """Texts ``first`` .. ``first + count - 1`` (read, not mapped)."""
    ends = read_rows(offsets_fd, first, count + 1, 1, np.int64)[:, 0]
    blob = os.pread(texts_fd, int(ends[-1] - ends[0]), int(ends[0]))
    cuts = (ends - ends[0]).tolist()
    return [blob[a:b].decode() for a, b in zip(cuts, cuts[1:], strict=False)]


def read_matrix(path: Path, width: int, dtype: Any = np.float32) -> npt.NDArray[Any]:
    return np.fromfile(path, dtype=dtype).reshape(-1, width)


# -- exact search and recall -------------------------------------------------------------------


def exact_neighbours(
    queries: Vectors, chunks: Iterator[tuple[int, Vectors]], k: int = K
) -> npt.NDArray[np.int64]:
    """The ``k`` rows of largest inner product with each query, best first, by brute
    force over ``chunks`` (the row number of each chunk's first row, its rows): the best
    ``k`` so far are merged with each chunk's, so only a chunk is in memory at a time."""
    best_ids = np.full((len(queries), k), -1, dtype=np.int64)
    best = np.full((len(queries), k), -np.inf, dtype=np.float32)
    for first, rows in chunks:
        scores = queries @ rows.T
        take = min(k, rows.shape[0])
        top = np.argpartition(-scores, take - 1, axis=1)[:, :take]
        ids = np.concatenate([best_ids, top + first], axis=1)
        values = np.concatenate([best, np.take_along_axis(scores, top, axis=1)], axis=1)
        order = np.argsort(-values, axis=1, kind="stable")[:, :k]
        best_ids = np.take_along_axis(ids, order, axis=1)
        best = np.take_along_axis(values, order, axis=1)
    return best_ids


def recall_at(found: Sequence[Sequence[int]], truth: npt.NDArray[np.int64], k: int = K) -> float:
    """The share of each query's true ``k`` nearest among the first ``k`` found, over
    all queries."""
    hits = sum(
        len(set(list(row)[:k]) & set(expected[:k].tolist()))
        for row, expected in zip(found, truth, strict=True)
    )
    return hits / (k * len(truth))


def file_chunks(path: Path, n: int) -> Iterator[tuple[int, Vectors]]:
    fd = os.open(path, os.O_RDONLY)
    try:
        for first in range(0, n, CHUNK):
            yield first, read_rows(fd, first, min(CHUNK, n - first), DIM, np.float32)
    finally:
        os.close(fd)


# -- memory ------------------------------------------------------------------------------------

STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def memory_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of a process (``/proc/<pid>/status``), bytes."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in STATUS_FIELDS:
                found[name] = int(value.split()[0]) * 1024
    return found


def disk_bytes(path: Path) -> int:
    """The bytes a file or a directory tree takes on disk (sparse files: what is used)."""
    if not path.is_dir():
        return path.stat().st_blocks * 512
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def mb(n: float) -> float:
    return round(n / 2**20, 1)


# -- where the memory is ----------------------------------------------------------------------


def deep_size(root: object, seen: set[int]) -> int:
    """The bytes of ``root`` and of everything it holds that ``seen`` does not name yet
    (``sys.getsizeof`` of each object: containers, slotted and plain objects; a
    memoryview's buffer and a numpy view's base are not followed)."""
    total, stack = 0, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, ModuleType, FunctionType, MethodType)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            stack.extend(obj)
        elif isinstance(obj, (str, bytes, int, float, memoryview, np.ndarray, UUID)):
            if isinstance(obj, UUID):
                stack.append(obj.int)
            continue
        else:
            if hasattr(obj, "__dict__"):
                stack.append(obj.__dict__)
            for klass in type(obj).__mro__:
                for slot in getattr(klass, "__slots__", ()):
                    if hasattr(obj, slot):
                        stack.append(getattr(obj, slot))
    return total


def smaps_rss(markers: dict[str, str]) -> dict[str, int]:
    """Resident bytes of this process's mappings (``/proc/self/smaps``): of the mapped
    files whose path contains each marker (by name), of the other files, and of the
    anonymous memory (the heaps: Python's objects, FAISS, DuckDB, tantivy's writer)."""
    found = dict.fromkeys([*markers, "other_files", "anonymous"], 0)
    name = "anonymous"
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=6)
            if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:
                path = head[5].strip() if len(head) > 5 else ""
                if not path.startswith("/"):
                    name = "anonymous"
                else:
                    name = next((n for n, m in markers.items() if m in path), "other_files")
            elif head and head[0] == "Rss:":
                found[name] += int(head[1]) * 1024
    return found


def pymalloc() -> dict[str, int]:
    """Python's small-object allocator: the bytes of its arenas, in use by objects and
    free in them (``sys._debugmallocstats``, which writes to the C stderr)."""
    with tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name.startswith("# bytes in allocated blocks"):
            found["pymalloc_in_use"] = int(value.strip().replace(",", ""))
        elif name.startswith("# bytes in available blocks"):
            found["pymalloc_free_in_arenas"] = int(value.strip().replace(",", ""))
    return found


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def c_heap() -> dict[str, int]:
    """glibc's heap (``mallinfo2``, every arena): the bytes its arenas hold, in use and
    free, and the large blocks it mapped apart; the number of arenas (``malloc_info``)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    libc.fdopen.restype = ctypes.c_void_p
    libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    info = libc.mallinfo2()
    found = {"malloc_arenas_bytes": info.arena, "malloc_in_use": info.uordblks,
             "malloc_free_in_arenas": info.fordblks,
             "malloc_mapped_apart": info.hblkhd}  # fmt: skip
    with tempfile.TemporaryFile() as out:
        stream = libc.fdopen(os.dup(out.fileno()), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        out.seek(0)
        found["malloc_arenas"] = out.read().count(b"<heap nr=")
    return found


def faiss_bytes(index: Any) -> int:
    """The bytes a FAISS index of ``projections.vectors`` holds: codes or vectors, the
    graph's links, the id map."""
    total: int = 8 * int(index.ntotal) if hasattr(index, "id_map") else 0
    inner = faiss.downcast_index(index.index) if hasattr(index, "id_map") else index
    if isinstance(inner, faiss.IndexFlat):
        return total + int(inner.ntotal * inner.d * 4)
    storage = faiss.downcast_index(inner.storage)
    total += int(storage.ntotal * storage.code_size)
    hnsw = inner.hnsw
    return total + int(4 * (hnsw.neighbors.size() + hnsw.levels.size()) + 8 * hnsw.offsets.size())


def breakdown(projection: Any) -> dict[str, float]:
    """Where this process's memory is, by structure (MB), on the engine thread: the
    Python objects of the folded rows (``MemoryState``), of the vector and text
    indexes and of the read caches; FAISS's indexes; DuckDB's buffers; the resident
    pages of the exact vectors' and tantivy's files; then what ``malloc_trim`` gives
    back (freed memory the C heap kept)."""
    seen: set[int] = set()
    rows = deep_size(projection.memory, seen)
    maps = sum(
        deep_size({k: v for k, v in vars(index).items() if k not in ("index", "exact")}, seen)
        for index in projection.vectors.values()
    )
    text = deep_size({k: v for k, v in vars(projection.text).items() if k != "index"}, seen)
    caches = deep_size(projection.caches, seen)
    indexes = sum(faiss_bytes(index.index) for index in projection.vectors.values())
    held = projection.store.con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()")
    duckdb = int((held.fetchone() or (0,))[0] or 0)
    mapped = smaps_rss({"exact_vectors_file": "/vectors/exact-", "tantivy_files": "/text/"})
    objects = pymalloc()
    import pyarrow  # (the store writes rows through Arrow, whose pool is mimalloc's)

    pool = pyarrow.default_memory_pool()
    arrow = {"arrow_pool_in_use": pool.bytes_allocated(), "arrow_pool_peak": pool.max_memory()}
    heap = c_heap()
    if tracemalloc.is_tracing():  # (PYTHONTRACEMALLOC=25: where Python's live memory was allocated)
        top = tracemalloc.take_snapshot().statistics("traceback")[:12]
        print(
            json.dumps(
                [[round(stat.size / 2**20, 1), stat.traceback.format()[-12:]] for stat in top]
            ),
            file=sys.stderr,
            flush=True,
        )
    tags = projection.store.con.execute(
        "SELECT tag, memory_usage_bytes FROM duckdb_memory() WHERE memory_usage_bytes > 0"
    ).fetchall()
    by_tag = {f"duckdb_{str(tag).lower()}": int(used) for tag, used in tags}
    flusher = projection.flusher
    print(f"flusher: {flusher.checkpoints} checkpoints, {getattr(flusher, 'refused', 0)} refused",
          file=sys.stderr, flush=True)  # fmt: skip
    log_file = Path(f"{projection.store.path}.wal")
    wal = log_file.stat().st_size if log_file.exists() else 0
    rss = memory_status()["VmRSS"]
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    trimmed = rss - memory_status()["VmRSS"]
    parts = {"python_rows_memory_state": rows, "python_vector_index_maps": maps,
             "python_text_index": text, "python_read_caches": caches, "faiss_indexes": indexes,
             "duckdb_buffers": duckdb, **by_tag, **mapped, **objects, **arrow, **heap,
             "malloc_trim_gave_back": trimmed, "duckdb_wal": wal,
             "vm_rss": rss}  # fmt: skip
    return {name: value if name == "malloc_arenas" else mb(value) for name, value in parts.items()}


# -- the phases (each in a process of its own) -------------------------------------------------


def faiss_phase(files: Files, plan: Plan) -> dict[str, Any]:
    """The peer: ``graph_index`` built alone over the same vectors; the ground truth."""
    vectors = read_matrix(files.vectors, DIM)
    queries = read_matrix(files.queries, DIM)
    started, cpu = time.perf_counter(), time.process_time()
    index = graph_index(DIM)
    index.train(vectors)
    index.add(vectors)
    seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    hwm = memory_status()["VmHWM"]
    faiss.write_index(index, str(files.peer))
    del vectors
    checked = queries[: plan.truth_queries]
    truth = exact_neighbours(checked, file_chunks(files.vectors, plan.n))
    files.truth.write_bytes(truth.tobytes())
    index.hnsw.efSearch = plan.ef_search
    _, found = index.search(checked, K)
    return {"build_s": round(seconds, 3), "build_cpu_s": round(cpu_s, 2),
            "vectors_per_s": round(plan.n / seconds), "vm_hwm_mb": mb(hwm),
            "recall_at_10": round(recall_at(found.tolist(), truth), 4),
            "index_mb": mb(files.peer.stat().st_size)}  # fmt: skip


class Progress:
    """A progress line on stderr every ``every`` seconds (and at the end)."""

    def __init__(self, label: str, total: int, every: float = 5.0) -> None:
        self.label, self.total, self.every = label, total, every
        self.started = self.shown = time.monotonic()

    def __call__(self, done: int, extra: str = "", final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.shown < self.every:
            return
        self.shown = now
        rate = done / max(now - self.started, 1e-9)
        left = f", {(self.total - done) / rate:.0f} s left" if 0 < done < self.total else ""
        print(f"{self.label} {done:,}/{self.total:,} ({done / self.total:.0%}, {rate:,.0f}/s"
              f"{left}){extra}", file=sys.stderr, flush=True)  # fmt: skip


async def ingest_phase(files: Files, plan: Plan, url: str) -> dict[str, Any]:
    """``record_experiences`` of every item, from ``plan.callers`` concurrent tasks."""
    from sync import PulseDB

    before = memory_status()
    db = await PulseDB.open(files.data_dir, url, projection_settings=plan.settings())
    vectors_fd = os.open(files.vectors, os.O_RDONLY)
    texts_fd = os.open(files.texts, os.O_RDONLY)
    offsets_fd = os.open(files.text_offsets, os.O_RDONLY)
    try:
        cid = await db.create_collective("bench", "scale", DIM)
        progress = Progress("ingest", plan.n)
        starts = iter(range(0, plan.n, BATCH))
        done = text_bytes = 0
        curve: list[tuple[int, int]] = []  # (experiences, VmRSS) at each tenth

        async def caller() -> None:
            nonlocal done, text_bytes
            for first in starts:
                count = min(BATCH, plan.n - first)
                vectors = read_rows(vectors_fd, first, count, DIM, np.float32)
                contents = read_texts(texts_fd, offsets_fd, first, count)
                text_bytes += sum(len(c.encode()) for c in contents)
                items = [{"content": c, "embedding": v}
                         for c, v in zip(contents, vectors, strict=True)]  # fmt: skip
                await db.record_experiences(cid, items)
                tenth = done * 10 // plan.n
                done += count
                if done * 10 // plan.n > tenth:
                    curve.append((done, memory_status()["VmRSS"]))
                progress(done, f", VmRSS {mb(memory_status()['VmRSS']):,.0f} MB")

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(caller() for _ in range(plan.callers)))
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        progress(done, final=True)
        after = memory_status()
        # acknowledged is not yet built: vectors the background inserter has not put in
        # the graph are searched exactly meanwhile, and inserted later (at the latest at
        # the next save). FAISS's build is a whole graph, so the ingest is timed until
        # Pulse's graph holds every vector too.
        print("scale: ingest: until the graph holds every vector", file=sys.stderr, flush=True)
        backlog = await db.engine.run(pending_vectors)
        await db.engine.run(complete_graphs)
        built_s, built_cpu_s = time.perf_counter() - started, time.process_time() - cpu
        parts = await db.engine.run(breakdown) if plan.breakdown else {}
    finally:
        for fd in (vectors_fd, texts_fd, offsets_fd):
            os.close(fd)
        await db.close()
    return {"collective": str(cid), "seconds": round(seconds, 3), "cpu_s": round(cpu_s, 2),
            "per_s": round(plan.n / seconds), "text_bytes": text_bytes,
            "pending_at_the_last_ack": backlog, "built_s": round(built_s, 3),
            "built_cpu_s": round(built_cpu_s, 2),
            "before": before, "after": after, "breakdown": parts,
            "curve": [[n, mb(rss)] for n, rss in curve]}  # fmt: skip


def pending_vectors(projection: Any) -> int:
    """Vectors acknowledged and searchable but not in their graph yet (engine thread)."""
    return sum(len(index.pending) for index in projection.vectors.values())


def complete_graphs(projection: Any) -> None:
    """Insert every pending vector into its graph (engine thread)."""
    for index in projection.vectors.values():
        index.wait()


async def search_phase(files: Files, plan: Plan, url: str) -> dict[str, Any]:
    """Open the data directory afresh; searches beside the peer's, then under writes."""
    from sync import PulseDB

    cid = UUID(plan.collective)
    queries = read_matrix(files.queries, DIM)
    truth = read_matrix(files.truth, K, np.int64)
    before = memory_status()
    started, opening = time.perf_counter(), time.process_time()
    db = await PulseDB.open(files.data_dir, url, projection_settings=plan.settings())
    open_s, open_cpu_s = time.perf_counter() - started, time.process_time() - opening
    try:

        async def similar(i: int) -> list[Any]:
            return await db.search_similar(cid, queries[i], k=K, energy_weight=0.0)

        await similar(0)
        restarted = memory_status()
        parts = await db.engine.run(breakdown) if plan.breakdown else {}
        peer = faiss.read_index(str(files.peer))
        peer.hnsw.efSearch = plan.ef_search
        pulse_ms: list[float] = []
        peer_ms: list[float] = []
        found: dict[int, list[int]] = {}
        peer_found: dict[int, list[int]] = {}
        cpu = {"pulse": 0.0, "peer": 0.0}  # the process's CPU seconds during each side's turns
        await similar(1)
        peer.search(queries[:1], K)
        for block, first in enumerate(range(0, plan.queries, BLOCK)):
            span = range(first, min(first + BLOCK, plan.queries))
            for side in ("pulse", "peer") if block % 2 == 0 else ("peer", "pulse"):
                cpu_started = time.process_time()
                for i in span:
                    if side == "pulse":
                        began = time.perf_counter()
                        hits = await similar(i)
                        pulse_ms.append((time.perf_counter() - began) * 1000)
                        found[i] = [number_of(h.experience.content) for h in hits]
                    else:
                        began = time.perf_counter()
                        _, ids = peer.search(queries[i : i + 1], K)
                        peer_ms.append((time.perf_counter() - began) * 1000)
                        peer_found[i] = ids[0].tolist()
                cpu[side] += time.process_time() - cpu_started
        checked = range(plan.truth_queries)
        recall = recall_at([found[i] for i in checked], truth)
        peer_recall = recall_at([peer_found[i] for i in checked], truth)
        writing_ms, writes = await while_writing(db, cid, files, plan, similar)
    finally:
        await db.close()
    state = (files.data_dir / "state").resolve()
    saved = faiss.read_index(str(state / "vectors" / f"experience-{cid}.faiss"))
    return {"open_s": round(open_s, 3), "open_cpu_s": round(open_cpu_s, 2), "before": before,
            "restarted": restarted, "breakdown": parts,
            "index": type(faiss.downcast_index(saved.index)).__name__,
            "state_mb": {path.name: mb(disk_bytes(path)) for path in sorted(state.iterdir())},
            "pulse_ms": pulse_ms, "peer_ms": peer_ms, "recall": recall,
            "pulse_cpu_us": round(cpu["pulse"] / plan.queries * 1e6),
            "peer_cpu_us": round(cpu["peer"] / plan.queries * 1e6),
            "peer_recall": peer_recall, "writing_ms": writing_ms, "writes": writes}  # fmt: skip


async def while_writing(
    db: Any, cid: UUID, files: Files, plan: Plan, similar: Callable[[int], Any]
) -> tuple[list[float], int]:
    """The searches' latencies (ms) while ``WRITERS`` tasks call ``record_experience``
    one after the other (each started writing before the first search); the writes."""
    vectors = read_matrix(files.writes, DIM)
    labels = np.fromfile(files.write_labels, dtype=np.int32)
    contents = Texts(plan.seed).make("write", 0, labels)
    stop = asyncio.Event()
    written = 0
    started = [asyncio.Event() for _ in range(WRITERS)]

    async def writer(w: int) -> None:
        nonlocal written
        j = w
        while not stop.is_set() and written < plan.writes_max:
            await db.record_experience(cid, contents[j % len(vectors)], vectors[j % len(vectors)])
            written += 1
            started[w].set()
            j += WRITERS

    tasks = [asyncio.create_task(writer(w)) for w in range(WRITERS)]
    latencies: list[float] = []
    try:
        for event in started:
            await event.wait()
        for i in range(plan.queries):
            began = time.perf_counter()
            await similar(i)
            latencies.append((time.perf_counter() - began) * 1000)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    return latencies, written


async def rebuild_phase(files: Files, plan: Plan, url: str) -> dict[str, Any]:
    """``sync.maintenance.rebuild`` of the data directory from the log."""
    from ops.progress import ProgressBar
    from sync import maintenance

    log = await JetStreamLog.connect(url, append_timeout=60)
    try:
        events = await log.last_seq()
        bar = ProgressBar("rebuild", unit="events")
        started, cpu = time.perf_counter(), time.process_time()
        await maintenance.rebuild(files.data_dir, log, settings=plan.settings(), progress=bar)
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        bar.finish()
    finally:
        await log.close()
    return {"seconds": round(seconds, 3), "cpu_s": round(cpu_s, 2), "events": events,
            "vm_hwm_mb": mb(memory_status()["VmHWM"])}  # fmt: skip


async def log_phase(files: Files, plan: Plan, url: str) -> dict[str, Any]:
    """The floor of any ingest that logs each experience before acknowledging it: raw
    nats-py publishing every item's bytes (its vector and text, nothing else) to a
    stream of its own on the same server, ``BATCH`` at a time from ``plan.callers``
    tasks, as the ingest's, each waiting for its batch's acknowledgement. A batch is one
    JetStream atomic batch (the ``Nats-Batch-*`` headers, one commit and one disk sync),
    as ``record_experiences`` writes one; the stream is removed afterwards."""
    import uuid

    import nats
    from nats.js import api

    nc = await nats.connect(url)
    js = nc.jetstream()
    stream = "SCALE_RAW_FLOOR"
    await js.add_stream(api.StreamConfig(
        name=stream, subjects=["scale.raw.>"], storage=api.StorageType.FILE, allow_atomic=True,
    ))  # fmt: skip
    vectors_fd = os.open(files.vectors, os.O_RDONLY)
    texts_fd = os.open(files.texts, os.O_RDONLY)
    offsets_fd = os.open(files.text_offsets, os.O_RDONLY)
    try:
        progress = Progress("raw log", plan.n)
        starts = iter(range(0, plan.n, BATCH))
        sent = payload_bytes = 0

        async def caller() -> None:  # as the ingest's callers: reading included
            nonlocal sent, payload_bytes
            for first in starts:
                count = min(BATCH, plan.n - first)
                vectors = read_rows(vectors_fd, first, count, DIM, np.float32)
                texts = read_texts(texts_fd, offsets_fd, first, count)
                batch = uuid.uuid4().hex
                for i, (v, c) in enumerate(zip(vectors, texts, strict=True), 1):
                    payload = v.tobytes() + c.encode()
                    payload_bytes += len(payload)
                    headers = {"Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(i)}
                    subject = f"scale.raw.{(first + i) % 64}"
                    if i < count:
                        await nc.publish(subject, payload, headers=headers)
                    else:
                        headers["Nats-Batch-Commit"] = "1"
                        reply = await nc.request(subject, payload, headers=headers, timeout=60)
                answer = json.loads(reply.data)
                if answer.get("count") != count:
                    raise RuntimeError(f"raw log: a batch of {count} was answered {answer}")
                sent += count
                progress(sent)

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(caller() for _ in range(plan.callers)))
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        progress(sent, final=True)
        stored = (await js.stream_info(stream)).state.messages
    finally:
        for fd in (vectors_fd, texts_fd, offsets_fd):
            os.close(fd)
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
        await nc.close()
    if stored != plan.n:
        raise RuntimeError(f"raw log: {stored} messages stored of {plan.n}")
    return {
        "seconds": round(seconds, 3),
        "cpu_s": round(cpu_s, 2),
        "per_s": round(plan.n / seconds),
        "bytes_per_message": round(payload_bytes / plan.n),
    }


PHASES = ("faiss", "log", "ingest", "search", "rebuild", "open")


async def open_phase(files: Files, plan: Plan, url: str) -> dict[str, Any]:
    """Only the open of the kept data directory, timed, and what it grew the process by
    (VmRSS, no search yet), then its close (not a phase of the run: ``--child open DIR``
    measures, or profiles, the open again)."""
    from sync import PulseDB

    before = memory_status()
    started, opening = time.perf_counter(), time.process_time()
    db = await PulseDB.open(files.data_dir, url, projection_settings=plan.settings())
    seconds, cpu_s = time.perf_counter() - started, time.process_time() - opening
    gc.collect()
    after = memory_status()
    grown = after["VmRSS"] - before["VmRSS"]
    result = {"seconds": round(seconds, 2), "cpu_s": round(cpu_s, 2),
              "vm_rss_growth_mb": mb(grown),
              # anonymous memory (the rows, the indexes) and mapped files' pages
              "anon_growth_mb": mb(after["RssAnon"] - before["RssAnon"]),
              "file_growth_mb": mb(after["RssFile"] - before["RssFile"]),
              "bytes_per_experience": round(grown / plan.n)}  # fmt: skip
    await db.close()
    return result


def child(phase: str, work: Path) -> None:
    """Run one phase in this process; its result is one JSON line on stdout."""
    files = Files(work)
    plan = files.read_plan()
    if phase == "faiss":
        result = faiss_phase(files, plan)
    else:
        # the run's server (or, when a kept --work directory's phase runs again to be
        # profiled, one started for it)
        with EmbeddedNats(files.nats) as server:
            go = {"log": log_phase, "ingest": ingest_phase, "search": search_phase,
                  "rebuild": rebuild_phase, "open": open_phase}  # fmt: skip
            result = asyncio.run(go[phase](files, plan, server.url))
    print(json.dumps(result), flush=True)


class Phases:
    """The phases' processes, one at a time; whatever is running is stopped when the
    run fails or is interrupted (each runs in a session of its own: a Ctrl-C reaches
    this process, which stops it)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.running: subprocess.Popen[str] | None = None

    def run(self, phase: str) -> dict[str, Any]:
        self.running = subprocess.Popen(
            [sys.executable, "-m", "ops.bench.scale", "--child", phase, str(self.work)],
            stdout=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
        )  # fmt: skip
        out, _ = self.running.communicate()
        code, self.running = self.running.returncode, None
        if code != 0:
            raise RuntimeError(f"the {phase} phase failed (exit {code}; its errors are above)")
        result = out.strip().splitlines()[-1]
        (self.work / f"result-{phase}.json").write_text(result)  # (kept with --work)
        return dict(json.loads(result))

    def stop(self) -> None:
        process, self.running = self.running, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the figures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    better: Better
    target: float
    detail: dict[str, object] = field(default_factory=dict)

    @property
    def met(self) -> bool:
        return self.value <= self.target if self.better == "lower" else self.value >= self.target


def pct(samples: Sequence[float], p: float) -> float:
    return round(float(np.percentile(np.asarray(samples), p)), 3)


def figures(plan: Plan, peer: dict[str, Any], ingest: dict[str, Any],
            search: dict[str, Any], rebuild: dict[str, Any],
            raw_log: dict[str, Any]) -> list[Figure]:  # fmt: skip
    """The figures of a run from its phases' results."""
    n = plan.n
    raw = n * DIM * 4 + ingest["text_bytes"]
    # the ingest until its graph holds every vector (results of an older run: until
    # the last acknowledgement, which is all they hold)
    built_s = ingest.get("built_s", ingest["seconds"])
    built_cpu_s = ingest.get("built_cpu_s", ingest["cpu_s"])
    built_per_s = n / built_s
    out = [
        Figure("raw_log_vs_faiss_build", sig(raw_log["per_s"] / peer["vectors_per_s"]),
               "higher", 0.8, {"experiences": n, "raw_log_s": raw_log["seconds"],
                               "raw_log_per_s": raw_log["per_s"],
                               "raw_log_cpu_s": raw_log["cpu_s"],
                               "bytes_per_message": raw_log["bytes_per_message"],
                               "faiss_per_s": peer["vectors_per_s"],
                               "what": "the floor of ingest_vs_faiss_build: raw nats-py "
                               "publishing each experience's bytes, acknowledged"}),
        Figure("ingest_vs_faiss_build", sig(built_per_s / peer["vectors_per_s"]), "higher",
               0.8, {"experiences": n, "pulse_s": built_s, "pulse_per_s": round(built_per_s),
                     "pulse_cpu_s": built_cpu_s,
                     "acknowledged_s": ingest["seconds"], "acknowledged_per_s": ingest["per_s"],
                     "acknowledged_cpu_s": ingest["cpu_s"],
                     "pending_at_the_last_ack": ingest.get("pending_at_the_last_ack"),
                     "callers": plan.callers, "batch": BATCH, "faiss_build_s": peer["build_s"],
                     "faiss_per_s": peer["vectors_per_s"],
                     "faiss_cpu_s": peer["build_cpu_s"],
                     "cpu_ratio": sig(peer["build_cpu_s"] / built_cpu_s),
                     "vs_raw_log": sig(built_per_s / raw_log["per_s"])}),
    ]  # fmt: skip
    p50, peer_p50 = pct(search["pulse_ms"], 50), pct(search["peer_ms"], 50)
    searches = {"experiences": n, "queries": len(search["pulse_ms"]), "k": K,
                "ef_search": plan.ef_search, "pulse_index": search["index"], "pulse_p50_ms": p50,
                "pulse_p99_ms": pct(search["pulse_ms"], 99), "faiss_p50_ms": peer_p50,
                "faiss_p99_ms": pct(search["peer_ms"], 99),
                "pulse_cpu_us_per_search": search["pulse_cpu_us"],
                "faiss_cpu_us_per_search": search["peer_cpu_us"],
                "cpu_ratio": sig(search["pulse_cpu_us"] / max(search["peer_cpu_us"], 1)),
                "pulse_recall_at_10": round(search["recall"], 4),
                "faiss_recall_at_10": round(search["peer_recall"], 4),
                "recall_queries": plan.truth_queries}  # fmt: skip
    out.append(Figure("similar_p50_vs_faiss", sig(p50 / peer_p50), "lower", 1.5, searches))
    out.append(Figure("similar_recall_at_10", round(search["recall"], 4), "higher", 0.95,
                      searches))  # fmt: skip
    writing = search["writing_ms"]
    w50, w99 = pct(writing, 50), pct(writing, 99)
    out.append(Figure("similar_p99_over_p50_writing", sig(w99 / w50), "lower", 3.0,
                      {"writers": WRITERS, "writes": search["writes"], "queries": len(writing),
                       "p50_ms": w50, "p99_ms": w99, "quiet_p50_ms": p50}))  # fmt: skip
    for name, was, now, parts in (
        ("memory_ingesting_vs_raw", ingest["before"], ingest["after"], ingest["breakdown"]),
        ("memory_restarted_vs_raw", search["before"], search["restarted"], search["breakdown"]),
    ):
        grown = now["VmRSS"] - was["VmRSS"]
        out.append(Figure(name, sig(grown / raw), "lower", 1.5, {
            "experiences": n, "raw_mb": mb(raw), "raw_bytes_per_experience": round(raw / n),
            "vm_rss_growth_mb": mb(grown), "bytes_per_experience": round(grown / n),
            "vm_rss_mb": mb(now["VmRSS"]), "vm_rss_before_mb": mb(was["VmRSS"]),
            "rss_anon_growth_mb": mb(now["RssAnon"] - was["RssAnon"]),
            "rss_file_growth_mb": mb(now["RssFile"] - was["RssFile"]),
            "vm_hwm_mb": mb(now["VmHWM"]), "total_vs_raw": sig(now["VmRSS"] / raw),
            "breakdown_mb": parts,
        }))  # fmt: skip
    if "error" in rebuild:
        out.append(Figure("rebuild_vs_faiss_build", math.nan, "lower", 1.5,
                          {"error": rebuild["error"]}))  # fmt: skip
    else:
        out.append(rebuild_figure(n, peer, rebuild))
    out.append(Figure("open_seconds", round(search["open_s"], 2), "lower", 10.0,
                      {"experiences": n, "after": "the ingest (state on disk)",
                       "cpu_s": search.get("open_cpu_s"),
                       "state_on_disk_mb": search["state_mb"]}))  # fmt: skip
    return out


def rebuild_figure(n: int, peer: dict[str, Any], rebuild: dict[str, Any]) -> Figure:
    """Rebuild seconds per event of the log beside the peer's build seconds per vector."""
    events, cpu = rebuild["events"], rebuild["cpu_s"]
    per_event, per_vector = rebuild["seconds"] / events, peer["build_s"] / n
    return Figure("rebuild_vs_faiss_build", sig(per_event / per_vector), "lower", 1.5,
                  {"events": events, "rebuild_s": rebuild["seconds"],
                   "rebuild_cpu_s": rebuild["cpu_s"], "rebuild_per_s": round(1 / per_event),
                   "rebuild_vm_hwm_mb": rebuild["vm_hwm_mb"],
                   "faiss_build_s": peer["build_s"], "faiss_per_s": peer["vectors_per_s"],
                   "faiss_cpu_s": peer["build_cpu_s"],
                   "cpu_ratio": sig(cpu * n / events / peer["build_cpu_s"])})  # fmt: skip


def table(found: Sequence[Figure]) -> str:
    """The readable summary on stderr."""
    lines = [f"{'figure':34} {'value':>10} {'target':>8}  met"]
    for f in found:
        bound = ("<= " if f.better == "lower" else ">= ") + f"{f.target:g}"
        value = "failed" if math.isnan(f.value) else f"{f.value:g}"
        lines.append(f"{f.name:34} {value:>10} {bound:>8}  {'yes' if f.met else 'NO'}")
    return "\n".join(lines)


def run(
    plan: Plan, say: Callable[[str], None] = lambda text: None, work: Path | None = None
) -> list[Figure]:
    """Every phase of a run, in a temporary directory removed afterwards (or in
    ``work``, kept: its data directory, log and files, to profile a phase again)."""
    with contextlib.ExitStack() as stack:
        if work is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="pulse-bench-scale-"))
        else:
            work.mkdir(parents=True, exist_ok=True)
            if any(work.iterdir()):
                raise ValueError(f"{work}: not empty")
            tmp = str(work)
        say(f"working in {tmp}")
        files, phases = Files(Path(tmp)), Phases(Path(tmp))
        write_data(files, plan, say)
        with EmbeddedNats(files.nats) as server:
            try:
                files.write_plan(plan)
                say("faiss: building graph_index alone, then the exact neighbours")
                peer = phases.run("faiss")
                say(f"faiss: {peer['build_s']} s ({peer['vectors_per_s']:,}/s)")
                say("log: raw nats-py publishing the same bytes (the floor of an ingest)")
                raw_log = phases.run("log")
                ingest = phases.run("ingest")
                plan = replace(plan, collective=ingest["collective"])
                files.write_plan(plan)
                say("search: a fresh process opens the data directory")
                search = phases.run("search")
                say(f"search: opened in {search['open_s']} s")
                try:
                    rebuild = phases.run("rebuild")
                except RuntimeError as exc:  # the other figures stand; this one failed
                    say(str(exc))
                    rebuild = {"error": str(exc)}
                nats = memory_status(server.pid) if server.pid else {}
            finally:
                phases.stop()
    found = figures(plan, peer, ingest, search, rebuild, raw_log)
    for f in found:
        if f.name.startswith("memory_") and nats:  # (the log's server, another process)
            f.detail["nats_server_vm_rss_mb_at_the_end"] = mb(nats["VmRSS"])
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.scale", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--size", type=float, default=1.0,
                        help="1.0: 1,000,000 experiences; 0.05: 50,000")  # fmt: skip
    parser.add_argument("--queries", type=int, default=1000,
                        help="searches per side, quiet and while writing (1000)")  # fmt: skip
    parser.add_argument("--recall-queries", type=int, default=500,
                        help="of those, checked against exact search (500)")  # fmt: skip
    parser.add_argument("--callers", type=int, default=4,
                        help="concurrent record_experiences calls (4)")  # fmt: skip
    parser.add_argument("--hnsw-threshold", type=int, default=Plan.hnsw_threshold,
                        help=f"Pulse's setting ({Plan.hnsw_threshold})")  # fmt: skip
    parser.add_argument("--ef-search", type=int, default=Plan.ef_search,
                        help=f"Pulse's and the peer's breadth ({Plan.ef_search})")  # fmt: skip
    parser.add_argument("--seed", type=int, default=Plan.seed)
    parser.add_argument("--work", type=Path, metavar="DIR",
                        help="run in DIR (new or empty) and keep it, to profile a phase "
                        "again (python -m ops.bench.scale --child PHASE DIR)")  # fmt: skip
    parser.add_argument("--child", nargs=2, metavar=("PHASE", "WORK"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        phase, work = options.child
        if phase not in PHASES:
            parser.error(f"--child: one of {', '.join(PHASES)}")
        child(phase, Path(work))
        return 0
    if options.size <= 0 or options.queries < 1 or options.callers < 1:
        parser.error("--size, --queries and --callers must be positive")
    plan = Plan.sized(options.size, queries=options.queries,
                      truth_queries=min(options.recall_queries, options.queries),
                      callers=options.callers, hnsw_threshold=options.hnsw_threshold,
                      ef_search=options.ef_search, seed=options.seed)  # fmt: skip
    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"scale: {text}", file=sys.stderr, flush=True)

    say(f"{plan.n:,} experiences of {DIM} dimensions")
    try:
        found = run(plan, say, options.work)
    except KeyboardInterrupt:
        say("interrupted; stopped what was running and removed the temporary directory")
        return 130
    for f in found:
        value = None if math.isnan(f.value) else f.value  # (a phase that failed)
        emit(f.name, value=value, better=f.better, target=f.target, met=f.met, **f.detail)
    emit("summary", experiences=plan.n, seconds=round(time.perf_counter() - started, 1),
         met=sum(f.met for f in found), figures=len(found),
         load_average=round(os.getloadavg()[0], 2))  # fmt: skip
    print(table(found), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

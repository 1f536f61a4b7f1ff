"""A host's projection of the log: DuckDB rows, FAISS indexes and the full-text index of
one state directory, applied batch by batch from the log with a checkpoint.

    <state dir>/state.duckdb       rows, views and the checkpoint (one transaction a batch)
    <state dir>/vectors/*.faiss    FAISS indexes + manifest.json (the sequence they reflect)
    <state dir>/text/              the tantivy index (committed before the manifest)

The DuckDB checkpoint is the truth. The indexes are saved now and then with the sequence
they reflect; on open, whatever they miss is caught up from DuckDB's stored rows and
embeddings (rows with ``updated_seq`` past the manifest), never from the network.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import numpy as np

from eventlog.ids import uuid7
from eventlog.log import EventLog, LogEntry
from projections.fold import FoldState
from projections.store import Store, Touched
from projections.text import TextIndex
from projections.vectors import VectorIndex, read_manifest, write_manifest

Progress = Callable[[int, int], None]  # (applied so far, total to apply)


@dataclass(frozen=True, slots=True)
class ProjectionSettings:
    hnsw_threshold: int = 10_000  # vectors per collective before its index becomes HNSW
    ef_search: int = 128  # HNSW search breadth (recall against speed)
    batch_size: int = 5000  # events per transaction when catching up
    save_every: int = 50  # batches between index saves while catching up


class Projection:
    """The folded state of one directory; ``apply`` batches, ``catch_up`` from a log."""

    def __init__(self, directory: str | Path, settings: ProjectionSettings | None = None) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.settings = settings or ProjectionSettings()
        self.store = Store(self.dir / "state.duckdb")
        self._seq = self.store.checkpoint()[0]
        self.text = TextIndex(self.dir / "text")
        (self.dir / "vectors").mkdir(exist_ok=True)
        self.vectors: dict[tuple[str, UUID], VectorIndex] = {}
        self._live_collectives: dict[UUID, int | None] = {}  # last known dimension if live
        self._load_indexes()

    # -- applying --------------------------------------------------------------------------

    @property
    def seq(self) -> int:
        """The last applied stream sequence (the DuckDB checkpoint)."""
        return self._seq

    def apply(self, entries: Sequence[LogEntry]) -> Touched:
        """Fold a batch of log entries (in stream order) into the state, atomically."""
        current = self.seq
        fresh = [e for e in entries if e.seq > current]
        if not fresh:
            return Touched()
        delta = FoldState()
        undecodable = []
        for entry in fresh:
            if entry.event is not None:
                delta.apply(entry.event)
            else:
                reason = entry.error.reason if entry.error else "unreadable"
                undecodable.append((entry.seq, entry.subject, reason))
        touched = self.store.apply(
            delta, last_seq=fresh[-1].seq, count=len(fresh), undecodable=undecodable
        )
        self._seq = fresh[-1].seq
        self._sync(touched)
        return touched

    async def catch_up(self, log: EventLog, *, progress: Progress | None = None) -> int:
        """Apply everything the log has past the checkpoint; returns how many events."""
        start = self.seq
        end = await log.last_seq()
        applied = batches = 0
        async for batch in log.read(start + 1, batch_size=self.settings.batch_size):
            self.apply(batch)
            applied += len(batch)
            batches += 1
            if progress is not None:
                progress(batch[-1].seq - start, max(end - start, batch[-1].seq - start))
            if batches % self.settings.save_every == 0:
                self.save()
        self.save()
        return applied

    # -- keeping the indexes in step -------------------------------------------------------

    def _index(self, kind: str, collective_id: UUID, dim: int) -> VectorIndex:
        index = self.vectors.get((kind, collective_id))
        if index is None or index.dim != dim:
            index = VectorIndex(dim, self.settings.hnsw_threshold, self.settings.ef_search)
            self.vectors[(kind, collective_id)] = index
        return index

    def _collective_dim(self, collective_id: UUID) -> int | None:
        """The dimension of a live collective, None when it is not live."""
        found = self.store.con.execute(
            "SELECT embedding_dimension FROM collectives WHERE collective_id = ?", [collective_id]
        ).fetchone()
        return int(found[0]) if found else None

    def _sync(self, touched: Touched) -> None:
        for collective_id in touched.collectives:
            now = self._collective_dim(collective_id)
            if collective_id in self._live_collectives and (
                self._live_collectives[collective_id] == now
            ):
                continue  # a repeated create: nothing its members depend on changed
            self._live_collectives[collective_id] = now
            for kind in ("experience", "insight"):
                self.vectors.pop((kind, collective_id), None)
            self.text.remove_collective(collective_id)
            touched.experiences |= self._ids("experience_rows", "experience_id", collective_id)
            touched.insights |= self._ids("insight_rows", "insight_id", collective_id)
        if touched.experiences:
            self._sync_rows("experience", touched.experiences)
        if touched.insights:
            self._sync_rows("insight", touched.insights)
        # no text commit here: a tantivy commit costs ~15 ms; searches commit first
        # (so they read every applied write) and save() commits with the manifest

    def _ids(self, table: str, column: str, collective_id: UUID) -> set[UUID]:
        rows = self.store.con.execute(
            f"SELECT {column} FROM {table} WHERE collective_id = ?", [collective_id]
        ).fetchall()
        return {r[0] for r in rows}

    def _sync_rows(self, kind: str, ids: set[UUID]) -> None:
        table, view, key = (
            ("experience_rows", "experiences", "experience_id")
            if kind == "experience"
            else ("insight_rows", "insights", "insight_id")
        )
        archived = "v.archived" if kind == "experience" else "false"
        staged = {"id": np.array([str(i) for i in ids], dtype=object)}  # noqa: F841
        rows = self.store.con.execute(
            f"""SELECT r.{key}, r.vec_id, r.collective_id, v.{key} IS NOT NULL AS live,
                       coalesce({archived}, false), r.embedding, r.content,
                       c.embedding_dimension
                FROM {table} r
                JOIN staged s ON r.{key} = CAST(s.id AS UUID)
                LEFT JOIN {view} v ON v.{key} = r.{key}
                LEFT JOIN collective_rows c ON c.collective_id = r.collective_id"""
        ).fetchall()
        adds: dict[tuple[UUID, int], tuple[list[int], list[bytes], list[UUID]]] = {}
        for row_id, vec_id, collective_id, live, is_archived, embedding, content, dim in rows:
            if live:
                index = self._index(kind, collective_id, dim)
                if vec_id not in index.members:
                    ids_, vecs, keys = adds.setdefault((collective_id, dim), ([], [], []))
                    ids_.append(vec_id)
                    vecs.append(embedding)
                    keys.append(row_id)
                    self.text.put(kind, row_id, collective_id, content)
                index.set_hidden(vec_id, bool(is_archived))
            else:
                index_or_none = self.vectors.get((kind, collective_id))
                if index_or_none is not None:
                    index_or_none.remove([vec_id])
                self.text.remove(row_id)
        for (collective_id, dim), (vec_ids, vectors, keys) in adds.items():
            matrix = np.frombuffer(b"".join(vectors), dtype="<f4").reshape(len(vectors), dim)
            self._index(kind, collective_id, dim).add(vec_ids, matrix, keys)

    # -- persistence -----------------------------------------------------------------------

    def _path(self, kind: str, collective_id: UUID) -> Path:
        return self.dir / "vectors" / f"{kind}-{collective_id}.faiss"

    def save(self) -> None:
        """Save the indexes with the sequence they reflect (the DuckDB checkpoint)."""
        self.text.commit()
        entries = {}
        for (kind, collective_id), index in self.vectors.items():
            path = self._path(kind, collective_id)
            index.save(path)
            entries[path.name] = index.dim
        for stale in (self.dir / "vectors").glob("*.faiss"):
            if stale.name not in entries:
                stale.unlink()
        write_manifest(self.dir / "vectors", self.seq, entries)

    def _load_indexes(self) -> None:
        saved_seq, entries = read_manifest(self.dir / "vectors")
        for name, dim in entries.items():
            kind, _, rest = name.partition("-")
            collective_id = UUID(rest.removesuffix(".faiss"))
            path = self.dir / "vectors" / name
            if path.exists():
                self.vectors[(kind, collective_id)] = VectorIndex.load(
                    path, dim, self.settings.hnsw_threshold, self.settings.ef_search
                )
        for (kind, collective_id), index in self.vectors.items():  # hidden / gone from DuckDB
            table, key = (
                ("experience_rows", "experience_id")
                if kind == "experience"
                else ("insight_rows", "insight_id")
            )
            for vec_id, row_id in self.store.con.execute(
                f"SELECT vec_id, {key} FROM {table} WHERE collective_id = ?", [collective_id]
            ).fetchall():
                if vec_id in index.members:
                    index.keys[vec_id] = row_id
            view, live_archived = (
                ("experiences", "archived") if kind == "experience" else ("insights", "false")
            )
            live = self.store.con.execute(
                f"SELECT vec_id, {live_archived} FROM {view} WHERE collective_id = ?",
                [collective_id],
            ).fetchall()
            live_ids = {v for v, _ in live}
            index.remove(index.members - live_ids)
            for vec_id, is_archived in live:
                if vec_id in index.members:
                    index.set_hidden(vec_id, bool(is_archived))
        if saved_seq < self.seq:  # the indexes are behind DuckDB: catch up from its rows
            touched = Touched()
            for table, key, target in (
                ("experience_rows", "experience_id", touched.experiences),
                ("insight_rows", "insight_id", touched.insights),
                ("collective_rows", "collective_id", touched.collectives),
            ):
                found = self.store.con.execute(
                    f"SELECT {key} FROM {table} WHERE updated_seq > ?", [saved_seq]
                ).fetchall()
                target.update(r[0] for r in found)
            self._sync(touched)
            self.save()
        for collective_id, dim in self.store.con.execute(
            "SELECT collective_id, embedding_dimension FROM collectives"
        ).fetchall():
            self._live_collectives.setdefault(collective_id, int(dim))

    def live_dimension(self, collective_id: UUID) -> int | None:
        """The embedding dimension of a live collective; None if it is not live."""
        return self._live_collectives.get(collective_id)

    def digest(self) -> str:
        return self.store.digest()

    def close(self) -> None:
        self.save()
        self.text.close()
        self.store.close()


# -- the state directory of a data directory, swapped atomically by rebuild -------------------


def state_link(data_dir: Path) -> Path:
    return Path(data_dir) / "state"


def open_projection(data_dir: str | Path, settings: ProjectionSettings | None = None) -> Projection:
    """The current projection of a data directory (created empty the first time)."""
    data_dir = Path(data_dir)
    link = state_link(data_dir)
    if not link.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        _point(link, _fresh_dir(data_dir))
    return Projection(link.resolve(), settings)


def _fresh_dir(data_dir: Path) -> Path:
    target = data_dir / f"state-{uuid7()}"
    target.mkdir(parents=True)
    return target


def _point(link: Path, target: Path) -> None:
    """Make ``link`` point at ``target`` in one atomic rename."""
    tmp = link.with_name(link.name + ".swap")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target.name)
    tmp.replace(link)


async def rebuild(
    data_dir: str | Path,
    log: EventLog,
    *,
    settings: ProjectionSettings | None = None,
    progress: Progress | None = None,
) -> tuple[Path, str]:
    """Replay the whole log into a fresh state directory, then swap it in atomically.

    The current state is untouched (and keeps serving) until the swap; afterwards it is
    removed. Returns the new directory and its digest.
    """
    data_dir = Path(data_dir)
    link = state_link(data_dir)
    old = link.resolve() if link.exists() else None
    target = _fresh_dir(data_dir)
    try:
        fresh = Projection(target, settings)
        await fresh.catch_up(log, progress=progress)
        digest = fresh.digest()
        fresh.close()
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    _point(link, target)
    if old is not None and old != target:
        shutil.rmtree(old, ignore_errors=True)
    return target, digest

"""The Postgres+pgvector peer of the edge benchmarks (``ops.bench.edges``): the
architecture of the agent-memory services users would pick instead of Pulse.

Postgres 16 with pgvector comes from the ``pgserver`` package's binaries (the ``bench``
extra: ``pip install -e '.[bench]'``; not a dependency of Pulse); ``psycopg`` is the
client. ``Postgres.start(directory)`` runs ``initdb`` in ``directory`` and starts the
server there as a child of this process, listening on a unix socket in that directory
only (no TCP), with the durable defaults (``fsync``, ``synchronous_commit on``) and
enough shared buffers to hold the table and its indexes; ``stop`` (or leaving its
``with`` block) ends it. As root (Postgres refuses to run as root) the server runs as
the system user ``pgserver``, created if missing, as the ``pgserver`` package does.

The schema (``SCHEMA``) is what such a service keeps: a table of experiences (id,
collective, content, importance, applications, created, a ``vector(384)``), an HNSW
index on the vectors (``vector_cosine_ops``; ``m``, ``ef_construction`` and the
search's ``hnsw.ef_search`` chosen by the benchmark), a GIN index on the ``simple``
text search vector of the content (a stored generated column, so ranking reads it
rather than parsing the content again) and a b-tree for the latest rows of a
collective. The queries:

- ``SIMILAR``: the k nearest by cosine distance (the HNSW index).
- ``TEXT``: the rows matching ANY of the query's words (``a | b | c``: the OR semantics
  of Pulse's text search), ranked by ``ts_rank``.
- ``HYBRID``: both rankings, ``pool`` candidates each, fused by Reciprocal Rank Fusion
  (score = sum of 1 / (60 + rank), as Pulse's hybrid search) in one statement.
- ``CONTEXT``: the hybrid query and the collective's latest rows, in one statement.
- ``RECORD``: one INSERT; ``REINFORCE``: an UPDATE of a counter.

Vectors go to the server in pgvector's binary form (``VectorDumper``), the way the
``pgvector`` client package sends them.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import re
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from uuid import UUID

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql
from psycopg.adapt import Dumper
from psycopg.pq import Format

DIM = 384
RRF_K = 60  # as Pulse's hybrid search (sync.recall.RRF_K)
USER = "pgserver"  # the system user the server runs as when this process is root

SCHEMA = f"""
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE experiences (
    id uuid PRIMARY KEY,
    collective uuid NOT NULL,
    content text NOT NULL,
    importance real NOT NULL DEFAULT 0.5,
    applications integer NOT NULL DEFAULT 0,
    created timestamptz NOT NULL DEFAULT now(),
    embedding vector({DIM}) NOT NULL,
    words tsvector GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED
);
"""

INDEXES = """
CREATE INDEX experiences_embedding ON experiences
    USING hnsw (embedding vector_cosine_ops) WITH (m = {m}, ef_construction = {ef});
CREATE INDEX experiences_words ON experiences USING gin (words);
CREATE INDEX experiences_latest ON experiences (collective, created DESC);
ANALYZE experiences;
"""

COLUMNS = "id, content, importance, created"

SIMILAR = f"""
SELECT {COLUMNS}, 1 - (embedding <=> %(q)s) AS score FROM experiences
WHERE collective = %(c)s ORDER BY embedding <=> %(q)s LIMIT %(k)s
"""

TEXT = f"""
SELECT {COLUMNS}, ts_rank(words, query) AS score
FROM experiences, to_tsquery('simple', %(t)s) AS query
WHERE collective = %(c)s AND words @@ query ORDER BY score DESC LIMIT %(k)s
"""

_FUSED = f"""
WITH by_vector AS (
    SELECT id, row_number() OVER (ORDER BY distance) AS r FROM (
        SELECT id, embedding <=> %(q)s AS distance FROM experiences
        WHERE collective = %(c)s ORDER BY embedding <=> %(q)s LIMIT %(pool)s
    ) AS nearest
), by_text AS (
    SELECT id, row_number() OVER (ORDER BY rank DESC) AS r FROM (
        SELECT id, ts_rank(words, query) AS rank
        FROM experiences, to_tsquery('simple', %(t)s) AS query
        WHERE collective = %(c)s AND words @@ query ORDER BY rank DESC LIMIT %(pool)s
    ) AS matching
), fused AS (
    SELECT coalesce(v.id, t.id) AS id,
           coalesce(1.0 / ({RRF_K} + v.r), 0) + coalesce(1.0 / ({RRF_K} + t.r), 0) AS score
    FROM by_vector AS v FULL JOIN by_text AS t ON v.id = t.id
    ORDER BY score DESC LIMIT %(k)s
)
SELECT {", ".join("e." + c for c in COLUMNS.split(", "))}, fused.score
FROM fused JOIN experiences AS e ON e.id = fused.id
"""

HYBRID = _FUSED + "ORDER BY fused.score DESC"

CONTEXT = f"""
(SELECT 'similar' AS part, * FROM ({_FUSED}) AS hits ORDER BY score DESC)
UNION ALL
(SELECT 'recent', {COLUMNS}, NULL FROM experiences WHERE collective = %(c)s
 ORDER BY created DESC LIMIT %(recent)s)
"""

RECORD = """
INSERT INTO experiences (id, collective, content, importance, embedding)
VALUES (%(id)s, %(c)s, %(content)s, %(importance)s, %(v)s)
"""

REINFORCE = "UPDATE experiences SET applications = applications + 1 WHERE id = %(id)s"


class Vector:
    """A vector for pgvector: the dumper below sends it in the binary form."""

    __slots__ = ("values",)

    def __init__(self, values: npt.ArrayLike) -> None:
        self.values = np.asarray(values, dtype=">f4")


class VectorDumper(Dumper):
    """``Vector`` in pgvector's binary input form: dimension and a zero (two big-endian
    int16), then the floats (big-endian float32)."""

    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        values: npt.NDArray[Any] = obj.values
        return struct.pack(">HH", len(values), 0) + values.tobytes()


def or_query(text: str) -> str:
    """``text``'s words as a ``to_tsquery`` of any of them (``a | b | c``): the OR
    semantics of Pulse's text search. Only letters, digits and underscores are kept, so
    no word can be read as a tsquery operator."""
    words = re.findall(r"\w+", text.lower())
    return " | ".join(dict.fromkeys(words)) or "''"


def fuse(rankings: Sequence[Sequence[Any]], k: int, rrf_k: int = RRF_K) -> list[Any]:
    """Reciprocal Rank Fusion of ``rankings`` (each best first): the ``k`` items with
    the highest sum of 1 / (rrf_k + rank), rank from 1; ties keep the first seen. What
    ``HYBRID`` computes in SQL, for checking it."""
    scores: dict[Any, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (rrf_k + rank)
    return sorted(scores, key=lambda item: -scores[item])[:k]


class Postgres:
    """A Postgres server with pgvector in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path, process: subprocess.Popen[bytes], user: str | None):
        self.directory, self.process, self.user = directory, process, user
        self.log = directory / "postgres.log"

    @property
    def conninfo(self) -> str:
        """Where to connect: the unix socket in the server's directory."""
        return f"host={self.directory} port=5432 user=postgres dbname=postgres"

    @classmethod
    def start(cls, directory: Path, shared_buffers: str = "1GB", timeout: float = 120) -> Postgres:
        """``initdb`` in ``directory`` (created) and a server started on it, once it
        answers."""
        binaries = _binaries()
        directory.mkdir(parents=True)
        data = directory / "data"
        user = None
        if os.geteuid() == 0:
            user = USER
            _run_as_other_user(directory, binaries)
        initdb = [str(binaries / "initdb"), "-D", str(data), "--auth=trust",
                  "--encoding=utf8", "-U", "postgres"]  # fmt: skip
        subprocess.run(initdb, check=True, capture_output=True, user=user)
        settings = {
            "listen_addresses": "", "unix_socket_directories": str(directory),
            "shared_buffers": shared_buffers, "maintenance_work_mem": "1GB",
            "fsync": "on", "synchronous_commit": "on", "max_connections": "40",
            "max_parallel_maintenance_workers": "0", "logging_collector": "off",
        }  # fmt: skip
        options = [f"--{name.replace('_', '-')}={value}" for name, value in settings.items()]
        log = open(directory / "postgres.log", "ab")  # noqa: SIM115 (the server's, kept open)
        process = subprocess.Popen(
            [str(binaries / "postgres"), "-D", str(data), *options],
            stdout=log, stderr=subprocess.STDOUT, user=user,
        )  # fmt: skip
        log.close()
        server = cls(directory, process, user)
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"postgres ended ({process.returncode}): {server.tail()}")
            try:
                with psycopg.connect(server.conninfo, connect_timeout=5):
                    return server
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    server.stop()
                    raise RuntimeError(f"postgres did not answer: {server.tail()}") from None
                time.sleep(0.05)

    def tail(self, size: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def stop(self, timeout: float = 60) -> None:
        """The server stopped (a fast shutdown: SIGINT), killed if it does not end."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Postgres:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection that sends ``Vector`` in binary."""
        connection = psycopg.connect(self.conninfo, autocommit=True)
        _register(connection)
        return connection

    def create(self, connection: psycopg.Connection[Any]) -> None:
        """The schema, without its indexes (``index`` builds them after a bulk load)."""
        connection.execute(SCHEMA)
        _register(connection)

    def index(self, connection: psycopg.Connection[Any], m: int, ef_construction: int) -> None:
        connection.execute(INDEXES.format(m=int(m), ef=int(ef_construction)))

    def load(
        self,
        connection: psycopg.Connection[Any],
        collective: UUID,
        rows: Iterable[tuple[UUID, str, npt.NDArray[np.float32]]],
    ) -> int:
        """``rows`` (id, content, vector) copied into the table in one COPY; how many."""
        count = 0
        copy_sql = (
            "COPY experiences (id, collective, content, embedding) FROM STDIN (FORMAT BINARY)"
        )
        with connection.cursor() as cursor, cursor.copy(copy_sql) as copy:
            copy.set_types(["uuid", "uuid", "text", "vector"])
            for eid, content, vector in rows:
                copy.write_row((eid, collective, content, Vector(vector)))
                count += 1
        return count

    def rows(self, connection: psycopg.Connection[Any]) -> int:
        row = connection.execute("SELECT count(*) FROM experiences").fetchone()
        return int(row[0]) if row else 0

    def size_mb(self, connection: psycopg.Connection[Any]) -> float:
        """The table's size with its indexes and TOAST, in MB."""
        row = connection.execute("SELECT pg_total_relation_size('experiences')").fetchone()
        return round(int(row[0]) / 1e6, 1) if row else 0.0

    @staticmethod
    def set_ef_search(connection: psycopg.Connection[Any], ef: int) -> None:
        connection.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(int(ef))))

    @staticmethod
    def plan(connection: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> str:
        """The plan Postgres picks for ``query`` (EXPLAIN, not run)."""
        explain = sql.SQL("EXPLAIN ") + sql.SQL(query)
        lines = connection.execute(explain, params).fetchall()
        return "\n".join(str(line[0]) for line in lines)


def _register(connection: psycopg.Connection[Any]) -> None:
    """``Vector`` sent in binary on ``connection``, once the extension exists."""
    info = psycopg.types.TypeInfo.fetch(connection, "vector")
    if info is not None:
        info.register(connection)
        dumper = type("VectorDumper", (VectorDumper,), {"oid": info.oid})
        connection.adapters.register_dumper(Vector, dumper)


def _binaries() -> Path:
    """The directory of the ``pgserver`` package's Postgres binaries (found without
    importing the package, which starts nothing but warns about its runtime directory)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the Postgres peer needs the pgserver package: pip install -e '.[bench]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _run_as_other_user(directory: Path, binaries: Path) -> None:
    """As root: the ``pgserver`` user (created if missing, as the ``pgserver`` package
    does) owns ``directory``, and can reach it and the binaries (read and traverse for
    everyone along their paths)."""
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/false", USER], check=True, capture_output=True)
    install = binaries.parent
    for path in (directory, install):
        for parent in path.parents:
            parent.chmod(parent.stat().st_mode | 0o055)
    for root, folders, files in os.walk(install):
        Path(root).chmod(Path(root).stat().st_mode | 0o055)
        for name in files:
            file = Path(root) / name
            if not file.is_symlink():
                file.chmod(file.stat().st_mode | 0o044 | (0o011 if name in folders else 0))
    for file in binaries.iterdir():
        file.chmod(file.stat().st_mode | 0o055)
    shutil.chown(directory, USER, USER)

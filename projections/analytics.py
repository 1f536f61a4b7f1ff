"""Read-only SQL over a projection: the analysts' side door, and Parquet export.

Only queries run (SELECT, EXPLAIN, ...): the state changes only through events. The
activities of the activity stream are offered as a table named ``activities`` for the
one query (they are presence, not folded state). Both run on a cursor of a flushed
state that the engine hands out (``Engine.cursor``), on a thread of their own: DuckDB
reads run beside the engine's writes.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any
from uuid import UUID

import duckdb
import msgspec
import numpy as np

from eventlog.errors import ValidationError

VIEWS = ("collectives", "experiences", "applications", "relations", "insights",
         "insight_sources", "wisdom", "dead_letters")  # fmt: skip


class SqlResult(msgspec.Struct, frozen=True, kw_only=True):
    columns: list[str]
    rows: list[list[Any]]  # JSON-ready values: UUIDs and times as text, vectors as sizes
    truncated: bool = False  # more rows than the limit
    seq: int = 0  # the stream sequence the state it read reflects


def check_read_only(sql: str) -> None:
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ValidationError(f"query: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise ValidationError(f"query: give exactly one statement, got {len(statements)}")
    kind = statements[0].type.name
    if kind == "EXPLAIN":  # EXPLAIN ANALYZE runs what it explains: only plain SELECTs
        words = sql.split()
        inner = " ".join(words[1:])
        if words[1:2] and words[1].upper() == "ANALYZE":
            raise ValidationError("query: EXPLAIN ANALYZE runs the statement; use EXPLAIN")
        kind = duckdb.extract_statements(inner)[0].type.name if inner else kind
    if kind != "SELECT":
        raise ValidationError(
            f"query: only read-only queries are allowed (SELECT, EXPLAIN), got {kind}; "
            "the state changes only through events"
        )


def run(
    cursor: duckdb.DuckDBPyConnection, sql: str, activities: list[Any], limit: int, seq: int = 0
) -> SqlResult:
    """Run a checked query on ``cursor`` (closed after) with ``activities`` as a table."""
    check_read_only(sql)
    try:  # inside the cursor's transaction, rolled back below: nothing a query does stays
        cursor.register("activities", _relation(cursor, _activity_columns(activities)))
        result = cursor.execute(sql)
        columns = [d[0] for d in result.description or []]
        rows = result.fetchmany(limit + 1)
    except duckdb.Error as exc:
        raise ValidationError(f"query: {_first_line(exc)}") from None
    finally:
        cursor.rollback()
        cursor.close()
    return SqlResult(
        columns=columns,
        rows=[[cell(v) for v in row] for row in rows[:limit]],
        truncated=len(rows) > limit,
        seq=seq,
    )


def export(
    cursor: duckdb.DuckDBPyConnection, directory: Path, activities: list[Any]
) -> dict[str, int]:
    """Every view as ``<directory>/<view>.parquet`` (local columns left out), plus the
    activities; returns the rows written per file. Closes ``cursor``."""
    written: dict[str, int] = {}
    try:  # one transaction (the cursor's): every file reflects the same sequence
        for view in VIEWS:
            target = directory / f"{view}.parquet"
            columns = [
                r[0] for r in cursor.execute(f"DESCRIBE {view}").fetchall() if r[0] != "vec_id"
            ]
            cursor.execute(
                f"COPY (SELECT {', '.join(columns)} FROM {view}) TO '{_quote(target)}' "
                "(FORMAT parquet)"
            )
            written[view] = cursor.execute(f"SELECT count(*) FROM {view}").fetchone()[0]  # type: ignore[index]
        cursor.execute(
            "CREATE TEMP TABLE activities (collective_id UUID, agent_id VARCHAR, "
            "task_description VARCHAR, working_on VARCHAR[], started_ms BIGINT, "
            "last_heartbeat_ms BIGINT)"
        )
        if activities:
            cursor.executemany(
                "INSERT INTO activities VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (str(a.collective_id), a.agent_id, a.task_description, list(a.working_on),
                     a.started_ms, a.last_heartbeat_ms)
                    for a in activities
                ],
            )  # fmt: skip
        cursor.execute(
            f"COPY activities TO '{_quote(directory / 'activities.parquet')}' (FORMAT parquet)"
        )
        written["activities"] = len(activities)
    finally:
        cursor.rollback()
        cursor.close()
    return written


def read_parquet_records(
    path: Path, chunk: int = 1000
) -> tuple[int, Generator[dict[str, Any], None, None]]:
    """The rows of a Parquet file as dicts of builtins (LIST columns as lists, NULL as
    None), in file order, read by an in-memory DuckDB ``chunk`` rows at a time: the number
    of rows (from the file's metadata) and the rows. The connection closes when the rows
    are read to the end or the generator is closed or dropped."""
    con = duckdb.connect(":memory:")
    try:
        source = f"read_parquet('{_quote(path)}')"
        counted = con.execute(f"SELECT count(*) FROM {source}").fetchone()
        total = int(counted[0]) if counted else 0
        result = con.execute(f"SELECT * FROM {source}")
    except duckdb.Error as exc:
        con.close()
        raise ValidationError(
            f"file: {path} is not a readable Parquet file: {_first_line(exc)}"
        ) from None
    columns = [d[0] for d in result.description or []]

    def rows() -> Generator[dict[str, Any], None, None]:
        try:
            while batch := result.fetchmany(chunk):
                for row in batch:
                    yield dict(zip(columns, row, strict=True))
        finally:
            con.close()

    return total, rows()


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def _activity_columns(activities: list[Any]) -> dict[str, Any]:
    return {
        "collective_id": np.array([str(a.collective_id) for a in activities], dtype=object),
        "agent_id": np.array([a.agent_id for a in activities], dtype=object),
        "task_description": np.array([a.task_description for a in activities], dtype=object),
        "working_on": np.array([", ".join(a.working_on) for a in activities], dtype=object),
        "started_ms": np.array([a.started_ms for a in activities], dtype=np.int64),
        "last_heartbeat_ms": np.array([a.last_heartbeat_ms for a in activities], dtype=np.int64),
    }


def _relation(cursor: duckdb.DuckDBPyConnection, table: dict[str, Any]) -> Any:
    staged = table  # noqa: F841  (read by DuckDB's replacement scan below)
    return cursor.sql(
        "SELECT CAST(collective_id AS UUID) AS collective_id, agent_id, task_description, "
        "working_on, started_ms, epoch_ms(last_heartbeat_ms) AS last_heartbeat FROM staged"
    )


def cell(value: Any) -> Any:
    """A JSON-ready value: UUIDs and times as text, embeddings as their size."""
    if isinstance(value, bytes):
        return f"<{len(value) // 4} floats>"
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [cell(v) for v in value]
    if isinstance(value, dict):
        return {k: cell(v) for k, v in value.items()}
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]

"""Read-only SQL over a projection: the analysts' side door.

Only queries run (SELECT, EXPLAIN, ...): the state changes only through events. The
activities of the activity stream are offered as a table named ``activities`` for the
one query (they are presence, not folded state).
"""

from __future__ import annotations

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


def run(con: duckdb.DuckDBPyConnection, sql: str, activities: list[Any], limit: int) -> SqlResult:
    """Run a checked query on a cursor of ``con`` with ``activities`` as a table."""
    check_read_only(sql)
    cursor = con.cursor()
    cursor.begin()  # rolled back below: whatever a query might change is undone
    try:
        table = {
            "collective_id": np.array([str(a.collective_id) for a in activities], dtype=object),
            "agent_id": np.array([a.agent_id for a in activities], dtype=object),
            "task_description": np.array([a.task_description for a in activities], dtype=object),
            "working_on": np.array([", ".join(a.working_on) for a in activities], dtype=object),
            "started_ms": np.array([a.started_ms for a in activities], dtype=np.int64),
            "last_heartbeat_ms": np.array(
                [a.last_heartbeat_ms for a in activities], dtype=np.int64
            ),
        }
        cursor.register("activities", _relation(cursor, table))
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
    )


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

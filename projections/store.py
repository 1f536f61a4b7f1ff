"""DuckDB storage of the folded rows: load the rows a batch touches, join them with the
batch's rows in Python (``projections.fold``), write them back, and advance the
checkpoint, all in one transaction. One writer per database: the instance's process."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from uuid import UUID

import duckdb
import msgspec
import numpy as np

from eventlog.errors import PulseError
from projections import schema
from projections.fold import (
    ApplicationRow,
    CollectiveRow,
    ExperienceRow,
    FoldState,
    InsightRow,
    RelationRow,
    Row,
    WisdomRow,
)

TABLE_OF: dict[type[Row], str] = {
    CollectiveRow: "collective_rows",
    ExperienceRow: "experience_rows",
    ApplicationRow: "application_rows",
    RelationRow: "relation_rows",
    InsightRow: "insight_rows",
    WisdomRow: "wisdom_rows",
}


class StateInUse(PulseError):
    """Another process holds the projection's database (DuckDB allows one writer)."""


class SchemaError(PulseError):
    """The database was written by a newer Pulse, or cannot be migrated."""


@dataclass(slots=True)
class Touched:
    """What one applied batch changed, for the vector and text indexes to follow."""

    experiences: set[UUID] = field(default_factory=set)
    insights: set[UUID] = field(default_factory=set)
    collectives: set[UUID] = field(default_factory=set)


def _column(values: list[Any], sql_type: str) -> np.ndarray[Any, Any]:
    """One staged column: UUIDs as text, lists as JSON text (cast back in SQL)."""
    if sql_type == "UUID":
        values = [None if v is None else str(v) for v in values]
    elif sql_type.endswith("[]"):
        values = [None if v is None else json.dumps([str(x) for x in v]) for v in values]
    return np.array(values, dtype=object)


def _cast(column: str, sql_type: str) -> str:
    if sql_type.endswith("[]"):
        return f"CAST(CAST({column} AS JSON) AS {sql_type}) AS {column}"
    return f"CAST({column} AS {sql_type}) AS {column}"


class Store:
    """The DuckDB file of a projection."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        try:
            self.con = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.IOException as exc:
            raise StateInUse(
                f"the projection {self.path} is in use by another process ({exc}); stop it, "
                "or ask the running instance instead"
            ) from exc
        if not read_only:
            self._migrate()
        self._types = {
            table: {row[0]: row[1] for row in self.con.execute(f"DESCRIBE {table}").fetchall()}
            for table in TABLE_OF.values()
        }
        # every tombstoned id (they are permanent): what later rows must not outlive
        self.deleted: set[UUID] = {
            row[0]
            for table, key in (("collective_rows", "collective_id"),
                               ("experience_rows", "experience_id"),
                               ("relation_rows", "relation_id"), ("insight_rows", "insight_id"),
                               ("wisdom_rows", "wisdom_id"))
            for row in self.con.execute(f"SELECT {key} FROM {table} WHERE deleted").fetchall()
        }  # fmt: skip
        self._next_vec_id = 1 + int(
            self.con.execute(
                "SELECT greatest((SELECT coalesce(max(vec_id), 0) FROM experience_rows),"
                " (SELECT coalesce(max(vec_id), 0) FROM insight_rows))"
            ).fetchone()[0]  # type: ignore[index]
        )

    def _migrate(self) -> None:
        self.con.execute(schema.TABLES)
        found = self.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(found[0]) if found else schema.SCHEMA_VERSION
        if version > schema.SCHEMA_VERSION:
            raise SchemaError(
                f"{self.path} has schema {version}; this Pulse knows up to "
                f"{schema.SCHEMA_VERSION}: upgrade Pulse, or `pulse rebuild` from the log"
            )
        self.con.begin()
        for step in range(version, schema.SCHEMA_VERSION):
            for statement in schema.MIGRATIONS[step]:
                self.con.execute(statement)
        self.con.execute(
            "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(schema.SCHEMA_VERSION)]
        )
        self.con.execute(schema.VIEWS)
        self.con.commit()

    def close(self) -> None:
        self.con.close()

    def checkpoint(self) -> tuple[int, int]:
        """(last applied stream sequence, number of events applied so far)."""
        found = self.con.execute("SELECT seq, applied FROM checkpoint WHERE id = 1").fetchone()
        return (int(found[0]), int(found[1])) if found else (0, 0)

    # -- applying a batch ------------------------------------------------------------------

    def apply(
        self,
        delta: FoldState,
        *,
        last_seq: int,
        count: int,
        undecodable: Sequence[tuple[int, str, str]] = (),
    ) -> Touched:
        """Merge a folded batch into the tables and move the checkpoint, atomically."""
        touched = Touched()
        self.con.begin()
        try:
            for row_type, rows in delta.rows.items():
                if rows:
                    self._merge(row_type, list(rows.values()), last_seq)
            tombstones = {
                row.key()[0]
                for rows in delta.rows.values()
                for row in rows.values()
                if getattr(row, "deleted", False)
            }
            self._forget(delta, self.deleted | tombstones)
            for seq, subject, reason in undecodable:
                self.con.execute(
                    "INSERT OR REPLACE INTO undecodable VALUES (?, ?, ?)", [seq, subject, reason]
                )
            self.con.execute(
                "INSERT INTO checkpoint VALUES (1, ?, ?) ON CONFLICT (id) DO UPDATE "
                "SET seq = excluded.seq, applied = checkpoint.applied + excluded.applied",
                [last_seq, count],
            )
            self.con.commit()
        except BaseException:
            self.con.rollback()
            raise
        self.deleted |= tombstones
        touched.experiences = {k[0] for k in delta.rows[ExperienceRow]}
        touched.insights = {k[0] for k in delta.rows[InsightRow]}
        touched.collectives = {k[0] for k in delta.rows[CollectiveRow]}
        return touched

    def _merge(self, row_type: type[Row], rows: list[Row], seq: int) -> None:
        table = TABLE_OF[row_type]
        types = self._types[table]
        names = [f.name for f in fields(row_type)]
        key = row_type.KEY
        # Literal keys, not a joined key table: DuckDB then prunes row groups by their
        # min/max (UUIDv7 keys are time-ordered), where a join scans the whole table and
        # makes every batch slower as the table grows.
        condition = f"{key[0]} IN ({uuid_literals({getattr(r, key[0]) for r in rows})})"
        loaded = self.con.execute(f"SELECT * FROM {table} WHERE {condition}").fetchall()
        columns = list(types)
        existing: dict[tuple[Any, ...], Row] = {}
        vec_ids: dict[tuple[Any, ...], int] = {}
        wanted = {r.key() for r in rows}
        for values in loaded:
            record = dict(zip(columns, values, strict=True))
            row = row_type(**{n: _from_db(record[n]) for n in names})
            if row.key() not in wanted:
                continue  # same first key, other second key (application rows)
            existing[row.key()] = row
            if "vec_id" in record and record["vec_id"] is not None:
                vec_ids[row.key()] = int(record["vec_id"])
        merged: list[Row] = []
        for row in rows:
            current = existing.get(row.key())
            merged.append(current.merge(row) if current is not None else row)
        staged: dict[str, np.ndarray[Any, Any]] = {
            n: _column([getattr(r, n) for r in merged], types[n]) for n in names
        }
        if "vec_id" in types:
            ids = []
            for row in merged:
                vec_id = vec_ids.get(row.key())
                if vec_id is None:
                    vec_id = self._next_vec_id
                    self._next_vec_id += 1
                ids.append(vec_id)
            staged["vec_id"] = np.array(ids, dtype=np.int64)
        staged["updated_seq"] = np.full(len(merged), seq, dtype=np.int64)
        select = ", ".join(_cast(c, types[c]) for c in columns)
        self.con.execute(f"INSERT OR REPLACE INTO {table} SELECT {select} FROM staged")

    def _forget(self, delta: FoldState, deleted: set[UUID]) -> None:
        """Drop the application counts of a deleted experience, whichever arrived first
        (tombstones are permanent, so the result does not depend on the order).
        ``deleted`` holds every tombstoned id, this batch's included."""
        experiences = {k[0] for k in delta.rows[ExperienceRow]}
        experiences |= {k[0] for k in delta.rows[ApplicationRow]}
        doomed = experiences & deleted
        if doomed:
            self.con.execute(
                f"DELETE FROM application_rows WHERE experience_id IN ({uuid_literals(doomed)})"
            )

    # -- reading ---------------------------------------------------------------------------

    def rows(self, row_type: type[Row]) -> dict[tuple[Any, ...], Row]:
        """Every stored row of a type, as fold rows (for checks and tools)."""
        table = TABLE_OF[row_type]
        names = [f.name for f in fields(row_type)]
        result = self.con.execute(f"SELECT {', '.join(names)} FROM {table}").fetchall()
        rows = (row_type(*map(_from_db, values)) for values in result)
        return {row.key(): row for row in rows}

    def max_hlc(self) -> int:
        """The largest HLC of anything folded so far (a restarted clock starts past it)."""
        parts = [
            f"SELECT max(created_hlc) FROM {t}"
            for t in ("collective_rows", "experience_rows", "relation_rows", "insight_rows",
                      "wisdom_rows")
        ] + ["SELECT max(last_hlc) FROM application_rows"]  # fmt: skip
        best = max(r[0] or 0 for r in self.con.execute(" UNION ALL ".join(parts)).fetchall())
        for column in ("importance", "confidence", "domain", "related_files", "archived"):
            found = self.con.execute(f"SELECT max({column}_stamp) FROM experience_rows").fetchone()
            if found and found[0]:
                best = max(best, int.from_bytes(found[0][:8], "big"))
        return int(best)

    def digest(self) -> str:
        """SHA-256 of the logical state: every base table's rows, sorted, local columns out."""
        h = hashlib.sha256()
        for name, query in schema.DIGEST_QUERIES.items():
            h.update(name.encode())
            result = self.con.execute(query)
            while batch := result.fetchmany(10_000):
                for row in batch:
                    h.update(msgspec.msgpack.encode(row))
        return h.hexdigest()


def uuid_literals(ids: Any) -> str:
    """UUIDs as a SQL list of literals (str(UUID) is hex digits and dashes: safe to inline).

    Point lookups by literal keys let DuckDB prune row groups; a joined parameter list
    makes it scan the table."""
    return ", ".join(f"'{UUID(str(i))}'" for i in sorted(ids, key=str))


def _from_db(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value

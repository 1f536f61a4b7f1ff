"""The projection's schema has a version and a migration path."""

from __future__ import annotations

from pathlib import Path

import pytest

from projections import schema
from projections.store import SchemaError, StateInUse, Store


def test_a_newer_schema_is_refused_with_advice(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.duckdb")
    store.con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    store.close()
    expected = f"schema 99; this Pulse knows up to {schema.SCHEMA_VERSION}: upgrade Pulse"
    with pytest.raises(SchemaError, match=expected):
        Store(tmp_path / "state.duckdb")


def test_a_version_1_database_is_migrated_on_open(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.duckdb")  # make it look as version 1 wrote it
    store.con.execute("ALTER TABLE application_rows DROP COLUMN collective_id")
    store.con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    store.close()
    store = Store(tmp_path / "state.duckdb")
    columns = {r[0] for r in store.con.execute("DESCRIBE application_rows").fetchall()}
    version = store.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    store.close()
    assert "collective_id" in columns and version == (str(schema.SCHEMA_VERSION),) == ("2",)


def test_a_database_held_by_another_process_is_reported(tmp_path: Path) -> None:
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
         "print('open', flush=True); sys.stdin.read()", str(tmp_path / "state.duckdb")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "open\n"
    try:
        with pytest.raises(StateInUse, match="in use by another process"):
            Store(tmp_path / "state.duckdb")
    finally:
        holder.communicate("", timeout=10)

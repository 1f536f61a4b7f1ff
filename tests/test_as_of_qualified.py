"""An admin's SQL as of a moment reads the past through temporary views that shadow the
state's names; a name qualified by the state's database passes them by, so it is
refused with a message that says which name to write instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlog.errors import ValidationError
from tests.test_as_of import projection_of, sql_rows, views_reading_views


def test_a_database_qualified_name_as_of_a_moment_is_refused_not_read_now(
    tmp_path: Path,
) -> None:
    p = projection_of(tmp_path / "live", views_reading_views())
    try:
        database = p.store.con.execute("SELECT current_database()").fetchone()[0]
        # the past differs from the present here, so reading the present would show
        then, now = (
            sql_rows(p, "SELECT count(*) FROM relation_rows", 2),
            sql_rows(p, "SELECT count(*) FROM relation_rows"),
        )
        assert then == ["[0]"] and now == ["[1]"]
        assert sql_rows(p, "SELECT count(*) FROM main.relation_rows", 2) == then
        for query in (
            f"SELECT count(*) FROM {database}.main.relation_rows",
            f'SELECT count(*) FROM "{database}"."main"."relations"',
            f"SELECT (SELECT count(*) FROM {database}.main.experience_rows) AS n",
        ):
            with pytest.raises(ValidationError, match=r"as of a moment, .* without its database"):
                sql_rows(p, query, 2)
            assert sql_rows(p, query)  # the present may name it so
    finally:
        p.close()

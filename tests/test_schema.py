"""The projection's schema has a version and a migration path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def _auto(created: Any) -> Any:
    """A created collective as this release writes it by default (``language`` "auto"): a
    migration reads a collective of a release before whose language its name chose as
    "auto", as the codec's upcaster reads its event, and its fold must say the same."""
    import msgspec

    return msgspec.structs.replace(created, language="auto")


def as_version_3(con: Any) -> None:
    """Give a database the application table versions 1 to 3 had: one count per
    (experience, instance), whatever collective its reports named."""
    con.execute("CREATE TABLE held AS SELECT * FROM application_rows")
    con.execute("DROP VIEW experiences")
    con.execute("DROP VIEW applications")
    con.execute("DROP TABLE application_rows")
    con.execute(
        "CREATE TABLE application_rows (experience_id UUID, instance_id UUID, "
        "applications UBIGINT NOT NULL, last_hlc UBIGINT NOT NULL, updated_seq BIGINT, "
        "collective_id UUID, PRIMARY KEY (experience_id, instance_id))"
    )
    con.execute("INSERT INTO application_rows SELECT * FROM held")
    con.execute("DROP TABLE held")
    con.execute("ALTER TABLE undecodable DROP COLUMN position")  # (version 12's)
    con.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")


def test_a_version_3_database_keeps_its_counts(tmp_path: Path) -> None:
    from eventlog import events as ev
    from eventlog.log import LogEntry
    from projections.projection import Projection
    from tests import factories as f

    cid = f.uuid7()
    lesson = f.experience(cid, "a lesson")
    events = [
        _auto(f.collective(cid)), lesson,
        ev.ExperienceReinforced(**f.common(), experience_id=lesson.experience_id,  # type: ignore[arg-type]
                                collective_id=cid, applications=3),
    ]  # fmt: skip
    projection = Projection(tmp_path)
    projection.apply([LogEntry(i, "pulse.test", e) for i, e in enumerate(events, start=1)])
    expected = projection.digest()
    projection.flush()
    as_version_3(projection.store.con)
    projection.close()
    migrated = Projection(tmp_path)
    counted = migrated.store.con.execute("SELECT applications FROM experiences").fetchall()
    assert migrated.digest() == expected
    migrated.close()
    assert counted == [(3,)]


def test_a_version_1_database_is_migrated_on_open(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.duckdb")  # make it look as version 1 wrote it
    as_version_3(store.con)
    store.con.execute("ALTER TABLE application_rows DROP COLUMN collective_id")
    store.con.execute("ALTER TABLE undecodable DROP COLUMN instance_id")
    for table in ("checkpoint_rows", "pending_write_rows", "thread_rows"):  # (version 8's)
        store.con.execute(f"DROP TABLE {table}")
    store.con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    store.close()
    store = Store(tmp_path / "state.duckdb")
    columns = {r[0] for r in store.con.execute("DESCRIBE application_rows").fetchall()}
    kept_aside = {r[0] for r in store.con.execute("DESCRIBE undecodable").fetchall()}
    version = store.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    threads = store.con.execute("SELECT count(*) FROM checkpoint_rows").fetchall()
    store.close()
    assert "collective_id" in columns and "instance_id" in kept_aside and threads == [(0,)]
    assert "position" in kept_aside
    assert version == (str(schema.SCHEMA_VERSION),) == ("12",)


def test_a_version_6_database_gains_languages_its_collectives_auto(tmp_path: Path) -> None:
    from eventlog.log import LogEntry
    from projections.projection import Projection
    from tests import factories as f

    cid = f.uuid7()
    projection = Projection(tmp_path)
    projection.apply([LogEntry(1, "pulse.test", _auto(f.collective(cid)))])
    expected = projection.digest()
    projection.flush()
    projection.store.con.execute("DROP VIEW collectives")  # as version 6 had it
    for column in ("language", "on_duplicate", "duplicate_similarity"):  # (9's too)
        projection.store.con.execute(f"ALTER TABLE collective_rows DROP COLUMN {column}")
    for table in ("experience_rows", "insight_rows"):
        projection.store.con.execute(f"ALTER TABLE {table} DROP COLUMN language")
    projection.store.con.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    projection.close()
    migrated = Projection(tmp_path)
    languages = migrated.store.con.execute("SELECT language FROM collectives").fetchall()
    assert migrated.digest() == expected
    migrated.close()
    assert languages == [("auto",)]  # (an ASCII name: English was auto's choice)


def as_version_4(con: Any) -> None:
    """Give a database what version 4 had: no authors, visibility, tokens or audit."""
    for view in ("experiences", "relations", "insights", "wisdom", "collectives", "tokens",
                 "audit", "insight_sources", "applications", "dead_letters"):  # fmt: skip
        con.execute(f"DROP VIEW IF EXISTS {view}")
    for table in ("experience_rows", "relation_rows", "insight_rows", "wisdom_rows"):
        for column in ("visibility", "author_owner", "author_agent"):
            con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    for column in ("author_owner", "author_agent"):
        con.execute(f"ALTER TABLE collective_rows DROP COLUMN {column}")
    con.execute("DROP TABLE token_rows")
    con.execute("DROP TABLE audit_rows")
    con.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")


def test_a_version_4_database_gains_authors_and_visibility(tmp_path: Path) -> None:
    """Rows from before principals have no author and count as "team"; the state keeps
    its digest, and the new events apply on top."""
    from eventlog import events as ev
    from eventlog.log import LogEntry
    from projections.projection import Projection
    from tests import factories as f

    cid = f.uuid7()
    events: list[ev.Event] = [f.collective(cid), f.experience(cid, "an old lesson")]
    projection = Projection(tmp_path)
    projection.apply([LogEntry(i, "pulse.test", e) for i, e in enumerate(events, start=1)])
    projection.flush()
    as_version_4(projection.store.con)
    projection.close()
    migrated = Projection(tmp_path)
    seen = migrated.store.con.execute("SELECT visibility, author_owner FROM experiences").fetchall()
    assert seen == [("team", None)]
    token = ev.TokenCreated(
        **f.common(), token_id=f.uuid7(), owner_id="o", secret_sha256="ab" * 32, scope="read"
    )  # type: ignore[arg-type]
    migrated.apply([LogEntry(3, "pulse.t.x", token)])
    migrated.flush()
    assert migrated.store.con.execute("SELECT count(*) FROM tokens").fetchone() == (1,)
    assert migrated.store.con.execute("SELECT count(*) FROM audit").fetchone() == (1,)
    migrated.close()


def test_a_version_2_database_names_the_writer_of_a_message_kept_aside(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.duckdb")  # as version 2 wrote it
    as_version_3(store.con)
    store.con.execute("ALTER TABLE undecodable DROP COLUMN instance_id")
    for table in ("checkpoint_rows", "pending_write_rows", "thread_rows"):  # (version 8's)
        store.con.execute(f"DROP TABLE {table}")
    store.con.execute("INSERT INTO undecodable VALUES (7, 'pulse.x', 'unreadable')")
    store.con.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    store.close()
    store = Store(tmp_path / "state.duckdb")
    letters = store.con.execute(
        "SELECT entity, seq, subject, reason, instance_id FROM dead_letters"
    ).fetchall()
    store.close()
    assert letters == [("message", 7, "pulse.x", "unreadable", None)]


def test_version_1_deletes_are_forgotten_by_the_migration(tmp_path: Path) -> None:
    """A version-1 database kept deleted content and counts without a collective;
    migrated, it holds what version 2 folds from the same events."""
    from eventlog import events as ev
    from eventlog.log import LogEntry
    from projections.projection import Projection
    from tests import factories as f

    kept, gone = f.uuid7(), f.uuid7()
    lesson = f.experience(kept, "a secret lesson")
    doomed = f.experience(gone, "in a doomed collective")
    reinforced = ev.ExperienceReinforced(
        **f.common(), experience_id=lesson.experience_id, collective_id=kept, applications=2
    )  # type: ignore[arg-type]
    events = [
        _auto(f.collective(kept)), lesson, reinforced, _auto(f.collective(gone)), doomed,
        ev.ExperienceDeleted(**f.common(), experience_id=lesson.experience_id,  # type: ignore[arg-type]
                             collective_id=kept),
        ev.CollectiveDeleted(**f.common(), collective_id=gone),  # type: ignore[arg-type]
    ]  # fmt: skip
    projection = Projection(tmp_path)
    projection.apply([LogEntry(i, "pulse.test", e) for i, e in enumerate(events, start=1)])
    expected = projection.digest()
    con = projection.store.con  # now make it look as version 1 left it
    as_version_3(con)
    con.execute("ALTER TABLE application_rows DROP COLUMN collective_id")
    con.execute("ALTER TABLE application_rows ADD COLUMN collective_id UUID")
    con.execute(
        "INSERT INTO application_rows (experience_id, instance_id, applications, last_hlc)"
        " VALUES (?, ?, 2, ?)",
        [lesson.experience_id, lesson.instance_id, reinforced.hlc],
    )
    con.execute(
        "UPDATE experience_rows SET content = ?, create_event = ?, importance = 0.5 "
        "WHERE experience_id = ?",
        [lesson.content, lesson.event_id, lesson.experience_id],
    )
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    assert projection.digest() != expected
    projection.close()
    migrated = Projection(tmp_path)
    assert migrated.digest() == expected
    leftovers = migrated.store.con.execute(
        "SELECT count(*) FROM experience_rows WHERE content IS NOT NULL AND deleted"
    ).fetchone()
    migrated.close()
    assert leftovers == (0,)


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


def test_holding_the_state_refuses_while_another_process_has_it_and_keeps_others_out(
    tmp_path: Path,
) -> None:
    """``holding_state`` (what ``pulse rebuild`` holds the state with): refused, naming
    the holder's pid, while another process has the state open; while held, no other
    process opens it; a data directory without a state has nothing to hold."""
    import subprocess
    import sys

    from projections.projection import holding_state, state_dir

    with holding_state(tmp_path / "empty", "rebuild"):  # (no state yet: nothing held)
        assert not (tmp_path / "empty").exists()
    database = state_dir(tmp_path) / "state.duckdb"
    Store(database).close()
    opening = "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('open', flush=True)"
    holder = subprocess.Popen(
        [sys.executable, "-c", opening + "; sys.stdin.read()", str(database)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "open\n"
    try:
        expected = (
            f"rebuild: the state {database} is open in another process (pid {holder.pid}); "
            "stop it first (Ctrl-C on pulse up), then run pulse rebuild"
        )
        with pytest.raises(StateInUse) as refused, holding_state(tmp_path, "rebuild"):
            pass
        assert str(refused.value) == expected
    finally:
        holder.communicate("", timeout=10)
    with holding_state(tmp_path, "rebuild"):
        other = subprocess.run(
            [sys.executable, "-c", opening, str(database)], capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert other.returncode != 0 and "lock" in other.stderr.lower(), other.stderr
    after = subprocess.run([sys.executable, "-c", opening, str(database)], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert after.returncode == 0 and after.stdout == "open\n", after.stderr


def test_a_version_5_database_keeps_history_from_its_upgrade_on(tmp_path: Path) -> None:
    """Before version 6 no history was kept: reads as of a moment before the upgrade are
    refused by name (a rebuild keeps all of it), the counts so far seed the counts'
    history, and an entity whose older events were not kept is refused, never guessed."""
    import pytest

    from eventlog import events as ev
    from eventlog.errors import ValidationError
    from eventlog.log import LogEntry
    from projections import past, queries
    from projections.projection import Projection
    from tests import factories as f

    cid = f.uuid7()
    old, other = f.experience(cid, "an old lesson"), f.experience(cid, "another")
    reinforced = ev.ExperienceReinforced(
        **f.common(), experience_id=other.experience_id, collective_id=cid, applications=2
    )  # type: ignore[arg-type]
    projection = Projection(tmp_path)
    projection.apply(
        [LogEntry(i, "pulse.test", e) for i, e in enumerate([f.collective(cid), old, other,
                                                             reinforced], start=1)]
    )  # fmt: skip
    projection.flush()
    con = projection.store.con
    for view in ("experiences", "history", "dead_letters", "relations", "insight_sources",
                 "insights", "applications", "audit"):  # fmt: skip
        con.execute(f"DROP VIEW IF EXISTS {view}")
    for column in ("valid_from_ms", "valid_to", "valid_to_stamp", "invalid_reason",
                   "invalid_reason_stamp", "invalidations"):  # fmt: skip
        con.execute(f"ALTER TABLE experience_rows DROP COLUMN {column}")
    con.execute("ALTER TABLE audit_rows DROP COLUMN change")
    con.execute("DROP TABLE count_history")
    # the old lesson as if recorded before the audit (schema 4): no history row at all
    con.execute(f"DELETE FROM audit_rows WHERE entity_id = '{old.experience_id}'")
    con.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    projection.close()

    migrated = Projection(tmp_path)
    assert past.history_from(migrated) == 4
    again = ev.ExperienceReinforced(
        **f.common(), experience_id=other.experience_id, collective_id=cid, applications=3
    )  # type: ignore[arg-type]
    touched = ev.ExperienceUpdated(
        **f.common(), experience_id=old.experience_id, collective_id=cid, importance=0.9
    )  # type: ignore[arg-type]
    migrated.apply([LogEntry(5, "pulse.test", again)])
    with pytest.raises(ValidationError, match="as_of: this host keeps the history from sequence 4"):
        past.past(migrated, 3)
    then = past.past(migrated, 4)
    assert queries.total_applications(then, other.experience_id) == 2  # type: ignore[arg-type]
    assert queries.total_applications(migrated, other.experience_id) == 3
    migrated.apply([LogEntry(6, "pulse.test", touched)])
    with pytest.raises(ValidationError, match="needs the history of an entity"):
        past.past(migrated, 5)  # the old lesson changed since, and no history of it was kept
    migrated.close()


def test_a_checkpoint_that_meets_a_copy_in_flight_is_left_for_later(tmp_path: Path) -> None:
    """DuckDB refuses a CHECKPOINT while a transaction on another cursor of the state
    writes (the analysts' snapshot copies the state in one of its own). A save must not
    fail for it (it once stopped a host from opening): the fold waits, the data stays."""
    store = Store(tmp_path / "state.duckdb")
    store.con.execute("CREATE TABLE notes (n INTEGER)")
    store.con.execute("INSERT INTO notes SELECT range FROM range(1000)")
    copying = store.con.cursor()
    copying.begin()
    copying.execute("CREATE TABLE aside (n INTEGER)")
    assert store.checkpoint_file() is False  # refused by DuckDB, not raised
    copying.commit()
    copying.close()
    assert store.checkpoint_file() is True
    store.close()
    reopened = Store(tmp_path / "state.duckdb")
    assert reopened.con.execute("SELECT count(*) FROM notes").fetchone() == (1000,)
    reopened.close()


def test_an_open_makes_the_views_again_only_when_their_sql_differs(tmp_path: Path) -> None:
    def views(store: Store) -> set[str]:
        found = store.con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal")
        return {row[0] for row in found.fetchall()}

    path = tmp_path / "state.duckdb"
    store = Store(path)
    made = views(store)
    assert "collectives" in made
    store.con.execute("DROP VIEW collectives")
    store.close()
    store = Store(path)  # this Pulse's views, by their id: taken as they are, nothing written
    assert views(store) == made - {"collectives"}
    store.con.execute("UPDATE meta SET value = 'another Pulse' WHERE key = 'views'")
    store.close()
    store = Store(path)  # another Pulse's views: all made again, under this one's id
    assert views(store) == made
    store.close()
    store = Store(path)
    assert views(store) == made
    store.close()

"""The SQL sandbox (``projections.analytics``): an analyst's read-only query over a real
instance on a real nats-server reads the state's tables and views and nothing else, within
its time, memory and result limits, and stops when its caller goes away; over the
Python API, over HTTP (`pulse up`) and on the command line. Queries an analyst means
(views, joins, aggregates, activities) and `export` keep working."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import UUID

import duckdb
import httpx
import pytest
import pytest_asyncio

from eventlog import EmbeddedNats
from eventlog.errors import (
    QueryCancelled,
    QueryOutOfMemory,
    QueryTimedOut,
    QueryTooComplex,
    QueryTooLarge,
    ValidationError,
)
from projections.analytics import SqlLimits
from projections.projection import ProjectionSettings
from sync import PulseDB
from sync.access import Principal
from tests.harness import clean_env, eventually, pulse, start, stop

LONG = "SELECT count(*) FROM range(1000000000000::BIGINT)"  # minutes of work, no memory
BIG_SORT = "SELECT * FROM range(100000000::BIGINT) ORDER BY random()"  # ~1 GB to sort


async def seeded(directory: Path, nats_url: str) -> PulseDB:
    """An instance holding a collective, two experiences, a relation and an activity."""
    instance = await PulseDB.open(directory, nats_url)
    team = await instance.create_collective("ana", "team", 3)
    first = await instance.record_experience(team, "retry publishes", [1.0, 0.0, 0.0])
    second = await instance.record_experience(team, "slow fsync", [0.0, 1.0, 0.0])
    await instance.store_relation(first, second, "Supports")
    await instance.reinforce_experience(first)
    await instance.register_activity(team, "bot-1", "analysing", ["notes.md"])
    return instance


@pytest.fixture
async def db(tmp_path: Path, nats_server: EmbeddedNats) -> AsyncIterator[PulseDB]:
    instance = await seeded(tmp_path / "db", nats_server.url)
    yield instance
    await instance.close()


@pytest.fixture(scope="module")
def module_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path_factory.mktemp("sandbox-nats"))
    server.start()
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def refusing_db(
    tmp_path_factory: pytest.TempPathFactory, module_nats: EmbeddedNats
) -> AsyncIterator[PulseDB]:
    """``db`` once for the module's queries that are refused before they run (they change
    nothing, and an instance of its own costs each more than its query)."""
    instance = await seeded(tmp_path_factory.mktemp("sandbox") / "db", module_nats.url)
    yield instance
    await instance.close()


def sql_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pulse-sql"]


# -- what an analyst means still works -----------------------------------------------------


async def test_views_joins_aggregates_and_activities_still_answer(db: PulseDB) -> None:
    counted = await db.sql(
        "SELECT c.name, count(*) AS n, sum(e.applications) AS used FROM experiences e "
        "JOIN collectives c USING (collective_id) GROUP BY c.name"
    )
    assert counted.columns == ["name", "n", "used"]
    assert (counted.rows, counted.truncated) == ([["team", 2, 1]], False)
    linked = await db.sql(
        "WITH r AS (SELECT source_id, target_id FROM relations) SELECT s.content, t.content "
        "FROM r JOIN experiences s ON s.experience_id = r.source_id "
        "JOIN experiences t ON t.experience_id = r.target_id"
    )
    assert linked.rows == [["retry publishes", "slow fsync"]]
    present = await db.sql("SELECT agent_id, task_description FROM activities")
    assert present.rows == [["bot-1", "analysing"]]
    numbered = await db.sql("SELECT sum(range) FROM range(10)")  # an allowed table function
    assert numbered.rows == [[45]]
    explained = await db.sql("EXPLAIN SELECT content FROM experiences")
    assert explained.rows and explained.truncated_by is None
    described = await db.sql("DESCRIBE experiences")
    assert ["content", "VARCHAR"] in [row[:2] for row in described.rows]
    listed = await db.sql(
        "SELECT table_name FROM information_schema.tables WHERE table_name = 'experiences'"
    )
    assert listed.rows == [["experiences"]]


async def test_export_still_writes_parquet_after_queries(db: PulseDB, tmp_path: Path) -> None:
    await db.sql("SELECT count(*) FROM experiences")  # the sandbox is on from here
    written = await db.export(tmp_path / "out")
    assert written["experiences"] == 2 and written["activities"] == 1
    target = tmp_path / "out" / "experiences.parquet"
    assert duckdb.connect().execute(f"SELECT count(*) FROM '{target}'").fetchone() == (2,)


# -- no files, URLs, extensions or settings ---------------------------------------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT * FROM read_text('/proc/self/environ')",
         "query: the table function read_text() is not allowed"),
        ("SELECT content FROM read_csv('/etc/passwd')",
         "query: the table function read_csv() is not allowed"),
        ("SELECT * FROM read_parquet('/tmp/*.parquet')",
         "query: the table function read_parquet() is not allowed"),
        ("SELECT * FROM glob('/*')", "query: the table function glob() is not allowed"),
        ("SELECT * FROM query('SELECT 1')", "query: the table function query() is not allowed"),
        ("FROM duckdb_settings()", "query: the table function duckdb_settings() is not allowed"),
        ("SELECT (SELECT count(*) FROM read_blob('/etc/hostname'))",
         "query: the table function read_blob() is not allowed"),
        ("SELECT * FROM range(2) r, LATERAL (SELECT * FROM read_text('/etc/hostname'))",
         "query: the table function read_text() is not allowed"),
        ("EXPLAIN SELECT * FROM read_text('/etc/hostname')",
         "query: the table function read_text() is not allowed"),
        ("SUMMARIZE SELECT * FROM read_text('/etc/hostname')",
         "query: the table function read_text() is not allowed"),
        ("SELECT * FROM 'https://example.com/data.parquet'",
         "query: no table or view named 'https://example.com/data.parquet'"),
        ("SELECT * FROM (WITH x AS (SELECT 1) SELECT 1) t, 'x.csv'",
         "query: no table or view named 'x.csv'"),
        ("DESCRIBE '/etc/passwd.csv'", "query: no table or view named '/etc/passwd.csv'"),
        ("COPY experiences TO '/tmp/out.csv'", "query: only read-only queries are allowed"),
        ("ATTACH '/tmp/other.db'", "query: only read-only queries are allowed"),
        ("INSTALL httpfs", "query: only read-only queries are allowed"),
        ("LOAD httpfs", "query: only read-only queries are allowed"),
        ("SET memory_limit = '100GB'", "query: only read-only queries are allowed"),
        ("PRAGMA threads = 1", "query: only read-only queries are allowed"),
        ("RESET memory_limit", "query: only read-only queries are allowed"),
        ("EXPLAIN -- a comment\n SET threads = 1", "query: only read-only queries are allowed"),
        ("EXPLAIN /* a comment */ ANALYZE SELECT 1", "query: EXPLAIN ANALYZE runs the statement"),
        ("EXPLAIN (FORMAT json) SELECT 1", "query: EXPLAIN takes no options here"),
        ("SELECT * FROM (PIVOT experiences ON experience_type USING count(*))",
         "query: only read-only queries are allowed"),
    ],
)  # fmt: skip
@pytest.mark.asyncio(loop_scope="module")
async def test_a_way_out_of_the_state_is_refused_by_name(
    refusing_db: PulseDB, query: str, message: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        await refusing_db.sql(query)
    assert str(refused.value).startswith(message), refused.value


async def test_a_file_the_service_can_read_stays_unread(
    db: PulseDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PULSE_TOKEN", "token-that-must-not-leak")
    secret = tmp_path / "secret.csv"
    secret.write_text("token\nfile-that-must-not-leak\n")
    for query in (f"SELECT * FROM '{secret}'", f"SELECT * FROM read_csv('{secret}')",
                  "SELECT * FROM read_text('/proc/self/environ')"):  # fmt: skip
        with pytest.raises(ValidationError) as refused:
            await db.sql(query)
        assert "must-not-leak" not in str(refused.value)
    assert (await db.sql("SELECT count(*) FROM experiences")).rows == [[2]]


async def test_extensions_and_settings_are_locked_and_the_engine_still_writes(
    db: PulseDB,
) -> None:
    await db.sql("SELECT 1")  # the first query puts the database in the sandbox
    settings = await db.engine.run(  # (analysts may not read settings: asked directly)
        lambda p: p.store.con.execute(
            "SELECT current_setting('lock_configuration'), "
            "current_setting('autoload_known_extensions'), "
            "current_setting('autoinstall_known_extensions')"
        ).fetchall()
    )
    assert settings == [(True, False, False)]
    # a function of a known extension is not fetched and loaded behind the query's back
    with pytest.raises(ValidationError, match="exists in the spatial extension"):
        await db.sql("SELECT st_point(1, 2)")
    # the engine's own connection keeps writing and checkpointing under the lock
    team = (await db.sql("SELECT collective_id FROM collectives")).rows[0][0]
    await db.record_experience(UUID(team), "after the lock", [0.0, 0.0, 1.0])
    await db.engine.run(lambda p: p.store.checkpoint_file())
    assert (await db.sql("SELECT count(*) FROM experiences")).rows == [[3]]


# -- time, memory, cancellation, result size ------------------------------------------------


async def test_a_query_past_its_time_limit_is_interrupted(db: PulseDB) -> None:
    db.engine.sql_limits = SqlLimits(time_limit=0.5)
    started = time.monotonic()
    with pytest.raises(QueryTimedOut) as stopped:
        await db.sql(LONG)
    # interrupted, not run to its end: the count takes many minutes on any machine, so a
    # bound far above the 0.5 s limit tells the two apart however loaded the machine is
    assert time.monotonic() - started < 60
    assert (stopped.value.limit, stopped.value.setting) == ("time", "PULSE_SQL_TIME_LIMIT")
    assert "time limit of the SQL sandbox, 0.5 s ($PULSE_SQL_TIME_LIMIT)" in str(stopped.value)
    await eventually(lambda: not sql_threads(), what="the query's thread ended")
    assert (await db.sql("SELECT count(*) FROM experiences")).rows == [[2]]


async def test_a_query_past_its_memory_limit_fails_without_spilling_to_disk(
    db: PulseDB,
) -> None:
    db.engine.sql_limits = SqlLimits(time_limit=60, memory_limit="64MB", temp_limit="0B")
    with pytest.raises(QueryOutOfMemory) as refused:
        await db.sql(BIG_SORT)
    assert refused.value.limit == "memory"
    assert "64MB of memory, $PULSE_SQL_MEMORY_LIMIT, and 0B of temp files" in str(refused.value)
    # (with room to spill, the sort would have gone to disk and succeeded)
    temp = Path(f"{db.engine.directory / 'state.duckdb'}.tmp")
    assert sum(f.stat().st_size for f in temp.glob("*")) == 0
    team = (await db.sql("SELECT collective_id FROM collectives")).rows[0][0]
    await db.record_experience(UUID(team), "the engine writes on", [0.0, 0.0, 1.0])
    assert (await db.sql("SELECT count(*) FROM experiences")).rows == [[3]]


async def test_cancelling_the_caller_interrupts_the_query(db: PulseDB) -> None:
    db.engine.sql_limits = SqlLimits(time_limit=120)
    task = asyncio.ensure_future(db.sql(LONG))
    await eventually(lambda: bool(sql_threads()), what="the query running")
    # meanwhile the event loop, the engine and other queries go on
    assert [c.name for c in await db.list_collectives()] == ["team"]
    assert (await db.sql("SELECT count(*) FROM experiences")).rows == [[2]]
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: not sql_threads(), timeout=10, what="the query interrupted")


async def test_results_stop_at_the_rows_limit_or_the_bytes_limit(db: PulseDB) -> None:
    rows = await db.sql("SELECT range FROM range(100)", limit=10)
    assert (len(rows.rows), rows.truncated, rows.truncated_by) == (10, True, "rows")
    exact = await db.sql("SELECT range FROM range(10)", limit=10)
    assert (len(exact.rows), exact.truncated, exact.truncated_by) == (10, False, None)
    db.engine.sql_limits = SqlLimits(max_bytes=2048)
    wide = await db.sql("SELECT repeat('x', 100) AS text FROM range(100)")
    assert (wide.truncated, wide.truncated_by) == (True, "bytes")
    assert 10 < len(wide.rows) < 100
    assert len(json.dumps(wide.rows, separators=(",", ":"))) <= 2048


@pytest.mark.parametrize("snapshot", [True, False], ids=["in-workers", "on-cursors"])
async def test_a_query_in_the_way_of_forgetting_is_cancelled_and_compact_goes_on(
    tmp_path: Path, nats_server: EmbeddedNats, snapshot: bool
) -> None:
    # with a snapshot, queries run in worker processes over it; without, on the
    # engine's own DuckDB
    settings = ProjectionSettings(snapshot_interval=1.0 if snapshot else None)
    db = await PulseDB.open(tmp_path / "db", nats_server.url, projection_settings=settings)
    try:
        team = await db.create_collective("ana", "team", 3)
        await db.record_experience(team, "kept", [1.0, 0.0, 0.0])
        db.engine.sql_limits = SqlLimits(time_limit=120)
        admin = asyncio.ensure_future(db.sql(LONG))
        with db.acting_as(Principal("ana", scope="read")):
            reader = asyncio.ensure_future(db.sql(LONG))
        workers = db.engine.sql_workers
        await eventually(
            lambda: (workers.running if workers is not None else db.engine.lent) == 2,
            timeout=30, what="both queries running",
        )  # fmt: skip
        done = await asyncio.wait_for(db.compact(), timeout=30)  # never waits for readers
        assert done.applied_seq > 0
        for task in (admin, reader):
            with pytest.raises(QueryCancelled, match="after a delete .* retry it"):
                await task
        assert (await db.sql("SELECT count(*) FROM experiences")).rows == [[1]]
    finally:
        await db.close()


async def test_a_query_too_long_too_large_or_too_deep_is_refused_before_it_binds(
    db: PulseDB,
) -> None:
    db.engine.sql_limits = SqlLimits(max_query_bytes=10_000, max_nodes=200, max_depth=60)
    for who in (None, Principal("ana", scope="read")):  # here, and in a worker
        with db.acting_as(who) if who else contextlib.nullcontext():
            with pytest.raises(QueryTooLarge) as long:
                await db.sql(" UNION ALL ".join(["SELECT 1"] * 1000))
            with pytest.raises(QueryTooComplex) as large:
                await db.sql(" UNION ALL ".join(["SELECT 1"] * 60))
            with pytest.raises(QueryTooComplex) as deep:
                await db.sql("SELECT * FROM (" * 30 + "SELECT 1 AS x" + ") t" * 30)
            with pytest.raises(QueryTooComplex) as deeper:  # past what Python's json reads
                await db.sql("SELECT * FROM (" * 500 + "SELECT 1 AS x" + ") t" * 500)
        assert "18989 bytes" in str(long.value) and "(10000 bytes" in str(long.value)
        assert (long.value.limit, long.value.setting) == (
            "query_bytes", "PULSE_SQL_MAX_QUERY_BYTES")  # fmt: skip
        assert "more than 200 nodes" in str(large.value)
        assert large.value.setting == "PULSE_SQL_MAX_NODES"
        for refused in (deep, deeper):
            assert "(60 levels of its parse tree, $PULSE_SQL_MAX_DEPTH" in str(refused.value)
    assert (await db.sql(" UNION ALL ".join(["SELECT 1"] * 10))).rows == [[1]] * 10


def test_the_limits_come_from_the_environment_and_are_checked() -> None:
    assert SqlLimits.from_env({}) == SqlLimits()
    assert SqlLimits() == SqlLimits(10.0, "2GB", "1GB", 16 * 1024 * 1024)
    assert SqlLimits.from_env(
        {"PULSE_SQL_TIME_LIMIT": "2.5", "PULSE_SQL_MEMORY_LIMIT": "512MB",
         "PULSE_SQL_TEMP_LIMIT": "0B", "PULSE_SQL_MAX_BYTES": "4096"}
    ) == SqlLimits(2.5, "512MB", "0B", 4096)  # fmt: skip
    assert SqlLimits.from_env(
        {"PULSE_SQL_MAX_QUERY_BYTES": "1000", "PULSE_SQL_MAX_NODES": "500",
         "PULSE_SQL_MAX_DEPTH": "100"}
    ) == SqlLimits(max_query_bytes=1000, max_nodes=500, max_depth=100)  # fmt: skip
    with pytest.raises(ValidationError, match=r"max_depth \(\$PULSE_SQL_MAX_DEPTH\): at most 800"):
        SqlLimits(max_depth=5000)
    with pytest.raises(ValidationError, match=r"max_nodes \(\$PULSE_SQL_MAX_NODES\): must be"):
        SqlLimits.from_env({"PULSE_SQL_MAX_NODES": "3"})
    with pytest.raises(ValidationError, match=r"\$PULSE_SQL_TIME_LIMIT: not a valid value"):
        SqlLimits.from_env({"PULSE_SQL_TIME_LIMIT": "soon"})
    with pytest.raises(ValidationError, match=r"memory_limit \(\$PULSE_SQL_MEMORY_LIMIT\)"):
        SqlLimits.from_env({"PULSE_SQL_MEMORY_LIMIT": "1GB'; SET threads = 1; --"})
    with pytest.raises(ValidationError, match=r"time_limit \(\$PULSE_SQL_TIME_LIMIT\)"):
        SqlLimits(time_limit=0)


# -- over HTTP and the command line -----------------------------------------------------------


async def test_over_http_refusals_and_limits_have_their_status_and_a_gone_client_cancels(
    tmp_path: Path,
) -> None:
    service = start(
        tmp_path / "data",
        env=clean_env(PULSE_SQL_TIME_LIMIT="120", PULSE_SQL_MEMORY_LIMIT="64MB",
                 PULSE_SQL_TEMP_LIMIT="0B"),
    )  # fmt: skip
    try:
        async with service.client() as client:
            ok = await client.post("/v1/sql", json={"query": "SELECT count(*) FROM experiences"})
            assert ok.status_code == 200 and ok.json()["rows"] == [[0]]
            refused = await client.post(
                "/v1/sql", json={"query": "SELECT * FROM read_text('/proc/self/environ')"}
            )
            assert refused.status_code == 422
            assert refused.json()["error"] == "ValidationError"
            assert refused.json()["message"].startswith(
                "query: the table function read_text() is not allowed"
            )
            too_big = await client.post("/v1/sql", json={"query": BIG_SORT})
            assert too_big.status_code == 413, too_big.text
            assert too_big.json()["error"] == "QueryOutOfMemory"
            # a client that gives up: its query is cancelled, not left to its 120 s
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/v1/sql", json={"query": LONG}, timeout=1.0)

            async def cancelled() -> bool:
                metrics = (await client.get("/metrics")).text
                return 'method="POST",route="/v1/sql",status="499"} 1.0' in metrics

            await eventually(cancelled, timeout=10, what="the query cancelled")
            again = await client.post("/v1/sql", json={"query": "SELECT 1 AS one"})
            assert again.json()["rows"] == [[1]]
    finally:
        stop(service)


async def test_over_http_a_query_past_its_time_limit_is_a_408(tmp_path: Path) -> None:
    service = start(tmp_path / "data", env=clean_env(PULSE_SQL_TIME_LIMIT="0.5"))
    try:
        async with service.client() as client:
            late = await client.post("/v1/sql", json={"query": LONG})
        assert late.status_code == 408
        assert late.json()["error"] == "QueryTimedOut"
    finally:
        stop(service)


def test_on_the_command_line_a_file_read_is_one_clear_line(tmp_path: Path) -> None:
    result = pulse("sql", "SELECT * FROM read_text('/proc/self/environ')", data_dir=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(
        "pulse: error: query: the table function read_text() is not allowed"
    ), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


async def test_duckdbs_own_views_are_not_the_state(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """pg_catalog's views show DuckDB's settings and paths: not part of the state."""
    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        with pytest.raises(
            ValidationError, match="no table or view named 'pg_catalog.pg_settings'"
        ):
            await db.sql("SELECT * FROM pg_catalog.pg_settings")
        found = await db.sql(
            "SELECT table_name FROM information_schema.tables WHERE table_name = 'experiences'"
        )
        assert found.rows == [["experiences"]]
    finally:
        await db.close()


async def test_settings_and_paths_are_not_read(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        for query in ("SELECT current_setting('temp_directory')", "SELECT getvariable('x')"):
            with pytest.raises(ValidationError, match="the function .* is not allowed"):
                await db.sql(query)
        assert (await db.sql("SELECT upper('still fine')")).rows == [["STILL FINE"]]
    finally:
        await db.close()

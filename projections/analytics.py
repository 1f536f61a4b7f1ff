"""Read-only SQL over a projection: the analysts' side door, and Parquet export.

Only queries run (SELECT, EXPLAIN, ...): the state changes only through events. The
activities of the activity stream are offered as a table named ``activities`` for the
one query (they are presence, not folded state). Both run on a cursor of a flushed
state that the engine hands out (``Engine.cursor``), on a thread of their own: DuckDB
reads run beside the engine's writes.

The SQL sandbox. An analyst's query reads the state's tables and views and nothing
else: no file, no URL, no extension, no setting changed, within a time, memory and result
limit (``SqlLimits``, from ``$PULSE_SQL_*``). Where it is enforced, and why there:

- ``enable_external_access = false`` cannot be used. It is an instance-wide DuckDB
  setting (there is no per-connection one), the analysts' cursors share the engine's
  instance, and the engine needs external access: ``Store.write`` inserts its staged
  columns by a Python replacement scan (``... FROM staged``), which that setting turns
  off (measured: "Table with name staged does not exist"), and ``export`` writes Parquet
  with ``COPY ... TO``. A second, sandboxed DuckDB instance that ATTACHes the state file
  read-only is refused by DuckDB while the engine's instance holds the file in the same
  process ("Unique file handle conflict: ... already attached by database"), and a copy
  of the state per query would cost what the state weighs.
- So every query is checked before DuckDB binds it (binding alone reads files: the CSV
  sniffer, globbing): its parse tree (``json_serialize_sql``) may name only tables and
  views of the database, ``activities`` and its own CTEs (plain identifiers: a file
  replacement scan needs a dot or a slash in the name), and only the table functions of
  ``TABLE_FUNCTIONS``; ``read_text``, ``read_csv``, ``read_parquet``, ``glob``,
  ``query``, ``'file.csv'`` and URLs are refused by name. A query the serializer cannot
  express (PIVOT inside a query) is refused too. Statements other than a query (COPY,
  ATTACH, INSTALL, LOAD, SET, PRAGMA, RESET, CALL, ...) were already refused by type.
- Behind that, instance-wide settings the engine does not need, set (``sandbox``) when
  the engine hands out its first cursor: no extension autoloading or autoinstalling, no
  community extensions, and ``lock_configuration = true`` (only the engine's own
  ``checkpoint_threshold`` and ``enable_progress_bar`` and the sandbox's two limits stay
  settable, by ``allowed_configs``): even a statement that slipped past the checks could
  change no setting.
- Memory: DuckDB's per-connection ``operator_memory_limit`` did not bound a sort of
  3e7 random rows (1 GB resident with it at 8 MB), so the limit is the instance's
  ``memory_limit`` (shared with the engine's writes, which need little: the state lives
  in Python) and ``max_temp_directory_size`` caps what spills to disk (measured: with
  200 MB of memory a sort spilled 680 MB; with a 50 MB cap it failed at 47 MB).
  DuckDB's ``max_execution_time`` is instance-wide too (it would also stop the engine's
  checkpoints), so time is a timer that calls ``interrupt()`` on the query's own cursor;
  cancelling the awaiting task interrupts it the same way (``run_async``).
- Rows stream from DuckDB (``execute`` returns before the result is built) and are
  fetched in chunks until the rows limit or ``max_bytes`` of JSON; then the result says
  ``truncated`` and which (``truncated_by``). Nothing runs on the event loop.
- Size, before DuckDB binds anything: the text at most ``max_query_bytes`` (256 KiB,
  QueryTooLarge, 413), its parse tree at most ``max_nodes`` objects (10,000) and
  ``max_depth`` levels (400: some 130 nested subqueries; QueryTooComplex, 422). Binding
  and planning are out of reach of ``interrupt()`` (measured: a query of 6,000 ``UNION
  ALL`` terms interrupted at 1 s stopped at 10.8 s; planning grows about quadratically
  with the terms), so in this process these caps are what bounds them. They do not bound
  everything a short query can do while planning: constant folding evaluates
  ``repeat('x', 1000000000)`` outside ``memory_limit`` (31 s, 4 GB). That is why a query
  runs in a process of its own over the analysts' snapshot, under an address-space limit
  and a wall-clock kill (``projections.sqlworker``, which says why in full), whenever the
  engine keeps a snapshot (the default); on a cursor of the engine (as this docstring
  describes) only without one, and for ``export``.
- Forgetting never waits for a reader: when the files are to be rewritten after a
  delete (``Engine``: ``scrub_after`` seconds after it, or ``pulse compact``), every
  query on a lent cursor is cancelled (QueryCancelled, 503: retry) and no cursor is lent
  until the rewrite is done; the workers' queries on a replaced snapshot are killed.
- Floats JSON cannot carry (NaN, Infinity, -Infinity: ``ln(0)``, ``avg(x) / 0.0``) stay
  IEEE values in ``SqlResult`` and in Arrow and Parquet; the service's JSON writes them
  as null (``SqlResult``).

A principal that may not see every row (an ``eventlog.access.Principal`` without the admin
scope) reads the same view names, each holding what it may see. How, and why
no query gets around them:

- Its query (checked as above too) may name nothing but the views of ``FILTERED_VIEWS``
  and its own CTEs, by a plain name alone (``check_sandboxed(..., restricted=True)``):
  no base table (``experience_rows``, ``meta``, ``*_checks``...), no catalog or schema
  (``main.experiences``, ``state.main.experiences``, ``information_schema.tables``),
  none of DuckDB's own views (``duckdb_tables``, ``pg_class``), no macro that reads the
  catalog (``pg_get_viewdef``), no SHOW TABLES and no EXPLAIN (its estimates count every
  row). The names are those of DuckDB's own parse tree of the very text that runs, so
  aliases, quoting and case change nothing. A CTE may not be named like any table or
  view of the database: out of the CTE's scope (a subquery's WITH) the name would reach
  the table; a CTE named like a filtered view reads the filtered view.
- Then ``restrict`` creates, on the query's own cursor and in its transaction, a
  temporary view for each of those names. DuckDB looks a plain name up among the
  connection's temporary objects before the database's, the temporary catalog is the
  connection's alone (an admin's query at the same moment reads the state's views), and
  the rollback that ends every query drops them. Each selects from the state's view of
  that name (catalog-qualified) the rows the rules of ``eventlog.access`` let the principal
  see, computed in SQL against a one-row table of its owner, agent and token collectives
  filled by parameters (free text is never spliced into SQL). A filtered view the query
  does not name holds no rows. So every row a query reads went through a filter, and a
  count counts what the principal may see.
- Every filtered view ends in a LIMIT that drops nothing, a barrier that no optimizer
  moves the query's own expressions below: an expression that raises (``error()``, a
  failing cast) runs on visible rows only, so its error tells nothing of hidden ones.
- ``vec_id`` (a local counter: it would count hidden rows) is NULL; insights list only
  the sources the principal may see; ``tokens`` and ``dead_letters`` are empty.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import threading
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

import duckdb
import msgspec
import numpy as np

from eventlog.access import (
    PRINCIPAL_SQL,
    Principal,
    member_sql,
    principal_parameters,
    visible_sql,
    wisdom_member_sql,
)
from eventlog.errors import (
    Forbidden,
    PulseError,
    QueryCancelled,
    QueryOutOfMemory,
    QueryTimedOut,
    QueryTooComplex,
    QueryTooLarge,
    ValidationError,
)
from projections.schema import TABLES as SCHEMA_TABLES
from projections.schema import VIEWS as SCHEMA_VIEWS
from projections.store import first

if TYPE_CHECKING:
    from projections.past import PastTables

VIEWS = ("collectives", "experiences", "applications", "relations", "insights",
         "insight_sources", "wisdom", "dead_letters", "tokens", "audit", "history",
         "sessions")  # fmt: skip
# table functions that compute rows and touch nothing outside the query
TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
# scalar functions that read the database's settings (paths of its files among them)
SETTING_READERS = frozenset({"current_setting", "getvariable"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIZE = re.compile(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_CHUNK = 1024  # rows fetched from DuckDB at a time
# the deepest parse tree Python's json reads back (its decoder recurses, one level of the
# interpreter's 1,000 per level of the tree, some taken by the caller's frames)
_DEEPEST = 800


@dataclass(frozen=True, slots=True)
class SqlLimits:
    """The limits of the SQL sandbox, set by whoever runs the instance (never by a
    query); ``from_env`` reads them from ``$PULSE_SQL_*``. An engine takes them from the
    environment at its first query unless ``Engine.sql_limits`` is set."""

    time_limit: float = 10.0  # seconds; then the query is interrupted ($PULSE_SQL_TIME_LIMIT)
    memory_limit: str = "2GB"  # DuckDB's memory, engine included ($PULSE_SQL_MEMORY_LIMIT)
    temp_limit: str = "1GB"  # spilled to temp files; "0B": none ($PULSE_SQL_TEMP_LIMIT)
    max_bytes: int = 16 * 1024 * 1024  # of result rows as JSON ($PULSE_SQL_MAX_BYTES)
    # the query's size: its text in bytes, and its parse tree's nodes and depth (the
    # time DuckDB takes to bind and plan grows with them, out of reach of the time limit
    # in the engine's process: see the module docstring)
    max_query_bytes: int = 256 * 1024  # $PULSE_SQL_MAX_QUERY_BYTES
    max_nodes: int = 10_000  # $PULSE_SQL_MAX_NODES
    max_depth: int = 400  # $PULSE_SQL_MAX_DEPTH

    def __post_init__(self) -> None:
        if not isinstance(self.time_limit, (int, float)) or not 0 < self.time_limit <= 86400:
            raise ValidationError(
                f"time_limit ($PULSE_SQL_TIME_LIMIT): must be seconds in (0, 86400], "
                f"got {self.time_limit!r}"
            )
        for name, variable in (("memory_limit", "MEMORY"), ("temp_limit", "TEMP")):
            value = getattr(self, name)
            if not isinstance(value, str) or not _SIZE.fullmatch(value.strip()):
                raise ValidationError(
                    f"{name} ($PULSE_SQL_{variable}_LIMIT): must be a size such as 512MB or "
                    f"2GB, got {value!r}"
                )
        for name, variable, least in (
            ("max_bytes", "MAX_BYTES", 1024),
            ("max_query_bytes", "MAX_QUERY_BYTES", 64),
            ("max_nodes", "MAX_NODES", 16),
            ("max_depth", "MAX_DEPTH", 16),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValidationError(
                    f"{name} ($PULSE_SQL_{variable}): must be an integer >= {least}, got {value!r}"
                )
        if self.max_depth > _DEEPEST:
            raise ValidationError(
                f"max_depth ($PULSE_SQL_MAX_DEPTH): at most {_DEEPEST}, got {self.max_depth!r}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SqlLimits:
        env = os.environ if environ is None else environ
        found: dict[str, Any] = {}
        for field_name, variable, kind in (
            ("time_limit", "PULSE_SQL_TIME_LIMIT", float),
            ("memory_limit", "PULSE_SQL_MEMORY_LIMIT", str),
            ("temp_limit", "PULSE_SQL_TEMP_LIMIT", str),
            ("max_bytes", "PULSE_SQL_MAX_BYTES", int),
            ("max_query_bytes", "PULSE_SQL_MAX_QUERY_BYTES", int),
            ("max_nodes", "PULSE_SQL_MAX_NODES", int),
            ("max_depth", "PULSE_SQL_MAX_DEPTH", int),
        ):
            text = env.get(variable, "").strip()
            if not text:
                continue
            try:
                found[field_name] = kind(text)
            except ValueError:
                raise ValidationError(f"${variable}: not a valid value: {text!r}") from None
        return cls(**found)


_ALLOWED_CONFIGS = ("memory_limit", "max_temp_directory_size", "checkpoint_threshold",
                    "enable_progress_bar")  # fmt: skip


def sandbox(con: duckdb.DuckDBPyConnection, limits: SqlLimits) -> None:
    """Set the sandbox's instance-wide settings through the engine's connection (on its
    thread): the extension switches and the lock once, the two limits every time."""
    found = first(con.execute("SELECT current_setting('lock_configuration')"))
    locked = bool(found and found[0])
    if not locked:
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET allow_community_extensions = false")
        con.execute(f"SET allowed_configs = {list(_ALLOWED_CONFIGS)!r}")
    con.execute(f"SET memory_limit = '{limits.memory_limit.strip()}'")
    con.execute(f"SET max_temp_directory_size = '{limits.temp_limit.strip()}'")
    if not locked:
        con.execute("SET lock_configuration = true")


class SqlResult(msgspec.Struct, frozen=True, kw_only=True):
    """The answer of a query. ``rows`` hold JSON-ready values (UUIDs and times as text,
    vectors as their sizes) but for the floats NaN, Infinity and -Infinity, kept as
    they are (IEEE values in Arrow and Parquet); JSON has no such numbers, so the JSON
    answers of the service carry them as null (as JavaScript's JSON.stringify does)."""

    columns: list[str]
    rows: list[list[Any]]
    truncated: bool = False  # more rows than a limit let through: see truncated_by
    # the stream sequence the state it read reflects; 0 for a principal that may not see
    # every row (the sequence counts every event of the stream, hidden ones too)
    seq: int = 0
    truncated_by: str | None = None  # "rows" (the limit argument) or "bytes" (max_bytes)


def check_read_only(sql: str, limits: SqlLimits | None = None) -> str:
    """Refuse anything but one query (a SELECT, or EXPLAIN of one) of at most
    ``limits.max_query_bytes``; returns the query (without its EXPLAIN)."""
    limits = limits or SqlLimits()
    size = len(sql.encode("utf-8", "surrogatepass"))
    if size > limits.max_query_bytes:
        raise QueryTooLarge(
            f"query: {size} bytes, longer than the SQL sandbox takes "
            f"({limits.max_query_bytes} bytes, $PULSE_SQL_MAX_QUERY_BYTES); ask for less "
            "(a long list of values: filter by a table or a range instead)",
            limit="query_bytes", setting="PULSE_SQL_MAX_QUERY_BYTES",
        )  # fmt: skip
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ValidationError(f"query: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise ValidationError(f"query: give exactly one statement, got {len(statements)}")
    kind = statements[0].type.name
    query = sql
    if kind == "EXPLAIN":  # EXPLAIN ANALYZE runs what it explains: only plain SELECTs
        words = _words(sql)
        following = words[1][1].upper() if len(words) > 1 else ""
        if following in ("ANALYZE", "ANALYSE"):
            raise ValidationError("query: EXPLAIN ANALYZE runs the statement; use EXPLAIN")
        if following == "(":
            raise ValidationError("query: EXPLAIN takes no options here; use plain EXPLAIN")
        query = sql[words[1][0] :] if len(words) > 1 else ""
        try:
            inner = duckdb.extract_statements(query)
        except duckdb.Error as exc:
            raise ValidationError(f"query: {_first_line(exc)}") from None
        kind = inner[0].type.name if len(inner) == 1 else "EXPLAIN"
    if kind != "SELECT":
        raise ValidationError(
            f"query: only read-only queries are allowed (SELECT, EXPLAIN), got {kind}; "
            "the state changes only through events"
        )
    return query


def _words(sql: str) -> list[tuple[int, str]]:
    """The first tokens of ``sql`` (comments left out), with where each starts."""
    tokens = duckdb.tokenize(sql)
    found: list[tuple[int, str]] = []
    for at, (start, kind) in enumerate(tokens):
        if kind == duckdb.token_type.comment:
            continue
        end = tokens[at + 1][0] if at + 1 < len(tokens) else len(sql)
        found.append((start, sql[start:end].strip()))
        if len(found) == 2:
            break
    return found


def check_sandboxed(
    cursor: duckdb.DuckDBPyConnection,
    query: str,
    *,
    restricted: bool = False,
    limits: SqlLimits | None = None,
    as_of: bool = False,
) -> frozenset[str]:
    """Refuse a query (a SELECT) that names anything but the tables and views of the
    database, ``activities``, its own CTEs and the table functions of
    ``TABLE_FUNCTIONS``: see the module docstring. Parses only; nothing is bound.
    ``as_of``: the query reads the state as of a moment, through temporary views that
    shadow the state's names; a name qualified by the state's database would pass them by
    and read the present, so it is refused.
    Returns the objects of the state it may read, which a query as of a moment is given
    (``past_views``; for an admin ``_past_reads``).

    ``restricted``: the query of a principal that may not see every row: it may name
    nothing but the views of ``FILTERED_VIEWS`` (by their names alone) and its own CTEs
    (see the module docstring); returns the views it names (for ``restrict``).

    ``limits``: a parse tree of more than ``max_nodes`` nodes (objects of the tree) or
    more than ``max_depth`` levels is QueryTooComplex."""
    limits = limits or SqlLimits()
    found = cursor.execute("SELECT json_serialize_sql(?)", [query]).fetchone()
    try:
        tree = json.loads(found[0]) if found else {"error": True, "error_message": "?"}
    except RecursionError:  # deeper than _DEEPEST, which is deeper than any max_depth
        raise _too_deep(limits) from None
    if tree.get("error"):
        if tree.get("error_type") == "parser":
            raise ValidationError(f"query: Parser Error: {tree.get('error_message')}")
        raise ValidationError(
            f"query: the SQL sandbox cannot check this query ({tree.get('error_message')}), "
            "so it does not run; write it as a plain SELECT (e.g. without PIVOT)"
        )
    ctes: set[str] = set()
    tables: list[tuple[str, str, str]] = []
    refs: list[dict[str, Any]] = []  # every table reference
    functions: set[str] = set()  # every scalar function named
    special = False  # SHOW TABLES and the like
    nodes = 0
    stack: list[tuple[Any, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limits.max_depth:
            raise _too_deep(limits)
        if isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        nodes += 1
        if nodes > limits.max_nodes:
            raise QueryTooComplex(
                f"query: its parse tree has more than {limits.max_nodes} nodes, more than the "
                "SQL sandbox takes ($PULSE_SQL_MAX_NODES: planning grows faster than the "
                "query); split it, or use a table or a range instead of a long list",
                limit="nodes", setting="PULSE_SQL_MAX_NODES",
            )  # fmt: skip
        stack.extend((value, depth + 1) for value in node.values())
        kind = node.get("type")
        if isinstance(node.get("cte_map"), dict):
            ctes.update(str(e.get("key", "")).lower() for e in node["cte_map"].get("map", []))
        if kind == "TABLE_FUNCTION" and isinstance(node.get("function"), dict):
            name = str(node["function"].get("function_name", "")).lower()
            if name not in TABLE_FUNCTIONS or node["function"].get("catalog"):
                raise ValidationError(
                    f"query: the table function {name}() is not allowed: the SQL sandbox "
                    "reads the state's tables and views only, never files, URLs or "
                    f"settings (allowed table functions: {', '.join(sorted(TABLE_FUNCTIONS))})"
                )
        elif kind == "FUNCTION" and str(node.get("function_name", "")).lower() in SETTING_READERS:
            raise ValidationError(
                f"query: the function {node['function_name']}() is not allowed: the SQL "
                "sandbox shows the state, not the database's settings or paths"
            )
        elif (kind == "BASE_TABLE" and "table_name" in node) or (
            kind == "SHOW_REF" and node.get("query") is None
            and node.get("show_type") != "SHOW_SPECIAL"  # SHOW TABLES and the like are fine
        ):  # fmt: skip
            tables.append(_name(node))
            refs.append(node)
        if kind == "FUNCTION":
            functions.add(str(node.get("function_name", "")).lower())
        elif kind == "SHOW_REF" and node.get("show_type") == "SHOW_SPECIAL":
            special = True
    if restricted:
        return _check_restricted(cursor, ctes, refs, functions, special)
    if as_of:
        for catalog, schema, table in tables:
            if catalog:
                shown = ".".join(p for p in (catalog, schema, table) if p)
                raise ValidationError(
                    f"query: as of a moment, {shown!r} would read the state as it is now: "
                    f"name it without its database ({schema + '.' if schema else ''}{table}), "
                    "which reads it as of the moment"
                )
    if not tables:
        return _past_reads(cursor, query, tables, ctes, functions, special)
    known = cursor.execute(
        "SELECT database_name, schema_name, table_name FROM duckdb_tables() UNION ALL "
        "SELECT database_name, schema_name, view_name FROM duckdb_views() "
        # DuckDB's own views (pg_catalog.pg_settings shows paths and settings) are not
        # the state; information_schema describes only the state's tables and views
        "WHERE NOT internal OR schema_name = 'information_schema'"
    ).fetchall()
    names = {(c.lower(), s.lower(), t.lower()) for c, s, t in known}
    for catalog, schema, table in tables:
        wanted = (catalog.lower(), schema.lower(), table.lower())
        if (
            not catalog
            and not schema
            and (wanted[2] == "activities" or (wanted[2] in ctes and _IDENTIFIER.fullmatch(table)))
        ):
            continue
        if any(
            t == wanted[2] and (not schema or s == wanted[1]) and (not catalog or c == wanted[0])
            for c, s, t in names
        ):
            continue
        shown = ".".join(p for p in (catalog, schema, table) if p)
        raise ValidationError(
            f"query: no table or view named {shown!r}: the SQL sandbox reads the state's "
            f"tables and views only ({', '.join(VIEWS)}, activities), never files or URLs"
        )
    return _past_reads(cursor, query, tables, ctes, functions, special)


_NONE: frozenset[str] = frozenset()


def _too_deep(limits: SqlLimits) -> QueryTooComplex:
    return QueryTooComplex(
        f"query: nested deeper than the SQL sandbox takes ({limits.max_depth} levels of its "
        "parse tree, $PULSE_SQL_MAX_DEPTH; a subquery takes about three, an operator one); "
        "flatten it, e.g. with WITH",
        limit="depth", setting="PULSE_SQL_MAX_DEPTH",
    )  # fmt: skip


def _name(ref: dict[str, Any]) -> tuple[str, str, str]:
    return (str(ref.get("catalog_name") or ""), str(ref.get("schema_name") or ""),
            str(ref.get("table_name") or ""))  # fmt: skip


# -- the views of a principal that may not see every row -------------------------------------

# Who a restricted query answers (its ``Principal``: owner, agent, collectives) is a
# one-row table of the query's cursor, filled by parameters (never spliced into SQL): ``p``
# in the filters below.
_ME = "temp.main.pulse_principal p"


def _sees(t: str) -> str:
    """Whether ``p`` may see the row ``t`` of a collective (``eventlog.access``)."""
    return visible_sql(
        t, f"{t}.collective_id IN (SELECT collective_id FROM temp.main.pulse_members)"
    )


# Which events of the audit and the history a principal sees: those about what it sees
# now, and about its own collectives
_AUDITED = (
    "(a.entity = 'experience' AND EXISTS (SELECT 1 FROM temp.main.experiences x "
    "WHERE x.experience_id = a.entity_id AND x.collective_id = a.collective_id)) "
    "OR (a.entity = 'relation' AND EXISTS (SELECT 1 FROM temp.main.relations x "
    "WHERE x.relation_id = a.entity_id AND x.collective_id = a.collective_id)) "
    "OR (a.entity = 'insight' AND EXISTS (SELECT 1 FROM temp.main.insights x "
    "WHERE x.insight_id = a.entity_id AND x.collective_id = a.collective_id)) "
    "OR (a.entity = 'wisdom' AND a.entity_id IN (SELECT wisdom_id FROM temp.main.wisdom)) "
    "OR (a.entity = 'session' AND EXISTS (SELECT 1 FROM temp.main.sessions x "
    "WHERE x.session_id = a.entity_id AND x.collective_id = a.collective_id)) "
    "OR (a.entity = 'collective' "
    "AND a.collective_id IN (SELECT collective_id FROM temp.main.pulse_members))"
)

# Each filtered view, in an order that defines a view before the views that read it:
# ``{src}`` is the state's own schema, catalog-qualified (inside a temporary view,
# ``main.x`` names the temporary schema's ``x``). They name each other as ``temp.main.x``.
FILTERED_VIEWS: dict[str, str] = {
    "experiences": (  # vec_id is a local counter: it would count the rows it may not see
        f"SELECT e.* REPLACE (NULL::BIGINT AS vec_id) FROM {{src}}experiences e, {_ME} "
        f"WHERE {_sees('e')}"
    ),
    "applications": (
        "SELECT a.* FROM {src}applications a WHERE EXISTS (SELECT 1 FROM "
        "temp.main.experiences e WHERE e.experience_id = a.experience_id "
        "AND e.collective_id = a.collective_id)"
    ),
    "relations": (  # shown with both of its ends only
        f"SELECT r.* FROM {{src}}relations r, {_ME} WHERE {_sees('r')} "
        "AND r.source_id IN (SELECT experience_id FROM temp.main.experiences) "
        "AND r.target_id IN (SELECT experience_id FROM temp.main.experiences)"
    ),
    "insights": (  # the sources it may not see are left out (as the API does)
        "SELECT i.* REPLACE (NULL::BIGINT AS vec_id, "
        "coalesce(k.kept, []::UUID[]) AS source_experiences) "
        f"FROM {{src}}insights i CROSS JOIN {_ME} LEFT JOIN ("
        "SELECT insight_id, list(experience_id ORDER BY n) AS kept FROM ("
        "SELECT insight_id, unnest(source_experiences) AS experience_id, "
        "generate_subscripts(source_experiences, 1) AS n FROM {src}insights) "
        "WHERE experience_id IN (SELECT experience_id FROM temp.main.experiences) "
        f"GROUP BY insight_id) k ON k.insight_id = i.insight_id WHERE {_sees('i')}"
    ),
    "insight_sources": (
        "SELECT s.* FROM {src}insight_sources s "
        "WHERE s.insight_id IN (SELECT insight_id FROM temp.main.insights) "
        "AND s.experience_id IN (SELECT experience_id FROM temp.main.experiences)"
    ),
    "wisdom": (  # no collective: "team" is every principal of its owner
        f"SELECT w.* FROM {{src}}wisdom w, {_ME} WHERE {visible_sql('w', wisdom_member_sql('w'))}"
    ),
    "collectives": (  # its own, and those where it sees something
        "SELECT c.* FROM {src}collectives c "
        "WHERE c.collective_id IN (SELECT collective_id FROM temp.main.pulse_members) "
        "OR c.collective_id IN (SELECT collective_id FROM temp.main.experiences "
        "UNION ALL SELECT collective_id FROM temp.main.insights "
        "UNION ALL SELECT collective_id FROM temp.main.relations)"
    ),
    "sessions": (  # of its own collectives (sessions have no visibility: the members')
        "SELECT s.* FROM {src}sessions s "
        "WHERE s.collective_id IN (SELECT collective_id FROM temp.main.pulse_members)"
    ),
    "audit": f"SELECT a.* FROM {{src}}audit a WHERE {_AUDITED}",  # what it sees now
    "history": (  # as the audit; an insight's change names the sources it may see only
        "SELECT a.* REPLACE (CASE WHEN a.event_type = 'insight.stored' THEN "
        "json_merge_patch(a.change, json_object('source_experiences', (SELECT "
        "to_json(i.source_experiences) FROM temp.main.insights i WHERE i.insight_id = "
        f"a.entity_id))) ELSE a.change END AS change) FROM {{src}}history a WHERE {_AUDITED}"
    ),
    "tokens": "SELECT * FROM {src}tokens WHERE false",  # admins only
    "dead_letters": "SELECT * FROM {src}dead_letters WHERE false",  # admins only
    "activities": (  # of its own collectives
        "SELECT a.* FROM temp.main.pulse_all_activities a "
        "WHERE a.collective_id IN (SELECT collective_id FROM temp.main.pulse_members)"
    ),
}
# No expression of the query may see a row the filter drops: filter pushdown could place
# the query's own WHERE (or a join condition) below a view's filter, where an error it
# raises (error(), a failed cast) on a row the principal may not see would tell about that
# row. A filter never moves below a LIMIT (that would change the answer), so every view
# ends in one that drops nothing: the views are evaluated first, and streamed.
_BARRIER = " LIMIT 9223372036854775807"


_HELPERS = ("pulse_principal", "pulse_members", "pulse_all_activities")  # restrict's tables
_OURS = "pulse_"  # the prefix of every temporary object a query's cursor is given


def _needs(names: Iterable[str]) -> list[str]:
    """The filtered views that reading ``names`` takes (they read each other), in the
    order of ``FILTERED_VIEWS``."""
    wanted = set(names)
    grown = True
    while grown:
        found = {
            n for name in wanted for n in _READS.findall(FILTERED_VIEWS[name])
            if n in FILTERED_VIEWS
        }  # fmt: skip
        grown = not found <= wanted
        wanted |= found
    return [name for name in FILTERED_VIEWS if name in wanted]


_READS = re.compile(r"temp\.main\.([a-z_]+)")
_SRC = re.compile(r"\{src\}([a-z_]+)")
# the collectives a principal is a member of
_MEMBERS = f"SELECT c.collective_id FROM {{src}}collectives c, {_ME} WHERE {member_sql('c')}"


def filtered_sources(names: Iterable[str]) -> frozenset[str]:
    """The views of the state (``{src}``'s) that ``restrict`` reads for a query that
    names ``names``: what a restricted query as of a moment is given (``past_views``)."""
    return frozenset(
        source
        for select in (_MEMBERS, *(FILTERED_VIEWS[name] for name in _needs(names)))
        for source in _SRC.findall(select)
    )


def restrict(
    cursor: duckdb.DuckDBPyConnection,
    viewer: Principal,
    names: Iterable[str],
    activities: Any,
    src: str | None = None,
) -> None:
    """Prepare a query's cursor (in its transaction) for ``viewer``: each view of
    ``FILTERED_VIEWS`` that reading ``names`` takes, as a temporary view of the same name
    holding what ``viewer`` may see, which shadows the state's (a connection's temporary
    objects are its own, found before the database's, and go with its rollback);
    ``activities`` (a relation of every live collective's activities) behind
    ``activities``. ``src``: the prefix of the views it filters (the state's own by
    default; ``past_views``' for a query as of a moment)."""
    src = src or _state_schema(cursor)
    cursor.execute(  # parameters: owner and agent are free text
        f"CREATE TEMP TABLE pulse_principal AS {PRINCIPAL_SQL}", principal_parameters(viewer)
    )
    cursor.execute(f"CREATE TEMP TABLE pulse_members AS {_MEMBERS.format(src=src)}")
    needed = _needs(names)
    if "activities" in needed:
        cursor.register("pulse_all_activities", activities)
    for name in FILTERED_VIEWS:
        if name in needed:
            select = FILTERED_VIEWS[name].format(src=src) + _BARRIER
        else:  # the query does not name it; should it all the same, it reads nothing
            select = "SELECT NULL AS unread WHERE false"
        cursor.execute(f"CREATE TEMP VIEW {name} AS {select}")


def _state_schema(cursor: duckdb.DuckDBPyConnection) -> str:
    """The state's own schema, catalog-qualified, as a prefix of a name."""
    found = cursor.execute("SELECT current_database()").fetchone()
    return '"' + str(found[0] if found else "").replace('"', '""') + '".main.'


# -- a query as of a moment -------------------------------------------------------------------

# The objects a query as of a moment reads in place of the state's: each base table (its
# present rows but those changed since, and the past rows of these), each logged table cut
# at the sequence, and each view of ``projections.schema`` again over them. A query makes
# only those it reads, with what they read in turn (``past_closure``): the views name
# each other and the tables, by ``FROM`` or ``JOIN``, and each such name becomes the
# temporary one, catalog-qualified (``temp.main.x``), so a view whose source was not made
# fails to bind rather than read the present.
_PAST = "pulse_asof_"  # their prefix under a restricted query's filtered views
_LOGGED_TABLES = ("audit_rows", "count_history", "undecodable")  # one row per sequence
_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)")
_VIEW = re.compile(r"CREATE OR REPLACE VIEW (\w+) AS\n(.*?);\n", re.DOTALL)
_SOURCE = re.compile(r"\b(FROM|JOIN)\s+(\w+)\b")
_BOOKKEEPING = (
    "meta",
    "checkpoint",
    "stray_tombstones",
    "partition_positions",
)  # read as they are (no past)
# the base tables of folded rows (``projections.store.TABLE_OF``'s)
_ROW_TABLES = tuple(
    t for t in _TABLE.findall(SCHEMA_TABLES) if t not in (*_BOOKKEEPING, *_LOGGED_TABLES)
)
_SCHEMA_VIEWS: dict[str, str] = dict(_VIEW.findall(SCHEMA_VIEWS))
# each object and the objects it reads directly, in an order that makes an object after
# what it reads (the schema creates each view after its sources)
_PAST_READS: dict[str, frozenset[str]] = {
    **{table: frozenset() for table in (*_ROW_TABLES, *_LOGGED_TABLES)},
    **{view: frozenset(m[1] for m in _SOURCE.findall(select) if m[1] in _SCHEMA_VIEWS
                       or m[1] in _ROW_TABLES or m[1] in _LOGGED_TABLES)
       for view, select in _SCHEMA_VIEWS.items()},
}  # fmt: skip


def _closure(name: str) -> frozenset[str]:
    found = {name}
    stack = [name]
    while stack:
        for source in _PAST_READS[stack.pop()]:
            if source not in found:
                found.add(source)
                stack.append(source)
    return frozenset(found)


_PAST_CLOSURE: dict[str, frozenset[str]] = {name: _closure(name) for name in _PAST_READS}
PAST_NAMES = frozenset(_PAST_READS)  # every object a query as of a moment may read
_NOW = "epoch_ms(get_current_timestamp())"  # "true now" in the views: true then


def _past_selects(prefix: str) -> dict[str, str]:
    def past_name(match: re.Match[str]) -> str:
        word, name = match.group(1), match.group(2)
        return f"{word} temp.main.{prefix}{name}" if name in _PAST_READS else match.group(0)

    return {name: _SOURCE.sub(past_name, select) for name, select in _SCHEMA_VIEWS.items()}


_PAST_SELECTS = {prefix: _past_selects(prefix) for prefix in ("", _PAST)}


def past_closure(names: Iterable[str]) -> list[str]:
    """The objects ``past_views`` makes for a query that reads ``names`` (those of them
    that are objects of the state, and what these read), in the order it makes them."""
    wanted: set[str] = set()
    for name in names:
        wanted |= _PAST_CLOSURE.get(name, frozenset())
    return [name for name in _PAST_READS if name in wanted]


def past_views(
    cursor: duckdb.DuckDBPyConnection,
    past: PastTables,
    names: Iterable[str] = PAST_NAMES,
    *,
    prefix: str = _PAST,
) -> str:
    """Make a query's cursor read the state as of ``past.seq``: of the objects the query
    reads (``names``: of ``PAST_NAMES``, others are left out; all by default) and what
    they read (``past_closure``), each base table as a temporary view of its present rows
    but those changed since, and the past rows of these (``projections.past``); the
    history cut at the sequence; each view of ``projections.schema`` again over them.
    ``prefix``: of their names; "" for an admin's query, which reads them by the usual
    names (a temporary object shadows the state's of the same name); ``pulse_asof_`` (the
    default) under a restricted query's filtered views. Returns their prefix,
    catalog-qualified (``restrict``'s ``src``)."""
    src = _state_schema(cursor)
    selects = _PAST_SELECTS[prefix]
    for name in past_closure(names):
        if name in selects:
            select = selects[name].replace(_NOW, str(int(past.moment_ms)))
        elif name in _LOGGED_TABLES:
            select = f"SELECT * FROM {src}{name} WHERE seq <= {int(past.seq)}"
        else:
            select = f"SELECT * FROM {src}{name}"
            if name in past.gone:
                key, keys = past.gone[name]
                pulse_keys = {"k": np.array([k.hex for k in keys], dtype=object)}  # noqa: F841
                cursor.execute(
                    f"CREATE TEMP TABLE pulse_gone_{name} AS SELECT k::UUID AS k FROM pulse_keys"
                )
                select += f" WHERE {key} NOT IN (SELECT k FROM temp.main.pulse_gone_{name})"
            if name in past.rows:
                pulse_staged, staged = past.rows[name]  # noqa: F841 (read by DuckDB by name)
                cursor.execute(f"CREATE TEMP TABLE pulse_over_{name} AS {staged} FROM pulse_staged")
                select += f" UNION ALL BY NAME SELECT * FROM temp.main.pulse_over_{name}"
        cursor.execute(f"CREATE TEMP VIEW {prefix}{name} AS {select}")
    return f"temp.main.{prefix}"


_WORD = re.compile(r"[a-z_][a-z0-9_]*")


def _past_reads(
    cursor: duckdb.DuckDBPyConnection,
    query: str,
    tables: list[tuple[str, str, str]],
    ctes: set[str],
    functions: set[str],
    special: bool,
) -> frozenset[str]:
    """Of ``PAST_NAMES``, those an admin's query (checked) may read: those its parse
    tree's table references name, and every word of its text that is one (should a
    reference escape the tree, it is still made: a name the query reads but that is not
    made would read the present). All of them when the query reads the catalog (SHOW
    TABLES, ``information_schema``, DuckDB's catalog macros), which lists them."""
    if special or (functions and _catalog_readers(cursor) & functions):
        return PAST_NAMES
    found = {w for w in _WORD.findall(query.lower()) if w in PAST_NAMES}
    for _catalog, _schema, table in tables:
        name = table.lower()
        if name in PAST_NAMES:
            found.add(name)
        elif name not in ctes and name not in _BOOKKEEPING and name != "activities":
            return PAST_NAMES  # a view of the catalog
    return frozenset(found)


def _check_restricted(
    cursor: duckdb.DuckDBPyConnection,
    ctes: set[str],
    refs: list[dict[str, Any]],
    functions: set[str],
    special: bool,
) -> frozenset[str]:
    views = ", ".join(FILTERED_VIEWS)
    if special:
        raise Forbidden(
            "query: SHOW TABLES, SHOW DATABASES and the like describe the whole database: "
            f"they need an admin token; this token reads the views {views} (DESCRIBE one)"
        )
    readers = _catalog_readers(cursor) & functions
    if readers:
        raise Forbidden(
            f"query: the function {sorted(readers)[0]}() reads DuckDB's catalog: it needs an "
            "admin token"
        )
    known: set[str] | None = None

    def catalog_names() -> set[str]:  # every table and view, DuckDB's own included
        nonlocal known
        if known is None:
            found = cursor.execute(
                "SELECT table_name FROM duckdb_tables() UNION ALL "
                "SELECT view_name FROM duckdb_views()"
            ).fetchall()
            known = {str(r[0]).lower() for r in found} | set(_HELPERS)
        return known

    # a CTE named like a table would name the table where the CTE is out of scope; so
    # would one named like the temporary objects made after this check (``restrict``'s,
    # ``past_views``': every one of them is named pulse_...)
    for cte in sorted(ctes - set(FILTERED_VIEWS)):
        if cte in catalog_names() or cte.startswith(_OURS):
            raise Forbidden(
                f"query: a CTE may not be named {cte!r}, the name of a table of the database "
                "(a token without the admin scope reads the views only); rename it"
            )
    read: set[str] = set()
    for ref in refs:
        catalog, schema, table = _name(ref)
        path = (ref.get("qualified_name") or {}).get("path") or [table]
        shown = ".".join(p for p in (catalog, schema, table) if p)
        name = table.lower()
        if catalog or schema or len(path) > 1 or not _IDENTIFIER.fullmatch(table):
            raise Forbidden(
                f"query: {shown!r} is not open to this token: a token without the admin scope "
                f"reads the views {views} by their names alone (no schema or database, no "
                "files); raw SQL needs an admin token"
            )
        if name in FILTERED_VIEWS:
            read.add(name)  # (a CTE of that name is harmless: it reads the views too)
        elif name in ctes:
            continue
        elif name in catalog_names():
            raise Forbidden(
                f"query: the table {table!r} is not open to this token: a token without the "
                f"admin scope reads the views {views}; raw SQL needs an admin token"
            )
        else:
            raise ValidationError(f"query: no table or view named {table!r} (the views: {views})")
    return frozenset(read)


_catalog_reader_names: frozenset[str] | None = None


def _catalog_readers(cursor: duckdb.DuckDBPyConnection) -> frozenset[str]:
    """DuckDB's macros that read its catalog (``pg_get_viewdef``, ``get_block_size``...),
    and the readers of settings."""
    global _catalog_reader_names
    if _catalog_reader_names is None:
        found = cursor.execute(
            "SELECT DISTINCT lower(function_name) FROM duckdb_functions() "
            "WHERE function_type = 'macro' AND regexp_matches(macro_definition, '\\bFROM\\b', 'i')"
        ).fetchall()
        _catalog_reader_names = frozenset(r[0] for r in found) | SETTING_READERS
    return _catalog_reader_names


def _execute(cursor: duckdb.DuckDBPyConnection, sql: str) -> duckdb.DuckDBPyConnection:
    # a frame of its own: DuckDB looks up unknown table names among the caller's local
    # variables (a Python replacement scan), and here there are only these two
    return cursor.execute(sql)


FORGETTING = (
    "query: cancelled to rewrite the state's files after a delete (forgetting never waits "
    "for readers); nothing is wrong with the query: retry it"
)


class SqlQuery:
    """One analyst's query on a cursor of its own (in a transaction over a flushed state;
    rolled back and closed after): ``run`` on a thread of its own, ``cancel`` from any
    thread, which interrupts it in DuckDB. ``run`` stops it after ``limits.time_limit``."""

    def __init__(
        self,
        cursor: duckdb.DuckDBPyConnection,
        sql: str,
        activities: list[Any],
        limit: int,
        seq: int,
        limits: SqlLimits,
        viewer: Principal | None = None,
        past: PastTables | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._cursor, self.sql, self._activities = cursor, sql, activities
        self._on_close = on_close  # told once the cursor is closed (Engine.release)
        self.past = past  # None: the state now; else the tables as of a sequence
        self.limit, self.seq, self.limits = limit, seq, limits
        self.viewer = viewer  # None: every row (an admin, the local operator)
        self._lock = threading.Lock()
        self._stopped: str | None = None  # "time" or "cancelled"
        self._executing = False
        self._closed = False

    def cancel(self, why: str = "cancelled") -> None:
        with self._lock:
            if self._stopped is None:
                self._stopped = why
            if not self._executing or self._closed:
                return  # run() looks at _stopped before it executes
            with contextlib.suppress(duckdb.Error, RuntimeError):
                self._cursor.interrupt()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._executing = False
        with contextlib.suppress(duckdb.Error):
            self._cursor.rollback()  # nothing a query does stays
        try:
            self._cursor.close()
        finally:
            if self._on_close is not None:
                self._on_close()

    def run(self) -> SqlResult:
        timer = threading.Timer(self.limits.time_limit, self.cancel, ("time",))
        timer.daemon = True
        timer.start()
        try:
            return self._run()
        except duckdb.InterruptException:
            raise self._stop_error() from None
        except duckdb.OutOfMemoryException:
            raise QueryOutOfMemory(
                f"query: needs more memory than the SQL sandbox allows ({self.limits.memory_limit} "
                f"of memory, $PULSE_SQL_MEMORY_LIMIT, and {self.limits.temp_limit} of temp "
                "files, $PULSE_SQL_TEMP_LIMIT); aggregate or filter more",
                limit="memory", setting="PULSE_SQL_MEMORY_LIMIT",
            ) from None  # fmt: skip
        except duckdb.Error as exc:
            raise ValidationError(f"query: {_first_line(exc)}") from None
        finally:
            timer.cancel()
            self.close()

    def _stop_error(self) -> PulseError:
        if self._stopped == "time":
            return QueryTimedOut(
                f"query: stopped at the time limit of the SQL sandbox, "
                f"{self.limits.time_limit:g} s ($PULSE_SQL_TIME_LIMIT); ask for less",
                limit="time", setting="PULSE_SQL_TIME_LIMIT",
            )  # fmt: skip
        if self._stopped == "forgetting":
            return QueryCancelled(FORGETTING)
        return PulseError("query: cancelled (the client went away)")

    def _run(self) -> SqlResult:
        cursor = self._cursor
        query = check_read_only(self.sql, self.limits)
        if self.viewer is None:
            reads = check_sandboxed(cursor, query, limits=self.limits, as_of=self.past is not None)
            cursor.execute("SET enable_progress_bar = false")  # it would print to our stdout
            cursor.register("activities", _relation(cursor, _activity_columns(self._activities)))
            if self.past is not None:  # under the usual names, shadowing the state's
                past_views(cursor, self.past, reads, prefix="")
        else:
            if duckdb.extract_statements(self.sql)[0].type.name == "EXPLAIN":
                raise Forbidden(
                    "query: EXPLAIN shows the plan over every row (its estimates count rows "
                    "this token may not see); it needs an admin token"
                )
            names = check_sandboxed(cursor, query, restricted=True, limits=self.limits)
            cursor.execute("SET enable_progress_bar = false")
            activities = _relation(cursor, _activity_columns(self._activities))
            src = None
            if self.past is not None:  # what the filtered views read, as of the moment
                src = past_views(cursor, self.past, filtered_sources(names))
            restrict(cursor, self.viewer, names, activities, src)
        with self._lock:
            if self._stopped is not None:
                raise self._stop_error()
            self._executing = True
        result = _execute(cursor, self.sql)
        columns = [d[0] for d in result.description or []]
        rows: list[list[Any]] = []
        size = 2  # the brackets of the list of rows
        truncated_by: str | None = None
        chunk = 16  # rows taken into Python at a time: few until their size is known, so
        # rows of megabytes each never pile up far past max_bytes outside DuckDB's memory
        while truncated_by is None:
            if self._stopped is not None:  # converting rows is Python's time, not DuckDB's
                raise self._stop_error()
            batch = result.fetchmany(max(1, min(chunk, self.limit + 1 - len(rows))))
            if not batch:
                break
            before = size
            for row in batch:
                if len(rows) == self.limit:
                    truncated_by = "rows"
                    break
                cells = [cell(v) for v in row]
                size += _json_size(cells) + 1
                if size > self.limits.max_bytes:
                    truncated_by = "bytes"
                    break
                rows.append(cells)
            per_row = max(1, (size - before) // max(1, len(batch)))
            chunk = max(1, min(_CHUNK, (self.limits.max_bytes - size) // per_row, 4 * chunk))
        return SqlResult(
            columns=columns,
            rows=rows,
            truncated=truncated_by is not None,
            seq=self.seq,
            truncated_by=truncated_by,
        )


def _json_size(cells: list[Any]) -> int:
    try:
        return len(msgspec.json.encode(cells))
    except (TypeError, ValueError, OverflowError):  # a value JSON cannot carry as is
        return len(str(cells))


class RunningQuery(Protocol):
    """A query ``run_async`` runs: a ``SqlQuery``, or a ``sqlworker.WorkerQuery``."""

    def run(self) -> SqlResult: ...
    def cancel(self, why: str = "cancelled") -> None: ...
    def close(self) -> None: ...


async def run_async(query: RunningQuery) -> SqlResult:
    """Run ``query`` on a thread of its own (never the event loop) and await its result;
    cancelling the awaiting task interrupts the query in DuckDB."""
    done: concurrent.futures.Future[SqlResult] = concurrent.futures.Future()

    def work() -> None:
        if not done.set_running_or_notify_cancel():
            query.close()
            return
        try:
            done.set_result(query.run())
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=work, name="pulse-sql", daemon=True).start()
    try:
        return await asyncio.wrap_future(done)
    except asyncio.CancelledError:
        query.cancel()
        raise


def export(
    cursor: duckdb.DuckDBPyConnection,
    directory: Path,
    activities: list[Any],
    on_close: Callable[[], None] | None = None,
) -> dict[str, int]:
    """Every view as ``<directory>/<view>.parquet`` (local columns left out), plus the
    activities; returns the rows written per file. Closes ``cursor`` (then calls
    ``on_close``)."""
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
        try:
            cursor.rollback()
            cursor.close()
        finally:
            if on_close is not None:
                on_close()
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

"""SQL by principal (``PulseDB.sql`` for a token without the admin scope): the same views,
each holding exactly what the principal may see, and nothing else to read.

Two owners (alice with two collectives, bob with one) hold experiences, relations,
insights and wisdom of every visibility by several authors, on a real nats-server. For
each token, every view answers what a plain model of the rules says (the model is
written from the rules of ``eventlog.access``'s docstring, calling none of Pulse's code),
counts included; admin tokens and the local operator see everything. Every way around
the filtered views (base tables, qualified names, aliases, CTE names, subqueries,
UNION, table functions, the catalog, quoting) is refused, and no error a query raises
tells about a row it may not see. Hypothesis then draws worlds and principals and
compares every view with the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog import EmbeddedNats
from eventlog.errors import Forbidden, ValidationError
from sync import PulseDB
from sync.access import Principal

V = [1.0, 0.0, 0.0]
in_module_loop = pytest.mark.asyncio(loop_scope="module")  # the tests that share ``world``
KINDS = ("experience", "relation", "insight", "wisdom")


# -- the model: the rules as the docstring of eventlog.access states them -------------------


@dataclass
class Row:
    kind: str  # experience, relation, insight or wisdom
    id: UUID
    collective: UUID | None  # None for wisdom
    owner: str  # the wisdom's owner (for the others, the collective's)
    visibility: str
    author: tuple[str, str | None]
    ends: tuple[UUID, ...] = ()  # a relation's ends, an insight's sources
    label: str = ""


@dataclass
class Model:
    collectives: dict[UUID, str] = field(default_factory=dict)  # id -> owner
    rows: dict[UUID, Row] = field(default_factory=dict)
    reinforced: set[UUID] = field(default_factory=set)
    activities: set[tuple[UUID, str]] = field(default_factory=set)  # (collective, agent)
    labels: dict[str, UUID] = field(default_factory=dict)

    def of(self, kind: str) -> list[Row]:
        return [r for r in self.rows.values() if r.kind == kind]


@dataclass(frozen=True)
class Who:
    owner: str
    agent: str | None = None
    limited: frozenset[UUID] | None = None
    admin: bool = False


def member(who: Who, model: Model, collective: UUID) -> bool:
    return who.admin or (
        model.collectives[collective] == who.owner
        and (who.limited is None or collective in who.limited)
    )


def sees(who: Who, model: Model, row: Row) -> bool:
    if who.admin or row.visibility == "org":
        return True
    if row.collective is None:  # wisdom: team is every principal of its owner
        inside = row.owner == who.owner
    else:
        inside = member(who, model, row.collective)
    if row.visibility == "private":
        return inside and row.author == (who.owner, who.agent)
    return inside


def expected(who: Who, model: Model) -> dict[str, Any]:
    """What each view holds for ``who`` (as ``snapshot`` reads it)."""
    experiences = {r.id for r in model.of("experience") if sees(who, model, r)}
    relations = {
        r.id for r in model.of("relation")
        if sees(who, model, r) and all(e in experiences for e in r.ends)
    }  # fmt: skip
    insights = {
        r.id: frozenset(e for e in r.ends if e in experiences)
        for r in model.of("insight") if sees(who, model, r)
    }  # fmt: skip
    wisdom = {r.id for r in model.of("wisdom") if sees(who, model, r)}
    seen = [model.rows[i] for i in experiences | relations | set(insights)]
    collectives = {c for c in model.collectives if member(who, model, c)}
    collectives |= {r.collective for r in seen if r.collective is not None}
    audit = {("collective", c) for c in model.collectives if member(who, model, c)}
    for kind, ids in (("experience", experiences), ("relation", relations),
                      ("insight", set(insights)), ("wisdom", wisdom)):  # fmt: skip
        audit |= {(kind, i) for i in ids}
    return {
        "experiences": experiences,
        "experience_count": len(experiences),
        "relations": relations,
        "insights": insights,
        "insight_sources": {(i, e) for i, ends in insights.items() for e in ends},
        "applications": experiences & model.reinforced,
        "wisdom": wisdom,
        "collectives": collectives,
        "audit": audit,
        "activities": {(c, a) for c, a in model.activities if member(who, model, c)},
    }


SNAPSHOT = """
SELECT
  (SELECT list(experience_id::VARCHAR) FROM experiences),
  (SELECT count(*) FROM experiences),
  (SELECT list(relation_id::VARCHAR) FROM relations),
  (SELECT list(insight_id::VARCHAR || '=' ||
                array_to_string(source_experiences::VARCHAR[], ','))
   FROM insights),
  (SELECT list(insight_id::VARCHAR || '>' || experience_id::VARCHAR) FROM insight_sources),
  (SELECT list(experience_id::VARCHAR) FROM applications),
  (SELECT list(wisdom_id::VARCHAR) FROM wisdom),
  (SELECT list(collective_id::VARCHAR) FROM collectives),
  (SELECT list(DISTINCT entity || '=' || entity_id::VARCHAR) FROM audit),
  (SELECT list(collective_id::VARCHAR || '/' || agent_id) FROM activities),
  (SELECT count(*) FROM tokens),
  (SELECT count(*) FROM dead_letters)
"""


async def snapshot(db: PulseDB, who: Principal | str | None) -> dict[str, Any]:
    """Every view as ``who`` reads it, in one query (``expected``'s shape); None: the
    instance's own principal."""
    if who is None:
        found = await db.sql(SNAPSHOT)
    else:
        with db.acting_as(who):
            found = await db.sql(SNAPSHOT)
    (experiences, count, relations, insights, sources, applications, wisdom, collectives,
     audit, activities, tokens, dead) = found.rows[0]  # fmt: skip

    def ids(values: list[str] | None) -> list[UUID]:
        return [UUID(v) for v in values or []]

    def pairs(values: list[str] | None, sep: str) -> set[tuple[Any, ...]]:
        return {tuple(v.split(sep)) for v in values or []}

    assert len(ids(experiences)) == len(set(ids(experiences)))  # nothing twice
    shown_insights: dict[UUID, frozenset[UUID]] = {}
    for text in insights or []:
        key, _, ends = text.partition("=")
        shown_insights[UUID(key)] = frozenset(UUID(e) for e in ends.split(",") if e)
    return {
        "experiences": set(ids(experiences)),
        "experience_count": count,
        "relations": set(ids(relations)),
        "insights": shown_insights,
        "insight_sources": {(UUID(i), UUID(e)) for i, e in pairs(sources, ">")},
        "applications": set(ids(applications)),
        "wisdom": set(ids(wisdom)),
        "collectives": set(ids(collectives)),
        "audit": {(kind, UUID(i)) for kind, i in pairs(audit, "=")},
        "activities": {(UUID(c), a) for c, a in pairs(activities, "/")},
        "tokens": tokens,
        "dead_letters": dead,
    }


def labels(model: Model, ids: set[UUID]) -> set[str]:
    return {model.rows[i].label for i in ids}


# -- writing the world (as admin principals of the chosen authors) ---------------------------


class Writer:
    def __init__(self, db: PulseDB, model: Model) -> None:
        self.db, self.model = db, model

    def acting(self, author: tuple[str, str | None]) -> Any:
        return self.db.acting_as(Principal(author[0], author[1], scope="admin"))

    async def collective(self, owner: str, name: str) -> UUID:
        with self.acting((owner, None)):
            cid = await self.db.create_collective(owner, name, 3)
        self.model.collectives[cid] = owner
        return cid

    def _add(self, row: Row) -> UUID:
        self.model.rows[row.id] = row
        if row.label:
            self.model.labels[row.label] = row.id
        return row.id

    async def experience(
        self, cid: UUID, visibility: str, author: tuple[str, str | None], label: str = ""
    ) -> UUID:
        with self.acting(author):
            eid = await self.db.record_experience(
                cid,
                label or "an experience",
                V,
                visibility=visibility,  # type: ignore[arg-type]
            )
        owner = self.model.collectives[cid]
        return self._add(Row("experience", eid, cid, owner, visibility, author, label=label))

    async def relation(
        self, source: UUID, target: UUID, visibility: str, author: tuple[str, str | None],
        label: str = "",
    ) -> UUID:  # fmt: skip
        with self.acting(author):
            rid = await self.db.store_relation(
                source,
                target,
                "Supports",
                visibility=visibility,  # type: ignore[arg-type]
            )
        cid = self.model.rows[source].collective
        assert cid is not None
        owner = self.model.collectives[cid]
        return self._add(
            Row("relation", rid, cid, owner, visibility, author, (source, target), label)
        )

    async def insight(
        self, cid: UUID, sources: list[UUID], visibility: str, author: tuple[str, str | None],
        label: str = "",
    ) -> UUID:  # fmt: skip
        with self.acting(author):
            iid = await self.db.store_insight(
                cid, label or "an insight", V, source_experiences=sources,
                visibility=visibility,  # type: ignore[arg-type]
            )  # fmt: skip
        owner = self.model.collectives[cid]
        return self._add(Row("insight", iid, cid, owner, visibility, author, tuple(sources), label))

    async def wisdom(
        self, owner: str, visibility: str, author: tuple[str, str | None], label: str = ""
    ) -> UUID:
        with self.acting(author):
            wid = await self.db.store_wisdom(
                owner, "CodingStyle", label or "small functions", [1.0, 0.0],
                visibility=visibility,  # type: ignore[arg-type]
            )  # fmt: skip
        return self._add(Row("wisdom", wid, None, owner, visibility, author, label=label))

    async def reinforce(self, eid: UUID) -> None:
        await self.db.reinforce_experience(eid)
        self.model.reinforced.add(eid)

    async def activity(self, cid: UUID, agent: str) -> None:
        await self.db.register_activity(cid, agent, "working")
        self.model.activities.add((cid, agent))


# -- a fixed world -----------------------------------------------------------------------


A1, A2, ALICE, BOB = ("alice", "a1"), ("alice", "a2"), ("alice", None), ("bob", None)


@dataclass
class World:
    db: PulseDB
    model: Model
    team: UUID  # alice's
    lab: UUID  # alice's
    bobs: UUID
    tokens: dict[str, str]
    who: dict[str, Who]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    """The fixed world, on an embedded nats-server of its own (the tests only read it)."""
    db = await PulseDB.open(tmp_path_factory.mktemp("sql-access"))
    try:
        model = Model()
        w = Writer(db, model)
        team = await w.collective("alice", "alice-team")
        lab = await w.collective("alice", "alice-lab")
        bobs = await w.collective("bob", "bob-team")
        t_private_a1 = await w.experience(team, "private", A1, "T private a1")
        t_private_a2 = await w.experience(team, "private", A2, "T private a2")
        await w.experience(team, "private", ALICE, "T private alice")
        t_team = await w.experience(team, "team", A1, "T team")
        t_org = await w.experience(team, "org", A2, "T org")
        await w.experience(lab, "team", A1, "L team")
        await w.experience(lab, "org", A1, "L org")
        b_private = await w.experience(bobs, "private", BOB, "B private")
        b_team = await w.experience(bobs, "team", BOB, "B team")
        b_org = await w.experience(bobs, "org", BOB, "B org")
        b_org2 = await w.experience(bobs, "org", BOB, "B org 2")
        await w.relation(t_team, t_org, "team", A1, "r team")
        await w.relation(t_private_a1, t_team, "private", A1, "r private a1")
        await w.relation(t_org, t_team, "org", A2, "r org, team end")
        await w.relation(b_org, b_org2, "org", BOB, "r bob org")
        await w.relation(b_team, b_org, "team", BOB, "r bob team")
        await w.insight(team, [t_private_a2, t_team, t_org], "org", A1, "i alice org")
        await w.insight(bobs, [b_team], "team", BOB, "i bob team")
        await w.insight(bobs, [b_private, b_org], "org", BOB, "i bob org")
        await w.wisdom("alice", "team", A1, "w alice team")
        await w.wisdom("alice", "private", A1, "w alice private a1")
        await w.wisdom("bob", "org", BOB, "w bob org")
        await w.wisdom("bob", "team", BOB, "w bob team")
        for eid in (t_team, b_team, b_org):
            await w.reinforce(eid)
        await w.activity(team, "a1")
        await w.activity(bobs, "bot")
        tokens = {
            "a1": (await db.create_token("alice", agent_id="a1", scope="read")).token,
            "a2": (await db.create_token("alice", agent_id="a2", scope="write")).token,
            "alice": (await db.create_token("alice", scope="read")).token,
            "bob": (await db.create_token("bob", scope="read")).token,
            "lab": (await db.create_token("alice", agent_id="a1", collectives=[lab])).token,
            "admin": (await db.create_token("carol", scope="admin")).token,
        }
        who = {
            "a1": Who("alice", "a1"), "a2": Who("alice", "a2"), "alice": Who("alice"),
            "bob": Who("bob"), "lab": Who("alice", "a1", frozenset({lab})),
            "admin": Who("carol", admin=True),
        }  # fmt: skip
        yield World(db, model, team, lab, bobs, tokens, who)
    finally:
        await db.close()


@in_module_loop
async def test_every_view_holds_what_each_token_may_see(world: World) -> None:
    db, model = world.db, world.model
    seen = {name: await snapshot(db, token) for name, token in world.tokens.items()}
    experiences = {name: labels(model, s["experiences"]) for name, s in seen.items()}
    elsewhere = {"T org", "L team", "L org", "B org", "B org 2"}  # alice's and bob's org
    assert experiences["a1"] == elsewhere | {"T private a1", "T team"}
    assert experiences["a2"] == elsewhere | {"T private a2", "T team"}
    assert experiences["alice"] == elsewhere | {"T private alice", "T team"}
    assert experiences["bob"] == {"T org", "L org", "B private", "B team", "B org", "B org 2"}
    # limited to the lab: its team rows, org rows elsewhere, not a1's private row of the
    # team collective it is not a member of through this token
    assert experiences["lab"] == {"T org", "L team", "L org", "B org", "B org 2"}
    assert len(experiences["admin"]) == 11
    relations = {name: labels(model, s["relations"]) for name, s in seen.items()}
    assert relations["a1"] == {"r team", "r private a1", "r org, team end", "r bob org"}
    assert relations["a2"] == {"r team", "r org, team end", "r bob org"}
    assert relations["bob"] == {"r bob org", "r bob team"}  # one end of the org one is team
    assert relations["lab"] == {"r bob org"}
    insights = {
        name: {model.rows[i].label: labels(model, set(ends)) for i, ends in s["insights"].items()}
        for name, s in seen.items()
    }
    assert insights["a1"] == {"i alice org": {"T team", "T org"}, "i bob org": {"B org"}}
    assert insights["a2"]["i alice org"] == {"T private a2", "T team", "T org"}
    assert insights["bob"] == {
        "i alice org": {"T org"}, "i bob team": {"B team"},
        "i bob org": {"B private", "B org"},
    }  # fmt: skip
    for name, kept in (("a1", ["T team", "T org"]), ("a2", ["T private a2", "T team", "T org"])):
        with db.acting_as(world.tokens[name]):
            listed = await db.sql(
                "SELECT source_experiences FROM insights WHERE content = 'i alice org'"
            )
        assert listed.rows == [[[str(model.labels[k]) for k in kept]]]  # in their order
    wisdom = {name: labels(model, s["wisdom"]) for name, s in seen.items()}
    assert wisdom["a1"] == wisdom["lab"] == {"w alice team", "w alice private a1", "w bob org"}
    assert wisdom["a2"] == wisdom["alice"] == {"w alice team", "w bob org"}
    assert wisdom["bob"] == {"w bob org", "w bob team"}
    assert seen["a1"]["collectives"] == {world.team, world.lab, world.bobs}
    assert seen["bob"]["collectives"] == {world.team, world.lab, world.bobs}  # org rows
    assert seen["a1"]["activities"] == {(world.team, "a1")}
    assert seen["lab"]["activities"] == set()
    assert seen["bob"]["activities"] == {(world.bobs, "bot")}
    assert labels(model, seen["bob"]["applications"]) == {"B team", "B org"}
    assert labels(model, seen["lab"]["applications"]) == {"B org"}
    for name, s in seen.items():
        want = expected(world.who[name], model)
        for view, rows in want.items():
            if name == "admin" and view == "audit":  # tokens and all: checked below
                assert rows <= s[view]
                continue
            assert s[view] == rows, (name, view)
        if name != "admin":
            assert (s["tokens"], s["dead_letters"]) == (0, 0), name
    assert seen["admin"]["tokens"] == 6
    assert any(kind == "token" for kind, _ in seen["admin"]["audit"])
    assert await snapshot(db, None) == seen["admin"]  # the local operator: everything


@in_module_loop
async def test_counts_and_aggregates_count_what_is_visible(world: World) -> None:
    db, model = world.db, world.model
    for name in ("a1", "bob", "lab"):
        want = expected(world.who[name], model)
        with db.acting_as(world.tokens[name]):
            counted = await db.sql(
                "SELECT (SELECT count(*) FROM experiences), (SELECT count(*) FROM relations), "
                "(SELECT count(*) FROM insights), (SELECT count(*) FROM wisdom), "
                "(SELECT count(*) FROM collectives), (SELECT count(*) FROM insight_sources), "
                "(SELECT sum(applications) FROM experiences), "
                "(SELECT count(vec_id) FROM experiences)"
            )
            by_visibility = await db.sql(
                "SELECT visibility, count(*) FROM experiences GROUP BY ALL ORDER BY 1"
            )
            summarized = await db.sql("SELECT column_name, count FROM (SUMMARIZE experiences)")
        assert counted.rows == [[
            len(want["experiences"]), len(want["relations"]), len(want["insights"]),
            len(want["wisdom"]), len(want["collectives"]), len(want["insight_sources"]),
            len(want["applications"]), 0,  # vec_id: a local counter, shown to admins only
        ]], name  # fmt: skip
        rows = [model.rows[i] for i in want["experiences"]]
        assert by_visibility.rows == [
            [v, n] for v in ("org", "private", "team")
            if (n := sum(1 for r in rows if r.visibility == v))
        ]  # fmt: skip
        assert ["content", len(rows)] in summarized.rows


@in_module_loop
async def test_admin_tokens_read_every_row_and_table(world: World) -> None:
    db = world.db
    with db.acting_as(world.tokens["admin"]):
        raw = await db.sql("SELECT count(*) FROM experience_rows")
        plan = await db.sql("EXPLAIN SELECT count(*) FROM experiences")
        tokens = await db.sql("SELECT count(*) FROM tokens")
        qualified = await db.sql("SELECT count(*) FROM main.experiences")
    assert raw.rows == qualified.rows == [[11]]
    assert plan.rows and tokens.rows == [[6]]
    with db.acting_as(world.tokens["bob"]):
        described = await db.sql("DESCRIBE experiences")
    assert described.rows == (await db.sql("DESCRIBE experiences")).rows  # the same columns


# every way a read token might reach rows outside its views: (query, what the refusal names)
REFUSED = [
    # base tables and the views behind the filtered ones, plain, quoted, in any case
    ("SELECT * FROM experience_rows", "experience_rows"),
    ('SELECT * FROM "experience_rows"', "experience_rows"),
    ('SELECT * FROM "EXPERIENCE_ROWS"', "EXPERIENCE_ROWS"),
    ("SELECT * FROM Token_Rows", "Token_Rows"),
    ("SELECT * FROM experience_checks", "experience_checks"),
    ("SELECT * FROM undecodable", "undecodable"),
    ("SELECT * FROM checkpoint", "checkpoint"),
    ("FROM wisdom_rows", "wisdom_rows"),
    ("TABLE audit_rows", "audit_rows"),
    # qualified names, which could name the state's own views
    ("SELECT * FROM main.experiences", "main.experiences"),
    ("SELECT * FROM state.main.experiences", "state.main.experiences"),
    ('SELECT * FROM "state"."main"."experiences"', "state.main.experiences"),
    ("SELECT * FROM state.experiences", "state.experiences"),
    ("SELECT * FROM memory.main.experiences", "memory.main.experiences"),
    ("SELECT * FROM temp.main.experiences", "temp.main.experiences"),
    ("SELECT * FROM system.main.duckdb_tables", "system.main.duckdb_tables"),
    ('SELECT * FROM "main.experiences"', "main.experiences"),
    ('SELECT * FROM "main"."experience_rows"', "main.experience_rows"),
    ("SELECT * FROM 'experiences.csv'", "experiences.csv"),
    # aliases and CTE names
    ("SELECT * FROM experience_rows AS experiences", "experience_rows"),
    (
        "WITH experience_rows AS (SELECT * FROM experiences) SELECT * FROM experience_rows",
        "experience_rows",
    ),
    ("WITH x AS (SELECT * FROM experience_rows) SELECT * FROM x", "experience_rows"),
    (
        "WITH experiences AS (SELECT * FROM main.experiences) SELECT * FROM experiences",
        "main.experiences",
    ),
    (
        "WITH RECURSIVE relation_rows AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM "
        "relation_rows WHERE n < 3) SELECT * FROM relation_rows",
        "relation_rows",
    ),
    ("WITH pulse_members AS (SELECT 1) SELECT * FROM pulse_members", "pulse_members"),
    ("SELECT * FROM pulse_principal", "pulse_principal"),
    ("SELECT * FROM pulse_all_activities", "pulse_all_activities"),
    # subqueries, unions, joins, lateral
    ("SELECT (SELECT count(*) FROM experience_rows)", "experience_rows"),
    (
        "SELECT * FROM experiences WHERE experience_id IN (SELECT experience_id FROM "
        "experience_rows)",
        "experience_rows",
    ),
    ("SELECT * FROM experiences WHERE EXISTS (SELECT 1 FROM insight_rows)", "insight_rows"),
    (
        "SELECT content FROM experiences UNION ALL SELECT content FROM experience_rows",
        "experience_rows",
    ),
    (
        "SELECT content FROM experiences EXCEPT SELECT content FROM main.experiences",
        "main.experiences",
    ),
    (
        "SELECT * FROM experiences e JOIN relation_rows r ON r.source_id = e.experience_id",
        "relation_rows",
    ),
    (
        "SELECT * FROM experiences e, LATERAL (SELECT * FROM experience_rows x WHERE "
        "x.experience_id = e.experience_id)",
        "experience_rows",
    ),
    ("SELECT * FROM unnest((SELECT list(content) FROM experience_rows))", "experience_rows"),
    ("SELECT * FROM (SELECT * FROM (SELECT * FROM wisdom_rows))", "wisdom_rows"),
    # table functions and the catalog
    ("SELECT * FROM duckdb_tables()", "duckdb_tables"),
    ("SELECT * FROM duckdb_views()", "duckdb_views"),
    ("SELECT * FROM duckdb_tables", "duckdb_tables"),
    ("SELECT * FROM sqlite_master", "sqlite_master"),
    ("SELECT * FROM pg_class", "pg_class"),
    ("SELECT * FROM pg_catalog.pg_class", "pg_catalog.pg_class"),
    ("SELECT * FROM information_schema.tables", "information_schema.tables"),
    ("SELECT * FROM query_table('experience_rows')", "query_table"),
    ("SELECT * FROM query('SELECT * FROM experience_rows')", "query"),
    ("SELECT * FROM pragma_table_info('experience_rows')", "pragma_table_info"),
    ("SELECT * FROM histogram('experience_rows', content)", "histogram"),
    ("SELECT * FROM read_parquet('x.parquet')", "read_parquet"),
    ("SELECT pg_get_viewdef(1)", "pg_get_viewdef"),
    ("SELECT get_block_size('state')", "get_block_size"),
    ("SELECT current_setting('memory_limit')", "current_setting"),
    ("SHOW TABLES", "SHOW TABLES"),
    ("SHOW ALL TABLES", "SHOW TABLES"),
    ("SHOW DATABASES", "SHOW TABLES"),
    ("DESCRIBE experience_rows", "experience_rows"),
    ("SUMMARIZE experience_rows", "experience_rows"),
    ("SHOW experience_rows", "experience_rows"),
    ("EXPLAIN SELECT count(*) FROM experiences", "EXPLAIN"),
]


@in_module_loop
async def test_every_way_around_the_views_is_refused(world: World) -> None:
    db = world.db
    names = await db.sql("SELECT table_name FROM information_schema.tables")
    every = sorted({r[0] for r in names.rows} - {
        "experiences", "applications", "relations", "insights", "insight_sources", "wisdom",
        "collectives", "audit", "history", "tokens", "dead_letters", "activities", "sessions",
    })  # fmt: skip
    assert {"experience_rows", "meta", "relation_checks"} <= set(every)
    cases = REFUSED + [(f"SELECT count(*) FROM {name}", name) for name in every]
    for token in (world.tokens["a1"], world.tokens["lab"]):
        with db.acting_as(token):
            for query, named in cases:
                with pytest.raises((Forbidden, ValidationError)) as refused:
                    await db.sql(query)
                assert named.lower() in str(refused.value).lower(), (query, refused.value)
                assert isinstance(refused.value, Forbidden) or "no table" in str(refused.value) \
                    or "not allowed" in str(refused.value), (query, refused.value)  # fmt: skip
    with db.acting_as(world.tokens["a1"]):
        # a CTE name out of its scope names nothing (it cannot name a table: see above)
        with pytest.raises(ValidationError, match="does not exist"):
            await db.sql("SELECT * FROM (WITH x AS (SELECT 1) SELECT * FROM x), x")


@in_module_loop
async def test_queries_over_the_views_answer_as_the_views(world: World) -> None:
    db, model = world.db, world.model
    want = expected(world.who["a1"], model)
    visible = labels(model, want["experiences"])
    queries = {
        # a CTE named like a view reads the filtered view
        "WITH experiences AS (SELECT * FROM experiences) SELECT content FROM experiences": visible,
        "WITH RECURSIVE walk(id) AS (SELECT experience_id FROM experiences UNION "
        "SELECT target_id FROM relations JOIN walk ON source_id = id) "
        "SELECT content FROM experiences WHERE experience_id IN (SELECT id FROM walk)": visible,
        'SELECT content FROM "Experiences" AS experience_rows': visible,
        "SELECT content FROM experiences UNION SELECT content FROM experiences": visible,
        "SELECT e.content FROM experiences e WHERE e.experience_id IN "
        "(SELECT source_id FROM relations UNION SELECT target_id FROM relations)": labels(
            model, {e for r in want["relations"] for e in model.rows[r].ends}
        ),
        "SELECT content FROM experiences e, LATERAL (SELECT count(*) AS n FROM relations r "
        "WHERE r.source_id = e.experience_id) WHERE n > 0": labels(
            model, {model.rows[r].ends[0] for r in want["relations"]}
        ),
        "SELECT content FROM (SELECT *, row_number() OVER (ORDER BY content) AS n "
        "FROM experiences)": visible,
        "SELECT content FROM experiences JOIN unnest(['T team', 'B private']) AS u(c) "
        "ON content = c": {"T team"},
    }
    with db.acting_as(world.tokens["a1"]):
        for query, contents in queries.items():
            found = await db.sql(query)
            assert {r[0] for r in found.rows} == contents, query


@in_module_loop
async def test_no_error_tells_about_a_row_the_query_may_not_see(world: World) -> None:
    """The query's own expressions run on visible rows only: an error() or a failing cast
    that fires on a hidden row would tell its content."""
    db = world.db
    probes = [
        "SELECT count(*) FROM experiences WHERE CASE WHEN content = '{c}' THEN "
        "error('leak') ELSE true END",
        "SELECT count(*) FROM experiences WHERE (CASE WHEN content = '{c}' THEN 'x' "
        "ELSE '1' END)::INTEGER = 1",
        "SELECT count(*) FROM experiences e JOIN collectives c USING (collective_id) "
        "WHERE (CASE WHEN e.content = '{c}' THEN 'x' ELSE '1' END)::INTEGER = 1",
        "SELECT count(*) FROM insights WHERE (CASE WHEN content = '{c}' THEN 'x' "
        "ELSE '1' END)::INTEGER = 1",
        "SELECT count(*) FROM relations r JOIN experiences e ON e.experience_id = r.source_id "
        "WHERE (CASE WHEN e.content = '{c}' THEN 'x' ELSE '1' END)::INTEGER = 1",
    ]
    with db.acting_as(world.tokens["a1"]):
        for hidden in ("B private", "B team", "T private a2", "i bob team"):
            for probe in probes:
                await db.sql(probe.format(c=hidden))  # no error
        with pytest.raises(ValidationError, match="leak"):  # a visible row: it fires
            await db.sql(probes[0].format(c="T team"))


async def test_owner_and_agent_names_are_data_never_sql(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    db = await PulseDB.open(tmp_path / "db", nats_server.url)
    try:
        model = Model()
        w = Writer(db, model)
        odd = "o'Brien \"Zoë\" 🚀 \\ ' OR '1'='1"
        agent = "ag'ent ü"
        theirs = await w.collective(odd, "odd")
        others = await w.collective("alice", "alice")
        await w.experience(theirs, "private", (odd, agent), "odd private")
        await w.experience(theirs, "team", (odd, None), "odd team")
        await w.experience(theirs, "private", (odd, None), "odd private, no agent")
        await w.experience(others, "team", ("alice", None), "alice team")
        await w.wisdom(odd, "private", (odd, agent), "odd wisdom")
        token = (await db.create_token(odd, agent_id=agent, scope="read")).token
        seen = await snapshot(db, token)
        assert labels(model, seen["experiences"]) == {"odd private", "odd team"}
        assert labels(model, seen["wisdom"]) == {"odd wisdom"}
        assert seen == {
            **expected(Who(odd, agent), model), "tokens": 0, "dead_letters": 0,
        }  # fmt: skip
        injected = (await db.create_token("x' OR '1'='1", scope="read")).token
        assert (await snapshot(db, injected))["experiences"] == set()
    finally:
        await db.close()


@in_module_loop
async def test_filtered_views_stay_on_their_own_query(world: World) -> None:
    """The temporary views of a token's query are its cursor's own: an admin query run at
    the same moment, and every later one, reads everything."""
    db = world.db

    async def count(token: str | None) -> int:
        query = "SELECT count(*) FROM experiences, range(2000)"  # long enough to overlap
        if token is None:
            return int((await db.sql(query)).rows[0][0]) // 2000
        with db.acting_as(token):
            return int((await db.sql(query)).rows[0][0]) // 2000

    found = await asyncio.gather(*(count(t) for t in [world.tokens["bob"], None] * 4))
    assert found == [6, 11] * 4
    assert await count(world.tokens["admin"]) == 11


@in_module_loop
async def test_only_admins_export(world: World, tmp_path: Path) -> None:
    db = world.db
    for name in ("a1", "a2", "bob", "lab"):
        with db.acting_as(world.tokens[name]), pytest.raises(Forbidden, match="exporting"):
            await db.export(tmp_path / name)
        assert not (tmp_path / name).exists()
    with db.acting_as(world.tokens["admin"]):
        written = await db.export(tmp_path / "admin")
    assert written["experiences"] == 11


# -- property: drawn worlds and principals against the model ---------------------------------

AUTHORS = [("alice", "a1"), ("alice", "a2"), ("alice", None), ("bob", "b1"), ("bob", None)]
VISIBILITY = st.sampled_from(["private", "team", "org"])


@dataclass
class Drawn:
    db: PulseDB
    model: Model
    writer: Writer
    collectives: list[UUID]


@pytest.fixture
async def drawn(tmp_path: Path, nats_server: EmbeddedNats) -> AsyncIterator[Drawn]:
    db = await PulseDB.open(tmp_path / "db", nats_server.url)
    model = Model()
    writer = Writer(db, model)
    collectives = [
        await writer.collective("alice", "one"), await writer.collective("alice", "two"),
        await writer.collective("bob", "three"),
    ]  # fmt: skip
    for cid in collectives:
        await writer.experience(cid, "team", (model.collectives[cid], None))
    await writer.activity(collectives[0], "a1")
    await writer.activity(collectives[2], "b1")
    yield Drawn(db, model, writer, collectives)
    await db.close()


@settings(
    max_examples=8, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip
@given(data=st.data())
async def test_drawn_worlds_answer_as_the_model_says(drawn: Drawn, data: st.DataObject) -> None:
    """Each example adds rows of drawn kinds, visibilities and authors to the world (rows
    of earlier examples stay) and reads every view as drawn principals."""
    model, writer = drawn.model, drawn.writer
    for _ in range(data.draw(st.integers(1, 6), label="writes")):
        kind = data.draw(st.sampled_from(KINDS + ("experience", "reinforce")), label="kind")
        cid = data.draw(st.sampled_from(drawn.collectives), label="collective")
        visibility = data.draw(VISIBILITY, label="visibility")
        author = data.draw(st.sampled_from(AUTHORS), label="author")
        inside = [r.id for r in model.of("experience") if r.collective == cid]
        if kind == "experience":
            await writer.experience(cid, visibility, author)
        elif kind == "relation" and len(inside) >= 2:
            source, target = data.draw(st.permutations(inside), label="ends")[:2]
            if not any(r.ends == (source, target) for r in model.of("relation")):
                await writer.relation(source, target, visibility, author)
        elif kind == "insight":
            sources = data.draw(st.lists(st.sampled_from(inside), min_size=1, max_size=3,
                                         unique=True), label="sources")  # fmt: skip
            await writer.insight(cid, sources, visibility, author)
        elif kind == "wisdom":
            owner = data.draw(st.sampled_from(["alice", "bob"]), label="owner")
            await writer.wisdom(owner, visibility, author)
        elif kind == "reinforce":
            await writer.reinforce(data.draw(st.sampled_from(inside), label="reinforced"))
    for _ in range(2):
        owner = data.draw(st.sampled_from(["alice", "bob", "carol"]), label="owner")
        agent = data.draw(st.sampled_from([None, "a1", "a2", "b1"]), label="agent")
        limited = data.draw(
            st.none() | st.frozensets(st.sampled_from(drawn.collectives), min_size=1),
            label="limited to",
        )
        who = Who(owner, agent, limited)
        principal = Principal(owner, agent, scope="read", collectives=limited)
        seen = await snapshot(drawn.db, principal)
        assert seen == {**expected(who, model), "tokens": 0, "dead_letters": 0}

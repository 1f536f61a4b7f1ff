"""The one definition of "visible to": its forms (``eventlog.access``) agree on every row.

Hypothesis draws principals (owners, agents, scopes, tokens limited to collectives, the
local operator) and rows of collectives and wisdom (every visibility, none too, as rows
from before visibility; authors of every owner and agent, none too). For each principal
and row, the Python predicate (``Principal.sees``, ``sees_wisdom``), the index terms
(``Viewer.reach``), the numpy mask (``Viewer.mask`` over columns built as the searches
build them) and the SQL condition (``visible_sql`` with ``member_sql`` over a real
DuckDB table, the principal's row made by ``PRINCIPAL_SQL``) give the same answer. An
admin reads without a filter in every form (``viewer_of`` is None).
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import duckdb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog.access import (
    PRINCIPAL_SQL,
    SCOPES,
    VISIBILITIES,
    Principal,
    member_sql,
    principal_parameters,
    viewer_of,
    visibility_code,
    visible_sql,
    wisdom_member_sql,
)

OWNERS = ("alice", "bob", "carol")
AGENTS = (None, "a1", "a2")
COLLECTIVES = (
    (UUID(int=1), "alice"),
    (UUID(int=2), "alice"),
    (UUID(int=3), "bob"),
    (UUID(int=4), "carol"),
)


@dataclass(frozen=True)
class Row:
    collective: int | None  # an index of COLLECTIVES; None: wisdom (of ``owner``)
    owner: str  # wisdom's owner (a collective's row: its collective's)
    visibility: str | None  # None: a row from before visibility
    author_owner: str | None
    author_agent: str | None


principals = st.builds(
    Principal,
    owner=st.sampled_from(OWNERS),
    agent=st.sampled_from(AGENTS),
    scope=st.sampled_from(SCOPES),
    collectives=st.none() | st.frozensets(st.sampled_from([c for c, _ in COLLECTIVES])),
    local=st.sampled_from([False, False, False, True]),  # the local operator, now and then
)
rows = st.builds(
    Row,
    collective=st.none() | st.integers(0, len(COLLECTIVES) - 1),
    owner=st.sampled_from(OWNERS),
    visibility=st.none() | st.sampled_from(VISIBILITIES),
    author_owner=st.none() | st.sampled_from(OWNERS),
    author_agent=st.sampled_from(AGENTS),
)


def python_form(me: Principal, row: Row) -> bool:
    if row.collective is None:
        return me.sees_wisdom(row.visibility, row.owner, row.author_owner, row.author_agent)
    collective_id, owner = COLLECTIVES[row.collective]
    return me.sees(
        row.visibility, me.member(owner, collective_id), row.author_owner, row.author_agent
    )


def terms_form(me: Principal, row: Row) -> bool | None:
    """What a term query built from ``Viewer.reach`` matches (None: wisdom, not indexed)."""
    if row.collective is None:
        return None
    viewer = viewer_of(me, COLLECTIVES[row.collective][1], COLLECTIVES[row.collective][0])
    if viewer is None:
        return True
    seen, author = viewer.reach()
    indexed = row.visibility or "team"  # (projections.text indexes it so)
    return indexed in seen or (
        author is not None and author == (row.author_owner, row.author_agent)
    )


def numpy_form(me: Principal, drawn: list[Row]) -> dict[int, bool]:
    """Per collective, columns as ``projections.queries`` builds them, masked."""
    found: dict[int, bool] = {}
    for at, (collective_id, owner) in enumerate(COLLECTIVES):
        index = [i for i, r in enumerate(drawn) if r.collective == at]
        authors: dict[tuple[str | None, str | None], int] = {}
        visibility = np.array([visibility_code(drawn[i].visibility) for i in index], np.int8)
        author = np.array(
            [
                authors.setdefault((drawn[i].author_owner, drawn[i].author_agent), len(authors))
                for i in index
            ],
            np.int32,
        )
        viewer = viewer_of(me, owner, collective_id)
        mask = (
            np.ones(len(index), bool)
            if viewer is None
            else viewer.mask(visibility, author, authors)
        )
        assert mask.dtype == np.bool_ and mask.shape == (len(index),)
        found.update(zip(index, mask.tolist(), strict=True))
    return found


_con: duckdb.DuckDBPyConnection | None = None


def sql_form(me: Principal, drawn: list[Row]) -> dict[int, bool]:
    """The SQL condition over a real DuckDB table of the rows (one connection for all)."""
    global _con
    if _con is None:
        _con = duckdb.connect()
    con = _con
    if me.admin:  # (no filtered views: ``analytics.SqlQuery`` with no viewer)
        return dict.fromkeys(range(len(drawn)), True)
    con.execute(f"CREATE OR REPLACE TEMP TABLE pulse_principal AS {PRINCIPAL_SQL}",
                principal_parameters(me))  # fmt: skip
    con.execute("CREATE OR REPLACE TEMP TABLE collectives (collective_id UUID, owner_id VARCHAR)")
    con.executemany("INSERT INTO collectives VALUES (?, ?)", [(str(c), o) for c, o in COLLECTIVES])
    con.execute(
        "CREATE OR REPLACE TEMP TABLE entities (n INTEGER, collective_id UUID, owner_id VARCHAR, "
        "visibility VARCHAR, author_owner VARCHAR, author_agent VARCHAR)"
    )
    if drawn:
        con.executemany(
            "INSERT INTO entities VALUES (?, ?, ?, ?, ?, ?)",
            [
                (n, None if r.collective is None else str(COLLECTIVES[r.collective][0]),
                 r.owner, r.visibility, r.author_owner, r.author_agent)
                for n, r in enumerate(drawn)
            ],
        )  # fmt: skip
    of_collectives = con.execute(
        f"SELECT e.n, {visible_sql('e', member_sql('c'))} FROM entities e "
        "JOIN collectives c USING (collective_id), temp.main.pulse_principal p"
    ).fetchall()
    of_wisdom = con.execute(
        f"SELECT w.n, {visible_sql('w', wisdom_member_sql('w'))} FROM entities w, "
        "temp.main.pulse_principal p WHERE w.collective_id IS NULL"
    ).fetchall()
    found = dict(of_collectives + of_wisdom)
    assert all(isinstance(v, bool) for v in found.values()), "a condition was NULL"
    return found


@given(st.lists(principals, min_size=1, max_size=4), st.lists(rows, max_size=30))
def test_the_forms_of_visible_to_agree(drawn_principals: list[Principal], drawn: list[Row]) -> None:
    for me in drawn_principals:
        python = {n: python_form(me, r) for n, r in enumerate(drawn)}
        by_sql = sql_form(me, drawn)
        assert by_sql == python, me
        by_numpy = numpy_form(me, drawn)
        assert by_numpy == {n: v for n, v in python.items() if drawn[n].collective is not None}
        for n, r in enumerate(drawn):
            terms = terms_form(me, r)
            assert terms is None or terms == python[n], (me, r)


@pytest.mark.parametrize(
    ("me", "row", "visible"),
    [  # the rule, spelled out (the forms above could agree on a wrong one)
        (Principal("alice", "a1", "read"), Row(0, "alice", "private", "alice", "a1"), True),
        (Principal("alice", "a2", "read"), Row(0, "alice", "private", "alice", "a1"), False),
        (Principal("alice", None, "write"), Row(0, "alice", "private", "alice", "a1"), False),
        (Principal("alice", "a2", "read"), Row(0, "alice", "team", "alice", "a1"), True),
        (Principal("alice", "a2", "read"), Row(0, "alice", None, "alice", "a1"), True),
        (Principal("bob", None, "write"), Row(0, "alice", "team", "alice", "a1"), False),
        (Principal("bob", None, "write"), Row(0, "alice", "org", "alice", "a1"), True),
        (Principal("bob", "b1", "admin"), Row(0, "alice", "private", "alice", "a1"), True),
        (  # a token limited to another collective of its owner: not a member here
            Principal("alice", "a1", "read", frozenset({UUID(int=2)})),
            Row(0, "alice", "team", "alice", "a1"),
            False,
        ),
        (  # ... but its own private rows there? not a member: only org rows
            Principal("alice", "a1", "read", frozenset({UUID(int=2)})),
            Row(0, "alice", "private", "alice", "a1"),
            False,
        ),
        (Principal("alice", "a2", "read"), Row(None, "alice", "team", "alice", "a1"), True),
        (Principal("bob", "b1", "read"), Row(None, "alice", "team", "alice", "a1"), False),
        (Principal("bob", "b1", "read"), Row(None, "alice", "org", "alice", "a1"), True),
        (Principal("alice", "a1", "read"), Row(None, "alice", "private", "alice", "a1"), True),
    ],
)
def test_the_rule(me: Principal, row: Row, visible: bool) -> None:
    assert python_form(me, row) is visible
    assert sql_form(me, [row]) == {0: visible}
    if row.collective is not None:
        assert numpy_form(me, [row]) == {0: visible}
        assert terms_form(me, row) is visible

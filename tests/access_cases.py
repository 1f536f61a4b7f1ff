"""The access walk's world and cases, shared by the test modules of each surface
(``test_access_http``, ``test_access_mcp``, ``test_access_python``, ``test_access_tokens``;
issue 13, ``eventlog.access`` and ``sync.access``): fail closed, on every method of the
HTTP API and every MCP tool.

One `pulse up` (with a service token of its own, the operator's) holds a world of owner
alice: a collective whose rows are all team-visible (``team``), one that also holds
org-visible rows (``shared``), one a limited token is limited to (``other``), and
wisdom of both visibilities. Its principals: alice's write, read and limited
(``collectives=[other]``) tokens, bob's write token (another owner) and an admin token.
The world is built once per test process (the ``world`` fixture, session-scoped: every
access module a process runs walks the same world; cases that change or delete make
fresh entities of their own, so no case depends on another's order).

Each case says what every principal that lacks access gets, exactly: 403 (it may see
the thing but not change it, or lacks the scope), 404 (an id that would reveal
existence: the answer is the one a never-created id gets), or a 200 answer that holds
only what it may see (a check of the answer, never a skip). ``CASES`` holds one per
method of the HTTP API (``ops.remote.API_METHODS``), ``MCP_CASES`` one per MCP tool
(and its actions and modes): a method or tool without a case fails. Then the same cases
with access: alice's write token (an admin token for the admin-only methods).
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import itertools
import json
import re
import ssl
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.harness import Service, start, stop

OP = "operator-s3cret"  # the service's own --token: the local operator
NF, FB = 404, 403
KIND = {401: "Unauthorized", 403: "Forbidden", 404: "NotFoundError"}
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TEAM_MARK, WISDOM_MARK, OTHER_MARK = "teamsecret", "wisdomsecret", "othersecret"
PRIVATE_MARK = "privatesecret"  # what alice's agent-a keeps to itself
_names = itertools.count()
TLS = ssl.create_default_context()  # made once: each client making its own costs ~50 ms


def http(url: str, token: str | None = None) -> httpx.AsyncClient:
    """A client of the service, with ``token`` as its bearer token (None: without one)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}".strip()}
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=60, verify=TLS)


def fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


# -- the world ------------------------------------------------------------------------------


@dataclass
class Place:
    """Where a case points: the collective, an experience (with a relation to another),
    an insight, and the collective fresh entities go to (so that the fixture's stay as
    they are). ``vis``: the visibility of what is made there."""

    collective: str
    exp: str
    insight: str
    scratch: str
    vis: str


@dataclass
class World:
    url: str
    secrets: dict[str, str]  # principal -> its bearer token
    token_ids: dict[str, str]
    team: Place
    shared: Place
    ids: dict[str, str]  # fixture entities by name
    # what a principal may never see (grows with fresh entities)
    hidden: dict[str, set[str]] = field(
        default_factory=lambda: {p: set() for p in ("bob", "limited", "reader", "alice")}
    )

    def client(self, who: str | None) -> httpx.AsyncClient:
        return http(self.url, None if who is None else self.secrets[who])

    async def call(self, who: str, method: str, **body: Any) -> Any:
        async with self.client(who) as client:
            response = await client.post(f"/v1/{method}", json=body)
        assert response.status_code == 200, f"{method} as {who}: {response.text}"
        return response.json()

    def hide(self, *ids: str, from_: tuple[str, ...] = ("bob", "limited")) -> None:
        for who in from_:
            self.hidden[who].update(ids)

    async def sql(self, query: str) -> list[Any]:
        """The rows of the operator's ``query``. A query a delete's rewrite of the files
        cancelled (503 ``QueryCancelled``, as documented: retry) is asked again."""
        async with self.client("op") as client:
            for _ in range(100):
                response = await client.post("/v1/sql", json={"query": query})
                if response.status_code != 503 or response.json()["error"] != "QueryCancelled":
                    break
                await asyncio.sleep(0.05)
        assert response.status_code == 200, f"sql: {response.text}"
        return list(response.json()["rows"])

    async def state(self) -> tuple[str, Any]:
        """What a refused call must leave as it was: the folded state and the activities."""
        digest = await self.call("op", "digest")
        return digest, await self.sql("SELECT * FROM activities ORDER BY ALL")


def _sync_call(client: httpx.Client, method: str, **body: Any) -> Any:
    response = client.post(f"/v1/{method}", json=body)
    assert response.status_code == 200, f"{method}: {response.text}"
    return response.json()


def build_world(url: str) -> World:
    """Alice's world, made by alice (so she is the author of every row)."""
    secrets = {"op": OP}
    token_ids: dict[str, str] = {}
    with httpx.Client(base_url=url, timeout=60) as client:

        def as_(who: str, method: str, **body: Any) -> Any:
            client.headers["Authorization"] = f"Bearer {secrets[who]}"
            return _sync_call(client, method, **body)

        def token(who: str, as_who: str = "op", **spec: Any) -> None:
            made = as_(as_who, "create_token", **spec)
            secrets[who], token_ids[who] = made["token"], made["token_id"]

        token("admin", owner_id="root", scope="admin")
        token("alice", as_who="admin", owner_id="alice", scope="write")

        def coll(name: str) -> str:
            cid: str = as_(
                "alice", "create_collective", owner_id="alice", name=name, embedder="hash"
            )
            return cid

        def exp(cid: str, content: str, visibility: str) -> str:
            eid: str = as_(
                "alice",
                "record_experience",
                collective_id=cid,
                content=content,
                visibility=visibility,
            )
            return eid

        def rel(a: str, b: str, kind: str, visibility: str) -> str:
            rid: str = as_(
                "alice",
                "store_relation",
                source_id=a,
                target_id=b,
                relation_type=kind,
                visibility=visibility,
            )
            return rid

        def ins(cid: str, content: str, sources: list[str], visibility: str) -> str:
            iid: str = as_(
                "alice",
                "store_insight",
                collective_id=cid,
                content=content,
                source_experiences=sources,
                visibility=visibility,
            )
            return iid

        def wis(pattern: str, vector: list[float], visibility: str) -> str:
            wid: str = as_(
                "alice",
                "store_wisdom",
                owner_id="alice",
                category="CodingStyle",
                pattern=pattern,
                embedding=vector,
                visibility=visibility,
            )
            return wid

        ids: dict[str, str] = {}
        ids["team"], ids["shared"], ids["other"] = coll("team"), coll("shared"), coll("other")
        ids["scratch"], ids["scratch_org"] = coll("scratch"), coll("scratch-org")
        token("reader", as_who="admin", owner_id="alice", scope="read")
        token(
            "limited", as_who="admin", owner_id="alice", scope="write", collectives=[ids["other"]]
        )
        token("bob", as_who="admin", owner_id="bob", scope="write")
        token("agent", as_who="admin", owner_id="alice", agent_id="agent-a", scope="write")

        team = ids["team"]
        ids["e1"] = exp(team, f"{TEAM_MARK} alpha nats retry one", "team")
        ids["e2"] = exp(team, f"{TEAM_MARK} alpha nats retry two", "team")
        ids["r"] = rel(ids["e1"], ids["e2"], "Supports", "team")
        ids["i"] = ins(team, f"{TEAM_MARK} insight alpha nats", [ids["e1"]], "team")
        as_(
            "alice",
            "register_activity",
            collective_id=team,
            agent_id="alice-bot",
            task_description=f"{TEAM_MARK} task",
        )

        shared = ids["shared"]
        ids["o1"] = exp(shared, "orgshared alpha nats one", "org")
        ids["o2"] = exp(shared, "orgshared alpha nats two", "org")
        ids["h1"] = exp(shared, f"{TEAM_MARK} alpha nats hidden", "team")
        ids["ro"] = rel(ids["o1"], ids["o2"], "Supports", "org")
        ids["rh"] = rel(ids["o1"], ids["h1"], "Implies", "org")  # an end bob may not see
        ids["rt"] = rel(ids["o1"], ids["o2"], "Implies", "team")
        ids["io"] = ins(shared, "orgshared insight alpha nats", [ids["o1"], ids["h1"]], "org")
        ids["it"] = ins(shared, f"{TEAM_MARK} insight alpha shared", [ids["o1"]], "team")
        as_(
            "alice",
            "register_activity",
            collective_id=shared,
            agent_id="alice-bot",
            task_description=f"{TEAM_MARK} task",
        )
        exp(ids["scratch_org"], "orgshared scratch", "org")  # so bob sees scratch-org

        ids["x1"] = exp(ids["other"], f"{OTHER_MARK} alpha nats", "team")
        ids["wt"] = wis(f"{WISDOM_MARK} pattern", [1.0, 0.0, 0.0], "team")
        ids["wo"] = wis("orgshared pattern", [0.0, 1.0, 0.0], "org")
        # agent-a's own: private, so not even alice's other principals see them
        ids["p1"] = as_(
            "agent",
            "record_experience",
            collective_id=team,
            content=f"{PRIVATE_MARK} alpha nats",
            visibility="private",
        )
        ids["pi"] = as_(
            "agent",
            "store_insight",
            collective_id=team,
            content=f"{PRIVATE_MARK} insight alpha nats",
            source_experiences=[ids["e1"]],
            visibility="private",
        )
        ids["pw"] = as_(
            "agent",
            "store_wisdom",
            owner_id="alice",
            category="CodingStyle",
            pattern=f"{PRIVATE_MARK} pattern",
            embedding=[0.6, 0.8, 0.0],
            visibility="private",
        )

    world = World(
        url=url,
        secrets=secrets,
        token_ids=token_ids,
        team=Place(team, ids["e1"], ids["i"], ids["scratch"], "team"),
        shared=Place(shared, ids["o1"], ids["io"], ids["scratch_org"], "org"),
        ids=ids,
    )
    world.hide(
        *(ids[k] for k in ("team", "scratch", "e1", "e2", "r", "i", "h1", "rh", "rt", "it")),
        TEAM_MARK,
    )
    world.hide(ids["other"], ids["x1"], ids["wt"], OTHER_MARK, WISDOM_MARK, from_=("bob",))
    world.hide(*(ids[k] for k in ("p1", "pi", "pw")), PRIVATE_MARK, from_=tuple(world.hidden))
    return world


@pytest.fixture(scope="session")
def walk_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The walk's `pulse up`, once per test process."""
    running = start(tmp_path_factory.mktemp("walk") / "data", "--token", OP)
    running.token = OP
    yield running
    stop(running)


@pytest.fixture(scope="session")
def world(walk_service: Service) -> World:
    """Alice's world on the walk's `pulse up`, once per test process."""
    return build_world(walk_service.url)


# -- making fresh entities (for the cases that change or delete) ------------------------------


@dataclass
class Ctx:
    """What a case builds its arguments from: the world and the place it points at."""

    w: World
    at: Place

    async def experience(self, content: str = "fresh alpha nats") -> str:
        vis = self.at.vis
        mark = TEAM_MARK if vis == "team" else "orgshared"
        eid: str = await self.w.call(
            "alice",
            "record_experience",
            collective_id=self.at.scratch,
            content=f"{mark} {content}",
            visibility=vis,
        )
        self._made(eid)
        return eid

    async def relation(self) -> str:
        a, b = await self.experience(), await self.experience()
        rid: str = await self.w.call(
            "alice",
            "store_relation",
            source_id=a,
            target_id=b,
            relation_type="Supports",
            visibility=self.at.vis,
        )
        self._made(rid)
        return rid

    async def insight(self) -> str:
        source = await self.experience()
        iid: str = await self.w.call(
            "alice",
            "store_insight",
            collective_id=self.at.scratch,
            content="fresh insight",
            source_experiences=[source],
            visibility=self.at.vis,
        )
        self._made(iid)
        return iid

    async def wisdom(self) -> str:
        wid: str = await self.w.call(
            "alice",
            "store_wisdom",
            owner_id="alice",
            category="CodingStyle",
            pattern="fresh pattern",
            embedding=[0.0, 0.0, 1.0],
            visibility=self.at.vis,
        )
        if self.at.vis == "team":
            self.w.hide(wid, from_=("bob",))
        return wid

    async def collective(self) -> str:
        cid: str = await self.w.call(
            "alice",
            "create_collective",
            owner_id="alice",
            name=fresh("doomed"),
            embedding_dimension=3,
        )
        if self.at.vis == "org":  # something bob sees in it
            await self.w.call(
                "alice",
                "record_experience",
                collective_id=cid,
                content="org",
                embedding=[1, 0, 0],
                visibility="org",
            )
        else:
            self._made(cid)
        return cid

    async def agent(self) -> str:
        agent = fresh("agent")
        await self.w.call(
            "alice", "register_activity", collective_id=self.at.scratch, agent_id=agent
        )
        return agent

    async def session(self, agent: str = "alice-bot") -> str:
        """A session of ``agent`` in the place's scratch collective, started by alice
        (sessions are the members': never bob's or the limited token's to see)."""
        made = await self.w.call(
            "alice",
            "start_session",
            collective_id=self.at.scratch,
            agent_id=agent,
            summary=f"{TEAM_MARK} nats alpha session",
        )
        session_id: str = made["session_id"]
        self.w.hide(session_id)
        return session_id

    async def thread(self, checkpoints: int = 1) -> str:
        """A thread of alice's in the place's scratch collective (``checkpoints`` of them,
        a pending write after the first), its name: threads are their writers', never
        bob's, the limited token's or alice's agent's to see."""
        name = fresh("thread")
        for i in range(checkpoints):
            made = await self.w.call(
                "alice", "put_checkpoint", collective_id=self.at.scratch, thread=name,
                checkpoint_id=f"000{i + 1}", checkpoint_type="json", checkpoint=STATE,
                metadata={"run_id": f"run-{name}-{i}", "step": i},
            )  # fmt: skip
            self.w.hide(made["thread_id"])
        await self.w.call(
            "alice", "put_pending_writes", collective_id=self.at.scratch, thread=name,
            checkpoint_id="0001", task_id="task-1", writes=[WRITE],
        )  # fmt: skip
        return name

    async def token(self) -> str:
        made = await self.w.call("admin", "create_token", owner_id="carol", scope="read")
        self.w.hide(made["token"], from_=tuple(self.w.hidden))
        token_id: str = made["token_id"]
        return token_id

    def _made(self, entity_id: str) -> None:
        if self.at.vis == "team":
            self.w.hide(entity_id)


# -- checks of answers ---------------------------------------------------------------------------

Check = Callable[[World, dict[str, Any], Any], None | Awaitable[None]]
Expect = int | Check  # a refusal's status, or a check of a 200 answer
Args = Callable[[Ctx], Awaitable[dict[str, Any]]]


def static(build: Callable[[Ctx], dict[str, Any]]) -> Args:
    async def args(ctx: Ctx) -> dict[str, Any]:
        return build(ctx)

    return args


def is_uuid(_: World, __: dict[str, Any], answer: Any) -> None:
    assert isinstance(answer, str) and UUID_RE.fullmatch(answer), answer


def exp_ids(answer: Any) -> set[str]:
    """The experience ids of a list or page of experiences or scored hits."""
    items = answer["items"] if isinstance(answer, dict) and "items" in answer else answer
    found = set()
    for item in items:
        inner = item.get("experience", item)
        found.add(inner["experience_id"])
    return found


def sees(*names: str, exactly: bool = True) -> Check:
    """The answer lists exactly (or at least) the experiences ``names`` of the world."""

    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        want = {w.ids[n] for n in names}
        got = exp_ids(answer)
        if exactly:
            assert got == want, (sorted(got), sorted(want))
        else:
            assert want <= got, (sorted(got), sorted(want))

    return check


def sees_org_only(w: World, args: dict[str, Any], answer: Any) -> None:
    sees("o1", "o2")(w, args, answer)


def context_of(
    *similar: str, insights: tuple[str, ...], relations: tuple[str, ...], agents: tuple[str, ...]
) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        assert exp_ids(answer["similar"]) == {w.ids[n] for n in similar}
        assert exp_ids(answer["recent"]) == {w.ids[n] for n in similar}
        assert {i["insight"]["insight_id"] for i in answer["insights"]} == {
            w.ids[n] for n in insights
        }
        assert {r["relation_id"] for r in answer["relations"]} == {w.ids[n] for n in relations}
        assert {a["agent_id"] for a in answer["active_agents"]} == set(agents)

    return check


def stats(experiences: int, relations: int, insights: int) -> Check:
    def check(_: World, __: dict[str, Any], answer: Any) -> None:
        got = (answer["experiences"], answer["relations"], answer["insights"])
        assert got == (experiences, relations, insights), answer
        assert answer["dead_letters"] == 0

    return check


def agents(*names: str) -> Check:
    def check(_: World, __: dict[str, Any], answer: Any) -> None:
        assert {a["agent_id"] for a in answer["items"]} == set(names), answer

    return check


def collective_named(name: str) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        assert answer["collective_id"] == w.ids[name] and answer["name"] == name

    return check


def experience_is(name: str) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        assert answer["experience_id"] == w.ids[name]

    return check


def insight_with(name: str, *sources: str) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        assert answer["insight_id"] == w.ids[name]
        assert answer["source_experiences"] == [w.ids[s] for s in sources]

    return check


def insights_are(*names: str, exactly: bool = True) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        got = {i["insight"]["insight_id"] for i in answer}
        want = {w.ids[n] for n in names}
        assert got == want if exactly else want <= got, (got, want)

    return check


def related(*relations: str) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        got = {r["relation"]["relation_id"] for r in answer["items"]}
        assert got == {w.ids[n] for n in relations}, answer

    return check


def wisdom(*names: str, exactly: bool = True) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        got = {s["wisdom"]["wisdom_id"] for s in answer}
        want = {w.ids[n] for n in names}
        assert got == want if exactly else want <= got, (got, want)
        assert all(s["wisdom"]["owner_id"] == "alice" for s in answer)

    return check


def wisdom_org_only(w: World, args: dict[str, Any], answer: Any) -> None:
    assert w.ids["wo"] in {s["wisdom"]["wisdom_id"] for s in answer}
    assert all(s["wisdom"]["visibility"] == "org" for s in answer), answer


def collectives(*names: str, exactly: bool = True) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        got = {c["collective_id"] for c in answer["items"]}
        want = {w.ids[n] for n in names}
        assert got == want if exactly else want <= got, (got, want)

    return check


def bob_collectives(w: World, _: dict[str, Any], answer: Any) -> None:
    """Bob lists alice's collectives that hold something org-visible, and no other."""
    got = {c["collective_id"] for c in answer["items"]}
    assert {w.ids["shared"], w.ids["scratch_org"]} <= got, answer
    assert all(c["owner_id"] == "alice" for c in answer["items"])  # (bob has none)


def limited_collectives(w: World, _: dict[str, Any], answer: Any) -> None:
    got = {c["collective_id"] for c in answer["items"]}
    assert {w.ids["other"], w.ids["shared"], w.ids["scratch_org"]} <= got, answer


def a_digest(_: World, __: dict[str, Any], answer: Any) -> None:
    assert isinstance(answer, str) and re.fullmatch(r"[0-9a-f]{16,128}", answer), answer


def a_status(_: World, __: dict[str, Any], answer: Any) -> None:
    assert answer["following"] is None and answer["stream"]["name"] == "PULSE", answer
    assert answer["applied_seq"] <= answer["last_seq"] == answer["stream"]["last_seq"]


def compacted(_: World, __: dict[str, Any], answer: Any) -> None:
    assert answer["applied_seq"] > 0 and answer["duckdb_seconds"] >= 0, answer


def rotated(_: World, __: dict[str, Any], answer: Any) -> None:
    assert len(answer["kek_id"]) == 16 and answer["rewrapped"] > 0, answer


def follows_all(_: World, __: dict[str, Any], answer: Any) -> None:
    assert answer == [], answer


def a_seq(_: World, __: dict[str, Any], answer: Any) -> None:
    assert isinstance(answer, int) and answer > 0


def no_seq(_: World, __: dict[str, Any], answer: Any) -> None:
    assert answer == 0


def caller(owner: str, scope: str, limited: bool = False) -> Check:
    """``whoami``'s answer: the asking principal itself, and nothing of another."""

    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        assert (answer["owner_id"], answer["scope"], answer["operator"]) == (owner, scope, False)
        assert answer["token_id"] is not None and answer["agent_id"] is None
        assert answer["collectives"] == ([w.ids["other"]] if limited else [])

    return check


def new_token(w: World, args: dict[str, Any], answer: Any) -> None:
    assert answer["token"].startswith("pulse_") and answer["owner_id"] == args["owner_id"]
    assert answer["scope"] == args["scope"]
    w.hide(answer["token"], from_=tuple(w.hidden))


def every_token(w: World, listed: set[str]) -> None:
    assert set(w.token_ids.values()) <= listed, (listed, w.token_ids)


def token_list(w: World, _: dict[str, Any], answer: Any) -> None:
    every_token(w, {t["token_id"] for t in answer})
    assert all("token" not in t and "secret_sha256" not in t for t in answer)


def a_page(_: World, __: dict[str, Any], answer: Any) -> None:
    assert set(answer) == {"items", "next"}


def rows_of(*names: str, exactly: bool = True) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        got = {row[0] for row in answer["rows"]}
        want = {w.ids[n] for n in names}
        assert got == want if exactly else want <= got, (got, want)

    return check


def an_activity(_: World, args: dict[str, Any], answer: Any) -> None:
    assert answer["agent_id"] == args["agent_id"]


def applications(n: int) -> Check:
    def check(_: World, __: dict[str, Any], answer: Any) -> None:
        assert answer == n

    return check


async def as_op(w: World, method: str, **body: Any) -> httpx.Response:
    async with w.client("op") as client:
        return await client.post(f"/v1/{method}", json=body)


def gone(getter: str, key: str) -> Check:
    """After a delete: the entity is no more, for anyone."""

    async def check(w: World, args: dict[str, Any], answer: Any) -> None:
        assert answer is None
        response = await as_op(w, getter, **{key: args[key]})
        assert response.status_code == NF, response.text

    return check


def experience_now(**fields: Any) -> Check:
    """After a change to ``args["experience_id"]`` (or a new one): what it holds now."""

    async def check(w: World, args: dict[str, Any], answer: Any) -> None:
        eid = args.get("experience_id") or answer
        found = (await as_op(w, "get_experience", experience_id=eid)).json()
        assert {k: found[k] for k in fields} == fields, found
        assert found["author_owner"] == "alice"

    return check


def stored(getter: str, key: str) -> Check:
    """A new entity (its id the answer), there and written by alice."""

    async def check(w: World, _: dict[str, Any], answer: Any) -> None:
        assert isinstance(answer, str) and UUID_RE.fullmatch(answer), answer
        found = await as_op(w, getter, **{key: answer})
        assert found.status_code == 200, found.text
        assert found.json().get("owner_id", "alice") == "alice"

    return check


def active_in_scratch(present: bool) -> Check:
    async def check(w: World, args: dict[str, Any], answer: Any) -> None:
        page = (await as_op(w, "get_active_agents", collective_id=args["collective_id"])).json()
        assert (args["agent_id"] in {a["agent_id"] for a in page["items"]}) is present, page

    return check


async def relation_stored(w: World, args: dict[str, Any], answer: Any) -> None:
    page = (await as_op(w, "get_related_experiences", experience_id=args["source_id"])).json()
    assert [r["relation"]["relation_id"] for r in page["items"]] == [answer]
    assert page["items"][0]["relation"]["author_owner"] == "alice"


def in_view(view: str, key: str, count: int) -> Check:
    """After a write: how many rows of ``view`` (the operator's SQL) have its id (the
    answer, or ``args[key]``)."""

    async def check(w: World, args: dict[str, Any], answer: Any) -> None:
        wanted = answer if isinstance(answer, str) else args[key]
        assert UUID_RE.fullmatch(wanted)
        query = f"SELECT count(*) FROM {view} WHERE {key} = '{wanted}'"
        rows = await w.sql(query)
        assert rows == [[count]], (view, wanted, rows)

    return check


async def revoked(w: World, args: dict[str, Any], answer: Any) -> None:
    listed = (await as_op(w, "list_tokens", include_revoked=True)).json()
    assert [t["revoked"] for t in listed if t["token_id"] == args["token_id"]] == [True]


def session_now(**fields: Any) -> Check:
    """A session (the answer, or in it): what it holds now, started by alice."""

    async def check(w: World, args: dict[str, Any], answer: Any) -> None:
        session_id = answer.get("session", answer)["session_id"]
        found = (await as_op(w, "get_session", session_id=session_id)).json()
        assert {k: found[k] for k in fields} == fields, found
        assert found["author_owner"] == "alice"

    return check


def sessions_of(n: int = 0) -> Check:
    """A page listing ``n`` sessions, of the agent the arguments name."""

    def check(_: World, args: dict[str, Any], answer: Any) -> None:
        assert [s["agent_id"] for s in answer["items"]] == [args["agent_id"]] * n, answer

    return check


def nothing(_: World, __: dict[str, Any], answer: Any) -> None:
    assert answer is None or answer == {"session": None}, answer


def resumed(_: World, args: dict[str, Any], answer: Any) -> None:
    assert answer["session"]["agent_id"] == args.get("agent_id", args.get("agent")), answer
    assert answer["context_by"] == "summary" and "similar" in answer["context"]


async def _checkpoints(w: World, collective_id: str, thread: str) -> list[Any]:
    """The checkpoints of a thread, as the operator sees them."""
    response = await as_op(w, "list_checkpoints", collective_id=collective_id, thread=thread)
    assert response.status_code == 200, response.text
    found: list[Any] = response.json()
    return found


def checkpoints_there(n: int, key: str) -> Check:
    """After a call: the thread the arguments name at ``key`` (or the first of a list
    there; ``run_ids``: the thread of the first run, ``_runs``'s) holds ``n``
    checkpoints, all of them alice's."""

    async def check(w: World, args: dict[str, Any], answer: Any) -> None:
        thread = args[key][0] if isinstance(args[key], list) else args[key]
        if key == "run_ids":
            thread = thread.removeprefix("run-").removesuffix("-0")
        found = await _checkpoints(w, args["collective_id"], thread)
        assert len(found) == n, found
        assert all(c["author_owner"] == "alice" for c in found), found

    return check


def writes_there(n: int) -> Check:
    async def check(w: World, args: dict[str, Any], answer: Any) -> None:
        assert answer is None
        found = await _checkpoints(w, args["collective_id"], args["thread"])
        assert len(found[-1]["pending_writes"]) == n, found

    return check


def checkpoint_found(_: World, args: dict[str, Any], answer: Any) -> None:
    assert answer["thread"] == args["thread"] and answer["checkpoint_id"] == "0001", answer
    assert answer["checkpoint"] == STATE and len(answer["pending_writes"]) == 1, answer


def listed(n: int) -> Check:
    def check(_: World, args: dict[str, Any], answer: Any) -> None:
        assert [c["thread"] for c in answer] == [args["thread"]] * n, answer

    return check


def no_threads(_: World, __: dict[str, Any], answer: Any) -> None:
    assert answer == [], answer  # (no principal but alice writes threads here)


def some_threads(_: World, __: dict[str, Any], answer: Any) -> None:
    assert answer and all(name.startswith(("thread-", "copy-")) for name in answer), answer


def counted(n: int) -> Check:
    def check(_: World, __: dict[str, Any], answer: Any) -> None:
        assert answer == n, answer

    return check


def all_of(*checks: Check) -> Check:
    async def check(w: World, args: dict[str, Any], answer: Any) -> None:
        for one in checks:
            await checked(one, w, args, answer)

    return check


def uuids(n: int) -> Check:
    def check(_: World, __: dict[str, Any], answer: Any) -> None:
        assert isinstance(answer, list) and len(answer) == n

    return check


# -- the cases -----------------------------------------------------------------------------------


@dataclass
class Case:
    """``args``: the arguments, pointing at a place; ``lacks``: per principal that lacks
    (some) access, what it gets (``bob@shared``: bob, pointed at the collective that holds
    org-visible rows); ``has``: the check of the answer to ``who``, who has access."""

    args: Args
    lacks: dict[str, Expect]
    has: Check
    who: str = "alice"


def writes(args: Args, has: Check) -> Case:
    """A write into a collective, or to an entity of one."""
    return Case(args, {"bob": NF, "bob@shared": FB, "reader": FB, "limited": NF}, has)


def speaks(case: Case) -> Case:
    """An activity of an agent: alice's agent-a token speaks for agent-a only."""
    case.lacks["agent"] = FB
    return case


def reads(args: Args, bob_shared: Check, has: Check) -> Case:
    """A read of a collective or an entity: the reader reads all of it."""
    return Case(args, {"bob": NF, "bob@shared": bob_shared, "reader": has, "limited": NF}, has)


def admin_only(args: Args, has: Check) -> Case:
    return Case(args, {p: FB for p in ("bob", "reader", "limited", "alice")}, has, who="admin")


SEARCH = "alpha nats"
FILTER = {"include_archived": True, "min_importance": 0.0}
STATE = base64.b64encode(b'{"messages": ["teamsecret"]}').decode()  # a checkpoint's bytes
WRITE = {"idx": 0, "channel": "messages", "value_type": "json", "value": "WyJoaSJd"}

CASES: dict[str, Case] = {
    # -- collectives
    "create_collective": Case(
        static(lambda c: {"owner_id": "alice", "name": fresh("made"), "embedder": "hash"}),
        {"bob": FB, "reader": FB, "limited": FB},  # another owner's; read; limited
        stored("get_collective", "collective_id"),
    ),
    "get_collective": reads(
        static(lambda c: {"collective_id": c.at.collective}),
        collective_named("shared"),
        collective_named("team"),
    ),
    "list_collectives": Case(
        static(lambda c: {}),
        {
            "bob": bob_collectives,
            "reader": collectives("team", "shared", "other", exactly=False),
            "limited": limited_collectives,
        },
        collectives("team", "shared", "other", "scratch", "scratch_org", exactly=False),
    ),
    "list_collectives:owner": Case(
        static(lambda c: {"owner_id": "alice"}),
        {"bob": bob_collectives, "limited": limited_collectives},
        collectives("team", "shared", "other", exactly=False),
    ),
    "find_collective": reads(  # by owner/name: bob sees "alice/shared", not "alice/team"
        static(lambda c: {"collective": f"alice/{_name_of(c)}"}),
        collective_named("shared"),
        collective_named("team"),
    ),
    "get_collective_stats": reads(
        static(lambda c: {"collective_id": c.at.collective}),
        stats(2, 1, 1),
        stats(2, 1, 1),  # team: e1 e2, r, i; shared for bob: o1 o2, ro, io
    ),
    "delete_collective": Case(  # it forgets every member's memories: an admin's
        lambda c: _one("collective_id", c.collective()),
        {"bob": NF, "bob@shared": FB, "reader": FB, "limited": NF, "alice": FB},
        gone("get_collective", "collective_id"),
        who="admin",
    ),
    # -- experiences
    "record_experience": writes(
        static(lambda c: {"collective_id": c.at.scratch, "content": f"{TEAM_MARK} new"}),
        experience_now(visibility="team", content=f"{TEAM_MARK} new"),
    ),
    "record_experiences": writes(
        static(
            lambda c: {
                "collective_id": c.at.scratch,
                "items": [{"content": f"{TEAM_MARK} a"}, {"content": "b"}],
            }
        ),
        uuids(2),
    ),
    "get_experience": reads(
        static(lambda c: {"experience_id": c.at.exp}), experience_is("o1"), experience_is("e1")
    ),
    "get_experience:private": Case(  # its author's only, not its owner's other principals
        static(lambda c: {"experience_id": c.w.ids["p1"]}),
        {p: NF for p in ("alice", "reader", "limited", "bob")},
        experience_is("p1"),
        who="agent",
    ),
    "get_recent_experiences": reads(
        static(lambda c: {"collective_id": c.at.collective, "limit": 50}),
        sees_org_only,
        sees("e1", "e2"),
    ),
    "list_experiences": reads(
        static(lambda c: {"collective_id": c.at.collective}), sees_org_only, sees("e1", "e2")
    ),
    "update_experience": writes(
        lambda c: _one("experience_id", c.experience(), importance=0.9),
        experience_now(importance=0.9),
    ),
    "archive_experience": writes(
        lambda c: _one("experience_id", c.experience()), experience_now(archived=True)
    ),
    "unarchive_experience": writes(lambda c: _archived(c), experience_now(archived=False)),
    "invalidate_experience": writes(
        lambda c: _one("experience_id", c.experience(), reason="stale", at=1_700_000_000_000),
        experience_now(valid_to_ms=1_700_000_000_000, invalid_reason="stale"),
    ),
    "revalidate_experience": writes(
        lambda c: _one("experience_id", c.experience(), reason="true again"),
        experience_now(valid_to_ms=None),
    ),
    "reinforce_experience": writes(
        lambda c: _one("experience_id", c.experience()), applications(1)
    ),
    "delete_experience": writes(
        lambda c: _one("experience_id", c.experience()), gone("get_experience", "experience_id")
    ),
    # -- search
    "search_similar": reads(
        static(lambda c: {"collective_id": c.at.collective, "query": SEARCH, "k": 20}),
        sees_org_only,
        sees("e1", "e2"),
    ),
    "search_text": reads(
        static(lambda c: {"collective_id": c.at.collective, "text": SEARCH, "k": 20}),
        sees_org_only,
        sees("e1", "e2"),
    ),
    "search_hybrid": reads(
        static(lambda c: {"collective_id": c.at.collective, "text": SEARCH, "k": 20}),
        sees_org_only,
        sees("e1", "e2"),
    ),
    "search_hybrid:filtered": reads(  # a filter that narrows: the visibility still holds
        static(
            lambda c: {"collective_id": c.at.collective, "text": SEARCH, "k": 20, "flt": FILTER}
        ),
        sees_org_only,
        sees("e1", "e2"),
    ),
    "search_similar:filtered": reads(
        static(
            lambda c: {"collective_id": c.at.collective, "query": SEARCH, "k": 20, "flt": FILTER}
        ),
        sees_org_only,
        sees("e1", "e2"),
    ),
    "list_cold_experiences": reads(
        static(lambda c: {"collective_id": c.at.collective, "threshold": 1.0}),
        sees("o1", "o2"),
        sees("e1", "e2"),
    ),
    "get_context_candidates": reads(
        static(lambda c: {"collective_id": c.at.collective, "text": SEARCH, "k": 20, "recent": 20}),
        context_of("o1", "o2", insights=("io",), relations=("ro",), agents=()),
        context_of("e1", "e2", insights=("i",), relations=("r",), agents=("alice-bot",)),
    ),
    # -- relations and insights
    "store_relation": writes(lambda c: _pair(c, relation_type="Elaborates"), relation_stored),
    "get_related_experiences": reads(
        static(lambda c: {"experience_id": c.at.exp}), related("ro"), related("r")
    ),
    "delete_relation": writes(
        lambda c: _one("relation_id", c.relation()), in_view("relations", "relation_id", 0)
    ),
    "store_insight": writes(
        lambda c: _distilled(c, "collective_id", content="distilled"),
        stored("get_insight", "insight_id"),
    ),
    "get_insight": reads(
        static(lambda c: {"insight_id": c.at.insight}),
        insight_with("io", "o1"),
        insight_with("i", "e1"),  # h1 is not bob's to see
    ),
    "get_insights": reads(
        static(lambda c: {"collective_id": c.at.collective, "query": SEARCH, "k": 10}),
        insights_are("io"),
        insights_are("i"),
    ),
    "delete_insight": writes(
        lambda c: _one("insight_id", c.insight()), gone("get_insight", "insight_id")
    ),
    # -- activities
    "register_activity": speaks(
        writes(
            static(lambda c: {"collective_id": c.at.scratch, "agent_id": fresh("bot")}),
            active_in_scratch(True),
        )
    ),
    "update_heartbeat": speaks(
        writes(
            static(lambda c: {"collective_id": c.at.collective, "agent_id": "alice-bot"}),
            an_activity,
        )
    ),
    "end_activity": Case(
        lambda c: _agent_in_scratch(c),
        {"bob": NF, "bob@shared": FB, "reader": FB, "limited": NF, "agent": FB},
        active_in_scratch(False),
    ),
    "get_active_agents": reads(
        static(lambda c: {"collective_id": c.at.collective}),
        agents(),  # activities are the members' only
        agents("alice-bot"),
    ),
    # -- sessions: the members' (no visibility), an agent's token for its own sessions
    "start_session": speaks(
        writes(
            static(
                lambda c: {
                    "collective_id": c.at.scratch,
                    "agent_id": fresh("bot"),
                    "summary": f"{TEAM_MARK} started",
                }
            ),
            session_now(summary=f"{TEAM_MARK} started", ended=False),
        )
    ),
    "update_session": Case(
        lambda c: _one("session_id", c.session(), bugs=["a bug"]),
        {"bob": NF, "bob@shared": NF, "reader": FB, "limited": NF, "agent": FB},
        session_now(bugs=["a bug"], ended=False),
    ),
    "end_session": Case(
        lambda c: _one("session_id", c.session(), changes=["a change"]),
        {"bob": NF, "bob@shared": NF, "reader": FB, "limited": NF, "agent": FB},
        session_now(changes=["a change"], ended=True),
    ),
    "delete_session": Case(
        lambda c: _one("session_id", c.session()),
        {"bob": NF, "bob@shared": NF, "reader": FB, "limited": NF, "agent": FB},
        gone("get_session", "session_id"),
    ),
    "get_session": Case(
        lambda c: _one("session_id", c.session()),
        {"bob": NF, "bob@shared": NF, "limited": NF, "reader": session_now(ended=False)},
        session_now(ended=False),
    ),
    "list_sessions": Case(
        lambda c: _agent_session(c),
        {"bob": NF, "bob@shared": sessions_of(), "limited": NF, "reader": sessions_of(1)},
        sessions_of(1),
    ),
    "resume_session": Case(
        lambda c: _agent_session(c),
        {"bob": NF, "bob@shared": nothing, "limited": NF, "reader": resumed},
        resumed,
    ),
    # -- threads: their writers' (no visibility), an agent's token for its own threads
    "put_checkpoint": writes(
        static(
            lambda c: {
                "collective_id": c.at.scratch,
                "thread": fresh("thread"),
                "checkpoint_id": "0001",
                "checkpoint_type": "json",
                "checkpoint": STATE,
            }
        ),  # fmt: skip
        checkpoints_there(1, "thread"),
    ),
    "put_pending_writes": Case(
        lambda c: _thread(c, checkpoint_id="0001", task_id="task-2", writes=[WRITE]),
        {"bob": NF, "bob@shared": FB, "reader": FB, "limited": NF, "agent": writes_there(1)},
        writes_there(2),
    ),
    "get_checkpoint": Case(
        lambda c: _thread(c),
        {"bob": NF, "bob@shared": NF, "limited": NF, "agent": NF, "reader": checkpoint_found},
        checkpoint_found,
    ),
    "list_checkpoints": Case(
        lambda c: _thread(c),
        {
            "bob": NF,
            "bob@shared": listed(0),
            "limited": NF,
            "agent": listed(0),
            "reader": listed(1),
        },
        listed(1),
    ),  # fmt: skip
    "list_threads": Case(
        lambda c: _thread(c, only=True),
        {
            "bob": NF,
            "bob@shared": no_threads,
            "limited": NF,
            "agent": no_threads,
            "reader": some_threads,
        },
        some_threads,
    ),  # fmt: skip
    "copy_thread": Case(
        lambda c: _copied(c),
        {"bob": NF, "bob@shared": FB, "reader": FB, "limited": NF, "agent": counted(0)},
        all_of(counted(1), checkpoints_there(1, "target")),
    ),
    "prune_threads": Case(
        lambda c: _threads(c, 2),
        {
            "bob": NF,
            "bob@shared": FB,
            "reader": FB,
            "limited": NF,
            "agent": all_of(counted(0), checkpoints_there(2, "threads")),
        },
        all_of(counted(1), checkpoints_there(1, "threads")),
    ),  # fmt: skip
    "delete_checkpoints_of_runs": Case(
        lambda c: _runs(c),
        {
            "bob": NF,
            "bob@shared": FB,
            "reader": FB,
            "limited": NF,
            "agent": all_of(counted(0), checkpoints_there(1, "run_ids")),
        },
        all_of(counted(1), checkpoints_there(0, "run_ids")),
    ),  # fmt: skip
    "delete_thread": Case(
        lambda c: _thread(c, only=False),
        {
            "bob": NF,
            "bob@shared": FB,
            "reader": FB,
            "limited": NF,
            "agent": checkpoints_there(1, "thread"),
        },
        checkpoints_there(0, "thread"),
    ),  # fmt: skip
    # -- wisdom: an owner's, "team" is every principal of the owner (a limited one too)
    "store_wisdom": Case(
        static(
            lambda c: {
                "owner_id": "alice",
                "category": "CodingStyle",
                "pattern": "p",
                "embedding": [0.0, 0.0, 1.0],
            }
        ),
        {"bob": FB, "reader": FB, "limited": in_view("wisdom", "wisdom_id", 1)},
        in_view("wisdom", "wisdom_id", 1),
    ),
    "get_wisdom": Case(
        static(lambda c: {"owner_id": "alice"}),
        {
            "bob": wisdom_org_only,
            "reader": wisdom("wt", "wo", exactly=False),
            "limited": wisdom("wt", "wo", exactly=False),
        },
        wisdom("wt", "wo", exactly=False),
    ),
    "get_wisdom:query": Case(  # nearest first
        static(lambda c: {"owner_id": "alice", "query": [0.0, 1.0, 0.0], "k": 50}),
        {
            "bob": wisdom_org_only,
            "reader": wisdom("wt", "wo", exactly=False),
            "limited": wisdom("wt", "wo", exactly=False),
        },
        wisdom("wt", "wo", exactly=False),
    ),
    "delete_wisdom": Case(
        lambda c: _one("wisdom_id", c.wisdom()),
        {"bob": NF, "bob@shared": FB, "reader": FB, "limited": in_view("wisdom", "wisdom_id", 0)},
        in_view("wisdom", "wisdom_id", 0),
    ),
    # -- the state as a whole: any principal, nothing of anyone in the answer (a stream
    # sequence counts what others wrote: 0 but for admins; a digest hashes every row)
    "sync": Case(static(lambda c: {}), {"bob": no_seq, "reader": no_seq}, no_seq),
    "sync:admin": Case(static(lambda c: {}), {}, a_seq, who="admin"),
    "whoami": Case(  # every principal, told of itself only
        static(lambda c: {}),
        {
            "bob": caller("bob", "write"),
            "reader": caller("alice", "read"),
            "limited": caller("alice", "write", limited=True),
        },
        caller("alice", "write"),
    ),  # fmt: skip
    "sql": Case(  # the views, holding what the principal may see
        static(lambda c: {"query": "SELECT experience_id FROM experiences"}),
        {
            "bob": rows_of("o1", "o2", exactly=False),
            "reader": rows_of("e1", "e2", "x1", exactly=False),
            "limited": rows_of("x1", "o1", "o2", exactly=False),
        },
        rows_of("e1", "e2", "o1", "o2", "h1", "x1", exactly=False),
    ),
    "sql:base": admin_only(  # raw SQL over the base tables: admins only
        static(lambda c: {"query": "SELECT experience_id FROM experience_rows"}),
        rows_of("e1", "e2", "o1", "o2", "h1", "x1", exactly=False),
    ),
    "sql:tokens": Case(  # the tokens view holds nothing but for admins
        static(lambda c: {"query": "SELECT token_id FROM tokens"}),
        {p: rows_of() for p in ("bob", "reader", "limited", "alice")},
        lambda w, a, answer: every_token(w, {row[0] for row in answer["rows"]}),
        who="admin",
    ),
    # -- admins only
    "create_token": admin_only(static(lambda c: {"owner_id": "alice", "scope": "read"}), new_token),
    "list_tokens": admin_only(static(lambda c: {}), token_list),
    "revoke_token": admin_only(lambda c: _one("token_id", c.token()), revoked),
    "dead_letters": admin_only(static(lambda c: {}), a_page),
    # (the walk's host follows every collective: following more changes nothing there)
    "follow": admin_only(static(lambda c: {"collectives": ["team"]}), follows_all),
    "status": admin_only(static(lambda c: {}), a_status),
    "digest": admin_only(static(lambda c: {}), a_digest),
    "compact": admin_only(static(lambda c: {}), compacted),
    "rotate_keys": admin_only(static(lambda c: {}), rotated),
}


def _name_of(c: Ctx) -> str:
    """The name of the collective a case's place points at."""
    return next(name for name in ("team", "shared") if c.w.ids[name] == c.at.collective)


async def mcp_gone(w: World, args: dict[str, Any], answer: Any) -> None:
    """After the session tool's delete: the session is no more, for anyone."""
    assert answer == {"deleted": args["session_id"]}, answer
    response = await as_op(w, "get_session", session_id=args["session_id"])
    assert response.status_code == NF, response.text


async def _one(name: str, made: Awaitable[str], **more: Any) -> dict[str, Any]:
    return {name: await made, **more}


async def _archived(c: Ctx) -> dict[str, Any]:
    experience_id = await c.experience()
    await c.w.call("alice", "archive_experience", experience_id=experience_id)
    return {"experience_id": experience_id}


async def _pair(c: Ctx, **more: Any) -> dict[str, Any]:
    """Two fresh experiences of the place (a triple is unique: fresh ends, a fresh one)."""
    source, target = await c.experience(), await c.experience()
    return {"source_id": source, "target_id": target, **more}


async def _distilled(c: Ctx, where: str, **more: Any) -> dict[str, Any]:
    """An insight's arguments: into the place's scratch collective, from a fresh source."""
    return {where: c.at.scratch, "source_experiences": [await c.experience()], **more}


async def _thread(c: Ctx, only: bool | None = None, **more: Any) -> dict[str, Any]:
    """A fresh thread of alice's in the place's scratch collective (``only``: the
    collective alone in the arguments; False: the collective and the thread, for a
    write that names nothing else)."""
    name = await c.thread()
    if only:
        return {"collective_id": c.at.scratch}
    return {"collective_id": c.at.scratch, "thread": name, **more}


async def _copied(c: Ctx) -> dict[str, Any]:
    source = await c.thread()
    return {"collective_id": c.at.scratch, "source": source, "target": fresh("copy")}


async def _threads(c: Ctx, checkpoints: int) -> dict[str, Any]:
    return {"collective_id": c.at.scratch, "threads": [await c.thread(checkpoints)]}


async def _runs(c: Ctx) -> dict[str, Any]:
    name = await c.thread()
    return {"collective_id": c.at.scratch, "run_ids": [f"run-{name}-0"]}


async def _agent_session(c: Ctx) -> dict[str, Any]:
    """A fresh agent with one session in the place's scratch collective."""
    agent = fresh("session-bot")
    await c.session(agent)
    return {"collective_id": c.at.scratch, "agent_id": agent}


async def _agent_in_scratch(c: Ctx) -> dict[str, Any]:
    """An agent of the place's collective: bob and the limited token are pointed at the
    place's (scratch) collective, whose activity is alice's."""
    agent = await c.agent()
    return {"collective_id": c.at.scratch, "agent_id": agent}


def cases_of(method: str) -> list[tuple[str, Case]]:
    found = [(k, c) for k, c in CASES.items() if k == method or k.startswith(f"{method}:")]
    if not found:
        pytest.fail(f"{method}: no case in the access walk; add one to CASES")
    return found


# -- the walk over HTTP --------------------------------------------------------------------------


def principal_and_place(w: World, who: str) -> tuple[str, Place]:
    if who == "bob@shared":
        return "bob", w.shared
    return who, w.team  # (agent: alice's agent-a)


def leak_free(w: World, who: str, args: dict[str, Any], text: str) -> None:
    """Nothing ``who`` may not see is in ``text`` (besides what it named itself)."""
    given = json.dumps(args)
    for secret in w.hidden.get(who, set()):
        if secret not in given:
            assert secret not in text, f"{who} was shown {secret}: {text[:500]}"


def normalized(text: str) -> str:
    return UUID_RE.sub("<id>", text)


def phantom(args: dict[str, Any]) -> dict[str, Any]:
    """The same arguments, every id swapped for one never created; a thread, named by
    its caller, for a name never used in its collective (the collective stays: a thread
    the caller may not see must read as one never made there)."""
    if "thread" in args:
        return {**args, "thread": fresh("never")}
    return json.loads(UUID_RE.sub(lambda _: str(uuid.uuid4()), json.dumps(args)))


async def http_call(w: World, who: str, method: str, args: dict[str, Any]) -> httpx.Response:
    async with w.client(who) as client:
        return await client.post(f"/v1/{method}", json=args)


async def judged(
    w: World, who: str, expect: Expect, status: int, body: Any, text: str, args: dict[str, Any]
) -> None:
    principal = principal_and_place(w, who)[0]
    leak_free(w, principal, args, text)
    if isinstance(expect, int):
        assert status == expect, f"as {who}: {status} {text[:300]}"
        assert body["error"] == KIND[expect], body
    else:
        assert status == 200, f"as {who}: {status} {text[:300]}"
        await checked(expect, w, args, body)


async def checked(check: Check, w: World, args: dict[str, Any], answer: Any) -> None:
    outcome = check(w, args, answer)
    if inspect.isawaitable(outcome):
        await outcome


# -- the cases over MCP -----------------------------------------------------------------------


def mcp_ids(answer: Any, key: str = "results") -> set[str]:
    return exp_ids(answer[key])


def recalled(*names: str, exactly: bool = True) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        got = mcp_ids(answer)
        want = {w.ids[n] for n in names}
        assert got == want if exactly else want <= got, (got, want)

    return check


def has_key(key: str) -> Check:
    def check(_: World, __: dict[str, Any], answer: Any) -> None:
        assert UUID_RE.fullmatch(answer[key]), answer

    return check


def mcp_agents(*names: str) -> Check:
    def check(_: World, __: dict[str, Any], answer: Any) -> None:
        assert {a["agent_id"] for a in answer["agents"]} == set(names), answer

    return check


def mcp_insights(*names: str) -> Check:
    def check(w: World, _: dict[str, Any], answer: Any) -> None:
        got = {i["insight"]["insight_id"] for i in answer["insights"]}
        assert got == {w.ids[n] for n in names}, answer

    return check


async def _mcp_agent(c: Ctx) -> dict[str, Any]:
    return {"collective": c.at.scratch, "action": "end", "agent": await c.agent()}


def _recall(mode: str, bob: Check, alice: Check) -> Case:
    return reads(
        static(lambda c: {"collective": c.at.collective, "query": SEARCH, "mode": mode, "k": 20}),
        bob,
        alice,
    )


def _context(w: World, args: dict[str, Any], answer: Any) -> None:
    vis = "org" if args["collective"] == w.shared.collective else "team"
    if vis == "org":
        context_of("o1", "o2", insights=("io",), relations=("ro",), agents=())(w, args, answer)
    else:
        assert {w.ids["e1"], w.ids["e2"]} <= exp_ids(answer["similar"])
        assert [a["agent_id"] for a in answer["active_agents"]] == ["alice-bot"]


MCP_CASES: dict[str, Case] = {
    "remember": writes(
        static(lambda c: {"collective": c.at.scratch, "content": f"{TEAM_MARK} via mcp"}),
        lambda w, a, answer: experience_now(content=a["content"], visibility="team")(
            w, {"experience_id": answer["experience_id"]}, None
        ),
    ),
    "recall:hybrid": _recall("hybrid", recalled("o1", "o2"), recalled("e1", "e2")),
    "recall:similar": _recall("similar", recalled("o1", "o2"), recalled("e1", "e2")),
    "recall:text": _recall("text", recalled("o1", "o2"), recalled("e1", "e2")),
    "recall:context": _recall("context", _context, _context),
    "reinforce": writes(
        lambda c: _one("experience_id", c.experience()),
        lambda w, a, answer: applications(1)(w, a, answer["applications"]),
    ),
    "relate": writes(lambda c: _pair(c, relation_type="RelatedTo"), has_key("relation_id")),
    "invalidate": writes(
        lambda c: _one("experience_id", c.experience(), reason="stale"),
        lambda w, a, answer: experience_now(invalid_reason="stale")(w, a, None),
    ),
    "insights:search": reads(
        static(lambda c: {"collective": c.at.collective, "action": "search", "text": SEARCH}),
        mcp_insights("io"),
        mcp_insights("i"),
    ),
    "insights:store": writes(
        lambda c: _distilled(c, "collective", action="store", text="seen"),
        has_key("insight_id"),
    ),
    "activity:register": speaks(
        writes(
            static(
                lambda c: {
                    "collective": c.at.scratch,
                    "action": "register",
                    "agent": fresh("mcp-bot"),
                }
            ),
            lambda w, a, answer: an_activity(w, {"agent_id": a["agent"]}, answer["activity"]),
        )
    ),
    "activity:heartbeat": speaks(
        writes(
            static(
                lambda c: {
                    "collective": c.at.collective,
                    "action": "heartbeat",
                    "agent": "alice-bot",
                }
            ),
            lambda w, a, answer: an_activity(w, {"agent_id": a["agent"]}, answer["activity"]),
        )
    ),
    "activity:end": Case(
        _mcp_agent,
        {"bob": NF, "bob@shared": FB, "reader": FB, "limited": NF, "agent": FB},
        lambda w, a, answer: active_in_scratch(False)(
            w, {"collective_id": a["collective"], "agent_id": answer["ended"]}, None
        ),
    ),
    "activity:active": reads(
        static(lambda c: {"collective": c.at.collective, "action": "active"}),
        mcp_agents(),
        mcp_agents("alice-bot"),
    ),
    "session:start": speaks(
        writes(
            static(
                lambda c: {
                    "collective": c.at.scratch,
                    "action": "start",
                    "agent": fresh("mcp-bot"),
                    "summary": f"{TEAM_MARK} via mcp",
                    "todo": [{"task": "first"}],
                }
            ),
            session_now(summary=f"{TEAM_MARK} via mcp", ended=False),
        )
    ),
    "session:update": Case(
        lambda c: _mcp_session(c, "update", architecture=["a note"]),
        {"bob": NF, "bob@shared": NF, "reader": FB, "limited": NF, "agent": FB},
        session_now(architecture=["a note"], ended=False),
    ),
    "session:end": Case(
        lambda c: _mcp_session(c, "end", summary=f"{TEAM_MARK} ended"),
        {"bob": NF, "bob@shared": NF, "reader": FB, "limited": NF, "agent": FB},
        session_now(summary=f"{TEAM_MARK} ended", ended=True),
    ),
    "session:delete": Case(
        lambda c: _mcp_session(c, "delete"),
        {"bob": NF, "bob@shared": NF, "reader": FB, "limited": NF, "agent": FB},
        mcp_gone,
    ),
    "session:get": Case(
        lambda c: _mcp_session(c, "get"),
        {"bob": NF, "bob@shared": NF, "limited": NF, "reader": session_now(ended=False)},
        session_now(ended=False),
    ),
    "session:resume": Case(
        lambda c: _mcp_resume(c),
        {"bob": NF, "bob@shared": nothing, "limited": NF, "reader": resumed},
        resumed,
    ),
}


async def _mcp_session(c: Ctx, action: str, **more: Any) -> dict[str, Any]:
    return {"action": action, "session_id": await c.session(), **more}


async def _mcp_resume(c: Ctx) -> dict[str, Any]:
    made = await _agent_session(c)
    return {"action": "resume", "collective": made["collective_id"], "agent": made["agent_id"]}


# -- refused: no principal --------------------------------------------------------------------


async def refusals(url: str, token: str | None) -> dict[str, httpx.Response]:
    """The answers to a request of every kind with ``token`` (None: no Authorization)."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-03-26",
            "capabilities": {},
            "clientInfo": {"name": "walk", "version": "1"},
        },
    }
    async with http(url, token) as client:
        return {
            "api": await client.post("/v1/list_collectives", json={}),
            "write": await client.post(
                "/v1/create_collective", json={"owner_id": "x", "name": "x", "embedder": "hash"}
            ),
            "metrics": await client.get("/metrics"),  # (/openapi.json and /docs: public)
            "watch": await client.get("/v1/watch_experiences"),
            "mcp": await client.post(
                "/mcp", json=initialize, headers={"Accept": "application/json, text/event-stream"}
            ),
        }


async def assert_refused(url: str, token: str | None, why: str) -> None:
    for route, response in (await refusals(url, token)).items():
        assert response.status_code == 401, (route, why, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        body = response.json()
        assert body["error"] == "Unauthorized" and why in body["message"], (route, body)
    async with http(url, token) as client:
        health = await client.get("/health")
    assert health.status_code == 200 and health.json() == {"status": "up"}

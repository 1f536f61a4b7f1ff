"""The access walk over the HTTP API (``tests.access_cases``): every method with
every principal that lacks access and with one that has it, and watch streams (server-sent
events) that carry only what the principal may see and end when its token is revoked."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ops.remote import API_METHODS
from tests.access_cases import (
    CASES,
    NF,
    TEAM_MARK,
    Ctx,
    Expect,
    World,
    cases_of,
    checked,
    http,
    http_call,
    judged,
    leak_free,
    normalized,
    phantom,
    principal_and_place,
)


@pytest.mark.parametrize("method", sorted(API_METHODS))
async def test_http_without_access(world: World, method: str) -> None:
    """Every principal that lacks access gets exactly what the rules give; a refusal
    changes nothing, and a 404 reads as the 404 of a never-created id.

    The arguments of every principal are made first (a case that changes or deletes
    makes fresh entities for each), then the state is read, the refused calls made, and
    the state read again: none of the refusals changed it. (Reading the state once per
    case rather than around each call saves a refresh of the analysts' snapshot per
    principal; the refusals that changed nothing, together, are each a refusal that
    changed nothing.) The principals answered 200 come last."""
    for name, case in cases_of(method):
        made = []
        for who, expect in case.lacks.items():
            principal, place = principal_and_place(world, who)
            made.append((who, principal, expect, await case.args(Ctx(world, place))))
        refused = [m for m in made if isinstance(m[2], int)]
        before = await world.state() if refused else None
        for who, principal, expect, args in refused:
            await asked(world, method, name, who, principal, expect, args)
        if refused:
            changed = f"{name}: a refusal changed the state ({[m[0] for m in refused]})"
            assert await world.state() == before, changed
        for who, principal, expect, args in [m for m in made if m not in refused]:
            await asked(world, method, name, who, principal, expect, args)


async def asked(
    w: World, method: str, name: str, who: str, principal: str, expect: Expect,
    args: dict[str, Any],
) -> None:  # fmt: skip
    """``method`` called by ``principal`` (``who`` in the case ``name``) judged; a 404
    compared with the 404 of a never-created id."""
    response = await http_call(w, principal, method, args)
    body = response.json()
    await judged(w, who, expect, response.status_code, body, response.text, args)
    if expect == NF:  # existence does not leak: the same as for an id never made
        never = await http_call(w, principal, method, phantom(args))
        assert never.status_code == NF, f"{name} as {who}: {never.text}"
        assert normalized(never.json()["message"]) == normalized(body["message"]), (
            name,
            who,
            body,
            never.json(),
        )


@pytest.mark.parametrize("method", sorted(API_METHODS))
async def test_http_with_access(world: World, method: str) -> None:
    for _, case in cases_of(method):
        args = await case.args(Ctx(world, world.team))
        response = await http_call(world, case.who, method, args)
        leak_free(world, case.who, args, response.text)
        assert response.status_code == 200, response.text
        await checked(case.has, world, args, response.json())


def test_every_method_has_a_case() -> None:
    methods = {name.split(":")[0] for name in CASES}
    assert methods == set(API_METHODS), (
        f"without a case: {sorted(set(API_METHODS) - methods)}; "
        f"not a method: {sorted(methods - set(API_METHODS))}"
    )


# -- watch (server-sent events) --------------------------------------------------------------


async def changes_until(lines: AsyncIterator[str], last: str) -> list[str]:
    """The experience ids of the changes a stream sends, up to ``last``."""
    seen: list[str] = []

    async def read() -> None:
        async for line in lines:
            if line.startswith("data: "):
                seen.append(json.loads(line[6:])["experience_id"])
                if seen[-1] == last:
                    return

    await asyncio.wait_for(read(), 20)
    return seen


async def test_watch_streams_only_what_the_principal_may_see(world: World) -> None:
    async with (
        world.client("bob") as bob,
        world.client("alice") as alice,
        world.client("limited") as limited,
        bob.stream("GET", "/v1/watch_experiences") as bob_sse,
        alice.stream("GET", "/v1/watch_experiences") as alice_sse,
        limited.stream("GET", "/v1/watch_experiences") as limited_sse,
    ):
        streams = [s.aiter_lines() for s in (bob_sse, alice_sse, limited_sse)]
        for lines in streams:
            assert await anext(lines) == ": watching"
        secret = await world.call(
            "alice",
            "record_experience",
            collective_id=world.ids["scratch"],
            content=f"{TEAM_MARK} watched",
        )
        world.hide(secret)
        await world.call("alice", "update_experience", experience_id=secret, importance=0.6)
        shown = await world.call(
            "alice",
            "record_experience",
            collective_id=world.ids["scratch_org"],
            content="orgshared watched",
            visibility="org",
        )
        bob_seen, alice_seen, limited_seen = [await changes_until(s, shown) for s in streams]
    assert alice_seen == [secret, secret, shown]
    assert bob_seen == [shown]
    assert limited_seen == [shown]


async def test_a_watch_ends_when_its_token_is_revoked(world: World) -> None:
    made = await world.call("admin", "create_token", owner_id="alice", scope="read")
    world.hide(made["token"], from_=tuple(world.hidden))
    async with (
        http(world.url, made["token"]) as client,
        client.stream("GET", "/v1/watch_experiences") as sse,
    ):
        lines = sse.aiter_lines()
        assert await anext(lines) == ": watching"
        before = await world.call(
            "alice",
            "record_experience",
            collective_id=world.ids["scratch"],
            content="seen while valid",
        )
        assert await changes_until(lines, before) == [before]
        await world.call("admin", "revoke_token", token_id=made["token_id"])
        after = await world.call(
            "alice",
            "record_experience",
            collective_id=world.ids["scratch"],
            content="not for a revoked token",
        )

        async def rest() -> list[str]:
            return [line async for line in lines]

        tail = await asyncio.wait_for(rest(), 20)  # the stream ends
    assert not any(after in line for line in tail), tail
    assert "event: unauthorized" in tail, tail

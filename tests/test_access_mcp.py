"""The access walk over MCP (``tests.access_cases``): every tool, and every action and
mode of one, with every principal that lacks access and with one that has it; names of
collectives resolved only among those the caller may see; and a tool of a server served
over HTTP never runs without the request's principal."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.fastmcp.exceptions import ToolError

from eventlog import EmbeddedNats
from ops.mcp_server import build_mcp
from sync import PulseDB
from tests.access_cases import (
    KIND,
    MCP_CASES,
    SEARCH,
    Ctx,
    World,
    checked,
    leak_free,
    mcp_ids,
    principal_and_place,
)

# -- the walk over MCP ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def mcp_session(w: World, who: str | None) -> AsyncIterator[ClientSession]:
    async with (
        w.client(who) as client,
        streamable_http_client(f"{w.url}/mcp", http_client=client) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def tool_error(text: str) -> str:
    """The kind of a tool error ("Error executing tool <name>: <Kind>: <message>")."""
    found = re.match(r"(?:Error executing tool \w+: )?(\w+): ", text)
    assert found, text
    return found.group(1)


async def mcp_call(w: World, who: str, tool: str, args: dict[str, Any]) -> tuple[bool, str]:
    async with mcp_session(w, who) as session:
        result = await session.call_tool(tool, args)
    text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
    return bool(result.isError), text


@pytest.mark.parametrize("name", sorted(MCP_CASES))
async def test_mcp_without_access(world: World, name: str) -> None:
    case, tool = MCP_CASES[name], name.split(":")[0]
    for who, expect in case.lacks.items():
        principal, place = principal_and_place(world, who)
        args = await case.args(Ctx(world, place))
        before = await world.state() if isinstance(expect, int) else None
        error, text = await mcp_call(world, principal, tool, args)
        leak_free(world, principal, args, text)
        if isinstance(expect, int):
            assert error and tool_error(text) == KIND[expect], f"{name} as {who}: {text}"
            assert await world.state() == before, f"{name} as {who} changed the state"
        else:
            assert not error, f"{name} as {who}: {text}"
            await checked(expect, world, args, json.loads(text))


@pytest.mark.parametrize("name", sorted(MCP_CASES))
async def test_mcp_with_access(world: World, name: str) -> None:
    case, tool = MCP_CASES[name], name.split(":")[0]
    args = await case.args(Ctx(world, world.team))
    error, text = await mcp_call(world, case.who, tool, args)
    leak_free(world, case.who, args, text)
    assert not error, text
    await checked(case.has, world, args, json.loads(text))


async def test_every_mcp_tool_has_a_case(world: World) -> None:
    """Every tool the server lists, and every action or mode of one, has a case."""
    async with mcp_session(world, "alice") as session:
        tools = (await session.list_tools()).tools
    listed = set()
    for tool in tools:
        properties = tool.inputSchema.get("properties", {})
        variants = [
            value for key in ("action", "mode") for value in properties.get(key, {}).get("enum", ())
        ]
        listed |= {f"{tool.name}:{v}" for v in variants} if variants else {tool.name}
    assert listed == set(MCP_CASES), (
        f"without a case: {sorted(listed - set(MCP_CASES))}; "
        f"not a tool: {sorted(set(MCP_CASES) - listed)}"
    )


async def test_mcp_names_a_collective_only_among_those_it_may_see(world: World) -> None:
    """A collective named by name: bob's bare names are his own (projections.naming);
    alice's he names alice/name, and finds only those he may see something of."""
    args = {"collective": "team", "query": SEARCH}
    error, text = await mcp_call(world, "bob", "recall", args)
    assert error and tool_error(text) == "NotFoundError", text
    assert "no collective named 'team' of owner 'bob'" in text
    error, text = await mcp_call(world, "bob", "recall", {**args, "collective": "shared"})
    assert error and tool_error(text) == "NotFoundError", text  # alice's is not his
    error, text = await mcp_call(world, "bob", "recall", {**args, "collective": "alice/team"})
    assert error and tool_error(text) == "NotFoundError", text
    error, text = await mcp_call(world, "bob", "recall", {**args, "collective": "alice/shared"})
    assert not error and mcp_ids(json.loads(text)) == {world.ids["o1"], world.ids["o2"]}


async def test_an_mcp_tool_served_over_http_never_runs_without_a_principal(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    """Over stdio a tool acts for the instance's principal; once its server is served over
    HTTP, a call that arrives without an HTTP request (so without the Guard's principal)
    is refused, never run as the instance's own (in `pulse up`, the local operator)."""
    db = await PulseDB.open(tmp_path / "db", nats_server.url)
    try:
        await db.create_collective("me", "team", embedder="hash")
        mcp = build_mcp(db)
        args = {"collective": "team", "query": "anything"}
        assert await mcp.call_tool("recall", args)  # as over stdio
        mcp.streamable_http_app()
        with pytest.raises(ToolError, match="Unauthorized: a tool call over HTTP without"):
            await mcp.call_tool("recall", args)
    finally:
        await db.close()

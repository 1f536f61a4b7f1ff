"""Pulse as MCP tools for agents: remember, recall, reinforce, relate, invalidate,
insights, activity, session.

Each tool is a function of this module (``TOOLS``) that finds the instance it acts on in
its context (``PulseMCP.db``); its parameters' enumerations are the event model's own
(``eventlog.events``: experience kinds, relation types, visibilities).
``build_mcp(db)`` makes a FastMCP server over an instance: ``sync.PulseDB`` inside
``pulse up`` (served at ``/mcp``, streamable HTTP), or, for ``pulse mcp`` (stdio), the
running service of the data directory through ``ops.remote.RemotePulseDB`` (a second
process cannot open the files) or an instance of its own when nothing runs. Tool
inputs carry the data model's limits in their JSON schemas; a refused input comes
back as a tool error with the library's message.

(No ``from __future__ import annotations``: FastMCP reads the annotations.)
"""

import asyncio
import functools
import logging
import types
import typing
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal
from uuid import UUID

import anyio
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from pydantic import Field, GetCoreSchemaHandler
from pydantic_core import core_schema

from eventlog import events as ev
from eventlog.errors import NotFoundError, PulseError, Unauthorized, ValidationError
from ops.encoding import to_json
from ops.http.errors import internal_error, internal_message
from ops.http.guard import principal_of
from projections import naming
from sync import access, models
from sync.access import Principal
from sync.api import OPERATIONS

log = logging.getLogger("pulse.mcp")


class _ClientWentAway(logging.Filter):
    """The MCP SDK's streamable HTTP transport logs a whole traceback at ERROR each time a
    client closes its session (its stream of server messages finds its reader closed:
    ``anyio.ClosedResourceError``). That is how every agent's session ends, not an
    error: such a record is kept out of the log, so the log grows with what goes wrong,
    not with the number of clients."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, anyio.ClosedResourceError)


def _quiet_disconnects() -> None:
    sdk = logging.getLogger("mcp.server.streamable_http")
    if not any(isinstance(f, _ClientWentAway) for f in sdk.filters):
        sdk.addFilter(_ClientWentAway())


INSTRUCTIONS = """Pulse is the shared memory of a collective of agents. Before a task,
`recall` what others learned (mode "context" also returns insights, relations and who is
active); after it, `remember` what you learned and `reinforce` what helped. At your start,
`session` "resume" (or "start" one); at your end, `session` "end" with your notes.
A collective is named by its name (one of your owner's), as owner/name (another owner's)
or by its id."""

Collective = Annotated[
    str,
    Field(
        description="a collective of yours by name, another owner's as owner/name, or an id",
        min_length=1,
        max_length=naming.REFERENCE_MAX,
    ),
]


class AsDeclared:
    """A tool parameter's type and limits as the declaration states them: the field
    ``field`` of the request model of ``operation`` (``sync.api``), e.g.
    ``Annotated[str, AsDeclared("record_experience", "content")]``, so a tool takes what
    the API takes, with the library's messages."""

    def __init__(self, operation: str, field: str) -> None:
        info = OPERATIONS[operation].request.model_fields[field]
        given = [arg for arg in typing.get_args(info.annotation) if arg is not type(None)]
        optional = typing.get_origin(info.annotation) in (typing.Union, types.UnionType)
        # (an optional field's type without its None: the tool says whether it is optional)
        annotation = given[0] if optional and len(given) == 1 else info.annotation
        metadata = tuple(info.metadata)
        self.type: Any = Annotated[(annotation, *metadata)] if metadata else annotation

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return handler.generate_schema(self.type)


Content = Annotated[
    str,
    AsDeclared("record_experience", "content"),
    Field(description="what was learned (1 byte to 100 KB of UTF-8)"),
]
Score = Annotated[float, AsDeclared("record_experience", "importance")]
Tags = Annotated[
    list[str], AsDeclared("record_experience", "domain"), Field(description="domain tags")
]
Files = Annotated[
    list[str],
    AsDeclared("record_experience", "related_files"),
    Field(description="related files"),
]
# the experience kinds: the tags of the event model's experience types
KINDS = tuple(kind.__struct_config__.tag for kind in ev.EXPERIENCE_TYPES)
if TYPE_CHECKING:
    Kind = str
else:
    Kind = Literal[KINDS]
Agent = Annotated[str, AsDeclared("record_experience", "source_agent")]
K = Annotated[int, AsDeclared("search_similar", "k")]
Limit = Annotated[
    int,
    Field(ge=1, le=models.PAGE_MAX, description=f"agents per page, 1..{models.PAGE_MAX}"),
]
After = Annotated[str | None, Field(description="the `next` of the page before", max_length=1000)]
Notes = Annotated[
    list[str],
    AsDeclared("update_session", "changes"),
    Field(description="short notes, one each (≤1 KB)"),
]
Visible = Annotated[
    ev.Visibility,
    Field(
        description="who may see it: private (you, the author), team (the collective's "
        "members) or org (every principal of the deployment)"
    ),
]
Moment = Annotated[
    int | str | None,
    Field(
        description="answer as the memory was then: a stream sequence, or an ISO 8601 time "
        "(e.g. 2026-11-30T09:00:00Z); default now"
    ),
]
# (printable ASCII, as over HTTP: the declaration's)
IdempotencyKey = Annotated[str, AsDeclared("record_experience", "idempotency_key")] | None


Tool = Callable[..., Awaitable[Any]]
Ctx = Context[Any, Any, Any]  # a tool call's context: its server, and its HTTP request


class PulseMCP(FastMCP):
    """The FastMCP server of one instance: its tools find the instance here (``db``), and
    whether the server is served over HTTP (``pulse up``; ``pulse mcp`` runs it over
    stdio, and a server is one or the other)."""

    def __init__(self, db: Any, **settings: Any) -> None:
        super().__init__("pulse", instructions=INSTRUCTIONS, log_level="WARNING", **settings)
        self.db = db
        self.over_http = False

    def streamable_http_app(self) -> Any:
        self.over_http = True
        return super().streamable_http_app()

    def sse_app(self, mount_path: str | None = None) -> Any:
        self.over_http = True
        return super().sse_app(mount_path)


def build_mcp(db: Any, **settings: Any) -> FastMCP:
    """The MCP server over ``db`` (a PulseDB or a RemotePulseDB), with every tool."""
    mcp = PulseMCP(db, **settings)
    _quiet_disconnects()
    for tool in TOOLS:
        mcp.add_tool(guarded(tool))
    return mcp


def _server(ctx: Ctx) -> PulseMCP:
    server = ctx.fastmcp
    if not isinstance(server, PulseMCP):
        raise TypeError("Pulse's tools are served by a PulseMCP (build_mcp)")
    return server


def instance(ctx: Ctx) -> Any:
    """The instance a tool call acts on."""
    return _server(ctx).db


def guarded(tool: Tool) -> Tool:
    """A tool acting for the principal of its request, whose unexpected errors reach the
    agent as an error id only: the traceback, type and message go to the log under that
    id. Pulse's own errors pass through as "<kind>: <the library's message>" (kinds:
    ValidationError, NotFoundError, Forbidden, Unauthorized, ConflictError, ...)."""

    @functools.wraps(tool)
    async def run(**kwargs: Any) -> Any:
        try:
            principal = _principal(kwargs["ctx"])
            if principal is None:  # over stdio: the instance's own (or the service's token)
                return await tool(**kwargs)
            with access.acting(principal):
                return await tool(**kwargs)
        except PulseError as exc:  # the library's message, named by its kind
            raise ToolError(f"{type(exc).__name__}: {exc}") from None
        except Exception as exc:
            error_id = internal_error(f"MCP tool {tool.__name__}", exc, log)
            raise ToolError(internal_message(error_id)) from None

    return run


def _principal(ctx: Ctx) -> Principal | None:
    """The principal ``pulse up``'s Guard resolved for the HTTP request carrying this
    tool call (``ops.http.guard.principal_of``); None over stdio. A tool call of a server
    served over HTTP without a request, or whose request has no principal, is refused:
    the Guard lets no such request through, and this keeps it so should that change
    (fail closed: never the instance's own principal, which in ``pulse up`` is the local
    operator)."""
    try:
        request = ctx.request_context.request
    except ValueError:  # (no request context at all)
        request = None
    if request is None:
        if _server(ctx).over_http:
            raise Unauthorized("a tool call over HTTP without its request has no principal")
        return None
    return principal_of(request)


# -- the tools ------------------------------------------------------------------------------


async def remember(
    ctx: Ctx,
    collective: Collective,
    content: Content,
    importance: Score = 0.5,
    confidence: Score = 0.5,
    domain: Tags | None = None,
    related_files: Files | None = None,
    kind: Kind = "Generic",
    details: Annotated[
        dict[str, Any] | None,
        Field(description="the fields of the kind, e.g. Fact: statement, source"),
    ] = None,
    agent: Agent = "mcp-agent",
    embedding: Annotated[
        list[float] | None,
        Field(
            description="a vector, when the collective has no embedder",
            max_length=models.DIMENSION_MAX,
        ),
    ] = None,
    visibility: Visible = "team",
    on_duplicate: Annotated[
        models.OnDuplicate | None,
        Field(
            description="if it duplicates a live experience of yours: keep both, reinforce "
            "that one instead, or link the two (default: the collective's setting)"
        ),
    ] = None,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    """Record an experience (what you learned); returns its id and what was done:
    {"experience_id", "outcome": "recorded" | "reinforced" | "linked", "duplicate_of"}
    (reinforced: the id is the live experience it duplicates, counted once more)."""
    db = instance(ctx)
    c = await db.find_collective(collective)
    eid = await db.record_experience(
        c.collective_id, content, embedding, experience_type={"kind": kind, **(details or {})},
        importance=importance, confidence=confidence, domain=domain or [],
        related_files=related_files or [], source_agent=agent, visibility=visibility,
        on_duplicate=on_duplicate, idempotency_key=idempotency_key,
    )  # fmt: skip
    of = getattr(eid, "duplicate_of", None)
    return {
        "experience_id": str(eid),
        "outcome": getattr(eid, "outcome", "recorded"),
        "duplicate_of": None if of is None else str(of),
    }


async def recall(
    ctx: Ctx,
    collective: Collective,
    query: Annotated[str, Field(min_length=1, max_length=10_000)],
    mode: Literal["hybrid", "similar", "text", "context"] = "hybrid",
    k: K = 5,
    domains: Tags | None = None,
    include_archived: bool = False,
    include_invalid: bool = False,
    as_of: Moment = None,
) -> dict[str, Any]:
    """Find what the collective knows about ``query``: {"results": [...]} by meaning
    and words (hybrid, similar or text), or everything for a task (context: similar,
    recent, insights, relations, active agents). What is no longer true is left out
    unless ``include_invalid``; ``as_of`` (a stream sequence or an ISO 8601 time)
    answers with what the collective knew then."""
    db = instance(ctx)
    c = await db.find_collective(collective, as_of=as_of)
    flt: dict[str, Any] = {"include_archived": include_archived}
    if include_invalid:
        flt["include_invalid"] = True
    if domains:
        flt["domains"] = domains
    if mode == "context":
        context = await db.get_context_candidates(
            collective_id=c.collective_id, text=query, k=k, filter=flt, as_of=as_of
        )
        parts: dict[str, Any] = await asyncio.to_thread(to_json, context)  # up to MBs
        return parts
    if mode == "text":
        found = await db.search_text(c.collective_id, query, k, flt, as_of=as_of)
    elif mode == "similar":
        found = await db.search_similar(c.collective_id, query, k, flt, as_of=as_of)
    else:
        found = await db.search_hybrid(c.collective_id, query, None, k, flt, as_of=as_of)
    return {"results": to_json(found)}


async def invalidate(
    ctx: Ctx,
    experience_id: UUID,
    reason: Annotated[str, AsDeclared("invalidate_experience", "reason")],
    at: Annotated[str | None, Field(description="ISO 8601 time; default now")] = None,
    true_again: bool = False,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    """Say an experience stopped being true (``at``, default now) and why, so recall
    leaves it out; or, with ``true_again``, that it is true again."""
    db = instance(ctx)
    if true_again:
        e = await db.revalidate_experience(experience_id, reason, idempotency_key=idempotency_key)
    else:
        e = await db.invalidate_experience(
            experience_id, reason, at, idempotency_key=idempotency_key
        )
    return {"experience": to_json(e)}


async def reinforce(
    ctx: Ctx, experience_id: UUID, idempotency_key: IdempotencyKey = None
) -> dict[str, Any]:
    """Count one more application of an experience that helped; returns the total."""
    db = instance(ctx)
    total = await db.reinforce_experience(experience_id, idempotency_key=idempotency_key)
    return {"experience_id": str(experience_id), "applications": total}


async def relate(
    ctx: Ctx,
    source_id: UUID,
    relation_type: ev.RelationType,
    target_id: UUID,
    strength: Score = 0.5,
    metadata: Annotated[str, AsDeclared("store_relation", "metadata")] | None = None,
    visibility: Visible = "team",
    invalidate: bool = False,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    """Link two experiences of one collective; returns the relation's id. With
    ``invalidate`` (Supersedes, Contradicts), the target stops being true now."""
    db = instance(ctx)
    rid = await db.store_relation(
        source_id, target_id, relation_type, strength=strength, metadata=metadata,
        visibility=visibility, invalidate=invalidate, idempotency_key=idempotency_key,
    )  # fmt: skip
    return {"relation_id": str(rid)}


async def insights(
    ctx: Ctx,
    collective: Collective,
    action: Literal["search", "store"],
    text: Annotated[str, Field(min_length=1, max_length=models.INSIGHT_MAX_BYTES)],
    source_experiences: Annotated[list[UUID] | None, Field(max_length=models.SOURCES_MAX)] = None,
    confidence: Score = 0.5,
    k: K = 5,
    visibility: Visible = "team",
    as_of: Moment = None,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    """Search the collective's insights near ``text`` (as of a moment with ``as_of``),
    or store ``text`` as an insight distilled from ``source_experiences`` (1 to 100
    ids)."""
    db = instance(ctx)
    c = await db.find_collective(collective, as_of=None if action == "store" else as_of)
    if action == "store":
        iid = await db.store_insight(
            c.collective_id, text, source_experiences=source_experiences or [],
            confidence=confidence, visibility=visibility, idempotency_key=idempotency_key,
        )  # fmt: skip
        return {"insight_id": str(iid)}
    found = await db.get_insights(c.collective_id, text, k, as_of=as_of)
    return {"insights": to_json(found)}


async def activity(
    ctx: Ctx,
    collective: Collective,
    action: Literal["register", "heartbeat", "end", "active"],
    agent: Agent | None = None,
    task: Annotated[str | None, Field(max_length=models.TASK_MAX_BYTES)] = None,
    working_on: Annotated[list[str], AsDeclared("register_activity", "working_on")] | None = None,
    limit: Limit = models.PAGE_DEFAULT,
    after: After = None,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    """Say what you work on (register), keep it alive (heartbeat), stop (end), or see
    who is active in the collective (active: {"agents": [...], "next": ...}, most
    recent first, ``limit`` per page; pass ``next`` as ``after`` for more)."""
    db = instance(ctx)
    c = await db.find_collective(collective)
    if action == "active":
        page = await db.get_active_agents(c.collective_id, limit=limit, after=after)
        return {"agents": to_json(page), "next": page.next}
    if agent is None:
        raise ValidationError(f"agent: required to {action} an activity")
    if action == "register":
        done = await db.register_activity(
            c.collective_id, agent, task or "", working_on or [],
            idempotency_key=idempotency_key,
        )  # fmt: skip
        return {"activity": to_json(done)}
    if action == "heartbeat":
        done = await db.update_heartbeat(
            c.collective_id, agent, task_description=task, working_on=working_on,
            idempotency_key=idempotency_key,
        )  # fmt: skip
        return {"activity": to_json(done)}
    await db.end_activity(c.collective_id, agent, idempotency_key=idempotency_key)
    return {"ended": agent}


async def session(
    ctx: Ctx,
    action: Literal["start", "update", "end", "resume", "get", "delete"],
    collective: Collective | None = None,
    agent: Agent | None = None,
    session_id: UUID | None = None,
    summary: Annotated[
        str | None,
        Field(
            description="what the session is about, where it stands (≤8 KB)",
            max_length=models.SESSION_SUMMARY_MAX_BYTES,
        ),
    ] = None,
    todo: Annotated[
        list[models.TodoIn] | None,
        Field(
            description="the whole todo list: {task, priority: low|medium|high, note, done} each",
            max_length=models.SESSION_TODO_MAX,
        ),
    ] = None,
    changes: Notes | None = None,
    bugs: Notes | None = None,
    architecture: Notes | None = None,
    k: K = 5,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    """Your working state in a collective, kept across your runs. At your start,
    "resume" (collective, agent): your latest open session and the context for its
    summary ({"session": null} when there is none: then "start" one, with a summary).
    As you go, "update" (session_id and any of summary, todo, changes, bugs,
    architecture: each replaces that field as a whole). At your end, "end"
    (session_id, with your final summary and notes). "get" shows a session; "delete"
    forgets it, with every summary it had (when it holds what must not be kept)."""
    db = instance(ctx)
    fields = {
        "summary": summary, "todo": todo, "changes": changes, "bugs": bugs,
        "architecture": architecture,
    }  # fmt: skip
    if action in ("start", "resume"):
        if collective is None or agent is None:
            missing = "collective" if collective is None else "agent"
            raise ValidationError(f"{missing}: required to {action} a session")
        c = await db.find_collective(collective)
        if action == "resume":
            found = await db.resume_session(c.collective_id, agent, k=k)
            if found is None:
                return {"session": None}
            resumed: dict[str, Any] = await asyncio.to_thread(to_json, found)
            return resumed
        started = await db.start_session(
            c.collective_id, agent, summary or "", idempotency_key=idempotency_key
        )
        more = {name: value for name, value in fields.items() if name != "summary"}
        if any(value is not None for value in more.values()):
            started = await db.update_session(
                started.session_id, **more, idempotency_key=_then(idempotency_key)
            )
        return {"session": to_json(started)}
    if session_id is None:
        raise ValidationError(f"session_id: required to {action} a session")
    if action == "delete":
        await db.delete_session(session_id, idempotency_key=idempotency_key)
        return {"deleted": str(session_id)}
    if action == "get":
        got = await db.get_session(session_id)
        if got is None:
            raise NotFoundError(f"session_id: no session {session_id}")
        return {"session": to_json(got)}
    change = db.update_session if action == "update" else db.end_session
    done = await change(session_id, **fields, idempotency_key=idempotency_key)
    return {"session": to_json(done)}


TOOLS: tuple[Tool, ...] = (
    remember,
    recall,
    invalidate,
    reinforce,
    relate,
    insights,
    activity,
    session,
)


def _then(key: str | None) -> str | None:
    """The idempotency key of the second write of one tool call (derived from its own)."""
    return None if key is None else f"{key[: models.IDEMPOTENCY_KEY_MAX - 5]}#then"

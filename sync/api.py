"""The API of Pulse, declared once: every public operation of an instance, with what
each surface needs to know of it.

``OPERATIONS`` is the whole API, in a stable order. Each ``Operation`` names a method of
``PulseDB`` (and so ``POST /v1/<name>``, the OpenAPI operationId, the remote client's
method), says in one whole sentence what it does, which token scope may call it at
least, whether it appends to the log, whether it takes an ``idempotency_key``, whether
it may answer None (the HTTP service then says 404), and carries its request model (one
flat object of its arguments, with the data model's limits: ``sync.requests``) and its
return type. The HTTP routes, the MCP tools, the CLI commands and ``ops.remote`` are
derived from it; an operation that is not declared here is on no surface.

Adding an operation: its implementation (a method of the domain service it belongs to,
``sync.instance`` lists them), its ``Delegate`` line on ``PulseDB``, then one entry
below. What the implementation shows (its request model, return type, whether it takes
an idempotency key, whether a getter may answer None) is read from it here, and
``tests/test_declaration.py`` holds the facade, the routes and the remote client to
this list.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import pydantic

from sync.requests import request_model

Scope = Literal["read", "write", "admin"]


@dataclass(frozen=True)
class Operation:
    """One operation of the API (see the module docstring)."""

    name: str  # PulseDB method, POST /v1/<name>, OpenAPI operationId, remote name
    summary: str  # one whole sentence ending in "."
    description: str  # the rest of the documentation
    scope: Scope  # the least token scope that may call it
    writes: bool  # appends events to the log
    idempotent: bool  # takes idempotency_key
    optional: bool  # may answer None (the service answers 404)
    request: type[pydantic.BaseModel]  # ONE flat object model of its arguments
    returns: Any  # the return type (resolved annotation)


# name: (scope, writes, summary). Reads first, then writes, then the admins' own; within
# each, by subject.
_DECLARED: dict[str, tuple[Scope, bool, str]] = {
    # -- collectives and experiences
    "get_collective": ("read", False, "Get a collective by id."),
    "find_collective": (
        "read",
        False,
        "Find the collective a caller names by id, by a name of its own owner, or as owner/name.",
    ),
    "list_collectives": ("read", False, "List the live collectives, one page at a time."),
    "get_collective_stats": (
        "read",
        False,
        "Count the live rows of a collective the caller may see.",
    ),
    "get_experience": ("read", False, "Get an experience by id, archived ones too."),
    "get_recent_experiences": (
        "read",
        False,
        "List a collective's newest experiences, newest first.",
    ),
    "list_experiences": (
        "read",
        False,
        "List a collective's experiences, oldest first, by offset.",
    ),
    "list_cold_experiences": (
        "read",
        False,
        "List the experiences whose energy is below a threshold, coldest first.",
    ),
    # -- recall
    "search_similar": (
        "read",
        False,
        "Find the experiences nearest in meaning to a vector or a text.",
    ),
    "search_text": ("read", False, "Find the experiences whose text matches words (BM25)."),
    "search_hybrid": (
        "read",
        False,
        "Find experiences by meaning and by words together, the two rankings fused.",
    ),
    "get_context_candidates": (
        "read",
        False,
        "Gather everything an agent needs before a task in one call.",
    ),
    # -- relations, insights, wisdom
    "get_related_experiences": ("read", False, "List the experiences linked to an experience."),
    "get_insight": ("read", False, "Get an insight by id."),
    "get_insights": ("read", False, "Find the insights nearest to a vector or a text."),
    "get_wisdom": ("read", False, "List an owner's wisdom, nearest to a vector first."),
    # -- presence and sessions
    "get_active_agents": (
        "read",
        False,
        "List the agents active in a collective, most recent first.",
    ),
    "get_session": ("read", False, "Get a session by id."),
    "list_sessions": ("read", False, "List the sessions of a collective, oldest first."),
    "resume_session": (
        "read",
        False,
        "Resume an agent's latest open session, with the context to go on with it.",
    ),
    # -- threads: an agent framework's checkpoints
    "get_checkpoint": (
        "read",
        False,
        "Get a checkpoint of a thread, the latest of a namespace unless one is named.",
    ),
    "list_checkpoints": (
        "read",
        False,
        "List the checkpoints of a collective's threads, newest first.",
    ),
    "list_threads": ("read", False, "List the names of a collective's threads."),
    # -- the state as a whole
    "sql": ("read", False, "Run one read-only SQL query over the state."),
    "sync": ("read", False, "Wait until this host has applied everything the log holds now."),
    "whoami": ("read", False, "Tell the caller who it is: owner, agent, scope and collectives."),
    # -- writes: collectives and experiences
    "create_collective": ("write", True, "Create a collective."),
    "record_experience": ("write", True, "Record what an agent learned."),
    "record_experiences": (
        "write",
        True,
        "Record up to 1,000 experiences at once, all or nothing.",
    ),
    "update_experience": (
        "write",
        True,
        "Change an experience's importance, confidence, domain or related files.",
    ),
    "invalidate_experience": ("write", True, "Say that an experience stopped being true, and why."),
    "revalidate_experience": (
        "write",
        True,
        "Say that an invalidated experience is true again, and why.",
    ),
    "archive_experience": ("write", True, "Hide an experience from searches, reversibly."),
    "unarchive_experience": ("write", True, "Show an archived experience in searches again."),
    "reinforce_experience": (
        "write",
        True,
        "Count one more application of an experience and return the total.",
    ),
    "delete_experience": ("write", True, "Delete an experience and forget it everywhere."),
    # -- writes: relations, insights, wisdom
    "store_relation": ("write", True, "Link two experiences of one collective."),
    "delete_relation": ("write", True, "Delete a relation and forget it."),
    "store_insight": (
        "write",
        True,
        "Store an insight distilled from experiences of a collective.",
    ),
    "delete_insight": ("write", True, "Delete an insight and forget it."),
    "store_wisdom": ("write", True, "Store a pattern learned across an owner's collectives."),
    "delete_wisdom": ("write", True, "Delete wisdom and forget it."),
    # -- writes: presence and sessions
    "register_activity": ("write", True, "Say what an agent is working on."),
    "update_heartbeat": ("write", True, "Keep an agent's activity alive."),
    "end_activity": ("write", True, "Say that an agent stopped working."),
    "start_session": ("write", True, "Start a session of an agent in a collective."),
    "update_session": ("write", True, "Replace the given fields of a session."),
    "end_session": ("write", True, "End a session, with its final fields if given."),
    "delete_session": ("write", True, "Delete a session and forget it, its history too."),
    # -- writes: threads
    "put_checkpoint": ("write", True, "Store a checkpoint of a thread."),
    "put_pending_writes": ("write", True, "Store a task's pending writes after a checkpoint."),
    "copy_thread": ("write", True, "Copy a thread's checkpoints and writes into another thread."),
    "prune_threads": ("write", True, "Delete all but the latest checkpoints of threads, or all."),
    "delete_checkpoints_of_runs": (
        "write",
        True,
        "Delete the checkpoints some runs made, in every thread.",
    ),
    "delete_thread": ("write", True, "Delete a thread and forget it."),
    # -- the admins' own
    "delete_collective": ("admin", True, "Delete a collective and forget everything in it."),
    "create_token": ("admin", True, "Create an access token."),
    "list_tokens": ("admin", False, "List the access tokens."),
    "revoke_token": ("admin", True, "Revoke an access token on every host."),
    "follow": ("admin", False, "Follow more collectives on this host."),
    "compact": (
        "admin",
        False,
        "Rewrite this host's files so that nothing deleted is left in them.",
    ),
    "rotate_keys": ("admin", False, "Rotate the key-encryption key."),
    "digest": ("admin", False, "Hash the logical state, of every collective or of one."),
    "status": ("admin", False, "Report this host, the log and how far behind the host is."),
    "dead_letters": ("admin", False, "List the events kept aside, one page at a time."),
}


def _implementations() -> dict[str, Callable[..., Any]]:
    """The method implementing each operation (a service's: ``PulseDB``'s delegate on
    the class is the implementation itself)."""
    from sync.instance import PulseDB

    return {name: getattr(PulseDB, name) for name in _DECLARED}


def _optional(name: str, returns: Any) -> bool:
    """A getter that answers None when there is nothing (or nothing the caller may see)."""
    return name.startswith("get_") and type(None) in typing.get_args(returns)


def _declare(name: str, implementation: Callable[..., Any]) -> Operation:
    scope, writes, summary = _DECLARED[name]
    returns = typing.get_type_hints(implementation)["return"]
    return Operation(
        name=name,
        summary=summary,
        description=inspect.getdoc(implementation) or summary,
        scope=scope,
        writes=writes,
        idempotent="idempotency_key" in inspect.signature(implementation).parameters,
        optional=_optional(name, returns),
        request=request_model(name, implementation),
        returns=returns,
    )


OPERATIONS: Mapping[str, Operation] = MappingProxyType(
    {name: _declare(name, method) for name, method in _implementations().items()}
)

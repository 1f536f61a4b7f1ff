"""The HTTP JSON API of an instance, served by ``pulse up``.

Every operation of the API (declared once: ``sync.api.OPERATIONS``) is ``POST
/v1/<name>`` with its arguments as one JSON object (the same names as in Python), e.g.
``POST /v1/record_experience {"collective_id": ..., "content": ...}``. One shape for
every operation keeps the API complete and the same as the library by construction; the
request bodies are the declaration's request models, so the OpenAPI schema at
``/openapi.json`` carries the data-model limits, and a bad request gets the library's
messages (every error, an unknown path's 404 and a wrong method's 405 too, in one shape):

    422 {"error": "ValidationError", "message": "importance: Input should be ...",
         "problems": ["importance: ..."]}
    404 NotFoundError, 409 ConflictError, 503 LogUnavailable, 401 without a credential,
    403 Forbidden (also: an Origin not of this service), 415 UnsupportedMediaType (a body
    that is not Content-Type application/json), 413 PayloadTooLarge (a body over
    $PULSE_MAX_BODY_BYTES, 8 MiB), and for anything unexpected 500 {"error":
    "InternalError", "message": ..., "error_id": "..."}: one line in the service log
    under that id (its traceback at debug level), never the details in the response

Every request carries a credential (``Guard``): an access token, or the data
directory's operator secret (``ops.operator_secret``), as ``Authorization: Bearer``;
only ``/health`` (up or down), ``/openapi.json`` and ``/docs`` (its assets shipped in the
package) answer without one, and the last two can be made private too.

Listings (list_collectives, get_related_experiences, get_active_agents, list_sessions,
dead_letters) answer one page, ``{"items": [...], "next": cursor or null}``: ``limit``
1..1000 (default 100), and ``after`` the ``next`` of the page before.

Results are JSON with embeddings left out (their ``dimension`` instead), or as lists of
floats with ``?embeddings=true``; ``?format=msgspec`` is the exact typed form
``ops.remote.RemotePulseDB`` decodes; ``POST /v1/sql`` also answers Arrow IPC or Parquet
(``ops.tables``). Also: ``GET /v1/watch_experiences`` (server-sent events), ``GET
/health``, ``GET /metrics`` (Prometheus text, ``ops.metrics``; admins and the operator,
or anyone on an address of its own: ``metrics_app``), and the MCP server's
streamable-HTTP transport at ``/mcp``.

What the OpenAPI schema promises of every route (statuses, the error body, strict JSON
types, limits, examples) is stated in ``ops.contract``; the routes are the routers of
``ops.http``, put together by ``create_app``.
"""

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from ops import console, contract
from ops.http import api, docs, health, metrics, watch
from ops.http.errors import answer_errors
from ops.http.guard import LOOPBACK, BodyLimit, Guard, origin_of
from ops.http.metrics import metrics_app
from ops.metrics import Metrics
from ops.serving import Limits, Slots, count_setting
from sync.api import OPERATIONS
from sync.instance import PulseDB

__all__ = ["LOOPBACK", "create_app", "metrics_app", "origin_of"]

MAX_BODY_BYTES = 8 * 1024 * 1024  # $PULSE_MAX_BODY_BYTES: a request body, in bytes


class PulseApp(FastAPI):
    """The app, with ``front`` (``api.Front``) answering ``POST /v1/<name>`` before the
    framework's layers; every other request goes through them."""

    front: api.Front | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        front = self.front
        if front is not None:
            taken = front.takes(scope)
            if taken is not None:
                await front.serve(scope, receive, send, taken)
                return
        await super().__call__(scope, receive, send)


def create_app(
    db: PulseDB,
    *,
    secret: str,
    host: str = "127.0.0.1",
    allow_origins: tuple[str, ...] = (),
    private_docs: bool = False,
    mcp_routes: list[Any] | None = None,
    lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]] | None = None,
    max_body_bytes: int | None = None,
    max_watchers: int | None = None,
    max_watchers_per_token: int | None = None,
) -> FastAPI:
    """The app over ``db``: ``secret`` is the operator secret (``ops.operator_secret``),
    ``host`` the address it listens on (its origins are its own), ``allow_origins`` the
    web apps' origins that may call it (with CORS), ``private_docs`` makes /openapi.json
    and /docs want a credential too. ``max_body_bytes``, ``max_watchers`` and
    ``max_watchers_per_token`` default to $PULSE_MAX_BODY_BYTES (8 MiB),
    $PULSE_MAX_WATCHERS (64) and $PULSE_MAX_WATCHERS_PER_TOKEN (16)."""
    app = PulseApp(
        title="Pulse", version="1", summary="A shared memory for collectives of AI agents",
        description=__doc__, lifespan=lifespan,
        docs_url=None, redoc_url=None,  # (ops.http.docs serves /docs, from the package)
    )  # fmt: skip
    counts = app.state.metrics = Metrics(db)  # (also read by `pulse up --metrics-listen`)
    watching = Slots(
        max_watchers or count_setting("PULSE_MAX_WATCHERS", Limits.max_watchers),
        max_watchers_per_token
        or count_setting("PULSE_MAX_WATCHERS_PER_TOKEN", Limits.max_watchers_per_token),
    )
    operations = list(OPERATIONS.values())  # the declared API (sync.api)
    app.include_router(api.router(db, operations))
    app.include_router(watch.router(db, secret, watching))
    app.include_router(health.router(db))
    app.include_router(metrics.router(db, counts))
    app.include_router(docs.router())
    app.include_router(console.router())
    app.router.routes.extend([docs.assets(), *(mcp_routes or [])])
    answer_errors(app)
    app.openapi = functools.partial(contract.schema_of, app, operations)  # type: ignore[method-assign]
    limit = max_body_bytes or count_setting("PULSE_MAX_BODY_BYTES", MAX_BODY_BYTES)
    guarded: dict[str, Any] = dict(
        metrics=counts, secret=secret, db=db, host=host, allow_origins=allow_origins,
        private_docs=private_docs, routes=api.paths(operations) | {watch.PATH},
    )  # fmt: skip
    app.add_middleware(api.Direct, db=db, operations=operations)  # (innermost)
    app.add_middleware(BodyLimit, limit=limit)
    app.add_middleware(Guard, **guarded)  # (outermost: sees the 413s)
    # (and before all of them, the same checks and calls for POST /v1/<name>)
    app.front = api.Front(db, operations, Guard(app, **guarded), limit)
    return app

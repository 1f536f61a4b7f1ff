"""The HTTP JSON API of an instance, served by ``pulse up``.

Every public method of ``PulseDB`` is ``POST /v1/<method>`` with its arguments as a JSON
object (the same names as in Python), e.g. ``POST /v1/record_experience {"collective_id":
..., "content": ...}``. One shape for every method keeps the API complete and the same as
the library by construction; the request bodies are the library's pydantic models (or
models derived from the method's signature), so the OpenAPI schema at ``/openapi.json``
carries the data-model limits, and a bad request gets the library's messages:

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
types, limits, examples) is stated in ``ops.contract``; bodies are read by ``read_body``.

(No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations.)
"""

import asyncio
import collections.abc
import contextlib
import json
import logging
import secrets
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import msgspec
import pydantic
from fastapi import FastAPI, Query
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

from eventlog.errors import (
    ConflictError,
    Forbidden,
    LogUnavailable,
    NotFoundError,
    PulseError,
    QueryCancelled,
    QueryOutOfMemory,
    QueryTimedOut,
    QueryTooLarge,
    Unauthorized,
    ValidationError,
)
from ops import contract, tables
from ops.encoding import to_json
from ops.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ops.metrics import Metrics
from ops.serving import Limits, Slots, count_setting, holder_of
from sync import models
from sync.access import Principal
from sync.api import OPERATIONS
from sync.instance import PulseDB
from sync.recall import Context

log = logging.getLogger("pulse.service")

STATUS: dict[type[PulseError], int] = {
    Unauthorized: 401,  # no principal: no token, or an unknown, revoked or expired one
    Forbidden: 403,  # a principal that may not do this (its scope, or not a member)
    ValidationError: 422,
    NotFoundError: 404,
    ConflictError: 409,
    LogUnavailable: 503,
    QueryTimedOut: 408,  # /v1/sql past $PULSE_SQL_TIME_LIMIT
    QueryOutOfMemory: 413,  # /v1/sql past $PULSE_SQL_MEMORY_LIMIT (and the temp files')
    QueryTooLarge: 413,  # /v1/sql: a query longer than $PULSE_SQL_MAX_QUERY_BYTES
    QueryCancelled: 503,  # /v1/sql stopped for a rewrite of the files after a delete: retry
}


# -- limits of the edge (environment variables of `pulse up`, or create_app's arguments) ---

MAX_BODY_BYTES = 8 * 1024 * 1024  # $PULSE_MAX_BODY_BYTES: a request body, in bytes
WATCH_RETRY_AFTER = 5  # seconds, the Retry-After of a watch refused for the cap
# (the caps on watch streams are ops.serving.Limits', read by `pulse up`)


METHODS = {"GET", "POST", "HEAD", "OPTIONS", "DELETE"}  # metric labels; others: "other"
KNOWN_ROUTES = ("/health", "/metrics", "/mcp", "/openapi.json", "/docs")


def route_of(path: str) -> str:
    if path.startswith("/v1/") and path[4:] in {*OPERATIONS, "watch_experiences"}:
        return path
    return path if path in KNOWN_ROUTES else "other"


LOOPBACK = ("127.0.0.1", "localhost", "::1")  # the loopback names of this machine


def own_origins(hosts: collections.abc.Iterable[str], port: int) -> set[str]:
    """The origins of this service's own pages (``/docs``): its loopback names and the
    addresses it is reached at (--host, and the one a request came to), at its port. (A
    page that rebinds its own name to one of them still has its own name as Origin.)"""
    names = {*LOOPBACK, *hosts}
    return {f"http://[{name}]:{port}" if ":" in name else f"http://{name.lower()}:{port}"
            for name in names}  # fmt: skip


def origin_of(text: str) -> str:
    """A configured origin (``--allow-origin``) as browsers send it: scheme://host[:port],
    lower case, no path; ValidationError naming it otherwise."""
    given = text.strip().rstrip("/").lower()
    scheme, sep, rest = given.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or any(c in rest for c in "/?#@ "):
        raise ValidationError(
            f"allow_origin: must be an origin like https://app.example or http://host:8080 "
            f"(scheme, host and port, no path), got {text!r:.100}"
        )
    return given


def _header(scope: Scope, name: bytes) -> list[str]:
    return [value.decode("latin-1") for key, value in scope["headers"] if key == name]


def _has_body(scope: Scope) -> bool:
    if _header(scope, b"transfer-encoding"):
        return True
    return any(length.strip() not in ("", "0") for length in _header(scope, b"content-length"))


def is_json(content_type: str) -> bool:
    """Whether a Content-Type is the media type application/json (parameters such as
    charset aside): the type is parsed, never searched for "json", so a browser's
    ``text/plain;charset=json`` (a request sent without a CORS preflight) is not."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json"


PRINCIPAL = "pulse.principal"  # the scope key of a request's resolved principal
DOCS_PATHS = ("/openapi.json", "/docs")  # and what is under /docs/ (its assets)


class Guard:
    """What every request must show, who it acts for, and request metrics. Plain ASGI,
    so streaming responses (SSE, MCP) pass through untouched.

    A browser cannot be made to act for its user here: a request whose ``Origin`` is not
    one of this service's own (``own_origins``) or one configured (``--allow-origin``) is
    403 on every path, and a request with a body must say Content-Type application/json
    (415 otherwise; a page can send other types without asking first). CORS headers are
    sent for the configured origins only (none by default).

    The principal (``sync.access``) goes in the request's scope (``PRINCIPAL``) for the
    endpoints and the MCP tools: that of its bearer token, an access token or the data
    directory's operator secret (``ops.operator_secret``: the local operator). Without
    one, 401 on every path but ``/health`` (which then answers "up" or "down" only) and
    the contract (``/openapi.json``, ``/docs``) unless ``private_docs``. Whatever the Host
    or the peer's address: loopback is no credential, since every user of the machine
    (and every page their browsers load) reaches it."""

    def __init__(
        self, app: ASGIApp, metrics: Metrics, secret: str, db: PulseDB, *, host: str,
        allow_origins: tuple[str, ...] = (), private_docs: bool = False,
    ) -> None:  # fmt: skip
        self.app, self.metrics, self.secret, self.db = app, metrics, secret, db
        self.host, self.private_docs = host, private_docs
        self.allowed = {origin_of(origin) for origin in allow_origins}
        self.inner: ASGIApp = self._authenticated
        if self.allowed:
            self.inner = CORSMiddleware(
                self._authenticated, allow_origins=sorted(self.allowed),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["Authorization", "Content-Type", "Accept", "Last-Event-ID",
                               "Mcp-Session-Id", "Mcp-Protocol-Version"],
                expose_headers=["Mcp-Session-Id", "Retry-After", "WWW-Authenticate"],
            )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        started = time.perf_counter()
        status = 500
        answered = False

        async def sending(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status, answered = message["status"], True
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, sending)
                return
            await self.inner(scope, receive, sending)
        except Exception as exc:  # anything unexpected: an id, one line in the log
            # (caught here, not by an app exception handler: Starlette would raise it on
            # to the server after the answer, which logs a traceback for every request)
            error_id = internal_error(f"{scope['method']} {path}", exc)
            if not answered:  # (a stream that already began just ends)
                await internal_response(error_id)(scope, receive, sending)
        finally:
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.metrics.observe(route_of(path), method, status, time.perf_counter() - started)

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        """The answer to a request a browser may have been made to send, if it is one."""
        origins = _header(scope, b"origin")
        if origins:
            address, port = scope.get("server") or ("", None)
            own = own_origins((self.host, str(address)), port) if port else set()
            foreign = [o for o in origins if o.strip().lower() not in own | self.allowed]
            if foreign or len(origins) > 1:
                named = foreign[0] if foreign else ", ".join(origins)
                return JSONResponse(
                    {"error": "Forbidden", "message": f"origin: {named!r:.200} is not an "
                     "origin of this service; pulse up --allow-origin ORIGIN lets a web app "
                     "of yours call it"},
                    status_code=403,
                )  # fmt: skip
        if _has_body(scope):
            types = _header(scope, b"content-type")
            if len(types) != 1 or not is_json(types[0]):
                given = types[0] if len(types) == 1 else (types or "none")
                return JSONResponse(
                    {"error": "UnsupportedMediaType", "message": "body: must be JSON with "
                     f"Content-Type: application/json, got {given!r:.200}"},
                    status_code=415,
                )  # fmt: skip
        return None

    async def _authenticated(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            scope[PRINCIPAL] = resolve(scope, self.secret, self.db)
        except Unauthorized as exc:
            if not self._public(scope["path"]):
                response = JSONResponse(
                    {"error": "Unauthorized", "message": str(exc)},
                    status_code=401, headers={"WWW-Authenticate": "Bearer"},
                )  # fmt: skip
                await response(scope, receive, send)
                return
            scope[PRINCIPAL] = None
        await self.app(scope, receive, send)

    def _public(self, path: str) -> bool:
        """Paths that answer without a credential: /health (up or down), and the contract
        unless private."""
        if path == "/health":
            return True
        return not self.private_docs and (path in DOCS_PATHS or path.startswith("/docs/"))


def resolve(scope: Scope, secret: str, db: PulseDB) -> Principal:
    """The principal of a request's bearer token (``secret``: the operator's), or
    Unauthorized (naming why). A stream asks again as it goes: a token revoked (or
    expired) meanwhile ends it."""
    given = _bearer(scope)
    if given is None:
        raise Unauthorized(
            "a bearer token is required: Authorization: Bearer <token> (an access token, "
            "or the operator secret in the data directory's operator-token file)"
        )
    if secrets.compare_digest(given.encode(), secret.encode()):
        return Principal.operator()
    return db.principal_of(given)


def _bearer(scope: Scope) -> str | None:
    """The token of ``Authorization: Bearer <token>``, if the request has one."""
    for key, value in scope["headers"]:
        if key == b"authorization":
            scheme, _, given = value.decode("latin-1").partition(" ")
            token: str = given.strip()
            if scheme.lower() == "bearer" and token:
                return token
            return ""  # (an empty token: no principal, and not the local operator)
    return None


def principal_of(request: Request) -> Principal:
    """The principal the Guard resolved for a request."""
    found = request.scope.get(PRINCIPAL)
    if not isinstance(found, Principal):
        raise Unauthorized("a bearer token is required: Authorization: Bearer <token>")
    return found


class BodyTooLarge(Exception):
    """Raised to the app by ``BodyLimit``'s receive past the limit."""


class BodyLimit:
    """Request bodies of at most ``limit`` bytes: a larger Content-Length is answered 413
    before anything is read, and a body without one (chunked) is counted as it arrives
    and answered 413 as soon as it passes the limit; the rest is never read. Plain ASGI,
    so the MCP route is covered too and responses stream through untouched."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0  # the server refuses what it cannot frame
                if declared > self.limit:
                    await self._refuse(scope, receive, send)
                    return
        received = 0
        too_large = False
        started = False

        async def limited() -> Message:
            nonlocal received, too_large
            if too_large:
                raise BodyTooLarge
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    too_large = True
                    raise BodyTooLarge
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            if too_large:
                return  # whatever the app makes of the exception, the answer is 413
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, sending)
        except BodyTooLarge:
            pass
        if too_large and not started:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(
            {"error": "PayloadTooLarge", "message": f"body: larger than the limit of "
             f"{self.limit} bytes of this service ($PULSE_MAX_BODY_BYTES); send less "
             "per request (e.g. smaller batches)"},
            status_code=413, headers={"Connection": "close"},
        )  # fmt: skip
        await response(scope, receive, send)


# -- the app ----------------------------------------------------------------------------------


def _error(exc: PulseError) -> JSONResponse:
    status = next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 500)
    body: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    problems = getattr(exc, "problems", None)
    if problems:
        body["problems"] = problems
    return JSONResponse(body, status_code=status)


def internal_error(where: str, exc: BaseException, logger: logging.Logger = log) -> str:
    """Log an unexpected error under a short random id, in one line at ERROR (the id,
    where, the exception's type and the start of its message, newlines escaped) and its
    traceback once at DEBUG ($PULSE_LOG_LEVEL of `pulse up`): a stream of bad
    requests grows the log by a line each, not a traceback each. The id is all a caller
    gets (never the exception's type, message or traceback)."""
    error_id = secrets.token_hex(6)
    logger.error("internal error %s in %s: %s %.200r", error_id, where, type(exc).__name__,
                 str(exc))  # fmt: skip
    logger.debug("internal error %s in %s: the traceback", error_id, where, exc_info=exc)
    return error_id


def internal_message(error_id: str) -> str:
    return f"internal error {error_id}: the service log has the details under this id"


def internal_response(error_id: str) -> JSONResponse:
    """The answer to an unexpected error: its id, never its type, message or traceback."""
    return JSONResponse(
        {"error": "InternalError", "message": internal_message(error_id), "error_id": error_id},
        status_code=500,
    )


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
    body_limit = max_body_bytes or count_setting("PULSE_MAX_BODY_BYTES", MAX_BODY_BYTES)
    watch_limit = max_watchers or count_setting("PULSE_MAX_WATCHERS", Limits.max_watchers)
    watch_per_token = max_watchers_per_token or count_setting(
        "PULSE_MAX_WATCHERS_PER_TOKEN", Limits.max_watchers_per_token
    )
    app = FastAPI(
        title="Pulse",
        version="1",
        summary="A shared memory for collectives of AI agents",
        description=__doc__,
        lifespan=lifespan,
        docs_url=None,  # (served below, from the package: no CDN)
        redoc_url=None,
    )
    metrics = app.state.metrics = Metrics(db)
    app.add_middleware(BodyLimit, limit=body_limit)
    app.add_middleware(
        Guard,
        metrics=metrics,
        secret=secret,
        db=db,
        host=host,
        allow_origins=allow_origins,
        private_docs=private_docs,
    )  # fmt: skip (outermost: sees the 413s)

    @app.exception_handler(PulseError)
    async def pulse_error(_: Request, exc: PulseError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(ClientDisconnect)
    async def gone(_: Request, __: ClientDisconnect) -> Response:
        # a client that went away, or was dropped for its slowness (ops.serving): nothing
        # went wrong here, and nobody reads the answer
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # (the query parameters: bodies are read by read_body)
        return _error(models.from_errors(list(exc.errors()), skip=("body", "query")))

    request_models: dict[str, type[pydantic.BaseModel]] = {}
    for name, operation in OPERATIONS.items():  # the declared API (sync.api)
        model = request_models[name] = operation.request
        app.add_api_route(
            f"/v1/{name}",
            (_sql_endpoint if name == "sql" else _endpoint)(db, name, model),
            methods=["POST"],
            summary=operation.summary,
            description=operation.description,
            name=name,
            tags=[_tag(name)],
            responses={
                **contract.responses(contract.errors_of(name, model)),
                **(contract.SQL_RESULTS if name == "sql" else {}),
            },
        )
    watching = Slots(watch_limit, watch_per_token)

    @app.get(
        "/v1/watch_experiences",
        tags=["experiences"],
        response_model=None,
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "a stream of server-sent events",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            **contract.responses(
                {
                    **contract.EVERY_ROUTE,
                    **contract.UNAUTHORIZED,
                    403: contract.EVERY_METHOD[403],
                    503: "TooManyWatchers: $PULSE_MAX_WATCHERS streams are open, or "
                    "$PULSE_MAX_WATCHERS_PER_TOKEN of this token (see Retry-After); or "
                    "LogUnavailable",
                }
            ),
        },
    )
    async def watch_experiences(request: Request) -> Response:
        """Changes to experiences as this instance applies them (server-sent events):
        one ``data: {json}`` line per change the caller may see, from the moment of the
        request. A stream whose token is revoked or expires meanwhile ends with
        ``event: unauthorized`` before the next change (or keep-alive). At most
        $PULSE_MAX_WATCHERS (64) streams at once, $PULSE_MAX_WATCHERS_PER_TOKEN (16) of
        one token; past that, 503 with Retry-After."""
        principal = principal_of(request)
        holder = holder_of(principal)
        if not watching.take(holder):
            mine = watching.refusal(holder) == "token"
            limit = watching.per_holder if mine else watching.limit
            return JSONResponse(
                {"error": "TooManyWatchers", "message": f"watch: {limit} watch streams are "
                 + ("open for this token, its limit ($PULSE_MAX_WATCHERS_PER_TOKEN)" if mine
                    else "open, the limit of this service ($PULSE_MAX_WATCHERS)")
                 + f"; retry in {WATCH_RETRY_AFTER} s"},
                status_code=503, headers={"Retry-After": str(WATCH_RETRY_AFTER)},
            )  # fmt: skip
        try:
            with db.acting_as(principal):
                watch = db.watch_experiences()
        except BaseException:
            watching.give_back(holder)
            raise

        def refused() -> bytes | None:
            """The end of a stream whose token was revoked or expired since it began."""
            try:
                resolve(request.scope, secret, db)
            except Unauthorized as exc:
                return b"event: unauthorized\ndata: " + json.dumps(str(exc)).encode() + b"\n\n"
            return None

        async def events() -> AsyncIterator[bytes]:
            yield b": watching\n\n"
            iterator = aiter(watch)
            try:
                while not await request.is_disconnected():
                    try:
                        change = await asyncio.wait_for(anext(iterator), 15)
                    except TimeoutError:
                        change = None
                    except StopAsyncIteration:
                        return
                    except PulseError as exc:  # the reader fell too far behind
                        yield b"event: overflow\ndata: " + json.dumps(str(exc)).encode() + b"\n\n"
                        return
                    ended = refused()
                    if ended is not None:
                        yield ended
                        return
                    if change is None:
                        yield b": keep-alive\n\n"
                        continue
                    yield b"data: " + json.dumps(to_json(change)).encode() + b"\n\n"
            finally:
                watch.close()

        return CountedStream(events(), watching, holder, media_type="text/event-stream")

    stream_head = StreamHead(db)

    @app.get(
        "/health",
        tags=["service"],
        response_model=None,
        responses={
            200: {"model": contract.Health, "description": "up (to admins: the details)"},
            503: {"model": contract.Health, "description": "down (to admins: why)"},
            **contract.responses(contract.EVERY_ROUTE),
        },
    )
    async def health(request: Request) -> JSONResponse:
        """Up or down; to an admin token or the operator, also the NATS connection, last
        applied vs stream sequence, the lag, the instance id and the analysts' snapshot
        (sequence numbers tell how much the stream holds: not for every caller)."""
        stream_seq: int | None = None
        connected = True
        try:
            stream_seq = await stream_head.read()
        except (PulseError, TimeoutError):
            connected = False
        health = db.health()  # (sync.instance.Health)
        connected = connected and health.nats_connected
        ok = connected and health.replicating
        body = {
            "status": "ok" if ok else "degraded",
            "nats_connected": connected,
            "replicating": health.replicating,
            "applied_seq": health.applied_seq,
            "stream_seq": stream_seq,
            "lag": None if stream_seq is None else max(0, stream_seq - health.applied_seq),
            "instance_id": str(health.instance_id),
            "snapshot": to_json(health.snapshot),  # (projections.snapshot)
        }
        if health.failure is not None:
            body["error"] = health.failure
        principal = request.scope.get(PRINCIPAL)
        if not (isinstance(principal, Principal) and principal.admin):
            body = {"status": "up" if ok else "down"}  # the rest is for admins
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get(
        "/metrics",
        tags=["service"],
        response_model=None,
        response_class=Response,
        responses={
            200: {
                "description": "the Prometheus text exposition format 0.0.4",
                "content": {METRICS_CONTENT_TYPE: {"schema": {"type": "string"}}},
            },
            **contract.responses(
                {**contract.EVERY_ROUTE, **contract.UNAUTHORIZED, 403: contract.ADMINS_ONLY}
            ),
        },
    )
    async def prometheus(request: Request) -> Response:
        """Prometheus metrics: requests, latencies, events applied, replication lag. For
        admin tokens and the operator (or anyone on --metrics-listen's address)."""
        principal_of(request).need_admin("reading /metrics")
        return await metrics_response(db, metrics)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = contract.document(app, request_models)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        """Swagger UI over /openapi.json, its scripts and styles from this service."""
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="Pulse API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
            oauth2_redirect_url=None,
            swagger_ui_parameters={"validatorUrl": None},  # (its default asks a web service)
        )  # fmt: skip

    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    for route in mcp_routes or []:
        app.router.routes.append(route)
    return app


DOCS_ASSETS = "/docs/assets"


async def metrics_response(db: PulseDB, metrics: Metrics) -> Response:
    try:
        stream_seq: int | None = await asyncio.wait_for(db.last_seq(), 5)
    except (PulseError, TimeoutError):
        stream_seq = None
    return Response(metrics.render(stream_seq), media_type=METRICS_CONTENT_TYPE)


def metrics_app(db: PulseDB, metrics: Metrics) -> ASGIApp:
    """``GET /metrics`` alone, without a credential, for ``pulse up --metrics-listen``: an
    address of its own that only the scrapers reach (a private network, or loopback for
    an agent beside it). Why not a ``metrics`` token scope: a scope is a value in the
    token events, and hosts of an older Pulse would refuse (dead-letter) a token created
    with a scope they do not know; an address of its own needs nothing on the log. On
    the API's address /metrics stays for admins and the operator (stream totals are not
    for every caller). Foreign Origins are refused here too."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        response: Response
        if _header(scope, b"origin"):
            response = JSONResponse(
                {"error": "Forbidden", "message": "origin: this address serves scrapers only"},
                status_code=403,
            )
        elif scope["path"] != "/metrics" or scope["method"] not in ("GET", "HEAD"):
            response = JSONResponse(
                {"error": "NotFoundError", "message": "path: this address serves GET /metrics"},
                status_code=404,
            )
        else:
            response = await metrics_response(db, metrics)
        await response(scope, receive, send)

    return serve


TAGS = (
    ("session", "sessions"), ("collective", "collectives"), ("relation", "relations"),
    ("related", "relations"),
    ("insight", "insights"), ("activit", "activities"), ("heartbeat", "activities"),
    ("agent", "activities"), ("wisdom", "wisdom"), ("search", "search"),
    ("context", "search"), ("sql", "analytics"), ("experience", "experiences"),
)  # fmt: skip


class CountedStream(StreamingResponse):
    """A streaming response holding one of the ``Slots`` of ``holder`` until it ends: the
    client went away, the stream ended, or it failed."""

    def __init__(
        self, content: AsyncIterator[bytes], slots: Slots, holder: str, **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self.slots, self.holder = slots, holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slots.give_back(self.holder)


class StreamHead:
    """The stream's last sequence for /health, asked of NATS at most every ``max_age``
    seconds: under load a health probe then costs one pass through the loop, not a
    round trip to NATS behind every queued request. Concurrent probes share one ask."""

    def __init__(self, db: PulseDB, max_age: float = 0.25) -> None:
        self._db = db
        self._max_age = max_age
        self._value: int | None = None
        self._at = -1e9
        self._asking: asyncio.Future[int] | None = None

    async def read(self) -> int:
        if self._value is not None and time.monotonic() - self._at < self._max_age:
            return self._value
        if self._asking is None:
            self._asking = asyncio.ensure_future(asyncio.wait_for(self._db.last_seq(), 5))
        asking = self._asking
        try:
            value = await asyncio.shield(asking)
        finally:
            if self._asking is asking and asking.done():
                self._asking = None
        self._value, self._at = value, time.monotonic()
        return value


def _tag(name: str) -> str:
    """The OpenAPI group of a method."""
    return next((tag for word, tag in TAGS if word in name), "state")


M = typing.TypeVar("M", bound=pydantic.BaseModel)


def _integral(value: Any) -> bool:
    return isinstance(value, float) and value.is_integer()


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() and abs(value) < 2**63 else value


async def read_body(request: Request, model: type[M]) -> M:
    """The request's body as ``model``: a JSON object of the method's arguments, with the
    JSON types the schema states (strict: no ``false`` for an integer, no ``"1"`` for a
    number); no body at all stands for ``{}`` where every argument has a default."""
    raw = await request.body()  # (JSON by its Content-Type: the Guard refused any other)
    try:
        if not raw.strip():
            if any(field.is_required() for field in model.model_fields.values()):
                raise ValidationError(
                    "body: required, a JSON object of the method's arguments "
                    "(Content-Type: application/json)"
                )
            return model.model_validate({}, strict=True)
        try:
            return model.model_validate_json(raw, strict=True)
        except pydantic.ValidationError as exc:
            if not any(_integral(error.get("input")) for error in exc.errors()):
                raise
            # JSON Schema counts 3.0 as an integer: read integral numbers as integers
            data = json.loads(raw, parse_float=_number)
            return model.model_validate_json(json.dumps(data), strict=True)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
        for error in errors:
            if error["type"] == "json_invalid":
                reason = (error.get("ctx") or {}).get("error", "not valid JSON")
                raise ValidationError(f"body: not valid JSON ({reason})") from None
        if any(not error["loc"] and error["type"] == "model_type" for error in errors):
            raise ValidationError(
                "body: must be a JSON object of the method's arguments "
                "(Content-Type: application/json)"
            ) from None
        raise models.translate(exc) from None


FORMAT = Query(
    "json",
    description="json: plain JSON; msgspec: the exact typed form ops.remote decodes",
)
EMBEDDINGS = Query(False, description="embeddings as lists of floats")


def _endpoint(
    db: PulseDB, name: str, model: type[pydantic.BaseModel]
) -> Callable[..., Awaitable[Response]]:
    method = getattr(db, name)
    takes_request = name == "get_context_candidates"
    returns = OPERATIONS[name].returns
    # results that can be large are encoded on a worker thread, not on the event loop
    large = typing.get_origin(returns) in (list, models.Page) or returns is Context
    optional = OPERATIONS[name].optional

    async def answer(request: Request) -> Any:
        body = await read_body(request, model)
        with db.acting_as(principal_of(request)):
            if takes_request:
                result = await method(body)
            else:
                result = await method(**body.model_dump(exclude_unset=True))
        if result is None and optional:  # a getter's "there is none" (or none it may see)
            raise NotFoundError(f"{_subject(name)}: none with that id")
        if isinstance(result, models.Page):  # a page of a listing, and where the rest is
            result = {"items": result, "next": result.next}
        return result

    async def endpoint(
        request: Request,
        format: Literal["json", "msgspec"] = FORMAT,
        embeddings: bool = EMBEDDINGS,
    ) -> Response:
        result = await answer(request)

        def render() -> Response:
            if format == "msgspec":
                return Response(msgspec.json.encode(result), media_type="application/json")
            return JSONResponse(to_json(result, embeddings=embeddings))

        return await asyncio.to_thread(render) if large else render()

    endpoint.__name__ = name
    endpoint.answer = answer  # type: ignore[attr-defined]
    return endpoint


def _sql_endpoint(
    db: PulseDB, name: str, model: type[pydantic.BaseModel]
) -> Callable[..., Awaitable[Response]]:
    """``POST /v1/sql``: the endpoint of ``_endpoint``, but a client that goes away
    cancels its query (interrupted in DuckDB: ``analytics.run_async``) instead of leaving
    it to run to its time limit for nobody; what little is sent then is a 499. The
    result is JSON, or Arrow IPC or Parquet when asked (``format=``, or ``Accept``).
    In JSON a float that is NaN, Infinity or -Infinity is null (JSON has no such
    numbers; ``SqlResult``); Arrow and Parquet keep the IEEE value."""
    answer = _endpoint(db, name, model).answer  # type: ignore[attr-defined]

    async def endpoint(
        request: Request,
        format: Literal["json", "msgspec", "arrow", "parquet"] = Query(
            "json",
            description="json, msgspec, arrow (Arrow IPC stream) or parquet; without it, an "
            "Accept of " + " or ".join(tables.MEDIA_TYPES.values()) + " asks for that one",
        ),
        embeddings: bool = EMBEDDINGS,
    ) -> Response:
        given = "format" in request.query_params
        form = format if given else tables.asked(request.headers.get("accept", ""))
        await request.body()  # read before waiting for the client to go (one receiver)
        answering = asyncio.ensure_future(answer(request))
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({answering, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not answering.done():
                answering.cancel()
                await asyncio.wait({answering})
        if answering.cancelled():
            return JSONResponse(
                {
                    "error": "ClientClosedRequest",
                    "message": "query: cancelled, the client went away",
                },
                status_code=499,
            )
        result = answering.result()
        if form in tables.MEDIA_TYPES:
            media_type = tables.MEDIA_TYPES[form]
            content = await asyncio.to_thread(tables.encode, result, form)
            return Response(content, media_type=media_type)
        if form == "msgspec":
            return Response(msgspec.json.encode(result), media_type="application/json")
        # (msgspec writes a float JSON cannot carry as null, where json.dumps would raise)
        content = msgspec.json.encode(to_json(result, embeddings=embeddings))
        return Response(content, media_type="application/json")

    endpoint.__name__ = name
    return endpoint


async def _client_gone(request: Request) -> None:
    """Return once the client of ``request`` (whose body was read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _subject(name: str) -> str:
    """The id argument of a getter, e.g. ``experience_id`` of ``get_experience``."""
    return f"{name.removeprefix('get_')}_id"

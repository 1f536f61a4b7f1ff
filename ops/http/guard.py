"""What every request of ``pulse up`` must show before it reaches a route: an Origin of
this service's own (or a configured one), JSON for a body, a bearer credential naming its
principal, and a body within the limit; and the request metrics, counted for each.

Plain ASGI middleware (``Guard``, ``BodyLimit``), so streaming responses (server-sent
events, MCP) pass through untouched. The routes read the principal with ``principal_of``.
"""

from __future__ import annotations

import collections.abc
import secrets
import time

from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventlog.errors import Unauthorized, ValidationError
from ops import console
from ops.http.errors import internal_error, internal_response
from ops.metrics import Metrics
from sync.access import Principal
from sync.instance import PulseDB

METHODS = {"GET", "POST", "HEAD", "OPTIONS", "DELETE"}  # metric labels; others: "other"
KNOWN_ROUTES = ("/health", "/metrics", "/mcp", "/openapi.json", "/docs")


def route_of(path: str, routes: collections.abc.Container[str]) -> str:
    """The route label of a request's metrics: one of ``routes`` or the known ones, else
    "other" (a label per unknown path would let any client grow the registry)."""
    if path in routes:
        return path
    if console.public(path):
        return console.PREFIX
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


def header(scope: Scope, name: bytes) -> list[str]:
    return [value.decode("latin-1") for key, value in scope["headers"] if key == name]


def has_body(scope: Scope) -> bool:
    if header(scope, b"transfer-encoding"):
        return True
    return any(length.strip() not in ("", "0") for length in header(scope, b"content-length"))


def is_json(content_type: str) -> bool:
    """Whether a Content-Type is the media type application/json (parameters such as
    charset aside): the type is parsed, never searched for "json", so a browser's
    ``text/plain;charset=json`` (a request sent without a CORS preflight) is not."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json"


PRINCIPAL = "pulse.principal"  # the scope key of a request's resolved principal
DOCS_PATHS = ("/openapi.json", "/docs")  # and what is under /docs/ (its assets)


class Guard:
    """What every request must show, who it acts for, and request metrics.

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
        routes: collections.abc.Container[str] = (), allow_origins: tuple[str, ...] = (),
        private_docs: bool = False,
    ) -> None:  # fmt: skip
        self.app, self.metrics, self.secret, self.db = app, metrics, secret, db
        self.routes = routes  # the paths counted under their own label (route_of)
        self.host, self.private_docs = host, private_docs
        self.allowed = {origin_of(origin) for origin in allow_origins}
        self.inner: ASGIApp = self._authenticated
        if self.allowed:
            self.inner = CORSMiddleware(
                self._authenticated, allow_origins=sorted(self.allowed),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["Authorization", "Content-Type", "Accept", "Last-Event-ID",
                               "Mcp-Session-Id", "Mcp-Protocol-Version"],
                expose_headers=["Mcp-Session-Id", "Retry-After", "WWW-Authenticate",
                                "Pulse-Outcome", "Pulse-Duplicate-Of", "Pulse-Outcomes"],
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
            refusal = self.refusal(scope)
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
            self.metrics.observe(
                route_of(path, self.routes), method, status, time.perf_counter() - started
            )

    def refusal(self, scope: Scope) -> JSONResponse | None:
        """The answer to a request a browser may have been made to send, if it is one."""
        origins = header(scope, b"origin")
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
        if has_body(scope):
            return not_json(header(scope, b"content-type"))
        return None

    async def _authenticated(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            scope[PRINCIPAL] = resolve(scope, self.secret, self.db)
        except Unauthorized as exc:
            if not self._public(scope["path"]):
                await unauthorized(exc)(scope, receive, send)
                return
            scope[PRINCIPAL] = None
        await self.app(scope, receive, send)

    def _public(self, path: str) -> bool:
        """Paths that answer without a credential: /health (up or down), the console's
        pages (``ops.console``: they hold no data, and ask for a token in the browser),
        and the contract unless private."""
        if path == "/health" or console.public(path):
            return True
        return not self.private_docs and (path in DOCS_PATHS or path.startswith("/docs/"))


def not_json(types: list[str]) -> JSONResponse | None:
    """The 415 of a body whose Content-Type headers (``types``) are not one, JSON's."""
    if len(types) == 1 and is_json(types[0]):
        return None
    given = types[0] if len(types) == 1 else (types or "none")
    return JSONResponse(
        {"error": "UnsupportedMediaType", "message": "body: must be JSON with "
         f"Content-Type: application/json, got {given!r:.200}"},
        status_code=415,
    )  # fmt: skip


def unauthorized(exc: Unauthorized) -> JSONResponse:
    """The 401 of a request without a (valid) credential."""
    return JSONResponse(
        {"error": "Unauthorized", "message": str(exc)},
        status_code=401, headers={"WWW-Authenticate": "Bearer"},
    )  # fmt: skip


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
        return OPERATOR
    return db.principal_of(given)


OPERATOR = Principal.operator()  # (frozen: one for every request of the operator)


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
        await too_large(self.limit)(scope, receive, send)


def too_large(limit: int) -> JSONResponse:
    """The 413 of a body over ``limit`` bytes (the connection closes: the rest of the
    body is never read)."""
    return JSONResponse(
        {"error": "PayloadTooLarge", "message": f"body: larger than the limit of "
         f"{limit} bytes of this service ($PULSE_MAX_BODY_BYTES); send less "
         "per request (e.g. smaller batches)"},
        status_code=413, headers={"Connection": "close"},
    )  # fmt: skip
